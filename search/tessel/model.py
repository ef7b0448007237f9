"""Tessel's search on a model: a pipeline plan whose schedule is a searched repetend.

A model cut into P contiguous stages, one per device, is Tessel's V shape (a chain; the
backward runs the chain in reverse), with each stage's own times: the sums of the cost
model's single-thread op times over the stage's forward (F), input-gradient (I) and
weight-gradient (W) parts (`schedlab.pipeline_stages.split_stages`; optimizer ops run
once per step, outside the schedule). Tessel's search (`search_tessel`) finds the
repetend of that shape (its blocks are each stage's forward and whole backward, B = I +
W) and completes it with a warm-up and a cool-down into each device's action list; the
plan carries those lists as its schedule rows, so the plan file is self-contained and
both backends run it like any written schedule.

The memory limit is in stage activations per device: `memory_factor` times P, what 1F1B
holds on its first device (1 by default: 1F1B's memory; None: no limit, the plan's real
bytes still checked against each device's memory when it is resolved). Times are scaled
so that the largest per-device work is 1 before the solver sees them (its tolerances are
absolute). The stage times are those of the graph the caller gives: a search weighs every
micro-batch count by the full step's, whose shares a micro-batch keeps but for each op's
fixed dispatch cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.order import OpCostUs, rough_cost_us
from schedlab.pipeline.shape import PipeShape, Stage
from schedlab.pipeline_stages import Part, split_stages
from schedlab.plan import Plan, PlanError
from schedlab.search.tessel.search import DEFAULT_SOLVER, TesselResult, search_tessel

TESSEL = "tessel"
DEFAULT_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class StageTimes:
    """One stage's work for the graph's batch, µs at one intra-op thread."""

    f_us: float
    i_us: float
    w_us: float


def stage_times_us(
    graph: Graph, stages: int | Sequence[int], op_cost_us: OpCostUs | None = None
) -> tuple[StageTimes, ...]:
    """Each stage's F, I and W time: the graph's ops split as a pipeline plan splits them,
    each timed by `op_cost_us` at one thread (None: the FLOP/byte roofline)."""
    split = split_stages(graph, stages if isinstance(stages, int) else tuple(stages))
    sums = [[0.0, 0.0, 0.0] for _ in range(split.n_stages)]
    column = {Part.F: 0, Part.I: 1, Part.W: 2}
    for op, s, part in zip(graph.ops, split.stage, split.part, strict=True):
        k = column.get(part)
        if k is not None:
            sums[s][k] += rough_cost_us(op) if op_cost_us is None else op_cost_us(op, 1)
    return tuple(StageTimes(f, i, w) for f, i, w in sums)


def model_shape(times: Sequence[StageTimes], name: str = "") -> PipeShape:
    """The V shape of `times`, stage s on device s, each stage's times scaled so that the
    largest per-device work is 1 (one activation unit per stage and micro-batch)."""
    if not times:
        raise SchedlabError("a pipeline needs at least one stage")
    largest = max(t.f_us + t.i_us + t.w_us for t in times)
    if largest <= 0:
        raise SchedlabError("every stage costs nothing: there is no schedule to search")
    P = len(times)
    stages = tuple(
        Stage(
            devices=(s,),
            next=(s + 1,) if s + 1 < P else (),
            f_time=t.f_us / largest,
            i_time=t.i_us / largest,
            w_time=t.w_us / largest,
            b_time=(t.i_us + t.w_us) / largest,
            name=f"stage {s}",
        )
        for s, t in enumerate(times)
    )
    return PipeShape(stages, P, name=name or f"{P}-stage chain")


def search_model_schedule(
    times: Sequence[StageTimes],
    micro_batches: int,
    *,
    memory_factor: float | None = 1.0,
    solver: str = DEFAULT_SOLVER,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> TesselResult:
    """Tessel's schedule for stages of `times` on as many devices, `micro_batches` of them,
    under `memory_factor` times 1F1B's activations per device (None: no limit)."""
    shape = model_shape(times)
    limit = None if memory_factor is None else memory_factor * shape.n_devices
    return search_tessel(shape, micro_batches, memory_limit=limit, solver=solver, time_limit_s=time_limit_s)


def with_tessel_schedule(
    plan: Plan,
    devices: tuple[str, ...],
    graph: Graph,
    micro_batches: int,
    stages: int | tuple[int, ...] | None = None,
    op_cost_us: OpCostUs | None = None,
    *,
    memory_factor: float | None = 1.0,
    solver: str = DEFAULT_SOLVER,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> tuple[Plan, TesselResult]:
    """`plan` as a pipeline over `devices` (one stage each, `stages` as a count or cut
    points; default one per device) under Tessel's searched schedule for `graph`'s stage
    times, and the search's result. A stage count other than the devices' is refused."""
    n_stages = len(devices) if stages is None else (len(stages) + 1 if isinstance(stages, tuple) else stages)
    if n_stages != len(devices):
        raise PlanError(
            "stages", f"Tessel's search here runs one stage per device: {len(devices)} stages, not {n_stages}"
        )
    try:
        times = stage_times_us(graph, stages if stages is not None else n_stages, op_cost_us)
        result = search_model_schedule(
            times, micro_batches, memory_factor=memory_factor, solver=solver, time_limit_s=time_limit_s
        )
    except PlanError:
        raise
    except SchedlabError as e:
        raise PlanError("schedule", f"Tessel's search: {e}") from None
    rows = tuple(tuple(row) for row in result.schedule.to_rows())
    out = replace(
        plan,
        micro_batches=micro_batches,
        stages=stages if isinstance(stages, tuple) else n_stages,
        stage_map="loop",
        schedule=rows,
        pipeline_devices=devices if len(devices) > 1 else (),
    )
    return out, result
