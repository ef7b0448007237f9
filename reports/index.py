"""The report's index page (`index.html`) and its machine-readable twin (`figures.json`).

index.html shows every figure inline (its PNG, with a link to the PDF) under a caption
that says what it shows and under which conditions (host, versions, graph and plan
hashes, repetitions, median and spread; "simulated" where it is), then lists the figures
that were not drawn and why. figures.json records, per figure, its files, the stored
data files it was drawn from and its conditions, so each can be traced and redrawn.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.io import write_json_atomic, write_text_atomic
from schedlab.reports.figures import FigureRecord, _rel, median_spread_text, versions_text
from schedlab.reports.load import RunData, Suite, best_label

REPORT_SCHEMA = "schedlab.report"
REPORT_VERSION = 1
FIGURES_JSON = "figures.json"
INDEX_HTML = "index.html"
REDRAW = {
    "speedup": "python -m schedlab.reports.figures.speedup {path}",
    "pred_vs_meas": "python -m schedlab.reports.figures.pred_vs_meas {path}",
    "gantt": "python -m schedlab.reports.figures.gantt {path}",
    "thread_scaling": "python -m schedlab.reports.figures.thread_scaling {path}",
    "history": "python -m schedlab.reports.figures.history {path}",
    "fidelity": "python -m schedlab.reports.figures.fidelity {path}",
    "placement_strategies": "python -m schedlab.reports.figures.placement_compare {path}",
    "rl_curve": "python -m schedlab.reports.figures.rl_curve {path}",
    "placement_map": "python -m schedlab.reports.figures.placement_map {path}",
}


@dataclass(frozen=True)
class Skipped:
    name: str
    run: str  # "" for a figure across the suite
    reason: str


def write_figures_json(
    suite: Suite, out_dir: Path, records: Sequence[FigureRecord], skipped: Sequence[Skipped]
) -> Path:
    data: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "version": REPORT_VERSION,
        "source": str(suite.root),
        "suite": suite.is_suite,
        "runs": [r.name for r in suite.runs],
        "created_unix_s": time.time(),
        "figures": [
            {**rec.to_json(relative_to=out_dir), "redraw": _redraw(rec, suite)} for rec in records
        ],
        "skipped": [{"name": s.name, "run": s.run, "reason": s.reason} for s in skipped],
    }
    return write_json_atomic(out_dir / FIGURES_JSON, data, indent=1)


def _redraw(rec: FigureRecord, suite: Suite) -> str:
    path = suite.root
    if rec.run and suite.is_suite:
        path = suite.root / rec.run
    return REDRAW.get(rec.name, "schedlab report {path}").format(path=path)


# ---- HTML ------------------------------------------------------------------------------

_CSS = """
body { font-family: "STIX Two Text", "Times New Roman", Georgia, serif; max-width: 62rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.2rem; margin-top: 2.2rem;
       border-bottom: 1px solid #ccc; } h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
.meta, .cond, .files { color: #555; font-size: 0.85rem; }
figure { margin: 1.2rem 0 2rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.95rem; margin-top: 0.4rem; }
.badge { display: inline-block; font-size: 0.75rem; padding: 0 0.4rem; border-radius: 0.3rem;
         margin-right: 0.3rem; color: white; background: #4477AA; vertical-align: middle; }
.badge.simulated { background: #EE6677; } .badge.mixed { background: #AA3377; }
table { border-collapse: collapse; font-size: 0.88rem; margin: 0.5rem 0; }
td, th { padding: 0.15rem 0.7rem 0.15rem 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: normal; }
code { font-size: 0.85em; }
.skipped li { color: #555; }
"""


def write_index(suite: Suite, out_dir: Path, records: Sequence[FigureRecord], skipped: Sequence[Skipped]) -> Path:
    e = html.escape
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>schedlab report: {e(suite.root.name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>schedlab report: {e(suite.root.name)}</h1>",
        f'<p class="meta">Drawn {when} from the stored files of <code>{e(str(suite.root))}</code> '
        f"({_what(suite)}); "
        f"redraw with <code>schedlab report {e(str(suite.root))}</code>. "
        f'Per-figure files, sources and conditions: <a href="{FIGURES_JSON}">{FIGURES_JSON}</a>.</p>',
    ]
    top = [r for r in records if not r.run]
    top_skipped = [s for s in skipped if not s.run]
    if top or top_skipped:
        parts.append("<h2>Across workloads</h2>" if suite.is_suite else "<h2>Speedup</h2>" if suite.runs
                     else "<h2>Simulator fidelity</h2>")
        parts += [_figure_html(r, out_dir, suite.root) for r in top]
        parts += _skipped_html(top_skipped)
    for run in suite.runs:
        parts.append(f"<h2>{e(run.workload)} <span class=\"meta\">({e(run.name)})</span></h2>")
        parts.append(_run_table(run))
        parts += [_figure_html(r, out_dir, suite.root) for r in records if r.run == run.name]
        parts += _skipped_html([s for s in skipped if s.run == run.name])
    parts.append("</body></html>")
    return write_text_atomic(out_dir / INDEX_HTML, "\n".join(parts) + "\n")


def _what(suite: Suite) -> str:
    """What the report was drawn from; a Suite without runs is a `schedlab fidelity` results file."""
    if suite.is_suite:
        return f"a suite of {len(suite.runs)} runs"
    return "one run" if suite.runs else "a fidelity results file"


def _figure_html(rec: FigureRecord, out_dir: Path, root: Path) -> str:
    e = html.escape
    png = next((p for p in rec.files if p.suffix == ".png"), rec.files[0])
    pdf = next((p for p in rec.files if p.suffix == ".pdf"), None)
    kind = "simulated" if rec.basis == "simulated" else ("mixed" if "simulated" in rec.basis else "measured")
    links = f' · <a href="{e(_rel(pdf, out_dir))}">PDF</a>' if pdf else ""
    base = root if root.is_dir() else root.parent  # a fidelity report's root is its results file
    sources = ", ".join(f"<code>{e(_rel(p, base))}</code>" for p in rec.sources)
    return (
        f'<figure id="{e((rec.run + "-" if rec.run else "") + rec.name)}">'
        f'<img src="{e(_rel(png, out_dir))}" alt="{e(rec.title)}">'
        f"<figcaption><span class=\"badge {kind}\">{e(rec.basis)}</span><b>{e(rec.title)}.</b> {e(rec.caption)}"
        f'<br><span class="cond">{e(rec.conditions_text)}</span>'
        f'<br><span class="files">Drawn from {sources}{links}</span></figcaption></figure>'
    )


def _skipped_html(skipped: Sequence[Skipped]) -> list[str]:
    if not skipped:
        return []
    items = "".join(f"<li><b>{html.escape(s.name)}</b>: {html.escape(s.reason)}</li>" for s in skipped)
    return [f'<h3>Not drawn</h3><ul class="skipped">{items}</ul>']


def _run_table(run: RunData) -> str:
    e = html.escape
    res = run.results
    best = res.best_searched
    created = (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(res.created_unix_s)) if res.created_unix_s else "?"
    )
    rows = [
        ("workload", f"{run.workload}, optimizer {run.run.get('optimizer', '?')}"),
        ("host", run.host),
        ("versions", versions_text(run.versions) or "?"),
        ("graph", run.graph_hash or "?"),
        ("search", _search_text(run)),
        ("validation", f"{res.repeats or '?'} repeats × {res.steps_per_repeat or '?'} steps, {created}"),
    ]
    if best is not None:
        rows.append((
            "best searched plan",
            f"{best.plan_hash} ({best.label}): {best.plan.describe()}; "
            f"{median_spread_text(best.measured_s, best.spread_s)}, predicted "
            + ("?" if best.predicted_s is None else f"{best.predicted_s * 1e3:.3f} ms (simulated)"),
        ))
    rows.append((
        "best plan (fastest measured)",
        "no plan measured cleanly" if res.best is None
        else f"{best_label(res.best)}: {res.best.plan_hash}, {median_spread_text(res.best.measured_s, res.best.spread_s)}",
    ))
    for name, m in sorted(res.baselines.items()):
        rows.append((f"baseline {name}", f"{m.plan_hash}: {median_spread_text(m.measured_s, m.spread_s)}"))
    for label, why in res.excluded:
        rows.append((f"not measured cleanly: {label}", why))
    if best is not None and best.max_rel_diff is not None:
        rows.append(("numerics", f"best plan vs eager PyTorch: max relative difference {best.max_rel_diff:.2e}"))
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _search_text(run: RunData) -> str:
    r = run.run
    parts = [f"strategy {r.get('strategy', '?')}", f"{r.get('trials', '?')} trials", f"seed {r.get('seed', '?')}"]
    m = r.get("machine")
    if isinstance(m, dict) and m.get("name"):
        parts.append(f"simulated machine {m['name']}")
    if run.search and isinstance(run.search.get("trials_per_s"), (int, float)):
        parts.append(f"{run.search['trials_per_s']:.1f} trials/s")
    return ", ".join(parts)
