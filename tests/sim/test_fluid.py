"""The processor-sharing server on its own (times in µs)."""

from __future__ import annotations

import pytest

from schedlab.sim import FluidShare


def drain(fs: FluidShare, now: float) -> list[tuple[float, list[int]]]:
    """Advance to every projected finish until idle; (time, finished keys) each."""
    out = []
    while (d := fs.next_delay(now)) is not None:
        now += d
        out.append((now, fs.advance(now)))
    return out


def test_one_job_runs_at_full_speed() -> None:
    fs = FluidShare(4)
    assert fs.start(0.0, 1, 2, 100.0) == []
    assert drain(fs, 0.0) == [(100.0, [1])]
    assert fs.busy_unit_us == pytest.approx(200.0)  # 2 cores for 100 µs


def test_oversubscription_stretches_by_total_over_capacity() -> None:
    fs = FluidShare(4)
    fs.start(0.0, 1, 4, 100.0)
    fs.start(0.0, 2, 2, 50.0)  # 6 threads on 4 cores: rate 2/3 each
    assert drain(fs, 0.0) == [(75.0, [2]), (pytest.approx(125.0), [1])]  # 1: 50 done by 75, 50 alone


def test_slowdown_gets_busy_capacity_of_the_others() -> None:
    seen: list[tuple[int, int]] = []

    def slowdown(key: int, busy: int) -> float:
        seen.append((key, busy))
        return 2.0 if busy else 1.0

    fs = FluidShare(4, slowdown)
    fs.start(0.0, 1, 3, 10.0)
    fs.start(0.0, 2, 3, 10.0)  # others busy: min(3, 4) = 3
    assert (1, 3) in seen and (2, 3) in seen
    # Rate: 4/6 share / 2 slowdown = 1/3 each -> both end at 30.
    assert drain(fs, 0.0) == [(pytest.approx(30.0), [1, 2])]


def test_max_jobs_queue_fifo() -> None:
    fs = FluidShare(2, max_jobs=2)
    for k in range(3):
        fs.start(0.0, k, 1, 10.0)
    assert fs.running == (0, 1)
    assert drain(fs, 0.0) == [(10.0, [0, 1]), (20.0, [2])]


def test_stale_versions_and_zero_work() -> None:
    fs = FluidShare(1)
    fs.start(0.0, 1, 1, 10.0)
    v = fs.version
    fs.start(5.0, 2, 1, 0.0)  # a zero-length job ends at once, on the next advance
    assert fs.version != v
    assert fs.next_delay(5.0) == 0.0
    assert fs.advance(5.0) == [2]
    assert drain(fs, 5.0) == [(10.0, [1])]  # 5 done alone before, 5 alone after


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FluidShare(0)
