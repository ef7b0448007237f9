"""Pipeline schedules to and from torch.distributed.pipelining, pinned to torch 2.13.

- `read_csv` / `write_csv`: torch's CSV form, one row per rank and one action per cell in
  torch's text (`0F1`, `3B0`, `2I5`, `1SEND_F0`, `(0F7;7B3)OVERLAP_F_B`); empty cells are
  torch's idle steps. What torch's `_dump_csv` writes reads back here, and what is
  written here loads with torch's `_load_csv`.
- `from_torch`: the per-rank compute order one of torch's schedule classes builds,
  computed as torch computes it, without a process group (the class is given stand-in
  stage objects that carry only the pipeline's size).
- `torch_spacing` / `torch_unit_makespan`: torch's own timing of an order, from
  `_schedule_visualizer.add_schedule_op_spacing` (F = I = W = 1, full backward B = 2,
  OVERLAP_F_B = 3, communication free), to hold against `time_schedule` under the same
  unit costs.

What torch 2.13 does here that a reader needs to know, each checked in
tests/pipeline/test_torch_io.py:

1. `Schedule1F1B`'s order numbers the last rank's forwards 1..M instead of 0..M-1 (it
   starts its forward counter at 0 and increments before use when that rank has no
   warm-up forwards), so the order lists F M and never F 0; the runtime itself runs
   0..M-1. `from_torch` renumbers exactly that pattern and nothing else.
2. `ScheduleGPipe` and `Schedule1F1B` end each rank with REDUCE_GRAD, which
   `add_schedule_op_spacing` rejects ("Unknown computation type"), and with the defect
   above torch's own `get_schedule_ops(..., add_spacing=True)` fails for both. REDUCE_GRAD,
   UNSHARD and RESHARD are communication (gradient reduction, FSDP gathers) and are
   dropped and counted like SEND/RECV.
3. `add_schedule_op_spacing` drops a rank's queue from its list once the queue empties,
   then goes on indexing the list by position, so the ranks after it borrow the previous
   rank's completion time and output row. A start time changes only when the borrowed
   completion time differs from the rank's own at a step where that rank could start
   work. For GPipe, 1F1B, Interleaved1F1B, LoopedBFS and InterleavedZeroBubble the
   queues empty from the last rank down, or all in one step, so nothing shifts. For
   ZBVZeroBubble they empty from rank 0 up (at P = 2; P = 4 with M >= 8; P = 8 with
   M = 16), so torch's rows mix ranks (its picture draws rank 1's tail on rank 0's row),
   but every rank's tail is back-to-back one-step W work, the borrowed completion time
   equals the rank's own, and every start time and the makespan stay right.
   `torch_spacing` reads times from positions, never from rows, and reports the actions
   drawn on another rank's row. A hand-written order where rank 0 ends with a two-step
   B while rank 1 still has one-step work does shift: torch says 8, the true makespan
   is 7.
4. `ScheduleDualPipeV` pairs a forward and a full backward in OVERLAP_F_B actions, which
   torch's spacing starts only when both halves are ready, runs as one three-step block,
   and completes F after one step and B after three. `from_torch` expands each into its
   forward then its backward, so the forward may start before the backward's gradient
   arrives: its makespan is at most torch's compound timing (25 against 26 at P = 2,
   M = 4; 103 against 110 at P = 8, M = 16), and `torch_unit_makespan` gives either.
5. The spacing makes the last stage's backward wait for the previous stage's forward,
   which a one-stage pipeline lacks, so it reports a deadlock; `torch_spacing` refuses
   one stage with that reason.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind, parse_action
from schedlab.pipeline.check import check_schedule
from schedlab.pipeline.schedule import Schedule, infer_chain, n_microbatches_of, orders_from_rows

TORCH_PINNED = "2.13"  # the torch minor version whose private pipelining API this module reads

# The schedule classes of torch.distributed.pipelining that build an order; the two base
# classes get_schedule_class also names (PipelineScheduleSingle, PipelineScheduleMulti) do not.
_TORCH_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)

# ---------------------------------------------------------------- CSV


def read_csv(
    path: str | os.PathLike[str],
    *,
    f_time: float = 1.0,
    b_time: float | None = None,
    i_time: float | None = None,
    w_time: float | None = None,
    f_mem: float = 1.0,
    w_mem: float = 0.0,
) -> Schedule:
    """A schedule from torch's CSV: row r is rank r's actions in order. The stages' ranks
    come from the actions (stage s runs where its actions are, and feeds s + 1, as torch
    reads it), micro-batches from the highest index; communication is dropped and counted
    in `comm_dropped`. Costs default to torch's units (F = I = W = 1, B = I + W). The
    schedule is validated, as torch's `_load_csv` does."""
    p = Path(path)
    try:
        with p.open(newline="") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise SchedlabError(f"no schedule file {p}") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SchedlabError(f"cannot read schedule file {p}: {e}") from None
    if not rows:
        raise SchedlabError(f"{p} holds no rows; torch's CSV has one row per rank")
    try:
        orders, dropped = orders_from_rows(rows)
        shape = infer_chain(
            orders, f_time=f_time, b_time=b_time, i_time=i_time, w_time=w_time, f_mem=f_mem, w_mem=w_mem
        )
        schedule = Schedule(
            shape=shape, n_microbatches=n_microbatches_of(orders), orders=orders, name=p.stem, comm_dropped=dropped
        )
        check_schedule(schedule)
    except SchedlabError as e:
        raise SchedlabError(f"{p}: {e}") from None
    return schedule


