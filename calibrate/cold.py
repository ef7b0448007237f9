"""What an op pays, in a step, for data that is not in the caches.

A microbenchmark calls an op back to back on the same tensors: megabytes of inputs and the
output buffer it gets back from the allocator stay in the caches, and a memory-bound kernel
runs at cache speed. In a step it does not. Measured on the 2-core development VM (AMD
EPYC, 1 MiB L2 per core, 32 MiB L3, torch 2.13, one thread, scratch models built from
`torch.nn` layers, not the held-out set), per op of a one-slot step against the same call
hot and the same call after 64 MiB were written elsewhere ("cold"):

- a ReLU of 4 MiB after a batch norm: 160 us in the step, 70 hot, 70 + 121 cold; a
  batch-norm backward on 8 MiB: 708 in the step, 263 hot, 263 + 517 cold;
- over the 140 ops of six scratch models that move a MiB or more, the step's excess over
  hot summed to 26.5 ms. Charging each op its cold extra times one share left 15.2 ms
  unexplained at a share of 0.7 (16.7 ms at 1.0). Weighting each input instead by how
  long ago the step last touched it (an eviction curve over reuse distance, measured the
  same way) left 24.1 ms, 17.7 ms with every output cold: an input the previous op has
  just written reads at nearly memory speed too.

So the model has two measured parts (`schedlab calibrate --cold`; off by default):

- per op class and thread count, the extra per MiB an op moves when its data comes from
  memory (`slope_us_per_mib`): calls of the replayed graphs up to 2 ms, and up to a quota
  per class of the others, that read at least `MIN_INPUT_BYTES` are timed after an
  eviction and hot (`time_cold`); a class keeps the median of extra / MiB moved, a class
  without such calls the median over all;
- the machine's in-step share (`share`): the median, over the replayed ops of the
  calibration graphs whose cold extra is at least `SHARE_MIN_US` and `SHARE_MIN_OF_HOT`
  of their hot time, of their excess in the step over hot divided by their own cold
  extra (`fit_share`). Divided by their class's slope instead, and with compute-bound
  ops in, the share of four quick calibrations came out 0.31 to 0.72; as here, 0.67, 0.67 and 0.81.
  The cold probe (`coverage.COLD_PROBE`) has megabyte tensors so that a quick
  calibration has such ops. It is replayed over more steps after more untimed ones than
  the other graphs (`run.replay_steps`): its first steps pay the allocator's fresh pages,
  and timed in them the share of seven quick calibrations read 0.28-1.0 (2026-12-07/08,
  AMD EPYC VM); past them, five read 0.53-0.87 (0.53, 0.73, 0.75, 0.76, 0.87).

An op's cold extra is share x its class's slope x the MiB it moves (`ColdCosts.extra_us`).
The Profile adds it to memory-bound ops (`Profile.cold_us`), and calibration takes it off
the replayed ops before fitting the context extras (`calibrate.context`), so that the two
do not count the same microseconds twice. Judged on the held-out models it did not
predict whole steps better (README, "Cold data"): one share per machine overcharges a
step whose data fits the caches better.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from schedlab.graph import COMPUTE_CLASSES
from schedlab.io import json_number

MIB = float(1 << 20)
MIN_INPUT_BYTES = 1 << 20  # a call reading less has a cold extra within the timing noise
SHARE_MIN_US = 20.0  # replayed ops whose cold extra is smaller say little of the share,
SHARE_MIN_OF_HOT = 0.25  # and those whose cold extra is a smaller share of their hot time
DEFAULT_LLC_BYTES = 32 << 20  # where the kernel does not say (sysfs)
COLD_REPS = 5  # cold calls, and hot ones, per (call, threads)
WARM_CALLS = 6  # calls that make a call's data hot again after an eviction
# The eviction buffer's most. A VM's sysfs may list its socket's whole L3 (480 MiB on the
# 2-core Intel Xeon dev VM), of which it holds a small share. There, on an 8 MiB add (890 us
# hot), writes of 32 / 128 / 256 / 960 MiB left an extra of 417 / 1,050 / 1,022 / 1,202 us
# and took 4 / 14 / 25 / 95 ms each; with 960 MiB, cold timing took 90 s of a quick
# calibration. At 128 MiB the fitted in-step share read 1.0 (clamped) and the slopes half
# those of 960 MiB; at 256 MiB, share 0.53 and slopes within 15% (quick calibration 145 s
# against 218 s, 107-132 s without cold costs).
EVICT_MAX_BYTES = 256 << 20


def llc_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The size of this machine's last-level cache (the highest level sysfs lists)."""
    best_level, best = -1, 0
    for d in sysfs.glob("index*"):
        try:
            level = int((d / "level").read_text())
            text = (d / "size").read_text().strip().upper()
            size = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        except (OSError, ValueError):
            continue
        if level > best_level or (level == best_level and size > best):
            best_level, best = level, size
    return best if best > 0 else DEFAULT_LLC_BYTES


