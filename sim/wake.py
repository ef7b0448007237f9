"""Where a co-run plan pays to wake its ops' OpenMP helpers, as a co-run slowdown factor.

Once a worker of the co-run executor runs an op with two or more intra-op threads, libgomp
manages more threads than there are cores and lets every helper sleep right after its
parallel region; the op's next region wakes it (`calibrate.wake` measures what that costs:
a cost model's `wake_us(op, threads)`, over all of a call's regions). A helper that lands on
an idle core pays the wake. One that lands on a core busy with another kernel is
time-sliced there, which the processor-sharing server already charges, except for the
call's first region: as the executor's traces read, the team that just ran on both cores
is held off them until the other team has had its turn, and the call waits that out
before its regions interleave with the other team's. So beside a busy team a call pays
one region's wake, the cost model's `region_wake_us(threads)` (the fit over every class:
a small call's one region), and no more than its whole wake. On a CPU device with two or
more slots, an op of k >= 2 threads runs at its co-run rate divided further by

    1 + wake_us / kernel_us * (idle_share + busy_share * first),
    idle_share = min(1, idle / (k - 1)),   busy_share = 1 - min(1, (cores - 1 - busy) / (k - 1)),
    first = min(1, region_wake_us / wake_us),

where busy is the number of cores the other kernels keep busy, idle = cores - 1 - busy -
held the number its helpers find idle, and held is 1 while another worker runs Python
under the interpreter lock (dispatching its next op: its core is awake, and a helper that
lands there is time-sliced, not woken from a halt, and waits out no team). So every engine
re-rates the running kernels when a worker takes the lock for a dispatch
(`FluidShare.hold`) and when the dispatch ends. With one slot the executor runs every op
on its main thread, whose one team fits the cores: nothing is throttled and nothing is
added. A cost model without `region_wake_us` charges nothing beside a busy team.

Measured on the 2-core Intel Xeon VM (2026-12-07, `scripts/corun_pairs.py` and the log's
"Session 52"): at two slots of two threads two overlapping `mm` of 440 and 518 us took
1,354 and 619 us, where processor sharing ends both by 958, while an LSTM layer's two
directions, of a region per time step, took 1.7-1.9x their one-slot time each. Re-scored on
session 50's runs (`fidelity --rescore`, the waits fitted again), the first region's wake
took the dev runs 13.3% / 11.8% to 11.7% / 9.9% and 14.7% / 10.8% to 13.2% / 9.1%
(profile-only / trace-calibrated), the three held-out runs 8.8% / 8.6% to 8.0% / 7.7%,
10.3% / 8.0% to 9.7% / 7.4% and 10.7% / 10.7% to 9.3% / 9.0%. A held-out run measured
afresh with it (run BC, 08:10-08:13, its own quick profile) read 8.7% / 7.2%, where the
previous model reads 9.8% / 8.3% on the same measurements.

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


def region_cost(cost: object) -> Callable[[int], float] | None:
    """The cost model's `region_wake_us(threads)`, or None where it has none."""
    fn = getattr(cost, "region_wake_us", None)
    return fn if callable(fn) else None


def idle_share(busy_others: int, threads: int, cores: int, held: int = 0) -> float:
    """Share (0..1) of an op's `threads - 1` helpers that find an idle core, `held` more
    cores kept awake by a worker running Python under the interpreter lock."""
    if threads < 2:
        return 0.0
    return min(1.0, max(0, cores - 1 - busy_others - held) / (threads - 1))


def busy_share(busy_others: int, threads: int, cores: int) -> float:
    """Share (0..1) of an op's `threads - 1` helpers that land on a core another kernel
    keeps busy (a core running a worker's Python is not one: see the module docstring)."""
    if threads < 2:
        return 0.0
    return 1.0 - min(1.0, max(0, cores - 1 - busy_others) / (threads - 1))


def first_shares(wake_us: np.ndarray, region_us: np.ndarray) -> np.ndarray:
    """Per op: the share of its wake a call pays beside a busy team, one region's
    (`region_us`) over its whole wake, at most 1; 0 where it pays no wake."""
    out = np.zeros(len(wake_us), dtype=np.float64)
    pays = wake_us > 0.0
    out[pays] = np.minimum(1.0, region_us[pays] / wake_us[pays])
    return out


def cost_first_shares(cost: object, wake_us: np.ndarray, threads: Sequence[int] | np.ndarray) -> np.ndarray | None:
    """`first_shares` of each op with the cost model's `region_wake_us` at its thread count
    (asked once per count), or None for a cost model without it: what every engine passes
    as `firsts`."""
    region = region_cost(cost)
    if region is None:
        return None
    counts, at = np.unique(np.asarray(threads, dtype=np.int64), return_inverse=True)
    per_count = np.fromiter((float(region(int(k))) for k in counts), dtype=np.float64, count=len(counts))
    return first_shares(wake_us, per_count[at.reshape(-1)])


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
    slowdown: SlowdownFn, fractions: Sequence[float], threads: Sequence[int], cores: int, held: int = 0,
    firsts: Sequence[float] | None = None,
) -> SlowdownFn:
    """`slowdown` times each op's wake factor (see the module docstring); `held`: while a
    worker holds the interpreter lock (`FluidShare.hold`); `firsts`: each op's
    `first_shares` (None: no charge beside a busy team)."""

    def slowed(op: int, busy_others: int) -> float:
        base = slowdown(op, busy_others)
        frac = fractions[op]
        if frac == 0.0:
            return base
        k = threads[op]
        charged = idle_share(busy_others, k, cores, held)
        if firsts is not None:
            charged = charged + busy_share(busy_others, k, cores) * firsts[op]
        return base * (1.0 + frac * charged)

    return slowed


def wake_table(
    table: np.ndarray, fractions: np.ndarray, threads: np.ndarray, cores: int, held: int = 0,
    firsts: np.ndarray | None = None,
) -> np.ndarray:
    """`table[op, busy cores of the others]` times each op's wake factor: a new array, the
    same floats `with_wake` gives."""
    busy = np.arange(table.shape[1], dtype=np.int64)
    helpers = np.maximum(threads - 1, 1)[:, None]
    multi = (threads >= 2)[:, None]
    charged = np.where(multi, np.minimum(1.0, np.maximum(0, cores - 1 - busy - held)[None, :] / helpers), 0.0)
    if firsts is not None:
        beside = np.where(multi, 1.0 - np.minimum(1.0, np.maximum(0, cores - 1 - busy)[None, :] / helpers), 0.0)
        charged = charged + beside * firsts[:, None]
    factor = 1.0 + fractions[:, None] * charged
    return np.where(fractions[:, None] == 0.0, table, table * factor)
