"""Memory-bound ops timed hot (back to back, as calibration's benchmarks call them) and cold
(the caches flushed before each call, as a step's data can be when its producer ran long
before), over tensor sizes from L2 to beyond L3, at one thread.

On the 2-core development VM (AMD EPYC, 2 MiB L2 per core, 32 MiB L3; 2026-11-27, two runs)
cold took 1.2-3.4x hot for tensors of 1-8 MiB and 1.0-1.8x at 16 MiB, where neither fits; on the
held-out models the quick Profile predicted the same classes (gelu, relu, threshold_backward,
add, batch-norm backward) at 0.3-0.7 of their one-thread time in a step, on signatures it
never measured: calibration's in-step extras come from the tiny-size graphs it replays.

Usage: python scripts/hot_cold.py [OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

FLUSH_BYTES = 64 << 20  # twice the development VM's L3
SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 21, 1 << 22)  # elements: 0.25 .. 16 MiB of fp32
REPS = 15


def _median_us(fn: Callable[[], Any], flush: torch.Tensor | None) -> float:
    times = []
    for _ in range(REPS):
        if flush is not None:
            flush.fill_(1)
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times[2:]) / 1e3  # the first calls warm up


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8)
    aten = torch.ops.aten
    rows = []
    print(f"{'op':8} {'elements':>9} {'MiB/tensor':>10} {'hot_us':>9} {'cold_us':>9} {'cold/hot':>8}")
    for n in SIZES:
        x, g = torch.randn(n), torch.randn(n)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("gelu", partial(aten.gelu.default, x)),
            ("relu", partial(aten.relu.default, x)),
            ("gelu_bw", partial(aten.gelu_backward.default, g, x)),
            ("add", partial(aten.add.Tensor, x, g)),
        ]
        for name, fn in cases:
            hot, cold = _median_us(fn, None), _median_us(fn, flush)
            rows.append({"op": name, "elements": n, "hot_us": round(hot, 2), "cold_us": round(cold, 2)})
            print(f"{name:8} {n:9d} {n * 4 / 2**20:10.2f} {hot:9.1f} {cold:9.1f} {cold / hot:8.2f}", flush=True)
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            json.dump({"torch": torch.__version__, "flush_bytes": FLUSH_BYTES, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