def require_torch_layout(schedule: Schedule) -> None:
    """torch's schedules are a chain of stages, each on one rank; refuse anything else
    (a stage spanning ranks, or a branching DAG of stages) with what to do instead."""
    shape = schedule.shape
    for s, st in enumerate(shape.stages):
        if len(st.devices) != 1:
            raise SchedlabError(
                f"stage {s} runs on devices {st.devices}; torch's schedules put each stage on one rank "
                f"(write this schedule with Schedule.to_text instead)"
            )
        want = (s + 1,) if s + 1 < shape.n_stages else ()
        if st.next != want:
            raise SchedlabError(
                f"stage {s} feeds {st.next}; torch's schedules are a chain where stage s feeds s + 1 "
                f"(write this schedule with Schedule.to_text instead)"
            )


def write_csv(schedule: Schedule, path: str | os.PathLike[str]) -> None:
    """Write `schedule` as torch's compute-only CSV, all or nothing: the rows go to a
    temporary file beside `path`, which then replaces `path` in one step."""
    check_schedule(schedule)
    require_torch_layout(schedule)
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            csv.writer(f).writerows(schedule.to_rows())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise SchedlabError(f"cannot write schedule file {p}: {e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------- torch's private API


def torch_version() -> str:
    import torch

    return str(torch.__version__)


@contextlib.contextmanager
def _private_api(what: str) -> Iterator[None]:
    """Turn a missing or changed private name into one message when torch is not the
    version this module was written against; on that version, a failure is a bug here
    and keeps its traceback."""
    try:
        yield
    except (ImportError, AttributeError, TypeError, KeyError, IndexError) as e:
        version = torch_version()
        if version.startswith(TORCH_PINNED + "."):
            raise
        raise SchedlabError(
            f"{what} reads torch.distributed.pipelining's private schedule API as torch {TORCH_PINNED} has it; "
            f"torch {version} differs ({type(e).__name__}: {e}). Install torch {TORCH_PINNED}.x, or update "
            f"schedlab/pipeline/torch_io.py for torch {version}"
        ) from None


@dataclass
class _StandInStage:
    """What torch's schedule constructors read of a stage: the pipeline's size, this
    rank's place in it, and no module (so nothing to compile or run)."""

    group_size: int
    num_stages: int
    stage_index: int
    group_rank: int = 0
    submod: None = None
    stage_index_to_group_rank: dict[int, int] = field(default_factory=dict)


def torch_schedule_names() -> tuple[str, ...]:
    """The torch schedule classes `from_torch` and `torch_unit_makespan` accept (names as
    torch's `get_schedule_class` takes them, any case)."""
    return _TORCH_SCHEDULES


def _canonical_name(name: str) -> str:
    by_lower = {n.lower(): n for n in _TORCH_SCHEDULES}
    if name.lower() not in by_lower:
        raise SchedlabError(f"unknown torch schedule {name!r}; choose one of: {', '.join(_TORCH_SCHEDULES)}")
    return by_lower[name.lower()]


@dataclass(frozen=True)
class _TorchOrder:
    rows: list[list[Any]]  # per rank, torch's _Action objects, idle steps (None) removed
    stage_rank: dict[int, int]  # torch's own stage -> rank mapping


def _torch_order(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: int | None) -> _TorchOrder:
    if n_ranks < 1 or n_microbatches < 1:
        raise SchedlabError(f"need at least one rank and one micro-batch (got {n_ranks} ranks, {n_microbatches})")
    with _private_api(f"importing torch's {name} schedule"):
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

        cls = get_schedule_class(name)
        single = issubclass(cls, PipelineScheduleSingle)
        if single:
            if stages_per_rank not in (None, 1):
                raise SchedlabError(f"torch's {name} runs one stage per rank, not {stages_per_rank}")
            stages: Any = _StandInStage(group_size=n_ranks, num_stages=n_ranks, stage_index=0)
        else:
            v = 2 if stages_per_rank is None else stages_per_rank
            if v < 1:
                raise SchedlabError(f"stages per rank must be at least 1, not {v}")
            stages = [_StandInStage(group_size=n_ranks, num_stages=v * n_ranks, stage_index=i) for i in range(v)]
        try:
            sched = cls(stages, n_microbatches)
        except ValueError as e:
            raise SchedlabError(
                f"torch's {name} refuses {n_ranks} ranks, {n_microbatches} micro-batches"
                f"{'' if single else f', {len(stages)} stages per rank'}: {e}"
            ) from None
        order = sched.pipeline_order
        rows = [[a for a in order[r] if a is not None] for r in range(n_ranks)]
        stage_rank = {s: s for s in range(n_ranks)} if single else dict(sched.stage_index_to_group_rank)
    return _TorchOrder(rows=rows, stage_rank=stage_rank)


def _renumber_1f1b_forwards(
    orders: tuple[tuple[Action, ...], ...], n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    """Undo torch 2.13's Schedule1F1B numbering defect: a rank whose forwards read
    1..M in order runs 0..M-1 (the runtime does); other ranks are left as they are."""
    out = []
    for order in orders:
        forwards = [a.mb for a in order if a.kind is Kind.F]
        if forwards == list(range(1, n_microbatches + 1)):
            order = tuple(Action(a.stage, a.kind, a.mb - 1) if a.kind is Kind.F else a for a in order)
        out.append(order)
    return tuple(out)


def from_torch(name: str, n_ranks: int, n_microbatches: int, stages_per_rank: int | None = None) -> Schedule:
    """The per-rank compute order torch's schedule class `name` builds for `n_ranks` ranks
    and `n_microbatches` micro-batches (stages per rank: 1 for GPipe and 1F1B, default 2
    for the others), with unit costs (F = I = W = 1, B = 2; give others with
    `schedule.with_shape(infer_chain(schedule.orders, ...))`). Idle steps are dropped,
    communication is counted in `comm_dropped`, OVERLAP_F_B pairs are expanded into their
    forward then their backward, and the result is validated, its stage -> rank mapping
    checked against torch's."""
    canonical = _canonical_name(name)
    torch_order = _torch_order(canonical, n_ranks, n_microbatches, stages_per_rank)
    with _private_api(f"reading torch's {canonical} order"):
        orders, dropped = orders_from_rows([[str(a) for a in row] for row in torch_order.rows])
    if canonical == "1F1B":
        orders = _renumber_1f1b_forwards(orders, n_microbatches)
    label = f"torch's {canonical} at {n_ranks} ranks, {n_microbatches} micro-batches"
    try:
        shape = infer_chain(orders)
        schedule = Schedule(
            shape=shape, n_microbatches=n_microbatches, orders=orders, name=f"torch-{canonical}", comm_dropped=dropped
        )
        check_schedule(schedule)
    except SchedlabError as e:
        raise SchedlabError(f"{label} is not a valid schedule: {e}") from None
    ours = {s: st.devices[0] for s, st in enumerate(shape.stages) if len(st.devices) == 1}
    if ours != torch_order.stage_rank:
        raise SchedlabError(
            f"{label}: its actions put stages on ranks {ours}, its own mapping says {torch_order.stage_rank}"
        )
    return schedule


# ---------------------------------------------------------------- torch's timing


@dataclass(frozen=True)
class TorchSpacing:
    """torch's unit-cost timing of an order (`add_schedule_op_spacing`)."""

    start: Mapping[Action, int]  # when each compute action starts
    makespan: int
    misplaced: tuple[Action, ...]  # actions torch's output draws on another rank's row (quirk 3 above)


def _space(rows: list[list[Any]]) -> TorchSpacing:
    """Run torch's spacing on per-rank torch actions and read times from positions: an
    action occupies its width from torch's table, an idle step (None) one step. A row's
    position is its index's clock whichever queue torch appended from, so times hold
    even where rows are mixed."""
    n_stages = 1 + max((s.stage_index for row in rows for a in row for s in (a.sub_actions or (a,))), default=-1)
    if n_stages < 2:
        raise SchedlabError(
            "torch's add_schedule_op_spacing makes the last stage's backward wait for the previous stage's "
            "forward, which a one-stage pipeline lacks, so it reports a deadlock; time one stage with time_schedule"
        )
    with _private_api("timing with torch's add_schedule_op_spacing"):
        from torch.distributed.pipelining._schedule_visualizer import (
            action_type_to_color_mapping,
            add_schedule_op_spacing,
        )

        owner = {str(a): r for r, row in enumerate(rows) for a in row}
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints every step of every rank
                spaced = add_schedule_op_spacing([list(row) for row in rows])
        except RuntimeError as e:
            raise SchedlabError(f"torch's add_schedule_op_spacing gave up: {e}") from None
        start: dict[Action, int] = {}
        misplaced: list[Action] = []
        makespan = 0
        for r, row in enumerate(spaced):
            t = 0
            for a in row:
                if a is None:
                    t += 1
                    continue
                t_sub = t
                for sub in a.sub_actions or (a,):
                    start[parse_action(str(sub))] = t_sub
                    if owner[str(a)] != r:
                        misplaced.append(parse_action(str(sub)))
                    t_sub += action_type_to_color_mapping[sub.computation_type].width
                t += action_type_to_color_mapping[a.computation_type].width
                makespan = max(makespan, t)
    return TorchSpacing(start=start, makespan=makespan, misplaced=tuple(sorted(misplaced)))


def torch_spacing(schedule: Schedule) -> TorchSpacing:
    """torch's timing of `schedule`'s order. torch times in its own units (F = I = W = 1,
    B = 2, free communication) whatever the schedule's costs; the schedule must be a
    chain with one rank per stage, as torch's are."""
    check_schedule(schedule)
    require_torch_layout(schedule)
    with _private_api("building torch actions"):
        from torch.distributed.pipelining.schedules import _Action

        rows = [[_Action.from_str(str(a)) for a in order] for order in schedule.orders]
    return _space(rows)


def torch_unit_makespan(
    name: str,
    n_ranks: int,
    n_microbatches: int,
    stages_per_rank: int | None = None,
    *,
    compound_overlap: bool = False,
) -> int:
    """torch's own makespan (F = I = W = 1, B = 2, free communication) of the order
    `from_torch` returns for the same arguments. With `compound_overlap`, DualPipeV's
    OVERLAP_F_B pairs are timed as torch has them, one three-step block started when both
    halves are ready, rather than expanded (the same for every other schedule)."""
    schedule = from_torch(name, n_ranks, n_microbatches, stages_per_rank)  # validates the order
    if compound_overlap:
        rows = _torch_order(_canonical_name(name), n_ranks, n_microbatches, stages_per_rank).rows
        with _private_api("filtering torch actions"):
            if any(a.sub_actions for row in rows for a in row):
                return _space([[a for a in row if a.is_compute_op] for row in rows]).makespan
    return torch_spacing(schedule).makespan
