"""The machine's roofline: the cost of an op whose class calibration never measured.

A class model is fitted from measurements of that class; a user's model may hold ops no
calibration replayed (a `_cdist_forward`, an `upsample_bicubic2d`). For those the Profile
falls back on what the machine can do at best, measured once per calibration:

    kernel_us(F, B, n) = a_us + max(F / peak_flops(n), B / bandwidth(n))

- ``gflops[n]``: a square float32 `mm` (large enough for every core's vector units, small
  enough to stay in cache) with n intra-op threads: the machine's peak arithmetic rate.
- ``gbps[n]``: an `add` of two tensors beyond the caches with n threads: 3 x 4 bytes per
  element moved over the measured time: the memory bandwidth (allocating the output
  included, as every op's is). At the mmap threshold of the tuned allocator (32 MiB) each
  call would fault its output in page by page and measure a tenth of the bandwidth.
- ``a_us``: the fixed cost of a call beyond the dispatch floor, the median of the
  measured classes' fitted ``a_us``: what a small op of any class pays.

The executor's dispatch cost comes on top, as for every op (`Profile.dispatch_us`). An
op is rarely as fast as the roofline, so a prediction that leans on it is optimistic;
`Profile.coverage` says how many ops of a graph did, and `schedlab simulate` prints it.
Thread counts not measured are interpolated between measured ones (linear in n), beyond
the largest measured one the rate stays where it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MM_N = 384  # 2 * 384^3 = 113 MFLOP: ~5 ms on one core of a 2020s server CPU
ADD_ELEMS = 1 << 22  # 3 x 16 MiB per call: beyond the caches, below the allocator's mmap threshold


@dataclass(frozen=True)
class Roofline:
    gflops: dict[int, float]  # intra-op threads -> peak GFLOP/s
    gbps: dict[int, float]  # intra-op threads -> memory bandwidth, GB/s
    a_us: float

    def _rate(self, table: dict[int, float], n: int) -> float:
        if n in table:
            return table[n]
        lower = max((k for k in table if k < n), default=None)
        upper = min((k for k in table if k > n), default=None)
        if lower is not None and upper is not None:
            w = (n - lower) / (upper - lower)
            return (1.0 - w) * table[lower] + w * table[upper]
        ref = lower if lower is not None else upper
        assert ref is not None
        return table[ref]

    def compute_us(self, flops: float, threads: int) -> float:
        return flops / (self._rate(self.gflops, max(1, threads)) * 1e3)

    def mem_us(self, nbytes: float, threads: int) -> float:
        return nbytes / (self._rate(self.gbps, max(1, threads)) * 1e3)

    def kernel_us(self, flops: float, nbytes: float, threads: int) -> float:
        return self.a_us + max(self.compute_us(flops, threads), self.mem_us(nbytes, threads))

    def parallel_share(self, flops: float, nbytes: float) -> float:
        """The roofline scales with threads as measured: all of its work is parallel."""
        return 1.0

    def work_share(self, flops: float, nbytes: float) -> float:
        """Share (0..1) of the one-thread kernel that is work, not the fixed cost `a_us`."""
        work = max(self.compute_us(flops, 1), self.mem_us(nbytes, 1))
        return work / (work + self.a_us) if work + self.a_us > 0 else 0.0

    def memory_share(self, flops: float, nbytes: float) -> float:
        """Fraction (0..1) of the op's one-thread roofline time that is memory traffic."""
        mem, compute = self.mem_us(nbytes, 1), self.compute_us(flops, 1)
        return mem / (mem + compute) if mem + compute > 0 else 1.0

    def shares(self, flops: float, nbytes: float) -> tuple[float, float, float]:
        """(`memory_share`, `work_share`, `parallel_share`), as the class models give them."""
        return self.memory_share(flops, nbytes), self.work_share(flops, nbytes), 1.0

    def to_params(self) -> dict[str, float]:
        """Flat parameters, as a class model gives them (reports print them)."""
        out = {"a_us": self.a_us}
        out.update({f"gflops_{k}": v for k, v in sorted(self.gflops.items())})
        out.update({f"gbps_{k}": v for k, v in sorted(self.gbps.items())})
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": "roofline",
            "gflops": {str(k): round(v, 3) for k, v in sorted(self.gflops.items())},
            "gbps": {str(k): round(v, 3) for k, v in sorted(self.gbps.items())},
            "a_us": round(self.a_us, 4),
        }

    @staticmethod
    def from_json(d: Any) -> Roofline:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")

        def table(key: str) -> dict[int, float]:
            raw = d[key]
            if not isinstance(raw, dict) or not raw:
                raise TypeError(f"{key} must be a non-empty object of threads -> rate")
            out = {int(k): float(v) for k, v in raw.items()}
            if any(k < 1 or not math.isfinite(v) or v <= 0 for k, v in out.items()):
                raise ValueError(f"{key} needs thread counts >= 1 and finite rates > 0")
            return out

        a_us = float(d["a_us"])
        if not math.isfinite(a_us) or a_us < 0:
            raise ValueError(f"a_us must be a finite number >= 0, not {a_us}")
        return Roofline(gflops=table("gflops"), gbps=table("gbps"), a_us=a_us)


def _best_us(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm up (allocations, thread team)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        out = fn()
        best = min(best, (time.perf_counter_ns() - t0) / 1e3)
        del out
    return best


def measure_roofline(
    threads: tuple[int, ...], set_threads: Callable[[int], Any], a_us: float = 0.0, reps: int = 5
) -> Roofline:
    """Peak GFLOP/s and GB/s at every thread count in `threads` (the fastest of `reps`
    calls: a neighbour only ever slows a call down). `a_us` is filled in after the fits."""
    a, b = torch.randn(MM_N, MM_N), torch.randn(MM_N, MM_N)
    x, y = torch.randn(ADD_ELEMS), torch.randn(ADD_ELEMS)
    mm_flops = 2.0 * MM_N**3
    add_bytes = 3.0 * 4 * ADD_ELEMS
    gflops: dict[int, float] = {}
    gbps: dict[int, float] = {}
    for n in sorted(threads):
        set_threads(n)
        gflops[n] = mm_flops / (_best_us(lambda: torch.mm(a, b), reps * n) * 1e3)
        gbps[n] = add_bytes / (_best_us(lambda: torch.add(x, y), reps * n) * 1e3)
        # More threads are never slower at the peak: a slower figure is a neighbour
        # holding a core while the team waits at its barrier (see `calibrate.timing`).
        lower = max((k for k in gflops if k < n), default=None)
        if lower is not None:
            gflops[n], gbps[n] = max(gflops[n], gflops[lower]), max(gbps[n], gbps[lower])
    return Roofline(gflops=gflops, gbps=gbps, a_us=a_us)