@dataclass(frozen=True)
class ColdPoint:
    """One call timed cold and hot at one thread count."""

    op_class: str
    nbytes: int  # bytes the call reads and writes
    threads: int
    extra_us: float  # median cold call - median hot call
    signature: str = ""  # the call's (calibrate.signature)


@dataclass(frozen=True)
class ColdCosts:
    """Each class's extra per MiB moved cold, and the share of it a step pays (see module docstring)."""

    share: float  # of the cold extra, paid by an op in a step
    slope_us_per_mib: dict[str, dict[int, float]]  # op class -> threads -> us per MiB moved cold
    pooled_us_per_mib: dict[int, float]  # threads -> over every class
    n_points: int = 0  # calls timed cold
    n_share_ops: int = 0  # replayed ops the share was fitted on

    def slope(self, op_class: str, threads: int) -> float:
        row = self.slope_us_per_mib.get(op_class) or self.pooled_us_per_mib
        if not row:
            return 0.0
        if threads in row:
            return row[threads]
        below = [k for k in row if k <= threads]
        return row[max(below)] if below else row[min(row)]

    def cold_us(self, op_class: str, nbytes: float, threads: int) -> float:
        """What a call of `op_class` moving `nbytes` pays with all its data in memory."""
        return self.slope(op_class, threads) * max(0.0, nbytes) / MIB

    def paid_slope(self, op_class: str, threads: int) -> float:
        """`slope` as a step pays it: none for a compute-bound class (`graph.COMPUTE_CLASSES`:
        charged, the built-in cnn's convolutions came out 16-21% slow)."""
        return 0.0 if op_class in COMPUTE_CLASSES else self.slope(op_class, threads)

    def extra_us(self, op_class: str, nbytes: float, threads: int) -> float:
        """What such a call pays in a step: the share of `cold_us` at its `paid_slope`
        (`ProfileColumns` does the same arithmetic over arrays)."""
        return self.share * (self.paid_slope(op_class, threads) * max(0.0, nbytes) / MIB)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": "share_x_class_slope",
            "share": round(self.share, 4),
            "slope_us_per_mib": {
                cls: {str(k): round(v, 4) for k, v in sorted(row.items())}
                for cls, row in sorted(self.slope_us_per_mib.items())
            },
            "pooled_us_per_mib": {str(k): round(v, 4) for k, v in sorted(self.pooled_us_per_mib.items())},
            "n_points": self.n_points,
            "n_share_ops": self.n_share_ops,
        }

    @staticmethod
    def from_json(d: Any) -> ColdCosts:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")

        def row(raw: Any, what: str) -> dict[int, float]:
            if not isinstance(raw, dict):
                raise TypeError(f"{what} must be an object of threads -> us per MiB")
            return {int(k): json_number(v, f"{what}.{k}", minimum=0.0) for k, v in raw.items()}

        slopes = d.get("slope_us_per_mib", {})
        if not isinstance(slopes, dict):
            raise TypeError("slope_us_per_mib must be an object of op class -> threads -> us per MiB")
        return ColdCosts(
            share=_share(d.get("share", 0.0)),
            slope_us_per_mib={str(c): row(r, f"slope_us_per_mib.{c}") for c, r in slopes.items()},
            pooled_us_per_mib=row(d.get("pooled_us_per_mib", {}), "pooled_us_per_mib"),
            n_points=int(d.get("n_points", 0)),
            n_share_ops=int(d.get("n_share_ops", 0)),
        )


def _share(v: Any) -> float:
    x = json_number(v, "share", minimum=0.0)
    if x > 1.0:
        raise ValueError(f"share must lie in [0, 1], not {v!r}")
    return x


class Evictor:
    """Writes a buffer of twice the last-level cache (at most `EVICT_MAX_BYTES`), pushing
    other data out of the caches."""

    def __init__(self, torch: Any, llc: int | None = None) -> None:
        nbytes = min(2 * (llc or llc_bytes()), EVICT_MAX_BYTES)
        self.buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)

    def __call__(self) -> None:
        self.buf.add_(1.0)


def time_cold(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], threads: Iterable[int],
    set_threads: Callable[[int], Any], evict: Callable[[], None], reps: int = COLD_REPS,
) -> dict[int, float]:
    """Per thread count, the median of `reps` calls each after `evict`, less the median of
    `reps` calls after `WARM_CALLS` back to back, in us: what the call pays for its data
    coming from memory. The calls right after a cold one are not hot yet (measured: a
    batch-norm backward on 8 MiB of inputs took 960, 2200, 2000, 720, 550 us in the five
    calls after an eviction, 300-480 us hot), so cold and hot calls are not paired."""
    out: dict[int, float] = {}
    for k in threads:
        set_threads(k)
        for _ in range(WARM_CALLS):
            fn(*args, **kwargs)
        hot = statistics.median(_timed_ns(fn, args, kwargs) for _ in range(max(1, reps)))
        cold = []
        for _ in range(max(1, reps)):
            evict()
            cold.append(_timed_ns(fn, args, kwargs))
        out[k] = (statistics.median(cold) - hot) / 1e3
    return out


