"""The optimisation history: simulated step time of every trial and the running best.

Dots are trials (objective: simulated step time), coloured by the strategy that proposed
them; a step line of the same colour is that strategy's running best, and the black line
the running best of the whole search. Dotted grey lines are the baselines' simulated step
times (search.json); the star marks the trial of the best validated plan.

Data: study.db (the Optuna study named in run.json, opened read-only), search.json.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from schedlab.reports import style
from schedlab.reports.figures import (
    SIMULATED,
    FigureRecord,
    FigureSkipped,
    describe_conditions,
    main_for,
    run_conditions,
)
from schedlab.reports.load import RUN_JSON, SEARCH_JSON, STUDY_DB, RunData, TrialPoint, host_text, readonly_storage_url


def running_best(values: list[float]) -> list[float]:
    out: list[float] = []
    for v in values:
        out.append(v if not out else min(out[-1], v))
    return out


def baseline_lines(run: RunData) -> dict[str, float]:
    """Baseline name -> simulated step time (s), from search.json (else results.json)."""
    out: dict[str, float] = {}
    base = (run.search or {}).get("baselines")
    if isinstance(base, dict):
        for name, b in base.items():
            v = b.get("predicted_step_time_s") if isinstance(b, dict) else None
            if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
                out[str(name)] = float(v)
    if not out:
        out = {n: m.predicted_s for n, m in run.results.baselines.items() if m.predicted_s is not None}
    return out


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    hist = run.history
    if hist is None:
        raise FigureSkipped(run.problems.get(STUDY_DB, "no study"))
    if not hist.trials:
        raise FigureSkipped(f"study {hist.study_name!r} has no completed trial with a finite value")
    trials = list(hist.trials)
    strategies = sorted({t.strategy for t in trials})
    ms = 1e3
    bases = baseline_lines(run)
    best_searched = run.results.best_searched
    best_trial = best_searched.trial if best_searched is not None else None
    values = [t.value_s * ms for t in trials] + [v * ms for v in bases.values()]
    with style.paper():
        fig = style.figure(style.PAGE_IN * 0.72, 2.6)
        ax = fig.add_subplot()
        if max(values) / min(values) > 8:
            ax.set_yscale("log")
        for si, strat in enumerate(strategies):
            pts = [t for t in trials if t.strategy == strat]
            c = style.colour(si)
            ax.plot([t.number for t in pts], [t.value_s * ms for t in pts], ls="none", marker="o", ms=2.6,
                    color=c, alpha=0.55, mew=0, label=f"{strat} ({len(pts)} trials)")
            _step(ax, pts, ms, color=c, lw=0.9, alpha=0.9)
        _step(ax, trials, ms, color=style.INK, lw=1.3, label="running best (all)")
        x_end = max(t.number for t in trials)
        dashes = ((0, (1, 1.5)), (0, (4, 1.5)), (0, (4, 1.5, 1, 1.5)), (0, (6, 2)))
        for i, (name, v) in enumerate(sorted(bases.items())):
            ax.axhline(v * ms, color=style.GREY, lw=0.8, ls=dashes[i % len(dashes)], zorder=0,
                       label=f"baseline {name}")
        marked = [t for t in trials if best_trial is not None and t.number == best_trial]
        if marked:
            ax.plot([marked[0].number], [marked[0].value_s * ms], marker="*", ms=9, color=style.colour(3),
                    mec=style.INK, mew=0.5, ls="none", label=f"best validated plan (trial {best_trial})", zorder=4)
        ax.set_xlabel("trial")
        ax.set_ylabel("simulated step time (ms)")
        ax.set_xlim(-0.5, x_end + 0.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), handlelength=1.4, borderaxespad=0)
        other = f"; {hist.n_other} failed/pruned trials not shown" if hist.n_other else ""
        png, pdf = style.save(
            fig,
            out_stem,
            note=f"Simulated (objective of the search) for machine {_machine_text(run)}; study {hist.study_name!r}, "
            f"{len(trials)} trials{other}; graph {run.graph_hash or '?'}.",
        )
    best_so_far = running_best([t.value_s for t in trials])
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "simulated": True,
        "machine_simulated": _machine_name(run),
        "study": hist.study_name,
        "storage": hist.storage,
        "trials": len(trials),
        "trials_not_shown": hist.n_other,
        "strategies": {
            s: {"trials": sum(t.strategy == s for t in trials),
                "best_s": min(t.value_s for t in trials if t.strategy == s)}
            for s in strategies
        },
        "best_s": best_so_far[-1],
        "best_trial": min(trials, key=lambda t: (t.value_s, t.number)).number,
        "baselines_simulated_s": bases,
        "validated_best_trial": best_trial,
    }
    _, db = readonly_storage_url(hist.storage, run.path)
    sources = [run.path / RUN_JSON] + ([db] if db else []) + ([run.path / SEARCH_JSON] if run.search else [])
    return FigureRecord(
        name="history",
        title=f"Optimisation history: {run.workload}",
        files=(png, pdf),
        sources=tuple(sources),
        caption=(
            f"Simulated step time of each of the {len(trials)} search trials (dots, by strategy) and the running "
            f"best (lines); grey lines: the baselines' simulated step times. All values simulated."
        ),
        basis=SIMULATED,
        conditions=conditions,
        conditions_text=describe_conditions(
            SIMULATED,
            host=f"{_machine_text(run)} (simulated)",
            versions=run.versions,
            graph_hash=run.graph_hash or None,
            stats=[
                f"study {hist.study_name!r}, {len(trials)} trials" + (f" ({hist.n_other} not shown)" if hist.n_other else ""),
                f"best simulated {best_so_far[-1] * 1e3:.3f} ms",
            ],
        ),
        run=run.name,
    )


def _step(ax: Any, pts: list[TrialPoint], ms: float, **kw: Any) -> None:
    xs = [t.number for t in pts]
    ys = running_best([t.value_s * ms for t in pts])
    ax.step(xs, ys, where="post", **kw)


def _machine_text(run: RunData) -> str:
    """The machine the search simulated, as run.json describes it."""
    m = run.run.get("machine")
    return host_text(m) if isinstance(m, dict) else str(m or "?")


def _machine_name(run: RunData) -> str:
    m = run.run.get("machine")
    if isinstance(m, dict):
        return str(m.get("name") or "?")
    return str(m or "?")


if __name__ == "__main__":
    sys.exit(main_for(draw, "history"))
