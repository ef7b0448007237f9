"""Whether a call pays its OpenMP helpers' wake (`schedlab.calibrate.wake`) beside a busy
team as it does beside an idle one.

`sim.wake` charges the wake only where a helper finds a halted core, so at two slots of two
threads an op whose other worker is running a kernel pays processor sharing alone. The dev
set scores better if the wake is charged on busy cores too (session 51, the log's
"Session 51"); this says whether a busy core makes a call pay. A few ops are timed at two
threads as calibration times wake cases (`gapped_median_us`): plain, beside the idle team of
`throttled_omp`, and beside a second two-thread team on another thread running `mm` back to
back, or with `--other-gap-us` of Python busy-wait between its calls as a worker's dispatch
leaves them. Processor sharing alone puts the busy side at 2x plain on two cores.

Usage: python scripts/busy_wake.py [--other-gap-us US] [--reps N]
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from schedlab.calibrate.wake import WAKE_ROUNDS, busy_wait_us, gapped_median_us, side_thread, time_wake_pair
from schedlab.exec.threads import set_intra_op_threads

THREADS = 2  # the timed call's team, and the busy one's


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    aten = torch.ops.aten
    x, dw, dense = r(8, 32, 32, 32), r(32, 1, 3, 3), r(32, 32, 3, 3)
    one = [1, 1]
    lstm = torch.nn.LSTM(128, 128, batch_first=True)
    seq = r(8, 32, 128)

    def lstm_layer() -> Any:
        with torch.no_grad():
            return lstm(seq)

    return [
        ("depthwise 3x3 conv 8x32x32x32", aten.convolution.default, (x, dw, None, one, one, one, False, [0, 0], 32)),
        ("  its backward", aten.convolution_backward.default,
         (r(8, 32, 32, 32), x, dw, [0], one, one, one, False, [0, 0], 32, [True, True, False])),
        ("dense 3x3 conv 32->32", aten.convolution.default, (x, dense, None, one, one, one, False, [0, 0], 1)),
        ("batch norm 8x32x32x32", aten._native_batch_norm_legit_functional.default,
         (r(8, 32, 32, 32), torch.ones(32), torch.zeros(32), torch.zeros(32), torch.ones(32), True, 0.1, 1e-5)),
        ("mm 256x256x256", aten.mm.default, (r(256, 256), r(256, 256))),
        ("nn.LSTM layer 8x32x128", lstm_layer, ()),
    ]


@contextmanager
def busy_team(threads: int, gap_us: float) -> Iterator[None]:
    """While inside, another thread runs `mm` of 256x256 at `threads` intra-op threads, with
    `gap_us` of Python busy-wait between calls."""

    def run(ready: threading.Event, stop: threading.Event) -> None:
        set_intra_op_threads(threads)
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        ready.set()
        while not stop.is_set():
            torch.mm(a, b)
            if gap_us > 0.0:
                busy_wait_us(gap_us)

    with side_thread(run, "schedlab-busy-team"):
        yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other-gap-us", type=float, default=0.0, help="Python busy-wait between the busy team's calls")
    ap.add_argument("--reps", type=int, default=15, help=f"timed calls per round (best of {WAKE_ROUNDS} rounds)")
    args = ap.parse_args()
    print(f"{'call':32s} {'plain us':>9s} {'idle team':>10s} {'busy team':>10s}")
    for name, fn, fargs in _cases():
        plain, idle = time_wake_pair(fn, fargs, {}, THREADS, THREADS, reps=args.reps, rounds=WAKE_ROUNDS)
        before = set_intra_op_threads(THREADS)
        try:
            with busy_team(THREADS, args.other_gap_us):
                busy = min(gapped_median_us(fn, fargs, {}, args.reps) for _ in range(WAKE_ROUNDS))
        finally:
            set_intra_op_threads(before)
        print(f"{name:32s} {plain:9.1f} {f'+{idle - plain:.0f}':>10s} {busy / plain:9.2f}x", flush=True)


if __name__ == "__main__":
    main()
