"""Schedules to and from torch.distributed.pipelining (torch 2.13): the CSV both ways,
torch's schedule classes imported, and torch's own timing against the one timing model."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import Action, Kind, PipeShape, Schedule, Stage, chain, parse_text, time_schedule, torch_io
from schedlab.pipeline.torch_io import (
    from_torch,
    read_csv,
    torch_schedule_names,
    torch_spacing,
    torch_unit_makespan,
    write_csv,
)

torch = pytest.importorskip("torch")
from torch.distributed.pipelining import schedules as torch_schedules  # noqa: E402

SIX = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble")
GRID = [(name, p, m) for name in SIX for p in (2, 4, 8) for m in (4, 8, 16)]


def _torch_schedule(name: str, n_ranks: int, n_microbatches: int) -> Any:
    """torch's schedule object for a multi-stage class, two stand-in stages per rank."""
    cls = torch_schedules.get_schedule_class(name)
    stages = [torch_io._StandInStage(group_size=n_ranks, num_stages=2 * n_ranks, stage_index=i) for i in range(2)]
    return cls(stages, n_microbatches)


def _cells(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


# ---------------------------------------------------------------- CSV


def test_written_csv_reads_back_identically(tmp_path: Path) -> None:
    s = from_torch("InterleavedZeroBubble", 4, 8)
    write_csv(s, tmp_path / "zb.csv")
    back = read_csv(tmp_path / "zb.csv")
    assert (back.orders, back.shape, back.n_microbatches, back.name) == (s.orders, s.shape, 8, "zb")
    assert back.comm_dropped == 0
    assert _cells(tmp_path / "zb.csv")[0][:5] == ["0F0", "0F1", "0F2", "0F3", "4F0"]


def test_read_csv_takes_costs_and_keeps_the_stage_map(tmp_path: Path) -> None:
    write_csv(from_torch("ZBVZeroBubble", 2, 4), tmp_path / "zbv.csv")
    s = read_csv(tmp_path / "zbv.csv", f_time=2.0, i_time=1.5, w_time=0.5, f_mem=3.0)
    assert [st.devices for st in s.shape.stages] == [(0,), (1,), (1,), (0,)]  # the V
    assert (s.shape.stages[0].f_time, s.shape.stages[0].i_time, s.shape.stages[0].w_time) == (2.0, 1.5, 0.5)
    assert s.shape.stages[0].b_time == 2.0  # B = I + W when only I and W are given
    unit = read_csv(tmp_path / "zbv.csv")
    assert time_schedule(s).peak_memory == tuple(3.0 * m for m in time_schedule(unit).peak_memory)
    assert time_schedule(unit).makespan == 25 < time_schedule(s).makespan


@pytest.mark.parametrize("name", ["Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"])
def test_a_written_csv_loads_in_torch(tmp_path: Path, name: str) -> None:
    s = from_torch(name, 4, 8)
    path = tmp_path / f"{name}.csv"
    write_csv(s, path)
    for row in _cells(path):
        for cell in row:
            assert str(torch_schedules._Action.from_str(cell)) == cell
    # torch's own loader: validates the order, infers stage -> rank, and lowers it with SEND/RECV
    runtime = torch_schedules._PipelineScheduleRuntime(
        [torch_io._StandInStage(group_size=4, num_stages=8, stage_index=i) for i in range(2)], 8
    )
    runtime._load_csv(str(path))
    assert [[str(a) for a in runtime.pipeline_order[r]] for r in range(4)] == s.to_rows()
    assert runtime.stage_index_to_group_rank == {i: st.devices[0] for i, st in enumerate(s.shape.stages)}
    assert any("SEND_F" in str(a) for a in runtime.pipeline_order_with_comms[0])


@pytest.mark.parametrize(
    "name", ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
)
def test_a_csv_torch_dumps_reads_back_identically(tmp_path: Path, name: str) -> None:
    ours = from_torch(name, 4, 8)
    sched = _torch_schedule(name, 4, 8)
    compute, comms, base = tmp_path / "compute.csv", tmp_path / "comms.csv", tmp_path / "base.csv"
    sched._dump_csv(str(compute), format="compute_only")
    sched._dump_csv(str(comms), format="compute_comms")
    torch_schedules.PipelineScheduleMulti._dump_csv(sched, str(base))
    for path in (compute, comms, base):
        back = read_csv(path)
        assert (back.orders, back.shape, back.n_microbatches) == (ours.orders, ours.shape, 8), path
    assert read_csv(compute).comm_dropped == 0
    # every SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD cell torch wrote is counted, nothing else
    comm_cells = [
        c for row in _cells(comms) for c in row if c and not torch_schedules._Action.from_str(c).is_compute_op
    ]
    assert read_csv(comms).comm_dropped == len(comm_cells) > 0
    if name == "DualPipeV":  # torch writes its compound actions; they read back expanded
        assert any("OVERLAP_F_B" in c for row in _cells(compute) for c in row)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([["0F0", "0B0"], ["1F0", "1X0", "1B0"]], r"row 1 \(rank 1\), cell 1: cannot read pipeline action '1X0'"),
        ([["0F0", "", "(0F1;1SEND_F0)OVERLAP_F_B"]], r"row 0 \(rank 0\), cell 2: .*compute actions only"),
        ([["0F0", "0B0"], ["1F0"]], r"missing 1B0"),
        ([["0F0", "1F0", "0B0"], ["1F0", "1B0"]], r"stage 1 spans devices \(0, 1\), but device 0 does not run 1B0"),
    ],
)
def test_a_malformed_csv_gives_one_error_naming_row_and_cell(
    tmp_path: Path, rows: list[list[str]], message: str
) -> None:
    path = tmp_path / "bad.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(SchedlabError, match=message):
        read_csv(path)


