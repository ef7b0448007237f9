"""What an op costs inside a training step, beyond what it costs called in a tight loop.

A microbenchmark calls one op back to back: its code, its branch history and its data
stay hot. In a step the op runs between other ops, and pays for that. Running the
calibration graphs on the executor (one slot, one thread) and comparing each op's event,
less the executor's own dispatch, with the benchmark of the same call on the same
tensors showed two regimes (2-core development VM, idle, torch 2.13; the built-in
workloads at size tiny and the coverage models at their small shape):

- an op whose target ran before in the step (an unrolled `nn.GRU` cell, the layers of a
  stack, the optimizer's update of each parameter): 0.6 us more than its benchmark
  (median over classes; sigmoid 0.1 us, addmm 1.9 us, a small convolution 21 us);
- the first op of its target in the step (the one `_log_softmax`, the first `addmm`):
  3.6 us more again (median; 2-12 us for most classes, 24-62 us for small convolutions
  and their backward). Over the forty-odd targets of a small model of 160 ops that is a
  tenth of its 1 ms step; over a GRU of 6,000 ops, under 1%.

A replay of the graph in Python between the calls measured several times these extras:
its own interpreter work between ops evicts more than the executor's generated step.

At the default sizes the warm extra grows with the data an op moves: in a benchmark's
tight loop its tensors stay in the caches, in a step they were written long before
(2-core AMD EPYC VM, idle, torch 2.13, one thread: relu +25 us at 1.6 MB to +167 us at
12.6 MB, threshold_backward +101 to +303 us at 2.4-18.9 MB, gelu +294 us at 12.6 MB,
about 10-25 us per MB). A class's median extra, charged to every size of the class,
made a 17-element gelu cost 294 us in the Profile (8 us measured). So the extra of a
call is a line in the megabytes it moves, per class (`WarmLine`: Theil-Sen over the
class's replayed signatures, slope at least 0, never extrapolated beyond the largest
op replayed); a class replayed at one size only gets the intercept over all classes
and the slope its point gives; a class never replayed, the line over all classes.

So calibration stores kernels as they run in a step (`warm`): the benchmark plus the
op's own warm extra (its signature's, else its class's line at the op's bytes, else the
line over all classes), in the signature table and in the points the class models are
fitted on. The
first-use extra is kept per class (`first_use_us`) and charged by a Profile bound to
the graph it predicts (`Profile.for_graph`), to the ops that are the first of their
target in program order (`first_uses`); an unbound Profile charges none.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedlab.graph import Graph


def first_uses(graph: Graph) -> frozenset[int]:
    """Ids of the non-view ops that are the first of their target in program order."""
    seen: set[str] = set()
    out: set[int] = set()
    for op in graph.ops:
        if not op.is_view and op.target not in seen:
            seen.add(op.target)
            out.add(op.id)
    return frozenset(out)


@dataclass(frozen=True)
class Occurrence:
    """One op of a replayed graph: its signature, class, whether it is its target's first
    use, and its call time in sequence (us)."""

    signature: str
    op_class: str
    first_use: bool
    in_seq_us: float
    nbytes: float = 0.0  # the bytes the op reads and writes


@dataclass(frozen=True)
class ContextCosts:
    """The extra (us) of an op in a step over its benchmark, per op class.

    A warm extra is `warm_us[cls] + warm_us_per_mb[cls] * min(MB, warm_max_mb[cls])` (a
    Profile of version 2 before the per-MB terms: the class's constant median)."""

    warm_us: dict[str, float]  # op class -> warm extra at 0 bytes (the line's intercept)
    warm_fallback_us: float  # over every class
    first_use_us: dict[str, float]  # op class -> median extra of its target's first use, over warm
    first_use_fallback_us: float
    warm_us_per_mb: dict[str, float] = field(default_factory=dict)  # op class -> the line's slope
    warm_fallback_us_per_mb: float = 0.0
    warm_max_mb: dict[str, float] = field(default_factory=dict)  # op class -> the largest op replayed
    warm_fallback_max_mb: float = 0.0

    def warm(self, op_class: str, nbytes: float = 0.0) -> float:
        """The warm extra (us) of a call of `op_class` that moves `nbytes`."""
        mb = max(0.0, float(nbytes)) / 1e6
        if op_class in self.warm_us:
            per_mb, cap = self.warm_us_per_mb.get(op_class, 0.0), self.warm_max_mb.get(op_class, 0.0)
            return self.warm_us[op_class] + per_mb * min(mb, cap)
        return self.warm_fallback_us + self.warm_fallback_us_per_mb * min(mb, self.warm_fallback_max_mb)

    def first_use(self, op_class: str) -> float:
        return self.first_use_us.get(op_class, self.first_use_fallback_us)

    def to_json(self) -> dict[str, Any]:
        def r(d: dict[str, float]) -> dict[str, float]:
            return {k: round(v, 4) for k, v in sorted(d.items())}

        return {
            "warm_us": r(self.warm_us),
            "warm_fallback_us": round(self.warm_fallback_us, 4),
            "warm_us_per_mb": r(self.warm_us_per_mb),
            "warm_fallback_us_per_mb": round(self.warm_fallback_us_per_mb, 4),
            "warm_max_mb": r(self.warm_max_mb),
            "warm_fallback_max_mb": round(self.warm_fallback_max_mb, 4),
            "first_use_us": r(self.first_use_us),
            "first_use_fallback_us": round(self.first_use_fallback_us, 4),
        }

    @staticmethod
    def from_json(d: Any) -> ContextCosts:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")

        def number(v: Any, what: str) -> float:
            x = float(v)
            if not math.isfinite(x):
                raise ValueError(f"{what} must be a finite number, not {v!r}")
            return x

        def table(key: str) -> dict[str, float]:
            raw = d.get(key, {})
            if not isinstance(raw, dict):
                raise TypeError(f"{key} must be an object of op class -> us")
            return {str(k): number(v, f"{key}.{k}") for k, v in raw.items()}

        return ContextCosts(
            warm_us=table("warm_us"),
            warm_fallback_us=number(d.get("warm_fallback_us", 0.0), "warm_fallback_us"),
            first_use_us=table("first_use_us"),
            first_use_fallback_us=number(d.get("first_use_fallback_us", 0.0), "first_use_fallback_us"),
            warm_us_per_mb=table("warm_us_per_mb"),
            warm_fallback_us_per_mb=number(d.get("warm_fallback_us_per_mb", 0.0), "warm_fallback_us_per_mb"),
            warm_max_mb=table("warm_max_mb"),
            warm_fallback_max_mb=number(d.get("warm_fallback_max_mb", 0.0), "warm_fallback_max_mb"),
        )


@dataclass(frozen=True)
class WarmLine:
    """extra_us = intercept_us + us_per_mb * min(MB, max_mb)."""

    intercept_us: float
    us_per_mb: float
    max_mb: float


def warm_line(points: Sequence[tuple[float, float]], intercept_us: float | None = None) -> WarmLine:
    """The warm extra as a line in MB through `points` (MB, extra us): Theil-Sen (the
    median of the slopes between points of different sizes, at least 0; the intercept the
    median of what is left), robust to the odd replay a neighbour slowed. Points of one
    size give no slope: then, with `intercept_us` (the line over all classes), the slope
    from it to their median; without, their median as a constant."""
    if not points:
        raise ValueError("warm_line needs at least one point")
    mb = np.array([p[0] for p in points], dtype=np.float64)
    extra = np.array([p[1] for p in points], dtype=np.float64)
    top = float(mb.max())
    i, j = np.triu_indices(len(points), k=1)
    apart = mb[j] != mb[i]
    if apart.any():
        slope = max(0.0, float(np.median((extra[j] - extra[i])[apart] / (mb[j] - mb[i])[apart])))
        return WarmLine(float(np.median(extra - slope * mb)), slope, top)
    mid = float(np.median(extra))
    if intercept_us is None or top <= 0.0:
        return WarmLine(mid, 0.0, top)
    return WarmLine(intercept_us, max(0.0, (mid - intercept_us) / top), top)


NO_CONTEXT = ContextCosts({}, 0.0, {}, 0.0)  # version 1 profiles: kernels as benchmarked


def _median(xs: Iterable[float], default: float = 0.0) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else default


def fit_context(
    occurrences: Sequence[Occurrence], hot_us: dict[str, float]
) -> tuple[ContextCosts, dict[str, float]]:
    """The per-class context extras, and each replayed signature's own warm extra.

    `hot_us`: the benchmarked one-thread call time of each signature (occurrences of a
    signature not benchmarked are ignored).
    """
    warm_by_sig: dict[str, list[float]] = {}
    classes: dict[str, str] = {}
    sig_mb: dict[str, float] = {}
    for o in occurrences:
        if o.signature in hot_us and not o.first_use:
            warm_by_sig.setdefault(o.signature, []).append(o.in_seq_us - hot_us[o.signature])
            classes[o.signature] = o.op_class
            sig_mb[o.signature] = o.nbytes / 1e6
    sig_warm = {sig: statistics.median(xs) for sig, xs in warm_by_sig.items()}
    by_class: dict[str, list[tuple[float, float]]] = {}
    for sig, extra in sig_warm.items():
        by_class.setdefault(classes[sig], []).append((sig_mb[sig], extra))
    every = [p for ps in by_class.values() for p in ps]
    overall = warm_line(every) if every else WarmLine(0.0, 0.0, 0.0)
    lines = {cls: warm_line(ps, overall.intercept_us) for cls, ps in by_class.items()}
    warm = ContextCosts(
        {c: w.intercept_us for c, w in lines.items()}, overall.intercept_us, {}, 0.0,
        {c: w.us_per_mb for c, w in lines.items()}, overall.us_per_mb,
        {c: w.max_mb for c, w in lines.items()}, overall.max_mb,
    )  # fmt: skip

    def warm_of(o: Occurrence) -> float:
        return sig_warm[o.signature] if o.signature in sig_warm else warm.warm(o.op_class, o.nbytes)

    first: dict[str, list[float]] = {}
    for o in occurrences:
        if o.first_use and o.signature in hot_us:
            first.setdefault(o.op_class, []).append(o.in_seq_us - hot_us[o.signature] - warm_of(o))
    first_use_us = {cls: statistics.median(xs) for cls, xs in first.items()}
    first_fallback = _median(x for xs in first.values() for x in xs)
    return dataclasses.replace(warm, first_use_us=first_use_us, first_use_fallback_us=first_fallback), sig_warm
