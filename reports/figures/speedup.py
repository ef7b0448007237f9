"""Speedup of the best validated plan over each baseline, one group of bars per workload.

As in the concurrency-control paper (Liu et al., IPDPS 2019, Fig. 9): bars are measured
speedups, baseline median step time over the best plan's median, with whiskers from the
interquartile ranges ([base p25 / best p75, base p75 / best p25]). Hollow diamonds are the
speedups the simulator predicted for the same plans.

The best plan is the run's best as every figure names it (`load.best_plan`): when no
searched plan was measured faster than a baseline, that baseline is the best plan, its
bar over itself is 1.00x, and the caption says how the fastest searched plan fared.

Data: results.json of each run (schedlab validate).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, NullLocator

from schedlab.reports import style
from schedlab.reports.figures import BOTH, FigureRecord, FigureSkipped, describe_conditions, median_spread_text
from schedlab.reports.load import RESULTS_JSON, Measured, NoBestPlan, RunData, best_label, best_plan, load


def speedup_of(best: Measured, base: Measured, baseline_name: str) -> float:
    """Measured speedup: results.json's own figure when it gives one, else the ratio of medians."""
    return best.speedup.get(baseline_name, base.measured_s / best.measured_s)


def spread_of(best: Measured, base: Measured) -> tuple[float, float] | None:
    """[low, high] speedup from the interquartile ranges of both, or None without spreads
    (or when the best plan is this baseline: a plan has no spread against itself)."""
    if best is base or best.spread_s is None or base.spread_s is None:
        return None
    return base.spread_s[0] / best.spread_s[1], base.spread_s[1] / best.spread_s[0]


def predicted_speedup(best: Measured, base: Measured) -> float | None:
    if best.predicted_s is None or base.predicted_s is None:
        return None
    return base.predicted_s / best.predicted_s


