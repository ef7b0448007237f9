"""Timing one op call: warm up, repeat within a time budget, take the median.

On a shared machine a neighbour's burst of work lands on some repetitions; a point is
therefore timed in several rounds, interleaved with the other thread counts of the same
op, and keeps the lowest round median (`time_point`): interference only ever adds time.

A neighbour that holds a core for long is worse for multi-threaded points: the op's
OpenMP team waits at its barrier for a thread that is not scheduled, and a 50 us
convolution takes 20 ms with 2 threads (measured here with one busy neighbour on 2
cores). On an idle machine more threads never make an op much slower than one thread
(ATen runs small ops on one thread), so a point slower than `CONTENDED_FACTOR` times the
one-thread time plus `CONTENDED_ABS_US` is retried after a short sleep, and reported as
contended if it stays slow; the caller leaves it out.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time each (op, threads) point."""

    budget_s: float = 0.02  # target time spent repeating one point (after warm-up)
    min_reps: int = 3
    max_reps: int = 50
    warmup: int = 1
    rounds: int = 3  # rounds over all thread counts; a point keeps its best round median
    retries: int = 3  # extra tries of a multi-thread point that looks contended
    retry_sleep_s: float = 0.005
    retry_budget_s: float = 30.0  # wall time all retries of a calibration may take


class RetryBudget:
    """Wall time left for retries: a neighbour that never yields must not stall the run."""

    def __init__(self, seconds: float) -> None:
        self.left_s = seconds

    def spend(self, seconds: float) -> None:
        self.left_s -= seconds


def time_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], cfg: TimingConfig
) -> tuple[float, Any]:
    """Median wall time of `fn(*args, **kwargs)` in microseconds, and the last result.

    The garbage collector is off while timing; outputs are freed between calls (as the
    executor frees them), so large outputs pay their allocation every call, as they do
    in a real step.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        out: Any = None
        first_ns = 1
        for _ in range(max(1, cfg.warmup)):
            out = None
            t0 = time.perf_counter_ns()
            out = fn(*args, **kwargs)
            first_ns = max(1, time.perf_counter_ns() - t0)
        reps = int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_s * 1e9 / first_ns)))
        times_ns: list[int] = []
        for _ in range(reps):
            out = None
            t0 = time.perf_counter_ns()
            out = fn(*args, **kwargs)
            times_ns.append(time.perf_counter_ns() - t0)
        return statistics.median(times_ns) / 1e3, out
    finally:
        if gc_was_enabled:
            gc.enable()


CONTENDED_FACTOR = 1.5
CONTENDED_ABS_US = 20.0


def back_to_back_median_us(call: Callable[[], Any], reps: int, warmup: int = 1) -> float:
    """Median wall time (us) of `reps` calls of `call` back to back, after `warmup` untimed
    ones: a probe's figure for a call alone (`calibrate.in_turn`, `host_scaling`,
    `team_stall`), where `time_call` is an op point's, with its budget."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def looks_contended(call_us: float, one_thread_us: float) -> bool:
    """Whether a multi-thread time is too slow to be the op's own (see module docstring)."""
    return call_us > CONTENDED_FACTOR * one_thread_us + CONTENDED_ABS_US


def time_point(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    threads: tuple[int, ...],
    cfg: TimingConfig,
    set_threads: Callable[[int], Any],
    budget: RetryBudget | None = None,
) -> tuple[dict[int, float], set[int]]:
    """Call time (us) of one op per thread count (best of `cfg.rounds` round medians),
    and the thread counts whose times still look contended after the retries (taken
    while `budget` has time left)."""
    budget = budget or RetryBudget(cfg.retry_budget_s)
    best = {k: float("inf") for k in threads}
    for _ in range(max(1, cfg.rounds)):
        for k in threads:
            set_threads(k)
            call_us, _ = time_call(fn, args, kwargs, cfg)
            best[k] = min(best[k], call_us)
    contended: set[int] = set()
    base = best[min(threads)]
    for k in threads:
        if k == min(threads):
            continue
        for _ in range(cfg.retries):
            if not looks_contended(best[k], base) or budget.left_s <= 0:
                break
            t0 = time.perf_counter()
            time.sleep(cfg.retry_sleep_s)  # let a neighbour's time slice pass
            set_threads(k)
            call_us, _ = time_call(fn, args, kwargs, cfg)
            best[k] = min(best[k], call_us)
            budget.spend(time.perf_counter() - t0)
        if looks_contended(best[k], base):
            contended.add(k)
    return best, contended
