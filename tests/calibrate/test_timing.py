"""Timing: medians, best-of-rounds, contended multi-thread points; CPU load accounting."""

from __future__ import annotations

import threading

import pytest
import torch

from schedlab.calibrate.corun import measure_corun
from schedlab.calibrate.host_load import CpuSnapshot, foreign_cpu_frac, snapshot, steal_frac
from schedlab.calibrate.threads import thread_counts
from schedlab.calibrate.timing import TimingConfig, looks_contended, time_call, time_point
from schedlab.exec.threads import set_intra_op_threads

FAST = TimingConfig(budget_s=0.0, min_reps=3, max_reps=3, rounds=2, retries=2, retry_sleep_s=0.0)


class FakeOp:
    """An op whose time per call depends on the thread count we set, from a script."""

    def __init__(self, script: dict[int, list[float]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.threads = 1
        self.calls: list[int] = []

    def set_threads(self, k: int) -> None:
        self.threads = k

    def __call__(self) -> None:
        import time

        self.calls.append(self.threads)
        seq = self.script[self.threads]
        dur_us = seq.pop(0) if len(seq) > 1 else seq[0]
        end = time.perf_counter() + dur_us * 1e-6
        while time.perf_counter() < end:
            pass


def test_time_call_returns_median_and_result() -> None:
    us, out = time_call(torch.ops.aten.add.Tensor, (torch.ones(3), torch.ones(3)), {}, FAST)
    assert 0 < us < 1000
    assert torch.equal(out, torch.full((3,), 2.0))


def test_time_point_keeps_the_best_round() -> None:
    op = FakeOp({1: [3000.0] * 4 + [1000.0], 2: [600.0]})
    times, contended = time_point(op, (), {}, (1, 2), FAST, op.set_threads)
    assert 900 < times[1] < 2500  # second round (1 warm-up + 3 reps) ran at 1000 us
    assert contended == set()


def test_contended_points_are_retried_then_reported() -> None:
    # k=2 is 20x slower than k=1 for the two rounds (8 calls), then recovers.
    op = FakeOp({1: [500.0], 2: [10_000.0] * 8 + [300.0]})
    times, contended = time_point(op, (), {}, (1, 2), FAST, op.set_threads)
    assert contended == set() and times[2] < 1000
    stuck = FakeOp({1: [500.0], 2: [10_000.0]})
    times, contended = time_point(stuck, (), {}, (1, 2), FAST, stuck.set_threads)
    assert contended == {2}
    assert stuck.calls.count(2) == 2 * 4 + 2 * 4  # rounds, then the retries


def test_looks_contended_allows_small_slowdowns() -> None:
    assert not looks_contended(3.5, 2.0)  # small op: thread-team overhead, not contention
    assert not looks_contended(140.0, 100.0)
    assert looks_contended(20_000.0, 50.0)


def test_intra_op_threads_are_per_calling_thread() -> None:
    seen: list[int] = []

    def worker() -> None:
        set_intra_op_threads(1)
        seen.append(torch.get_num_threads())

    before = set_intra_op_threads(2)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [1]
    assert torch.get_num_threads() == 2
    set_intra_op_threads(before)
    assert thread_counts(4) == (1, 2, 3, 4)
    assert thread_counts(68, limit=2) == (1, 2)


def test_foreign_cpu_frac() -> None:
    a = CpuSnapshot(busy_s=10.0, total_s=100.0, own_s=5.0)
    b = CpuSnapshot(busy_s=16.0, total_s=110.0, own_s=8.0)  # 6 busy, 3 ours, out of 10
    assert foreign_cpu_frac(a, b) == 0.3
    assert foreign_cpu_frac(None, b) is None
    assert foreign_cpu_frac(a, a) is None
    s = snapshot()
    assert s is None or s.total_s >= s.busy_s >= s.steal_s >= 0.0


def test_the_hypervisors_steal_is_not_another_process() -> None:
    a = CpuSnapshot(busy_s=10.0, total_s=100.0, own_s=5.0, steal_s=1.0)
    b = CpuSnapshot(busy_s=16.0, total_s=110.0, own_s=8.0, steal_s=3.0)  # 6 busy: 3 ours, 2 stolen, 1 theirs
    assert foreign_cpu_frac(a, b) == pytest.approx(0.1)
    assert steal_frac(a, b) == pytest.approx(0.2)
    assert steal_frac(None, b) is None and steal_frac(a, a) is None


def test_steal_is_read_from_proc_stat(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import builtins
    import os

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 20 0 5 25 0 0\ncpu0 50 0 25 400 10 0 2 12 0 0\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: real_open(stat if path == "/proc/stat" else path, *a, **kw))
    s = snapshot()
    hz = os.sysconf("SC_CLK_TCK")
    assert s is not None and s.steal_s == 25 / hz and s.total_s == 1000 / hz and s.busy_s == (1000 - 820) / hz


def test_corun_on_one_core_is_neutral() -> None:
    figs = measure_corun(cores=1)
    assert (figs.mem_slowdown, figs.compute_slowdown, figs.measured) == (1.0, 1.0, False)


def test_corun_times_the_one_thread_pairs_before_any_team(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed after the two teams of all the cores, the 96 MB add beside itself read 1.60-2.36
    in three quick calibrations (1.08-1.12 before): the one-thread pairs come first."""
    from schedlab.calibrate import corun

    order: list[int] = []

    def fake_alone_and_together(fn, args, duration_s, rounds=3, intra=1):  # type: ignore[no-untyped-def]
        order.append(intra)
        return 10.0, 25.0

    monkeypatch.setattr(corun, "alone_and_together_us", fake_alone_and_together)
    monkeypatch.setattr(corun, "serial_window", lambda duration_s, rounds: 0.0)
    figs = corun.measure_corun(cores=2, duration_s=0.001, rounds=1)
    assert order[:3] == [1, 1, 1] and set(order[3:]) == {2}  # add, mm, tiny add; then the teams
    assert figs.mem_slowdown == figs.gil_slowdown == 2.5 and figs.oversub_mem == 1.25


def test_retries_stop_when_the_budget_is_spent() -> None:
    from schedlab.calibrate.timing import RetryBudget

    stuck = FakeOp({1: [500.0], 2: [10_000.0]})
    budget = RetryBudget(0.0)
    _, contended = time_point(stuck, (), {}, (1, 2), FAST, stuck.set_threads, budget)
    assert contended == {2}
    assert stuck.calls.count(2) == 2 * 4  # the rounds only: no retry


def test_a_waited_for_child_counts_as_our_own_cpu() -> None:
    import subprocess
    import sys

    before = snapshot()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    after = snapshot()
    if before is None or after is None:
        pytest.skip("no /proc/stat here")
    assert after.own_s - before.own_s >= 0.3  # the worker's CPU is ours, not a neighbour's


def test_the_oversubscription_probes_add_into_an_output_each_thread_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh 16 MiB output per call put the allocator's page faults in the two teams'
    factor (x1.12-1.66 where a kept output reads x0.93-0.99): the teams' probes call
    `AddInto`, whose output is allocated once per thread and written in place."""
    from schedlab.calibrate import corun

    add = corun.AddInto()
    a, b = torch.ones(4), torch.full((4,), 2.0)
    first, again = add(a, b), add(a, b)
    assert first.data_ptr() == again.data_ptr() and torch.equal(again, torch.full((4,), 3.0))
    other: list[torch.Tensor] = []
    t = threading.Thread(target=lambda: other.append(add(a, b)))
    t.start()
    t.join()
    assert other[0].data_ptr() != first.data_ptr()  # each thread its own output
    assert add(torch.ones(8), torch.ones(8)).shape == (8,)  # a new shape, a new output

    calls: list[tuple[str, int]] = []

    def fake_alone_and_together(fn, args, duration_s, rounds=3, intra=1):  # type: ignore[no-untyped-def]
        calls.append((type(fn).__name__, intra))
        return 10.0, 25.0

    monkeypatch.setattr(corun, "alone_and_together_us", fake_alone_and_together)
    monkeypatch.setattr(corun, "serial_window", lambda duration_s, rounds: 0.0)
    corun.measure_corun(cores=2, duration_s=0.001, rounds=1)
    assert [name for name, intra in calls if intra == 2].count("AddInto") == 2  # the 1 MiB and 16 MiB adds


def _figures_reading(monkeypatch: pytest.MonkeyPatch, shares: list[float | None]) -> list[float]:
    """`measure_corun` faked to read the co-run figures beside other processes using
    `shares` of the CPU in turn, each reading's mem_slowdown its index."""
    from schedlab.calibrate import corun

    calls: list[float] = []

    def fake(cores: int, duration_s: float = 0.25, rounds: int = 3) -> corun.CorunFigures:
        i = len(calls)
        calls.append(float(i))
        return corun.CorunFigures(float(i), 1.0, 1.0, measured=True, foreign_cpu_frac=shares[i])

    monkeypatch.setattr(corun, "measure_corun", fake)
    return calls


def test_busy_corun_figures_are_read_again_until_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading beside 9.2% of foreign CPU had inflated the two-team factors 1.2-1.3x:
    the figures are read again, and the first quiet reading ends it."""
    from schedlab.calibrate import corun

    calls = _figures_reading(monkeypatch, [0.092, 0.01, 0.0])
    figs, readings = corun.measure_corun_quiet(2, tries=3)
    assert readings == [0.092, 0.01] and len(calls) == 2 and figs.mem_slowdown == 1.0


def test_a_machine_that_stays_busy_keeps_the_quietest_corun_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedlab.calibrate import corun

    calls = _figures_reading(monkeypatch, [0.2, 0.05, 0.12])
    figs, readings = corun.measure_corun_quiet(2, tries=3)
    assert readings == [0.2, 0.05, 0.12] and len(calls) == 3
    assert figs.foreign_cpu_frac == 0.05 and figs.mem_slowdown == 1.0
    with pytest.raises(ValueError, match="tries"):
        corun.measure_corun_quiet(2, tries=0)


def test_a_quiet_or_unreadable_machine_reads_the_corun_figures_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedlab.calibrate import corun

    for first in (0.0, None):
        calls = _figures_reading(monkeypatch, [first, 0.0])
        figs, readings = corun.measure_corun_quiet(2)
        assert readings == [first] and len(calls) == 1 and figs.mem_slowdown == 0.0
