"""How well this host runs one op on all its cores right now: a probe of a tenth of a second.

A shared virtual machine's cores are not its own. On the 2-core development VM, minutes
apart (2026-11-27, quiet by its own load figures): a 512x1024x1024 `mm` scaled 1.77x and
then 1.90-1.99x from one thread to two, an `add` of two 4M-element tensors 2.42x and then
1.35-1.57x, and one held-out model's step at one slot of two threads measured 17.6 ms and
then 22.9-23.6 ms while its one-thread step stayed at 30-31 ms. A Profile's two-thread
figures are those of the hour it was calibrated in, so a fidelity figure of two-thread
plans measures the host's drift as much as the model. The probe makes that drift a
recorded figure: calibration keeps it in the Profile's meta, and `schedlab fidelity
--held-out` takes it before and after each model, beside its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.timing import back_to_back_median_us
from schedlab.exec.threads import set_intra_op_threads

MM_SHAPE = (512, 1024, 1024)  # compute-bound: about 1 GFLOP
ADD_ELEMS = 1 << 22  # memory-bound: 48 MB of traffic, far beyond the caches
REPS = 5


@dataclass(frozen=True)
class HostScaling:
    """One-thread time over `threads`-thread time of a compute-bound and a memory-bound op."""

    threads: int
    compute_speedup: float
    memory_speedup: float
    compute_1t_us: float
    memory_1t_us: float

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "compute_speedup": round(self.compute_speedup, 3),
                "memory_speedup": round(self.memory_speedup, 3), "compute_1t_us": round(self.compute_1t_us, 1),
                "memory_1t_us": round(self.memory_1t_us, 1)}

    @staticmethod
    def from_json(d: Any) -> HostScaling | None:
        """The probe as saved; None for anything else (a file from before the probe)."""
        try:
            return HostScaling(int(d["threads"]), float(d["compute_speedup"]), float(d["memory_speedup"]),
                               float(d["compute_1t_us"]), float(d["memory_1t_us"]))
        except (KeyError, TypeError, ValueError):
            return None


def _median_us(fn: Callable[[], None], threads: int, reps: int) -> float:
    set_intra_op_threads(threads)
    return back_to_back_median_us(fn, reps)


def probe_host_scaling(threads: int, reps: int = REPS) -> HostScaling | None:
    """The probe at `threads` threads (None below 2: nothing to scale). The calling thread's
    intra-op thread count is restored."""
    if threads < 2:
        return None
    m, k, n = MM_SHAPE
    a, b, c = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    x, y, z = torch.randn(ADD_ELEMS), torch.randn(ADD_ELEMS), torch.empty(ADD_ELEMS)

    def mm() -> None:
        torch.mm(a, b, out=c)  # into a kept buffer: no allocation or page fault is timed

    def add() -> None:
        torch.add(x, y, out=z)

    before = set_intra_op_threads(threads)
    try:
        mm1, add1 = _median_us(mm, 1, reps), _median_us(add, 1, reps)
        mmk, addk = _median_us(mm, threads, reps), _median_us(add, threads, reps)
    finally:
        set_intra_op_threads(before)
    return HostScaling(threads, mm1 / mmk, add1 / addk, mm1, add1)
