"""The placement strategies side by side: how fast a placement each found, at what search cost.

Left: per strategy, the simulated step time of its best placement (bar, ms); where
`schedlab validate` measured that strategy's plans, the measured median of the one it
ranked first beside it, with the interquartile range as whiskers. Horizontal lines are the
baselines (the one-device plans among them): dashed, simulated; dotted, measured. Right:
each strategy's search wall time (log scale, s), with its trial count.

The simulated times are for the machine the placement was searched on (run.json); the
measured ones for the host validate ran on.

Data: run.json, search.json (strategies, best, baselines), results.json.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, NullFormatter

from schedlab.reports import style
from schedlab.reports.figures import (
    BOTH,
    SIMULATED,
    FigureRecord,
    FigureSkipped,
    describe_conditions,
    main_for,
    run_conditions,
)
from schedlab.reports.figures.history import baseline_lines
from schedlab.reports.load import RESULTS_JSON, RUN_JSON, SEARCH_JSON, RunData
from schedlab.reports.load_placement import (
    PlacementDataError,
    StrategyResult,
    machine_label,
    require_placement_run,
    searched_machine,
    strategy_results,
)

NAME = "placement_strategies"
_MS = 1e3
_DASHES = ((0, (4, 1.5)), (0, (4, 1.5, 1, 1.5)), (0, (6, 2)), (0, (2, 1)))
_PREDICTED = style.colour(0)
_MEASURED = style.colour(1)
_WALL = style.colour(2)
_MIN_WALL_S = 1e-3  # a log axis cannot show 0 s: shorter searches are drawn at 1 ms


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    try:
        require_placement_run(run)
        machine = searched_machine(run)
        strategies = strategy_results(run)
    except PlacementDataError as e:
        raise FigureSkipped(str(e)) from None
    predicted_bases = baseline_lines(run)
    measured_bases = {n: m.measured_s for n, m in sorted(run.results.baselines.items())}
    n_measured = sum(s.measured is not None for s in strategies)
    basis = BOTH if n_measured or measured_bases else SIMULATED
    mlabel = machine_label(machine)
    x = list(range(len(strategies)))
    width = 0.38
    with style.paper():
        fig = style.figure(style.PAGE_IN, 2.9)
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1.0], "wspace": 0.32})
        preds = [s.best_predicted_s * _MS for s in strategies]
        offset = width / 2 if n_measured else 0.0
        bars = left.bar([i - offset for i in x], preds, width, color=_PREDICTED, label="best predicted (simulated)",
                        zorder=2)
        left.bar_label(bars, labels=[style.fmt_number(v) for v in preds], fontsize=5.5, padding=1.5)
        _measured_bars(left, strategies, x, offset, width)
        for i, (name, v) in enumerate(sorted(predicted_bases.items())):
            left.axhline(v * _MS, color=style.GREY, lw=0.8, ls=_DASHES[i % len(_DASHES)], zorder=1,
                         label=f"baseline {name} (simulated)")
        for i, (name, v) in enumerate(measured_bases.items()):
            left.axhline(v * _MS, color=_MEASURED, lw=0.7, ls=(0, (1, 1.2 + 0.6 * i)), alpha=0.8, zorder=1,
                         label=f"baseline {name} (measured)")
        left.set_xticks(x, [s.name for s in strategies])
        left.set_ylabel("step time (ms)")
        left.set_ylim(0, None)
        left.set_title("best placement per strategy", loc="left")
        handles, labels = left.get_legend_handles_labels()
        bars_first = sorted(range(len(labels)), key=lambda i: "baseline" in labels[i])  # stable: bars, then lines
        left.legend([handles[i] for i in bars_first], [labels[i] for i in bars_first], loc="upper left",
                    bbox_to_anchor=(0.0, -0.12), ncol=2, handlelength=2.2, columnspacing=1.0)

        _wall_bars(right, strategies, x)
        right.set_xticks(x, [s.name for s in strategies], rotation=45, ha="right", rotation_mode="anchor")
        right.set_ylabel("search wall time (s, log)")
        right.set_title("search cost", loc="left")
        fig.suptitle(f"Placement strategies, {run.workload} on {mlabel}: predictions simulated", x=0.02, ha="left")
        note = f"Predicted step times simulated for {mlabel}."
        if basis == BOTH:
            note += f" Measured on {run.host}, median and IQR of {_repeats_text(run)}."
        png, pdf = style.save(fig, out_stem, note=note + f" Graph {run.graph_hash or '?'}.")
    best = min(strategies, key=lambda s: s.best_predicted_s)
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "simulated": True,
        "machine_simulated": machine.name,
        "devices": [d.id for d in machine.devices],
        "strategies": {s.name: _strategy_json(s) for s in strategies},
        "best_strategy": best.name,
        "baselines_simulated_s": predicted_bases,
        "baselines_measured_s": measured_bases,
    }
    sources = [run.path / RUN_JSON, run.path / SEARCH_JSON] + ([run.path / RESULTS_JSON] if basis == BOTH else [])
    missing = [s.name for s in strategies if s.measured is None]
    return FigureRecord(
        name=NAME,
        title=f"Placement strategies: {run.workload} on {machine.name}",
        files=(png, pdf),
        sources=tuple(sources),
        caption=(
            f"Simulated step time of the best placement each of the {len(strategies)} strategies found on "
            f"{mlabel} (bars) and its search wall time (right, log scale); lines: the baselines. "
            + (f"Beside a prediction: the measured median (whiskers: IQR) of that strategy's first-ranked "
               f"validated plan{'' if not missing else '; not measured: ' + ', '.join(missing)}. "
               if n_measured else "No strategy's plan was measured (run `schedlab validate`). ")
            + f"Fastest predicted: {best.name}, {best.best_predicted_s * _MS:.3f} ms (simulated)."
        ),
        basis=basis,
        conditions=conditions,
        conditions_text=describe_conditions(
            basis if basis == SIMULATED else BOTH + " (bars simulated)",
            host=f"{mlabel} (simulated)" + (f"; measured on {run.host}" if basis == BOTH else ""),
            versions=run.versions,
            graph_hash=run.graph_hash or None,
            plan_hashes=[s.best.plan.hash for s in strategies if s.best is not None],
            repeats=run.results.repeats if basis == BOTH else None,
            steps_per_repeat=run.results.steps_per_repeat if basis == BOTH else None,
            stats=[f"{len(strategies)} strategies", f"best {best.name} {best.best_predicted_s * _MS:.3f} ms simulated"],
        ),
        run=run.name,
    )


def _wall_bars(ax: Any, strategies: tuple[StrategyResult, ...], x: list[int]) -> None:
    """Search wall time per strategy (log scale), its trial count on top; "n/a" where not recorded."""
    timed = [(i, s) for i, s in zip(x, strategies, strict=True) if s.wall_s is not None]
    walls = [max(s.wall_s or 0.0, _MIN_WALL_S) for _, s in timed]
    ax.set_yscale("log")
    if timed:
        bars = ax.bar([i for i, _ in timed], walls, 0.6, color=_WALL, zorder=2)
        ax.bar_label(bars, labels=[f"{s.trials} tr." for _, s in timed], fontsize=5.5, padding=1.5)
        lo, hi = min(walls) / 2.5, max(walls) * 4.0
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(FixedLocator(style.log_ticks(lo, hi)))
        ax.yaxis.set_major_formatter(style.fmt_tick_formatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    for i, s in zip(x, strategies, strict=True):
        if s.wall_s is None:  # at the foot of the axis, in axes coordinates vertically
            ax.text(i, 0.02, f"n/a\n{s.trials} tr.", transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=5.5, color=style.GREY)


def _measured_bars(ax: Any, strategies: tuple[StrategyResult, ...], x: list[int], offset: float, width: float) -> None:
    xs, ys, lo, hi = [], [], [], []
    for i, s in zip(x, strategies, strict=True):
        m = s.measured
        if m is None:
            continue
        xs.append(i + offset)
        ys.append(m.measured_s * _MS)
        p25, p75 = m.spread_s if m.spread_s else (m.measured_s, m.measured_s)
        lo.append(max(m.measured_s - p25, 0.0) * _MS)
        hi.append(max(p75 - m.measured_s, 0.0) * _MS)
    if xs:
        ax.bar(xs, ys, width, color=_MEASURED, label="measured (median, IQR)", zorder=2)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=style.INK, elinewidth=0.6, capsize=1.5, zorder=3)


def _strategy_json(s: StrategyResult) -> dict[str, Any]:
    m = s.measured
    return {
        "best_predicted_s": s.best_predicted_s,
        "trials": s.trials,
        "wall_s": s.wall_s,
        "best_plan_hash": None if s.best is None else s.best.plan.hash,
        "best_trial": None if s.best is None else s.best.trial,
        "measured": None if m is None else {
            "label": m.label,
            "trial": m.trial,
            "plan_hash": m.plan_hash,
            "predicted_s": m.predicted_s,
            "median_s": m.measured_s,
            "spread_s": None if m.spread_s is None else list(m.spread_s),
        },
    }


def _repeats_text(run: RunData) -> str:
    res = run.results
    text = f"{res.repeats} repeats" if res.repeats else "the repeats"
    return text + (f" × {res.steps_per_repeat} steps" if res.steps_per_repeat else "")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.placement_compare RUN_DIR [OUT_DIR]`: redraw this figure from a stored run."""
    return main_for(draw, NAME, argv)


if __name__ == "__main__":
    sys.exit(main())