def test_reading_a_missing_or_empty_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SchedlabError, match="no schedule file"):
        read_csv(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(SchedlabError, match="holds no rows"):
        read_csv(tmp_path / "empty.csv")


def test_writing_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.csv"
    path.write_text("old\n")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch_io.os, "replace", failing_replace)
    with pytest.raises(SchedlabError, match=r"cannot write schedule file .*No space left"):
        write_csv(from_torch("GPipe", 2, 4), path)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["s.csv"]  # no temporary file left behind
    monkeypatch.undo()
    write_csv(from_torch("GPipe", 2, 4), path)
    assert _cells(path)[1] == ["1F0", "1F1", "1F2", "1F3", "1B0", "1B1", "1B2", "1B3"]


def test_a_schedule_torch_cannot_hold_is_not_written(tmp_path: Path) -> None:
    # stage 0 sharded over both devices (a Tessel M shape's head): torch puts a stage on one rank
    shape = PipeShape(stages=(Stage(devices=(0, 1), next=(1,)), Stage((0,), (2,)), Stage((1,))), n_devices=2)
    orders, _ = parse_text("0: 0F0 1F0 1B0 0B0\n1: 0F0 2F0 2B0 0B0\n")
    with pytest.raises(SchedlabError, match=r"stage 0 runs on devices \(0, 1\); torch's schedules put"):
        write_csv(Schedule(shape=shape, n_microbatches=1, orders=orders), tmp_path / "m.csv")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- importing torch's classes


def test_names_and_refusals() -> None:
    assert torch_schedule_names() == (*SIX, "DualPipeV")
    for name in torch_schedule_names():
        assert torch_schedules.get_schedule_class(name)  # torch knows each name
    assert from_torch("interleaved1f1b", 2, 4).orders == from_torch("Interleaved1F1B", 2, 4).orders
    with pytest.raises(SchedlabError, match="unknown torch schedule 'PipelineScheduleMulti'; choose one of: GPipe"):
        from_torch("PipelineScheduleMulti", 2, 4)
    with pytest.raises(SchedlabError, match=r"torch's 1F1B refuses 8 ranks, 4 micro-batches: Number of microbatches"):
        from_torch("1F1B", 8, 4)
    with pytest.raises(
        SchedlabError, match=r"torch's ZBVZeroBubble refuses .* 3 stages per rank: ZBV requires exactly 2"
    ):
        from_torch("ZBVZeroBubble", 4, 8, stages_per_rank=3)
    with pytest.raises(SchedlabError, match="torch's GPipe runs one stage per rank, not 2"):
        from_torch("GPipe", 4, 8, stages_per_rank=2)


def test_gpipe_and_1f1b_drop_reduce_grad_and_1f1b_numbers_the_last_rank_from_zero() -> None:
    # torch 2.13's own order: the last rank's forwards read 1..M, and each rank ends in REDUCE_GRAD
    raw = torch_schedules.Schedule1F1B(torch_io._StandInStage(group_size=4, num_stages=4, stage_index=0), 8)
    last = [str(a) for a in raw.pipeline_order[3] if a is not None]
    assert last[:2] == ["3F1", "3B0"] and "3F8" in last and "3F0" not in last and last[-1] == "3REDUCE_GRAD"
    s = from_torch("1F1B", 4, 8)
    assert s.to_text().splitlines()[3] == "3: " + " ".join(f"3F{m} 3B{m}" for m in range(8))
    assert s.comm_dropped == 4  # one REDUCE_GRAD per rank
    assert time_schedule(s).makespan == 3 * (8 + 4 - 1)


def test_dualpipev_overlap_pairs_are_expanded_forward_first() -> None:
    s = from_torch("DualPipeV", 4, 8)
    raw = _torch_schedule("DualPipeV", 4, 8).pipeline_order[0]
    first = next(a for a in raw if a is not None and a.sub_actions)
    f, b = (torch_io.parse_action(str(x)) for x in first.sub_actions)
    i = s.orders[0].index(f)
    assert s.orders[0][i + 1] == b and (f.kind, b.kind) == (Kind.F, Kind.B)
    assert len(s.orders[0]) == sum(len(a.sub_actions or (a,)) for a in raw if a is not None)


