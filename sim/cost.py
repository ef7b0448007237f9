"""The cost model the simulator asks: how long an op's kernel takes, and the executor's overhead.

`calibrate.profile.Profile` implements it from measurements; tests use small hand-made
ones. Times are in microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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


def op_cost_us(cost: CostModel) -> Callable[[Op, int], float]:
    """`cost`'s time of an op alone with k intra-op threads, dispatch included (µs): the
    weights a ``critical-path`` order takes from a calibrated model
    (`schedlab.plan.resolve(..., op_cost_us=op_cost_us(profile))`)."""

    def time_us(op: Op, threads: int) -> float:
        return float(cost.dispatch_us(op)) + float(cost.kernel_us(op, threads))

    return time_us
