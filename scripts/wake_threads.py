"""How the wake cost of throttled OpenMP helpers (`schedlab.calibrate.wake`) grows with the
team: a few representative ops timed at 2, 4, 8, ... threads up to the cores, each plain and
with libgomp's spinning throttled, as calibration times them at the most threads only.

Then the same ops at one thread three ways: among one-thread calls only (as a one-thread
plan's step runs them), each right after a call at all the cores (the helpers of that team
still spinning), and as calibration times them (`calibrate.timing.time_point`, rounds over
1..N threads in turn). On a 16-core Xeon the profile charged a one-thread step's
compute-bound kernels 20-48% more than they took there (mm 1.24x, addmm 1.25x, convolution
1.48x, its backward 1.20x; 2026-11-27): this says whether the calibration's order is why.

Usage: python scripts/wake_threads.py [OUT.json]  (prints a table; writes rows as JSON)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from schedlab.calibrate.timing import TimingConfig, time_call, time_point
from schedlab.calibrate.wake import time_wake_pair
from schedlab.exec.threads import set_intra_op_threads


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    aten = torch.ops.aten
    return [
        ("mm 128x512x512", aten.mm.default, (r(128, 512), r(512, 512))),
        ("mm 512x1024x1024", aten.mm.default, (r(512, 1024), r(1024, 1024))),
        ("add 1M", aten.add.Tensor, (r(1 << 20), r(1 << 20))),
        ("add 8M", aten.add.Tensor, (r(1 << 23), r(1 << 23))),
        ("conv 32x64x28x28 k3", aten.convolution.default,
         (r(32, 64, 28, 28), r(64, 64, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        ("layer_norm 8192x512", aten.native_layer_norm.default, (r(8192, 512), [512], r(512), r(512), 1e-5)),
    ]


def main(argv: list[str]) -> int:
    cores = os.cpu_count() or 1
    teams = sorted({1 << k for k in range(1, cores.bit_length()) if 1 << k <= cores} | ({cores} if cores >= 2 else set()))
    rows = []
    print(f"{'op':24} {'threads':>7} {'plain_us':>10} {'throttled_us':>12} {'extra_us':>9}")
    with torch.no_grad():
        for name, fn, args in _cases():
            for k in teams:
                plain_us, throttled_us = time_wake_pair(fn, args, {}, k, cores, reps=7, rounds=3)
                rows.append({"op": name, "threads": k, "cores": cores, "plain_us": round(plain_us, 2),
                             "throttled_us": round(throttled_us, 2), "extra_us": round(max(0.0, throttled_us - plain_us), 2)})
                print(f"{name:24} {k:7} {plain_us:10.1f} {throttled_us:12.1f} {rows[-1]['extra_us']:9.1f}", flush=True)
    one = _one_thread(teams) if cores >= 2 else []
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            json.dump({"cores": cores, "torch": torch.__version__, "rows": rows, "one_thread": one}, f, indent=1)
    return 0


def _one_thread(teams: list[int], reps: int = 15) -> list[dict[str, Any]]:
    """Each case at one thread: alone, right after a call at the most threads, and as
    calibration times it (module docstring)."""
    most = max(teams)
    rows = []
    print(f"\n{'op':24} {'alone_us':>9} {'after_' + str(most) + 't_us':>12} {'calibration_us':>14} "
          f"{'after/alone':>11} {'calib/alone':>11}")
    with torch.no_grad():
        for name, fn, args in _cases():
            set_intra_op_threads(1)
            alone_us, _ = time_call(fn, args, {}, TimingConfig())
            after_ns = []
            for _ in range(reps):
                set_intra_op_threads(most)
                fn(*args)
                set_intra_op_threads(1)
                t0 = time.perf_counter_ns()
                fn(*args)
                after_ns.append(time.perf_counter_ns() - t0)
            best, _ = time_point(fn, args, {}, (1, *teams), TimingConfig(), set_intra_op_threads)
            after_us = statistics.median(after_ns) / 1e3
            rows.append({"op": name, "alone_us": round(alone_us, 2), "after_most_us": round(after_us, 2),
                         "most_threads": most, "calibration_us": round(best[1], 2)})
            print(f"{name:24} {alone_us:9.1f} {after_us:12.1f} {best[1]:14.1f} {after_us / alone_us:11.2f} "
                  f"{best[1] / alone_us:11.2f}", flush=True)
    set_intra_op_threads(1)
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv))
