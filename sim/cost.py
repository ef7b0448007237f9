"""The cost model the simulator asks: how long an op's kernel takes, and the executor's overhead.

`calibrate.profile.Profile` implements it from measurements; tests use small hand-made
ones. Times are in microseconds.
"""

from __future__ import annotations

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
