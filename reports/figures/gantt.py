"""Gantt chart of the best plan: simulated | measured, one row per worker, one step.

Both panels share the time axis (ms from the start of the step), so the lengths compare
directly. Bars are coloured by op kind (F, B, W, OPT, COMM; `style.KIND_COLOURS`); white
between bars is time no kernel ran on that worker (executor overhead, waiting).

Data: traces/best.sim.json and traces/best.exec.json (schedlab validate). The simulated
trace holds one step; of the measured steps the figure shows the *median* one (the step
whose length is the median of the trace's steps), so that one disturbed step on a busy
machine does not stand for the plan. When the two step lengths differ more than
`SHARED_AXIS_MAX_RATIO`-fold, each panel gets its own time axis (else one would be empty).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.plan import Plan
from schedlab.reports import style
from schedlab.reports.figures import BOTH, FigureRecord, FigureSkipped, main_for, run_conditions, run_conditions_text
from schedlab.reports.load import TRACE_FILES, RunData, best_label
from schedlab.trace import Trace, TraceEvent

SIM_STEP = 0
SHARED_AXIS_MAX_RATIO = 3.0
_KIND_ORDER = ("F", "B", "W", "OPT", "COMM", "OVERHEAD")
_NS_PER_MS = 1e6


def row_of(e: TraceEvent) -> tuple[str, int]:
    return (e.device, e.worker)


def row_label(row: tuple[str, int]) -> str:
    device, worker = row
    return f"{device} link {-1 - worker}" if worker < 0 else f"{device} w{worker}"


def _row_key(row: tuple[str, int]) -> tuple[str, int, int]:
    device, worker = row
    return (device, 1 if worker < 0 else 0, abs(worker))  # workers first, then links


def median_step(trace: Trace) -> int:
    """The step whose length is the median of the trace's steps (the lower one of an even count)."""
    steps = sorted({e.step for e in trace.events})
    if not steps:
        raise FigureSkipped("the measured trace has no events")
    walls = trace.meta.get("step_times_s") or []
    if len(walls) == len(steps) and steps == list(range(len(steps))):
        length = {k: float(walls[k]) for k in steps}  # the executor's own wall time per step
    else:
        length = {k: float(max(e.end_ns for e in trace.step_events(k))) for k in steps}
    ranked = sorted(steps, key=lambda k: (length[k], k))
    return ranked[(len(ranked) - 1) // 2]


def step_events(trace: Trace, step: int = SIM_STEP) -> list[TraceEvent]:
    evs = trace.step_events(step)
    if not evs:
        steps = sorted({e.step for e in trace.events})
        raise FigureSkipped(f"trace has no events of step {step} (steps: {steps[:5]})")
    return evs


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    missing = [TRACE_FILES[k] for k in ("best.sim", "best.exec") if k not in run.traces]
    if missing:
        raise FigureSkipped("; ".join(run.problems.get(m, f"{m} missing") for m in missing))
    sim, meas = run.traces["best.sim"], run.traces["best.exec"]
    step = median_step(meas)
    n_steps = len({e.step for e in meas.events})
    sim_evs, meas_evs = step_events(sim), step_events(meas, step)
    rows = sorted({row_of(e) for e in sim_evs} | {row_of(e) for e in meas_evs}, key=_row_key)
    y_of = {r: i for i, r in enumerate(rows)}
    kinds = [k for k in _KIND_ORDER if any(e.kind == k for e in (*sim_evs, *meas_evs))]
    kinds += sorted({e.kind for e in (*sim_evs, *meas_evs)} - set(kinds))
    sim_ms = max(e.end_ns for e in sim_evs) / _NS_PER_MS
    meas_ms = max(e.end_ns for e in meas_evs) / _NS_PER_MS
    times = [float(t) for t in meas.meta.get("step_times_s") or []]
    median_ms = statistics.median(times) * 1e3 if times else None
    plan, who = drawn_plan(run, meas)
    validated = next(
        (m for m in (*run.results.candidates, *run.results.baselines.values()) if m.plan_hash == plan.hash), None
    )
    plan_hashes = {str(t.meta.get("plan_hash", "")) for t in (sim, meas)} | {plan.hash}
    if run.results.best is not None:  # traces of another plan than the best one: warned below
        plan_hashes.add(run.results.best.plan_hash)
    plan_hashes.discard("")
    graph_hashes = {str(t.meta.get("graph_hash", "")) for t in (sim, meas)} | {run.graph.hash if run.graph else ""}
    graph_hashes.discard("")
    with style.paper():
        height_in = 1.3 + 0.26 * len(rows)
        fig = style.figure(style.PAGE_IN, height_in)
        shared = max(sim_ms, meas_ms) <= SHARED_AXIS_MAX_RATIO * max(min(sim_ms, meas_ms), 1e-9)
        axes = fig.subplots(1, 2, sharex=shared, sharey=True)
        for ax, evs, title in (
            (axes[0], sim_evs, f"simulated: {sim_ms:.2f} ms"),
            (axes[1], meas_evs, _measured_title(step, n_steps, meas_ms)),
        ):
            _bars(ax, evs, y_of, kinds)
            ax.set_title(title, loc="left", fontsize=8)
            ax.set_xlabel("time from step start (ms)")
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.spines["left"].set_visible(False)
            ax.tick_params(axis="y", length=0)
            ax.grid(axis="x", color=style.GREY, lw=0.3, alpha=0.5)
            ax.set_axisbelow(True)
        axes[0].set_yticks(range(len(rows)))
        axes[0].set_yticklabels([row_label(r) for r in rows])
        if shared:
            axes[0].set_xlim(0, max(sim_ms, meas_ms) * 1.02)
        else:
            axes[0].set_xlim(0, sim_ms * 1.02)
            axes[1].set_xlim(0, meas_ms * 1.02)
            for ax in axes:
                ax.set_xlabel("time from step start (ms), own scale")
        fig.suptitle(
            f"{run.workload}, {who} {plan.hash[:8]}: {plan.describe()}",
            x=0.01, y=1.0 - 0.04 / height_in, ha="left", va="top", fontsize=8.5,
        )
        handles = [
            style.patch(style.KIND_COLOURS.get(k, style.GREY), style.KIND_LABELS.get(k, k)) for k in kinds
        ]
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles),
                   handlelength=1.2, columnspacing=1.2)
        # In inches: suptitle and panel titles above, tick labels, axis label and legend below.
        fig.subplots_adjust(wspace=0.06, top=1.0 - 0.5 / height_in, bottom=0.72 / height_in)
        warn = "" if len(plan_hashes) == 1 else f" WARNING: traces and results name different plans {sorted(plan_hashes)}."
        if len(graph_hashes) > 1:
            warn += f" WARNING: traces and graph.json name different graphs {sorted(graph_hashes)}."
        png, pdf = style.save(
            fig,
            out_stem,
            note=f"{_footnote(run, meas, len(times), plan)} Left panel simulated.{warn}",
        )
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "plan_hash": plan.hash,
        "plan": plan.describe(),
        "plan_is": who,
        "validation_median_s": None if validated is None else validated.measured_s,
        "trace_plan_hashes": {"sim": sim.meta.get("plan_hash"), "exec": meas.meta.get("plan_hash")},
        "trace_graph_hashes": {"sim": sim.meta.get("graph_hash"), "exec": meas.meta.get("graph_hash")},
        "step": step,
        "steps_in_trace": n_steps,
        "shared_time_axis": shared,
        "simulated_step_ms": round(sim_ms, 4),
        "measured_step_ms": round(meas_ms, 4),
        "measured_steps": len(times),
        "measured_median_ms": None if median_ms is None else round(median_ms, 4),
        "measured_spread_ms": _iqr_ms(times),
        "rows": [row_label(r) for r in rows],
        "events": {"sim": len(sim_evs), "exec": len(meas_evs)},
    }
    return FigureRecord(
        name="gantt",
        title=f"Best plan, simulated and measured: {run.workload}",
        files=(png, pdf),
        sources=(run.path / TRACE_FILES["best.sim"], run.path / TRACE_FILES["best.exec"]),
        caption=(
            f"One training step of the {who}, {plan.describe()}, simulated (left) and measured on the "
            f"executor (right; step {step}, the median of the {n_steps} steps in the trace), one row per worker, "
            f"coloured by op kind"
            + ("" if shared else "; the panels have their own time scales, the step lengths differ "
               f"{max(sim_ms, meas_ms) / max(min(sim_ms, meas_ms), 1e-9):.1f}-fold")
            + ". Simulated "
            f"{sim_ms:.2f} ms; measured {meas_ms:.2f} ms"
            + ("" if median_ms is None else f" (median of the trace's {len(times)} steps {median_ms:.2f} ms)")
            + ("" if validated is None else
               f"; validation measured this plan at a median of {validated.measured_s * 1e3:.2f} ms over "
               f"{len(validated.times_s) or '?'} steps")
            + "."
        ),
        basis=BOTH,
        conditions=conditions,
        conditions_text=run_conditions_text(
            run,
            BOTH + " (left panel simulated)",
            plan_hashes=sorted(plan_hashes),
            stats=[f"simulated {sim_ms:.3f} ms", f"measured step {step} of {n_steps} {meas_ms:.3f} ms"]
            + ([] if median_ms is None else [f"median of {len(times)} steps {median_ms:.3f} ms" + (
                "" if conditions["measured_spread_ms"] is None
                else " (IQR {:.3f}–{:.3f} ms)".format(*conditions["measured_spread_ms"]))]),
        ),
        run=run.name,
    )


