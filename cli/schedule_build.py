"""What `schedlab schedule` times: the schedule its flags name, on the placement they name,
checked, timed, and with its steady-state time per micro-batch.

Four sources of a schedule:
- a generator name (gpipe, 1f1b, interleaved:V, ...): on `--placement vshape` the chain
  `generators.default_shape` builds for it (interleaved:2 gets 2P stages on the loop map,
  zbv 2P on the v map), on a placement FILE that file's stages;
- ``tessel``: Tessel's search on the placement;
- ``torch:CLASS``: the order torch.distributed.pipelining's schedule class builds;
- a CSV file as torch writes it (one row per rank).

Times (--f, --b, --w; I = B - W) mean one block's: for vshape, one device's share of one
micro-batch, split evenly among the stages a schedule puts on each device (so every
schedule on vshape does the same work and makespans compare as they stand); for the other
Tessel shapes, each V stage's, and each sharded block's too.

Steady state per micro-batch, `steady_state_method`:
- ``marginal`` (generated and Tessel schedules): the same generator (for Tessel, the same
  repetend, completed again) at M + k micro-batches, k the smallest step it accepts
  (interleaved needs M a multiple of P), and (makespan(M + k) - makespan(M)) / k: what
  one more micro-batch costs once the pipeline is full;
- ``completion_spacing`` (imported schedules, which cannot be regenerated at another M,
  or a generator that accepts no larger M nearby): the mean time between micro-batch
  completions over the middle half of the run (`Timeline.completion_spacing`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.cli.pipeline_placement import BlockTimes, load_placement
from schedlab.errors import SchedlabError
from schedlab.pipeline import PipeShape, Schedule, Timeline, check_schedule, infer_chain, time_schedule
from schedlab.pipeline.generators import default_shape, generate, schedule_names
from schedlab.pipeline.tessel_shapes import SHAPES, tessel_shape

TESSEL = "tessel"
TORCH_PREFIX = "torch:"
CHAIN_PLACEMENT = "vshape"  # the Tessel shape that is a plain chain
MARGINAL = "marginal"
COMPLETION_SPACING = "completion_spacing"


@dataclass(frozen=True)
class ScheduleRequest:
    """The command line's choices, as plain values."""

    placement: str
    schedule: str
    n_devices: int | None
    n_microbatches: int | None
    times: BlockTimes
    memory_limit: float | None = None
    solver: str = "highs"
    time_limit_s: float = 60.0


@dataclass(frozen=True)
class BuiltSchedule:
    """A checked schedule, its timeline, and its steady state per micro-batch."""

    request: ScheduleRequest
    schedule: Schedule
    timeline: Timeline
    source: str  # "generator", "tessel", "torch" or "csv"
    steady_state_per_microbatch: float
    steady_state_method: str  # MARGINAL or COMPLETION_SPACING
    steady_state_step: int | None  # k of the marginal; None for completion spacing
    tessel: Any = None  # schedlab.search.tessel.TesselResult for a Tessel search


def build_schedule(req: ScheduleRequest) -> BuiltSchedule:
    """Resolve, check (`check_schedule`, with the memory limit) and time the request."""
    if req.memory_limit is not None and req.memory_limit <= 0:
        raise SchedlabError(f"--memory must be positive, not {req.memory_limit:g}")
    name = req.schedule.strip()
    if name == TESSEL:
        return _tessel(req)
    if name.startswith(TORCH_PREFIX):
        return _torch(req, name.removeprefix(TORCH_PREFIX))
    if name.partition(":")[0] in {n.partition(":")[0] for n in schedule_names()}:
        return _generated(req, name)
    if name.lower().endswith(".csv") or Path(name).is_file():
        return _csv(req, Path(name))
    raise SchedlabError(
        f"unknown schedule {name!r}: give a generator ({', '.join(schedule_names())}), {TESSEL}, "
        f"{TORCH_PREFIX}CLASS (torch's schedule classes, e.g. torch:1F1B) or a CSV file"
    )


def _need(value: int | None, flag: str, what: str) -> int:
    if value is None:
        raise SchedlabError(f"{what} needs {flag}")
    if value < 1:
        raise SchedlabError(f"{flag} must be at least 1, not {value}")
    return value


def _is_file_placement(placement: str) -> bool:
    return placement not in SHAPES


def _file_shape(req: ScheduleRequest) -> PipeShape:
    """The placement FILE's shape, its device count checked against --devices."""
    if not Path(req.placement).is_file():
        raise SchedlabError(
            f"unknown placement {req.placement!r}: give a Tessel shape ({', '.join(SHAPES)}) or a placement "
            f"JSON file (no file {req.placement} here)"
        )
    shape = load_placement(req.placement, req.times)
    if req.n_devices is not None and req.n_devices != shape.n_devices:
        raise SchedlabError(
            f"placement file {req.placement} is for {shape.n_devices} devices, not --devices {req.n_devices}"
        )
    return shape


def _tessel_placement(req: ScheduleRequest, n_devices: int) -> PipeShape:
    """A Tessel shape by name with the request's times; W is the share W/B of every
    block's backward (the shape splits each backward in half otherwise)."""
    shape = tessel_shape(req.placement, n_devices, f_time=req.times.f, b_time=req.times.b)
    share = req.times.w / req.times.b
    stages = tuple(
        dataclasses.replace(st, w_time=st.b_time * share, i_time=st.b_time * (1 - share)) for st in shape.stages
    )
    return dataclasses.replace(shape, stages=stages)