def draw(all_runs: Sequence[RunData], out_stem: Path) -> FigureRecord:
    # A workload whose plans all failed to measure has no bar to draw; say so.
    bests: dict[str, Measured] = {}
    missing: dict[str, str] = {}
    for r in all_runs:
        try:
            bests[r.name] = best_plan(r.results)
        except NoBestPlan as e:
            missing[r.workload] = str(e)
    runs = [r for r in all_runs if r.name in bests]
    if not runs:
        raise FigureSkipped("; ".join(f"{w}: {why}" for w, why in missing.items()))
    baselines = sorted({name for r in runs for name in r.results.baselines})
    if not baselines:
        raise FigureSkipped(f"{RESULTS_JSON} holds no baseline measured cleanly to compare with")
    n_b = len(baselines)
    group = min(0.8, 0.3 * n_b)  # a lone baseline gets a slim bar, not the whole slot
    width = group / n_b
    conditions: dict[str, Any] = {"workloads": {}, "not_drawn": missing}
    bars: list[tuple[float, int, float, tuple[float, float] | None, float | None]] = []  # x, baseline, s, iqr, pred
    for gi, run in enumerate(runs):
        best = bests[run.name]
        searched = run.results.best_searched
        wl: dict[str, Any] = {
            "run": run.name,
            "host": run.host,
            "graph_hash": run.graph_hash,
            "repeats": run.results.repeats,
            "steps_per_repeat": run.results.steps_per_repeat,
            "best": {**_cond(best), "role": best.role, "is": best_label(best)},
            "searched_plan_won": run.results.searched_plan_won,
            "best_searched": None if searched is None else {
                **_cond(searched),
                "speedup": {n: speedup_of(searched, b, n) for n, b in sorted(run.results.baselines.items())},
            },
            "excluded": [list(e) for e in run.results.excluded],
            "baselines": {},
        }
        for bi, name in enumerate(baselines):
            base = run.results.baselines.get(name)
            if base is None:
                continue
            s, sp, pred = speedup_of(best, base, name), spread_of(best, base), predicted_speedup(best, base)
            bars.append((gi - group / 2 + width * (bi + 0.5), bi, s, sp, pred))
            wl["baselines"][name] = {
                **_cond(base),
                "speedup": s,
                "speedup_iqr": None if sp is None else list(sp),
                "predicted_speedup": pred,
            }
        conditions["workloads"][run.workload] = wl
    values = [v for _, _, s, sp, pred in bars for v in (s, *(sp or ()), pred) if v is not None and v > 0]
    # Linear bars from 0 as in the paper; when one speedup (or its spread) dwarfs the others,
    # a log axis with bars from 1 keeps a 0.9× and a 90× both readable.
    log = max(values) / min(values) > 8.0
    with style.paper():
        fig = style.figure(max(style.COLUMN_IN, 0.9 + 0.75 * len(runs) * max(n_b, 2) / 2), 2.3)
        ax = fig.add_subplot()
        ax.axhline(1.0, color=style.GREY, lw=0.6, ls="--", zorder=0)
        if log:
            ax.set_yscale("log")
        labelled: set[int] = set()
        any_pred = False
        for x, bi, s, sp, pred in bars:
            yerr = None if sp is None else [[max(s - sp[0], 0.0)], [max(sp[1] - s, 0.0)]]
            ax.bar(
                x, s - 1.0 if log else s, width * 0.92, bottom=1.0 if log else 0.0, color=style.colour(bi),
                label=None if bi in labelled else f"vs {baselines[bi]}", zorder=2,
            )
            labelled.add(bi)
            if yerr is not None:
                ax.errorbar(x, s, yerr=yerr, fmt="none", elinewidth=0.6, capsize=1.5, ecolor=style.INK, zorder=3)
            up = s >= 1.0 or not log
            ax.annotate(
                f"{s:.2f}×", (x, s), xytext=(0, 2 if up else -2), textcoords="offset points", ha="center",
                va="bottom" if up else "top", fontsize=6, zorder=5,
                bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.8},
            )
            if pred is not None:
                ax.plot(
                    x, pred, marker="D", ms=3.5, mfc="white", mec=style.INK, mew=0.7, ls="none", zorder=4,
                    label=None if any_pred else "predicted (simulated)",
                )
                any_pred = True
        ax.set_xticks(range(len(runs)))
        two_line = any(bests[r.name].role == "baseline" for r in runs)  # tick says which baseline is best
        ax.set_xticklabels([
            r.workload + ("" if bests[r.name].role == "candidate" else f"\n(best: baseline {bests[r.name].label})")
            for r in runs
        ])
        ax.set_xlim(-0.6, len(runs) - 0.4)
        if log:
            lo, hi = min(min(values), 1.0) / 1.4, max(values) * 1.6
            ax.set_ylim(lo, hi)
            ax.yaxis.set_major_locator(FixedLocator(style.log_ticks(lo, hi, most=7)))
            ax.yaxis.set_major_formatter(style.fmt_tick_formatter())
            ax.yaxis.set_minor_locator(NullLocator())
        else:
            ax.set_ylim(0, max(max(values), 1.0) * 1.18 + 0.05)
        ax.set_ylabel("speedup of best plan (×)" + (", log scale" if log else ""))
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("predicted"))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper center",
                  bbox_to_anchor=(0.5, -0.22 if two_line else -0.13), ncol=n_b + int(any_pred), handlelength=1.2)
        hosts = sorted({r.host for r in runs})
        reps = sorted({str(r.results.repeats) for r in runs})
        png, pdf = style.save(
            fig,
            out_stem,
            note=f"Measured on {'; '.join(hosts)}; median of {', '.join(reps)} repeats; "
            "whiskers: interquartile range; diamonds: simulated.",
        )
    caption = (
        "Speedup of the best validated plan over each baseline, per workload: baseline median step time "
        "over the best plan's median, measured on the real executor. Whiskers span the interquartile ranges; "
        "hollow diamonds are the speedups the simulator predicted (simulated)."
    )
    lost = [_lost_text(r, bests[r.name]) for r in runs if bests[r.name].role == "baseline"]
    if lost:
        caption += " " + " ".join(lost)
    if missing:
        caption += " Not drawn: " + "; ".join(f"{w} ({why})" for w, why in missing.items()) + "."
    stats = []
    for run in runs:
        best = bests[run.name]
        each = [f"{best_label(best)} {best.plan_hash[:8]} {median_spread_text(best.measured_s, best.spread_s)}"]
        each += [
            f"{n} {m.plan_hash[:8]} {median_spread_text(m.measured_s, m.spread_s)}"
            for n, m in sorted(run.results.baselines.items())
        ]
        stats.append(f"{run.workload}: " + "; ".join(each))
    text = describe_conditions(
        BOTH + " (diamonds simulated)",
        host="; ".join(sorted({r.host for r in runs})),
        versions=runs[0].versions,
        repeats=runs[0].results.repeats if len({r.results.repeats for r in runs}) == 1 else None,
        steps_per_repeat=runs[0].results.steps_per_repeat,
        stats=[*stats, "graphs " + ", ".join(f"{r.workload} {r.graph_hash or '?'}" for r in runs)],
    )
    return FigureRecord(
        name="speedup",
        title="Speedup of the best plan over the baselines",
        files=(png, pdf),
        sources=tuple(r.path / RESULTS_JSON for r in runs),
        caption=caption,
        basis=BOTH,
        conditions=conditions,
        conditions_text=text,
    )


def _lost_text(run: RunData, best: Measured) -> str:
    """The caption's sentence for a run whose best plan is a baseline."""
    text = (
        f"On {run.workload} a baseline was faster than every searched plan: the best plan is baseline "
        f"{best.label} (its bar over itself is 1.00×)"
    )
    searched = run.results.best_searched
    if searched is not None:
        text += (
            f"; the fastest searched plan, {searched.label} ({searched.plan_hash[:8]}), measured "
            f"{speedup_of(searched, best, best.label):.2f}× of it"
        )
    return text + "."


def _cond(m: Measured) -> dict[str, Any]:
    return {
        "label": m.label,
        "plan_hash": m.plan_hash,
        "plan": m.plan.describe(),
        "median_s": m.measured_s,
        "spread_s": None if m.spread_s is None else list(m.spread_s),
        "n_times": len(m.times_s),
        "predicted_s": m.predicted_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.speedup PATH [OUT_DIR]`: one figure for a run or a whole suite."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print("usage: python -m schedlab.reports.figures.speedup RUN_DIR|SUITE [OUT_DIR]", file=sys.stderr)
        return 2
    suite = load(args[0])
    out_dir = Path(args[1]) if len(args) == 2 else suite.root / "report"
    print(*draw(suite.runs, out_dir / "speedup").files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
