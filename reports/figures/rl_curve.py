"""The RL placer's training curve: step time per policy-gradient iteration, and entropy.

Black step line: the best step time found so far; coloured line: the mean step time of the
iteration's feasible samples (gaps where none fit memory); dashed, on the right axis: the
entropy of the placement policy, which falls as it commits to a placement. A dotted grey
line is the best baseline of the same basis as the reward. The step times are simulated or
measured as the RL reward was (rl/curve.json "reward"), and the figure says which.

Data: rl/curve.json (`schedlab search --space placement --strategy rl`), run.json, and
search.json or results.json for the baseline line.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.reports import style
from schedlab.reports.figures import (
    MEASURED,
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
    RlCurve,
    load_rl_curve,
    machine_label,
    require_placement_run,
    searched_machine,
)

NAME = "rl_curve"
_MS = 1e3
_MEAN = style.colour(0)
_ENTROPY = style.colour(1)


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    try:
        require_placement_run(run)
        curve = load_rl_curve(run.path)
        machine = searched_machine(run)
    except PlacementDataError as e:
        raise FigureSkipped(str(e)) from None
    pts = curve.points
    iters = [p.iteration for p in pts]
    best = best_so_far_ms(curve)
    mean = [math.nan if p.mean_step_time_s is None else p.mean_step_time_s * _MS for p in pts]
    entropy = [p.entropy for p in pts]
    basis = SIMULATED if curve.reward == "simulated" else MEASURED
    base_name, base_s, base_source = _best_baseline(run, curve)
    mlabel = machine_label(machine)
    where = f"simulated for {mlabel}" if basis == SIMULATED else f"measured on {run.host}"
    with style.paper():
        fig = style.figure(style.PAGE_IN * 0.62, 2.6)
        ax = fig.add_subplot()
        ax.plot(iters, mean, color=_MEAN, lw=0.9, marker="o", ms=1.8, mew=0, label="mean of feasible samples")
        ax.step(iters, best, where="post", color=style.INK, lw=1.3, label="best so far")
        if base_s is not None:
            ax.axhline(base_s * _MS, color=style.GREY, lw=0.8, ls=(0, (1, 1.5)), zorder=0,
                       label=f"best baseline: {base_name}")
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"step time (ms, {basis})")
        ax.set_xlim(min(iters) - 0.5, max(iters) + 0.5)
        ax2 = ax.twinx()
        ax2.spines["right"].set_visible(True)
        ax2.plot(iters, entropy, color=_ENTROPY, lw=0.9, ls=(0, (4, 1.5)), label="policy entropy (right)")
        ax2.set_ylabel("policy entropy (nats per decision)", color=_ENTROPY)
        ax2.tick_params(axis="y", colors=_ENTROPY)
        ax2.set_ylim(0, max(max(entropy), 1e-9) * 1.08)
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, handlelength=1.8)
        ax.set_title(f"RL placement on {mlabel} ({curve.reward} reward)", loc="left")
        png, pdf = style.save(
            fig, out_stem,
            note=f"Step times {where} ({curve.reward} reward); {_config_text(curve)}; graph {run.graph_hash or '?'}.",
        )
    feasible = [p.feasible_share for p in pts]
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "reward": curve.reward,
        "simulated": basis == SIMULATED,
        "machine_simulated": machine.name,
        "config": curve.config,
        "iterations": len(pts),
        "best_step_time_s": curve.best_step_time_s,
        "best_so_far_last_s": None if math.isnan(best[-1]) else best[-1] / _MS,
        "evaluations": curve.evaluations,
        "first_mean_step_time_s": next((p.mean_step_time_s for p in pts if p.mean_step_time_s is not None), None),
        "entropy_first": entropy[0],
        "entropy_last": entropy[-1],
        "feasible_share_min": min(feasible),
        "feasible_share_last": feasible[-1],
        "wall_s": pts[-1].wall_s,
        "baseline": None if base_s is None else {"name": base_name, "step_time_s": base_s},
    }
    sources = [curve.path, run.path / RUN_JSON] + ([run.path / base_source] if base_source else [])
    return FigureRecord(
        name=NAME,
        title=f"RL placer training ({curve.reward} reward): {run.workload}",
        files=(png, pdf),
        sources=tuple(sources),
        caption=(
            f"Per policy-gradient iteration ({len(pts)} iterations, {_config_text(curve)}): the best step time so "
            f"far and the mean over the iteration's feasible samples (ms, {where}), and the policy's entropy "
            f"(right axis). Reward: {curve.reward} step time. {_best_text(curve).capitalize()}"
            + ("." if base_s is None else f"; best baseline ({base_name}) {base_s * _MS:.3f} ms.")
        ),
        basis=basis,
        conditions=conditions,
        conditions_text=describe_conditions(
            basis,
            host=f"{mlabel} (simulated)" if basis == SIMULATED else run.host,
            versions=run.versions,
            graph_hash=run.graph_hash or None,
            stats=[f"{curve.reward} reward", f"{len(pts)} iterations", _config_text(curve),
                   _best_text(curve)],
        ),
        run=run.name,
    )


def best_so_far_ms(curve: RlCurve) -> list[float]:
    """The best step time up to each iteration (ms); NaN before the first feasible placement."""
    out: list[float] = []
    best = math.inf
    for p in curve.points:
        if p.best_step_time_s is not None:
            best = min(best, p.best_step_time_s * _MS)
        out.append(best if math.isfinite(best) else math.nan)
    return out


def _best_baseline(run: RunData, curve: RlCurve) -> tuple[str, float | None, str]:
    """The fastest baseline in the reward's basis: (name, step time s or None, its file)."""
    if curve.reward == "simulated":
        bases, source = baseline_lines(run), SEARCH_JSON if run.search else RESULTS_JSON
    else:
        bases, source = {n: m.measured_s for n, m in run.results.baselines.items()}, RESULTS_JSON
    if not bases:
        return "", None, ""
    name = min(bases, key=lambda n: bases[n])
    return name, bases[name], source


def _best_text(curve: RlCurve) -> str:
    if curve.best_step_time_s is None:
        return "no feasible placement found"
    return f"best found {curve.best_step_time_s * _MS:.3f} ms"


def _config_text(curve: RlCurve) -> str:
    c = curve.config
    keys = (("groups", "groups"), ("samples", "samples/iteration"), ("lr", "lr"), ("entropy", "entropy weight"),
            ("seed", "seed"))
    return ", ".join(f"{label} {c[k]}" for k, label in keys if c.get(k) is not None) or "config not recorded"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.rl_curve RUN_DIR [OUT_DIR]`: redraw this figure from a stored run."""
    return main_for(draw, NAME, argv)


if __name__ == "__main__":
    sys.exit(main())