def _generated(req: ScheduleRequest, name: str) -> BuiltSchedule:
    m = _need(req.n_microbatches, "--micro-batches M", f"schedule {name!r}")
    if _is_file_placement(req.placement):
        shape = _file_shape(req)
    elif req.placement == CHAIN_PLACEMENT:
        p = _need(req.n_devices, "--devices P", f"schedule {name!r}")
        t = req.times
        shape = default_shape(name, p, f_time=t.f, b_time=t.b, i_time=t.i, w_time=t.w)
    else:
        raise SchedlabError(
            f"schedule {name!r} runs on a chain of stages, and {req.placement} is not one: use --placement "
            f"{CHAIN_PLACEMENT} (or a FILE holding a chain), or --schedule {TESSEL} to search a schedule for "
            f"{req.placement}"
        )
    schedule = generate(name, shape, m)
    timeline = check_schedule(schedule, memory_limit=req.memory_limit)
    return _with_marginal(req, schedule, timeline, "generator", lambda mb: generate(name, shape, mb))


def _tessel(req: ScheduleRequest) -> BuiltSchedule:
    from schedlab.search.tessel import search_tessel
    from schedlab.search.tessel.complete import complete

    m = _need(req.n_microbatches, "--micro-batches M", "a Tessel search")
    if _is_file_placement(req.placement):
        shape = _file_shape(req)
    else:
        shape = _tessel_placement(req, _need(req.n_devices, "--devices P", "a Tessel search"))
    result = search_tessel(shape, m, memory_limit=req.memory_limit, solver=req.solver, time_limit_s=req.time_limit_s)
    timeline = check_schedule(result.schedule, memory_limit=req.memory_limit)
    built = _with_marginal(
        req, result.schedule, timeline, TESSEL, lambda mb: complete(result.repetend, mb, req.memory_limit)
    )
    return dataclasses.replace(built, tessel=result)


def _torch(req: ScheduleRequest, cls: str) -> BuiltSchedule:
    from schedlab.pipeline.torch_io import from_torch

    what = f"torch's {cls} schedule"
    p = _need(req.n_devices, "--devices P", what)
    m = _need(req.n_microbatches, "--micro-batches M", what)
    return _imported(req, from_torch(cls, p, m), "torch")


def _csv(req: ScheduleRequest, path: Path) -> BuiltSchedule:
    from schedlab.pipeline.torch_io import read_csv

    schedule = read_csv(path)
    if req.n_devices is not None and req.n_devices != schedule.n_devices:
        raise SchedlabError(f"{path} has {schedule.n_devices} rows (one per rank), not --devices {req.n_devices}")
    if req.n_microbatches is not None and req.n_microbatches != schedule.n_microbatches:
        raise SchedlabError(
            f"{path} runs {schedule.n_microbatches} micro-batches, not --micro-batches {req.n_microbatches}"
        )
    return _imported(req, schedule, "csv")


def _imported(req: ScheduleRequest, schedule: Schedule, source: str) -> BuiltSchedule:
    """An imported order on the placement: on vshape the chain its actions imply, with the
    times split over each device's stages as for a generated chain; else the placement's
    own stages, which the order must fit."""
    p = schedule.n_devices
    if _is_file_placement(req.placement):
        shape = _file_shape(req)
    elif req.placement == CHAIN_PLACEMENT:
        per_device = schedule.shape.n_stages / p
        t = req.times
        shape = infer_chain(
            schedule.orders,
            f_time=t.f / per_device,
            b_time=t.b / per_device,
            i_time=t.i / per_device,
            w_time=t.w / per_device,
            f_mem=1.0 / per_device,
        )
    else:
        shape = _tessel_placement(req, p)
    schedule = schedule.with_shape(shape)
    timeline = check_schedule(schedule, memory_limit=req.memory_limit)
    return BuiltSchedule(
        request=req,
        schedule=schedule,
        timeline=timeline,
        source=source,
        steady_state_per_microbatch=timeline.completion_spacing(),
        steady_state_method=COMPLETION_SPACING,
        steady_state_step=None,
    )


def _with_marginal(
    req: ScheduleRequest, schedule: Schedule, timeline: Timeline, source: str, regenerate: Callable[[int], Schedule]
) -> BuiltSchedule:
    marginal = marginal_per_microbatch(regenerate, schedule.n_microbatches, timeline.makespan, schedule.shape)
    if marginal is None:
        steady, method, step = timeline.completion_spacing(), COMPLETION_SPACING, None
    else:
        (steady, step), method = marginal, MARGINAL
    return BuiltSchedule(req, schedule, timeline, source, steady, method, step)


def marginal_per_microbatch(
    regenerate: Callable[[int], Schedule], n_microbatches: int, makespan: float, shape: PipeShape
) -> tuple[float, int] | None:
    """((makespan(M + k) - makespan(M)) / k, k) for the smallest k the generator accepts,
    trying k up to the number of stages plus devices (interleaved's step is P); None if it
    accepts none of them."""
    for k in range(1, shape.n_stages + shape.n_devices + 1):
        try:
            more = regenerate(n_microbatches + k)
        except SchedlabError:
            continue
        return (time_schedule(more).makespan - makespan) / k, k
    return None
