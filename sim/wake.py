"""Where a co-run plan pays to wake its ops' OpenMP helpers, as a co-run slowdown factor.

Once a worker of the co-run executor runs an op with two or more intra-op threads, libgomp
manages more threads than there are cores and lets every helper sleep right after its
parallel region; the op's next region wakes it (`calibrate.wake` measures what that costs:
a cost model's `wake_us(op, threads)`). A helper that lands on an idle core pays the wake;
one that lands on a core busy with another kernel is time-sliced there instead, which the
processor-sharing server already charges. So on a CPU device with two or more slots, an op
of k >= 2 threads runs at its co-run rate divided further by

    1 + wake_us / kernel_us * idle_share,   idle_share = min(1, idle / (k - 1)),

where idle = cores - 1 - (cores the other kernels keep busy) - held is the number of cores
its helpers find idle, and held is 1 while another worker runs Python under the
interpreter lock (dispatching its next op: its core is awake, and a helper that lands there
is time-sliced, not woken from a halt). So every engine re-rates the running kernels when
a worker takes the lock for a dispatch (`FluidShare.hold`) and when the dispatch ends.
With one slot the executor runs every op on its main thread, whose one team fits the
cores: nothing is throttled and nothing is added.

The factor multiplies the cost model's own co-run slowdown, as a function of the same
(op, busy cores of the others), so the SimPy, fast and compiled engines charge it alike:
`with_wake` wraps a FluidShare's slowdown function and `wake_table` scales the compiled
engine's table, with the same floating-point operations in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from schedlab.graph import Op

SlowdownFn = Callable[[int, int], float]


def wake_cost(cost: object) -> Callable[[Op, int], float] | None:
    """The cost model's `wake_us(op, threads)`, or None where it has none."""
    fn = getattr(cost, "wake_us", None)
    return fn if callable(fn) else None


def idle_share(busy_others: int, threads: int, cores: int, held: int = 0) -> float:
    """Share (0..1) of an op's `threads - 1` helpers that find an idle core, `held` more
    cores kept awake by a worker running Python under the interpreter lock."""
    if threads < 2:
        return 0.0
    return min(1.0, max(0, cores - 1 - busy_others - held) / (threads - 1))


def wake_fractions(wake_us: np.ndarray, kernel_us: np.ndarray, demand: np.ndarray) -> np.ndarray | None:
    """Per op: its wake cost over its kernel time; 0 where its kernel holds one core
    (`demand`: one thread, or a call run inline, `sim.cost.team_or_inline`, has no helper to
    wake) or has no kernel time. None when no op pays anything."""
    pays = (demand >= 2) & (wake_us > 0.0) & (kernel_us > 0.0)
    if not pays.any():
        return None
    out = np.zeros(len(demand), dtype=np.float64)
    out[pays] = wake_us[pays] / kernel_us[pays]
    return out


def with_wake(
    slowdown: SlowdownFn, fractions: Sequence[float], threads: Sequence[int], cores: int, held: int = 0
) -> SlowdownFn:
    """`slowdown` times each op's wake factor (see the module docstring); `held`: while a
    worker holds the interpreter lock (`FluidShare.hold`)."""

    def slowed(op: int, busy_others: int) -> float:
        base = slowdown(op, busy_others)
        frac = fractions[op]
        if frac == 0.0:
            return base
        return base * (1.0 + frac * idle_share(busy_others, threads[op], cores, held))

    return slowed


def wake_table(table: np.ndarray, fractions: np.ndarray, threads: np.ndarray, cores: int, held: int = 0) -> np.ndarray:
    """`table[op, busy cores of the others]` times each op's wake factor: a new array, the
    same floats `with_wake` gives."""
    busy = np.arange(table.shape[1], dtype=np.int64)
    helpers = np.maximum(threads - 1, 1)[:, None]
    idle = np.minimum(1.0, np.maximum(0, cores - 1 - busy - held)[None, :] / helpers)
    idle = np.where((threads >= 2)[:, None], idle, 0.0)
    factor = 1.0 + fractions[:, None] * idle
    return np.where(fractions[:, None] == 0.0, table, table * factor)