def _timed_ns(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Nanoseconds of one call of `fn`; its output is freed before returning."""
    t0 = time.perf_counter_ns()
    res = fn(*args, **kwargs)
    t1 = time.perf_counter_ns()
    del res
    return t1 - t0


def fit_slopes(points: Sequence[ColdPoint]) -> tuple[dict[str, dict[int, float]], dict[int, float]]:
    """Each class's median extra per MiB moved cold, per thread count (at least 0), and the
    median over every point per thread count."""
    by_class: dict[tuple[str, int], list[float]] = {}
    pooled: dict[int, list[float]] = {}
    for p in points:
        if p.nbytes <= 0:
            continue
        per_mib = p.extra_us / (p.nbytes / MIB)
        by_class.setdefault((p.op_class, p.threads), []).append(per_mib)
        pooled.setdefault(p.threads, []).append(per_mib)
    slopes: dict[str, dict[int, float]] = {}
    for (cls, k), xs in by_class.items():
        slopes.setdefault(cls, {})[k] = max(0.0, statistics.median(xs))
    return slopes, {k: max(0.0, statistics.median(xs)) for k, xs in pooled.items()}


def fit_share(replayed: Iterable[tuple[float, float, float]]) -> tuple[float, int]:
    """The in-step share: the median of excess / cold extra over the (excess over hot in a
    step, cold extra, hot time) of replayed ops whose cold extra is at least `SHARE_MIN_US`
    and `SHARE_MIN_OF_HOT` of their hot time (a 10 ms matmul's 200 us cold extra is within
    its step's noise), clipped to [0, 1]; 0 with no such op (nothing measured says what a
    step pays). Also how many ops it was fitted on."""
    ratios = [
        excess / cold for excess, cold, hot in replayed if cold >= max(SHARE_MIN_US, SHARE_MIN_OF_HOT * hot)
    ]
    if not ratios:
        return 0.0, 0
    return min(1.0, max(0.0, statistics.median(ratios))), len(ratios)


class ReplayedOp(NamedTuple):
    """One op of a replayed calibration graph, as the share is fitted on it."""

    signature: str
    op_class: str
    nbytes: int
    excess_us: float  # its time in the step less its hot call
    hot_us: float


def cold_lookup(points: Sequence[ColdPoint]) -> Callable[[str, str, float], float]:
    """`cold_us(signature, op class, bytes)`: the one-thread cold extra timed for that
    signature, else its class's slope (or the pooled one) times its bytes."""
    slopes, pooled = fit_slopes(points)
    unit = ColdCosts(1.0, slopes, pooled)
    own = {p.signature: p.extra_us for p in points if p.threads == 1 and p.signature}

    def cold_us(signature: str, op_class: str, nbytes: float) -> float:
        return own[signature] if signature in own else unit.cold_us(op_class, nbytes, 1)

    return cold_us


def share_points(points: Sequence[ColdPoint], replayed: Iterable[ReplayedOp]) -> list[tuple[str, float, float, float]]:
    """Each replayed op as the share is fitted on it: (op class, excess over hot in the
    step, its cold extra (`cold_lookup`), hot time), all in us. Calibration keeps them in
    the Profile's meta (``cold_share_points``), so that a fit of the share can be tried
    again on a saved profile."""
    cold_us = cold_lookup(points)
    return [(o.op_class, o.excess_us, cold_us(o.signature, o.op_class, o.nbytes), o.hot_us) for o in replayed]


def fit_cold(points: Sequence[ColdPoint], replayed: Iterable[ReplayedOp]) -> ColdCosts:
    """The cold costs from the calls timed cold, and the share (`fit_share`) from the
    replayed ops, each divided by its cold extra (`share_points`)."""
    return cold_from(points, share_points(points, replayed))


def cold_from(points: Sequence[ColdPoint], kept: Sequence[tuple[str, float, float, float]]) -> ColdCosts:
    """`fit_cold` from the replayed ops' `share_points` already computed (`kept`)."""
    slopes, pooled = fit_slopes(points)
    share, n = fit_share((excess, cold, hot) for _, excess, cold, hot in kept)
    return ColdCosts(share, slopes, pooled, len(points), n)


def tensor_bytes(values: Iterable[Any]) -> int:
    """Bytes of the tensors among `values` (lists and tuples looked into)."""
    import torch

    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, (list, tuple)):
            total += tensor_bytes(v)
    return total
