"""The cost model the simulator asks: how long an op's kernel takes, and the executor's overhead.

`calibrate.profile.Profile` implements it from measurements; tests use small hand-made
ones. Times are in microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from schedlab.graph import Op


class CostModel(Protocol):
    def kernel_us(self, op: Op, threads: int) -> float:
        """Time of `op`'s kernel alone on an idle device with `threads` intra-op threads."""
        ...

    def dispatch_us(self, op: Op) -> float:
        """Executor time spent in Python around `op` (holds the interpreter lock)."""
        ...

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        """Factor (>= 1) by which `op`'s kernel slows when `busy_cores` cores of the
        device are busy with other kernels (shared memory bandwidth and caches)."""
        ...


def shares_idle_threads(cost: object) -> bool:
    """Whether `cost` models a runtime whose intra-op threads are one pool that co-running
    kernels share (TensorFlow's Eigen pool): a thread a kernel cannot use takes another
    kernel's work. A runtime without the flag runs each kernel's threads as a team (OpenMP
    under ATen) that holds its cores, used or not, once the kernel opens a parallel region."""
    return bool(getattr(cost, "shares_idle_threads", False))


def cores_kept_busy(alone_us: Any, at_threads_us: Any, threads: Any) -> Any:
    """Cores a kernel keeps busy in a runtime that `shares_idle_threads`: its speedup over one
    thread (`alone_us` / `at_threads_us`), rounded, within 1..`threads`. Scalars or arrays."""
    speedup = np.asarray(alone_us, dtype=np.float64) / np.maximum(np.asarray(at_threads_us, dtype=np.float64), 1e-9)
    return np.clip(np.rint(speedup), 1, threads).astype(np.int64)


# A kernel at k threads no faster than this over one thread ran inline on its caller.
INLINE_SPEEDUP = 1.05


def team_or_inline(alone_us: Any, at_threads_us: Any, threads: Any) -> Any:
    """Cores a kernel holds under ATen's OpenMP: its whole team of `threads` when it runs a
    parallel region, one when it runs inline on the calling thread. ATen runs a call inline
    below its grain size (an elementwise op of under 32,768 elements, a small matmul), so a
    call that is no faster at `threads` than at one thread (`INLINE_SPEEDUP`) is taken to
    have run inline: two co-run workers of such calls each keep one core, not a team of
    two. Measured on the held-out models' plans of two slots of two threads (2-core VM,
    seven saved runs and quick profiles re-scored, 2026-11-27): gru-tagger's mean error
    there from +29..+75% to +5..+39%, the eleven models' MAPE 0.55-1.06 points lower in
    every pair. Scalars or arrays."""
    speedup = np.asarray(alone_us, dtype=np.float64) / np.maximum(np.asarray(at_threads_us, dtype=np.float64), 1e-9)
    return np.where(speedup > INLINE_SPEEDUP, np.asarray(threads), 1).astype(np.int64)


def team_basis(cost: object) -> Callable[[Op, int], float]:
    """What the demand rules (`team_or_inline`, `cores_kept_busy`) compare an op's speedup
    on: the cost model's `team_basis_us(op, threads)` where it has one (a Profile: the
    kernel alone, without the co-run executor's wait per op, which is no part of whether
    a call opens a parallel region), else its `kernel_us`."""
    fn = getattr(cost, "team_basis_us", None)
    return fn if callable(fn) else cost.kernel_us  # type: ignore[attr-defined, no-any-return]


def inlines_small_calls(cost: object) -> bool:
    """Whether `cost` models ATen's runtime on a CPU (a calibrated `Profile`), where a call
    below the grain size runs inline on its caller and holds one core (`team_or_inline`).
    A cost model without the flag (the tests' hand-made ones) holds every kernel's team."""
    return bool(getattr(cost, "inlines_small_calls", False))


def demand_rule(cost: object) -> Callable[[Any, Any, Any], Any] | None:
    """How `cost`'s CPU kernels hold cores while they run (the processor-sharing demand,
    `sim.fluid`), from (one-thread µs, µs at their threads, threads): `cores_kept_busy` where
    it `shares_idle_threads`, `team_or_inline` where it `inlines_small_calls`; None where a
    kernel holds its threads' cores whatever its times."""
    if shares_idle_threads(cost):
        return cores_kept_busy
    if inlines_small_calls(cost):
        return team_or_inline
    return None


def op_cost_us(cost: CostModel) -> Callable[[Op, int], float]:
    """`cost`'s time of an op alone with k intra-op threads, dispatch included (µs): the
    weights a ``critical-path`` order takes from a calibrated model
    (`schedlab.plan.resolve(..., op_cost_us=op_cost_us(profile))`)."""

    def time_us(op: Op, threads: int) -> float:
        return float(cost.dispatch_us(op)) + float(cost.kernel_us(op, threads))

    return time_us