def test_a_torch_with_another_private_api_gets_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.delattr(torch_schedules, "get_schedule_class")
    with pytest.raises(SchedlabError, match=r"as torch 2\.13 has it; torch 2\.99\.0 differs \(ImportError"):
        from_torch("GPipe", 2, 4)


# ---------------------------------------------------------------- torch's timing against ours


@pytest.mark.parametrize(("name", "n_ranks", "n_mb"), GRID)
def test_torch_and_schedlab_time_torchs_schedules_alike(name: str, n_ranks: int, n_mb: int) -> None:
    """Unit costs (F = I = W = 1, B = 2), free communication: torch's spacing and the one
    timing model start every action at the same step, so the makespans are equal."""
    try:
        s = from_torch(name, n_ranks, n_mb)
    except SchedlabError as e:
        assert name == "1F1B" and n_mb < n_ranks, e  # the one combination torch refuses
        return
    timeline = time_schedule(s)
    spacing = torch_spacing(s)
    assert spacing.start == {a: int(t) for a, t in timeline.start.items()}
    assert spacing.makespan == timeline.makespan == torch_unit_makespan(name, n_ranks, n_mb)
    # closed forms, each rank busy 3 steps per micro-batch and stage it holds
    if name in ("GPipe", "1F1B"):
        assert timeline.makespan == 3 * (n_mb + n_ranks - 1)
    elif n_mb % n_ranks == 0 and name in ("Interleaved1F1B", "LoopedBFS"):
        assert timeline.makespan == 3 * 2 * n_mb + 3 * (n_ranks - 1)
    elif n_mb % n_ranks == 0 and name == "InterleavedZeroBubble":
        assert timeline.makespan == 3 * 2 * n_mb + (n_ranks - 1)  # W fills all but the first forwards' fill


def test_torchs_reindexing_mixes_zbv_rows_but_no_time() -> None:
    """ZBV's ranks empty their queues from rank 0 up, so torch's spacing appends rank 1's
    tail to rank 0's row (and so on); each tail is back-to-back one-step W work, so the
    completion time a rank borrows is its own and no start moves (checked in the grid)."""
    s = from_torch("ZBVZeroBubble", 4, 8)
    spacing = torch_spacing(s)
    assert spacing.misplaced == tuple(map(torch_io.parse_action, ["1W7", "2W6", "2W7", "3W5", "3W6", "3W7"]))
    assert spacing.makespan == time_schedule(s).makespan == 51
    assert torch_spacing(from_torch("Interleaved1F1B", 4, 8)).misplaced == ()


def test_torchs_reindexing_shifts_a_rank_that_borrows_a_later_completion() -> None:
    """Rank 0 ends with a two-step B (5..7) while rank 1 still has one-step W work: once
    rank 0's queue empties torch runs rank 1's queue against rank 0's completion time, so
    1W1, ready at 6, starts at 7. The true makespan is 7; torch's spacing says 8."""
    orders, _ = parse_text("0: 0F0 0F1 0B0 0B1\n1: 1F0 1I0 1F1 1I1 1W0 1W1\n")
    s = Schedule(shape=chain(2), n_microbatches=2, orders=orders)
    timeline = time_schedule(s)
    spacing = torch_spacing(s)
    assert (timeline.makespan, timeline.start[Action(1, Kind.W, 1)]) == (7, 6)
    assert (spacing.makespan, spacing.start[Action(1, Kind.W, 1)]) == (8, 7)
    assert spacing.misplaced == (Action(1, Kind.W, 1),)


def test_dualpipev_compound_actions_wait_for_both_halves() -> None:
    """torch times an OVERLAP_F_B pair as one 3-step block started when both the forward
    and the backward are ready; expanded, the forward runs as soon as it can."""
    for n_ranks, n_mb, expanded, compound in ((2, 4, 25, 26), (4, 8, 51, 54), (8, 16, 103, 110)):
        s = from_torch("DualPipeV", n_ranks, n_mb)
        assert time_schedule(s).makespan == torch_unit_makespan("DualPipeV", n_ranks, n_mb) == expanded
        assert torch_unit_makespan("DualPipeV", n_ranks, n_mb, compound_overlap=True) == compound
    assert torch_unit_makespan("ZBVZeroBubble", 2, 4, compound_overlap=True) == 25  # no pairs: the same
    rows = [[a for a in row if a.is_compute_op] for row in torch_io._torch_order("DualPipeV", 2, 4, None).rows]
    spacing = torch_io._space(rows)
    for a in (a for row in rows for a in row if a.sub_actions):
        f, b = (torch_io.parse_action(str(x)) for x in a.sub_actions)
        assert spacing.start[b] == spacing.start[f] + 1  # the backward half follows the one-step forward


def test_torch_spacing_refuses_one_stage() -> None:
    s = from_torch("GPipe", 1, 4)
    assert time_schedule(s).makespan == 12
    with pytest.raises(SchedlabError, match="one-stage pipeline lacks"):
        torch_spacing(s)
