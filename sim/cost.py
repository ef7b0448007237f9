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
    under ATen) that holds its cores, used or not."""
    return bool(getattr(cost, "shares_idle_threads", False))


def cores_kept_busy(alone_us: Any, at_threads_us: Any, threads: Any) -> Any:
    """Cores a kernel keeps busy in a runtime that `shares_idle_threads`: its speedup over one
    thread (`alone_us` / `at_threads_us`), rounded, within 1..`threads`. Scalars or arrays."""
    speedup = np.asarray(alone_us, dtype=np.float64) / np.maximum(np.asarray(at_threads_us, dtype=np.float64), 1e-9)
    return np.clip(np.rint(speedup), 1, threads).astype(np.int64)


def op_cost_us(cost: CostModel) -> Callable[[Op, int], float]:
    """`cost`'s time of an op alone with k intra-op threads, dispatch included (µs): the
    weights a ``critical-path`` order takes from a calibrated model
    (`schedlab.plan.resolve(..., op_cost_us=op_cost_us(profile))`)."""

    def time_us(op: Op, threads: int) -> float:
        return float(cost.dispatch_us(op)) + float(cost.kernel_us(op, threads))

    return time_us
