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

The probe also times a tiny call, a one-element `add` into a kept output called back to
back: what the interpreter and the dispatcher cost an op, which a small model's step is
made of and which the `mm` does not see. Between two quick calibrations of 2026-12-07 (the
2-core Intel Xeon VM) the executor's own per-op floor went from 1.18 to 1.68 us while the
one-thread `mm` moved 3%; the dev set's small models ran their one-slot plans 1.36-1.75x
slower in a run of the hour before than in one two hours earlier, their big ones 1.05-1.10x.
Neither figure sees every drift: in a run of the hour after, the tiny call read 0.89-1.07x
and the `mm` 1.01-1.08x their calibration while the held-out models' one-slot steps ran
1.05-1.22x their time of three hours before.
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
TINY_CALLS = 200  # tiny calls per timed rep: far above the timer's resolution


@dataclass(frozen=True)
class HostScaling:
    """One-thread time over `threads`-thread time of a compute-bound and a memory-bound op."""

    threads: int
    compute_speedup: float
    memory_speedup: float
    compute_1t_us: float
    memory_1t_us: float
    call_us: float = 0.0  # one tiny call (interpreter and dispatcher); 0: a probe from before it was timed

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "compute_speedup": round(self.compute_speedup, 3),
                "memory_speedup": round(self.memory_speedup, 3), "compute_1t_us": round(self.compute_1t_us, 1),
                "memory_1t_us": round(self.memory_1t_us, 1), "call_us": round(self.call_us, 3)}

    @staticmethod
    def from_json(d: Any) -> HostScaling | None:
        """The probe as saved; None for anything else (a file from before the probe)."""
        try:
            return HostScaling(int(d["threads"]), float(d["compute_speedup"]), float(d["memory_speedup"]),
                               float(d["compute_1t_us"]), float(d["memory_1t_us"]), float(d.get("call_us", 0.0)))
        except (AttributeError, KeyError, TypeError, ValueError):
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

    one, out1, add_out = torch.ones(1), torch.empty(1), torch.ops.aten.add.out

    def tiny() -> None:
        for _ in range(TINY_CALLS):
            add_out(one, one, out=out1)

    before = set_intra_op_threads(threads)
    try:
        mm1, add1 = _median_us(mm, 1, reps), _median_us(add, 1, reps)
        call_us = _median_us(tiny, 1, reps) / TINY_CALLS
        mmk, addk = _median_us(mm, threads, reps), _median_us(add, threads, reps)
    finally:
        set_intra_op_threads(before)
    return HostScaling(threads, mm1 / mmk, add1 / addk, mm1, add1, call_us)
