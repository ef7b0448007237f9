"""The per-op-class cost model: kernel time from work (FLOPs, bytes) and intra-op threads.

In the spirit of the concurrency-control paper's performance model (Liu et al., IPDPS
2019: time = a + b/n + c*n per op), with b made a function of the op's work so that one
model covers every shape of a class:

    mem_us(B)     = MB * us_per_mb + us_per_mb_dram * max(0, MB - cache_mb)   (MB = B / 1e6)
    work_us(F, B) = F * us_per_gflop / 1e9 + mem_us(B)                (one thread)
    p(F, B)       = p_max * work_us / (work_us + h_us)                (parallel share)
    kernel_us(n)  = a_us + work_us * ((1 - p) + p / n) + c_us * (n - 1)

- ``a_us``: fixed cost of a call beyond the executor's dispatch (kernel setup).
- ``us_per_gflop``, ``us_per_mb``: single-thread cost of compute and of memory traffic
  (an additive roofline: one of the two dominates for most ops).
- ``us_per_mb_dram``, ``cache_mb``: the extra cost per MB once an op's data no longer fits
  in cache (bandwidth of memory rather than cache, page faults of fresh large outputs):
  a hinge at ``cache_mb``, linear on both sides, so it extrapolates linearly. Measured on a 2-core Xeon: ~0.15 us/KB for
  data in L2, ~4x that beyond.
- ``p_max``, ``h_us``: Amdahl's parallel share, which grows with the work: ATen runs ops
  below a grain size on one thread, so small ops do not speed up with threads.
- ``c_us``: cost of each extra thread of the team (fork/join, spinning).

All times are microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

PARAM_NAMES = ("a_us", "us_per_gflop", "us_per_mb", "us_per_mb_dram", "cache_mb", "p_max", "h_us", "c_us")


@dataclass(frozen=True)
class WorkThreadsModel:
    """kernel_us = a + work * ((1 - p) + p / n) + c * (n - 1); see the module docstring."""

    a_us: float
    us_per_gflop: float
    us_per_mb: float
    us_per_mb_dram: float
    cache_mb: float
    p_max: float
    h_us: float
    c_us: float

    def mem_us(self, nbytes: float) -> float:
        """Single-thread time of the op's memory traffic."""
        mb = nbytes * 1e-6
        return mb * self.us_per_mb + self.us_per_mb_dram * max(0.0, mb - self.cache_mb)

    def work_us(self, flops: float, nbytes: float) -> float:
        """Single-thread time of the op's work (no fixed cost)."""
        return flops * self.us_per_gflop * 1e-9 + self.mem_us(nbytes)

    def kernel_us(self, flops: float, nbytes: float, threads: int) -> float:
        work = self.work_us(flops, nbytes)
        p = self._parallel_share_of(work)
        n = max(1, threads)
        return self.a_us + work * ((1.0 - p) + p / n) + self.c_us * (n - 1)

    def parallel_share(self, flops: float, nbytes: float) -> float:
        """p: the share (0..1) of the op's one-thread work that runs in a parallel region."""
        return self._parallel_share_of(self.work_us(flops, nbytes))

    def _parallel_share_of(self, work_us: float) -> float:
        """`parallel_share` of an op whose one-thread work is `work_us` (`kernel_us` has it already)."""
        return self.p_max * work_us / (work_us + self.h_us) if work_us > 0 else 0.0

    def work_share(self, flops: float, nbytes: float) -> float:
        """Share (0..1) of the one-thread kernel that is work, not the fixed cost `a_us`."""
        return self._work_share_of(self.work_us(flops, nbytes))

    def _work_share_of(self, work_us: float) -> float:
        return work_us / (work_us + self.a_us) if work_us + self.a_us > 0 else 0.0

    def memory_share(self, flops: float, nbytes: float) -> float:
        """Fraction (0..1) of the single-thread work that is memory traffic."""
        return self.shares(flops, nbytes)[0]

    def shares(self, flops: float, nbytes: float) -> tuple[float, float, float]:
        """(`memory_share`, `work_share`, `parallel_share`) of one op:
        what a co-run slowdown reads (`Profile.corun_slowdown`), in one pass."""
        mem, work = self.mem_us(nbytes), self.work_us(flops, nbytes)
        return (mem / work if work > 0 else 1.0), self._work_share_of(work), self._parallel_share_of(work)

    def scaled(self, factor: float) -> WorkThreadsModel:
        """The same shape, every time multiplied by `factor` (p is unchanged)."""
        return WorkThreadsModel(
            a_us=self.a_us * factor,
            us_per_gflop=self.us_per_gflop * factor,
            us_per_mb=self.us_per_mb * factor,
            us_per_mb_dram=self.us_per_mb_dram * factor,
            cache_mb=self.cache_mb,
            p_max=self.p_max,
            h_us=self.h_us * factor,
            c_us=self.c_us * factor,
        )

    def to_params(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in PARAM_NAMES}

    @staticmethod
    def from_params(d: dict[str, Any]) -> WorkThreadsModel:
        values = {k: float(d[k]) for k in PARAM_NAMES}
        for k, v in values.items():
            if not math.isfinite(v) or v < 0 or (k == "p_max" and v > 1):
                raise ValueError(f"parameter {k} must be a finite number >= 0 (p_max <= 1), not {v}")
        return WorkThreadsModel(**values)


def predict_array(
    theta: Array, flops: Array, nbytes: Array, threads: Array
) -> Array:
    """Vectorised kernel_us for parameters in fitting order (PARAM_NAMES)."""
    a, f, b, b_dram, cache_mb, p_max, h, c = theta
    mb = nbytes * 1e-6
    work = flops * f * 1e-9 + mb * b + b_dram * np.maximum(0.0, mb - cache_mb)
    p = p_max * work / (work + h + 1e-12)
    return a + work * ((1.0 - p) + p / threads) + c * (threads - 1.0)