def drawn_plan(run: RunData, meas: Trace) -> tuple[Plan, str]:
    """The plan the traces are of (the measured trace says), and what it is, in the words
    the speedup figure uses for the run's best plan (`load.best_plan`): "best plan", "best
    plan (= baseline NAME)", or "traced plan, not the best ..." when the traces disagree
    with results.json (the figure then also warns)."""
    best = run.results.best
    plan: Plan | None = None
    raw = meas.meta.get("plan")
    if raw:
        try:
            plan = Plan.from_json(raw)
        except SchedlabError:
            plan = None
    if plan is None:
        if best is None:
            raise FigureSkipped("the trace names no plan and results.json names no best plan")
        plan = best.plan
    if best is None:
        return plan, "traced plan (results.json names no best plan)"
    if best.plan_hash == plan.hash:
        return plan, best_label(best)
    return plan, f"traced plan, not the {best_label(best)} {best.plan_hash[:8]}"


def _bars(ax: Any, evs: list[TraceEvent], y_of: dict[tuple[str, int], int], kinds: list[str]) -> None:
    for kind in kinds:
        by_row: dict[int, list[tuple[float, float]]] = {}
        for e in evs:
            if e.kind == kind:
                by_row.setdefault(y_of[row_of(e)], []).append(
                    (e.start_ns / _NS_PER_MS, max(e.dur_ns, 1) / _NS_PER_MS)
                )
        for y, spans in by_row.items():
            ax.broken_barh(spans, (y - 0.38, 0.76), facecolors=style.KIND_COLOURS.get(kind, style.GREY), lw=0)


def _measured_title(step: int, n_steps: int, step_ms: float) -> str:
    return f"measured: {step_ms:.2f} ms (step {step}, the median of {n_steps})"


def _iqr_ms(times: list[float]) -> list[float] | None:
    if len(times) < 2:
        return None
    q = statistics.quantiles(times, n=4, method="inclusive")
    return [round(q[0] * 1e3, 4), round(q[2] * 1e3, 4)]


def _footnote(run: RunData, meas: Trace, n: int, plan: Plan) -> str:
    versions = meas.meta.get("versions") or run.versions
    torch = versions.get("torch", "?") if isinstance(versions, dict) else "?"
    return (
        f"Measured on {run.host}, torch {torch}, {n} timed steps; graph {run.graph_hash or '?'}, "
        f"plan {plan.hash}."
    )


if __name__ == "__main__":
    sys.exit(main_for(draw, "gantt"))
