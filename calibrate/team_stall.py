"""What a call pays to start its OpenMP team while another worker's team holds the cores.

With two slots of two or more intra-op threads, each co-run worker has its own team, and on
a machine with as many cores as one team has threads, a worker whose team runs a long kernel
keeps every core busy. A call of the other worker then waits for its helpers to get a core:
the scheduler hands it one after a time slice, or when the long kernel ends. Measured on the
2-core Intel Xeon VM (2026-12-07, torch 2.13, two threads per call, 200 calls each, every
call after a 300 us sleep), beside a back-to-back two-thread `mm` of 0.36 to 14 ms:

- a `sum` over a 1 MiB tensor's rows, an `add` of two, and a 128 x 128 `mm`, 9-18 us each
  back to back alone, took a median of 75-178 us and a mean of 169-566 us; the 90th
  percentile was about the long kernel's own length up to 3 ms, and 87-2,003 us beyond it;
- the long `mm` itself ran at its own pace (395 us a call against 360 alone, 1,205 against
  1,246): the newcomer waits, the team that holds the cores does not;
- a one-thread call (`t()`) beside it: 10-17 us against 0.8, which is the co-run dispatch's.

So the stall is a property of the machine's scheduler, bounded by what the other team has
left, and heavy-tailed: in three rounds of 450 calls beside a 4 ms `mm`, a median of 56-99
us, a 90th percentile of 133-274 us, and 0-42 calls of more than a millisecond, which moved
the mean from 79 to 308 us. The simulator charges a call beside a busy team one region's
wake (`sim.wake`, `Profile.region_wake_us`: 64.5 us on run BC's quick profile), about
the median here. Re-scored on that profile's dev and held-out runs (the waits fitted again),
a charge of 150 or 300 us read 10.5% / 8.7% and 10.4% / 8.4% on the dev set against 10.8% /
9.2%, and 8.5-8.6% / 6.9-7.0% held-out against 8.7% / 7.2%; the same 300 us charged even
where it exceeds the call's own wake read 13.9% / 11.9% on the dev set (the fluid engine
charges it to the team already running too, which the `mm` above shows is not slowed). So
the probe is recorded with each calibration (`measure_team_stall`, the profile's meta and
`schedlab calibrate`'s summary), not yet charged: its mean moves too much from one round to
the next to stand in for a fitted figure.

`time_team_stall` times it at a thread count: per small forking call, each timed after
`GAP_US` of Python, the call beside a side thread's team running `mm`s of `SIDE_US` or more
back to back, less the same call's median back to back alone; the mean, median and 90th
percentile of those extras over all the calls.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.timing import back_to_back_median_us
from schedlab.calibrate.wake import busy_wait_us, side_thread
from schedlab.exec.threads import set_intra_op_threads

GAP_US = 300.0  # Python on the calling thread before each timed call, as a worker's dispatch
SIDE_US = 4000.0  # the side team's call: long against the stall, so few calls end it early
CALLS = 150  # timed calls of each small call beside the side team (and alone)
ALONE_REPS = 50  # back-to-back calls alone, whose median is the call's own time


def _side_mm(threads: int, at_least_us: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Two square matrices whose `mm` at `threads` takes at least `at_least_us`."""
    n = 128
    while True:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        t0 = time.perf_counter_ns()
        for _ in range(3):
            torch.mm(a, b)
        if (time.perf_counter_ns() - t0) / 3e3 >= at_least_us or n >= 4096:
            return a, b
        n = int(n * 1.25)


def _small_calls() -> list[Callable[[], Any]]:
    """Calls that fork their team at two or more threads and take 10-20 us alone: a row
    reduction, an elementwise add and a small matmul (1 MiB tensors, a 128-square mm)."""
    x = torch.randn(4096, 64)
    m = torch.randn(128, 128)
    return [lambda: x.sum(0), lambda: torch.add(x, x), lambda: torch.mm(m, m)]


def _beside_us(call: Callable[[], Any], calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        busy_wait_us(GAP_US)
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


@dataclass(frozen=True)
class StallLevel:
    """The stall (us) of a small call at `threads` beside a busy team, over `calls` calls."""

    threads: int
    mean_us: float
    median_us: float
    p90_us: float
    alone_us: float  # the small calls' own median back to back, averaged
    calls: int

    def to_json(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {k: round(float(v), 2) for k, v in self.__dict__.items()}
        out["threads"], out["calls"] = self.threads, self.calls
        return out


def time_team_stall(threads: int, calls: int | None = None, side_us: float | None = None) -> StallLevel:
    """The stall of each of `calls` (default `CALLS`) calls of each small call at `threads`
    intra-op threads beside a side thread's team of as many threads running `mm`s of
    `side_us` (default `SIDE_US`) or more back to back, less that call's own time (see the
    module docstring)."""
    calls = CALLS if calls is None else calls
    side_us = SIDE_US if side_us is None else side_us
    if threads < 2 or calls < 1:
        raise ValueError(f"a team stall needs two or more threads and a call, not {threads} and {calls}")
    before = set_intra_op_threads(threads)
    try:
        a, b = _side_mm(threads, side_us)
        small = _small_calls()
        alone = [back_to_back_median_us(c, ALONE_REPS) for c in small]

        def side(ready: threading.Event, stop: threading.Event) -> None:
            set_intra_op_threads(threads)
            torch.mm(a, b)
            ready.set()
            while not stop.is_set():
                torch.mm(a, b)

        with side_thread(side, "schedlab-stall-team"):
            beside = [_beside_us(c, calls) for c in small]
    finally:
        set_intra_op_threads(before)
    extras = sorted(max(0.0, t - own) for ts, own in zip(beside, alone, strict=True) for t in ts)
    return StallLevel(
        threads=threads,
        mean_us=statistics.fmean(extras),
        median_us=statistics.median(extras),
        p90_us=extras[int(0.9 * (len(extras) - 1))],
        alone_us=statistics.fmean(alone),
        calls=len(extras),
    )


def measure_team_stall(threads: Sequence[int], cores: int, calls: int | None = None) -> list[StallLevel]:
    """`time_team_stall` at each thread count of `threads` from 2 up to `cores` (a team of
    fewer threads than cores leaves a core free), by ascending count; empty on one core."""
    return [time_team_stall(k, calls) for k in sorted(set(threads)) if 2 <= k <= cores]


def describe(levels: Sequence[StallLevel]) -> str:
    """One line for `schedlab calibrate`'s summary."""
    points = ", ".join(
        f"{lv.threads} thr median {lv.median_us:.0f} us, p90 {lv.p90_us:.0f}, mean {lv.mean_us:.0f}" for lv in levels
    )
    return f"team stall (a small call beside a busy team, recorded, not charged): {points}"
