"""Fits of the cost model with scipy, and held-out error.

Points are fitted in log space on the time of a whole op call (the executor's call floor
plus the kernel), so a 2 us op and a 20 ms op weigh the same, and kernels near zero do
not blow up the residuals. A soft-L1 loss keeps a few disturbed timings (a busy
neighbour on a shared machine) from dragging the fit.

Held-out error: the distinct op signatures of a class are split by a seeded shuffle;
about 20% are held out (every thread count of a held-out signature is held out with
it, so the error is that of an unseen shape). The stored parameters are those fitted on
the remaining 80%, so the reported error is the error of exactly what is stored.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares, minimize_scalar

from schedlab.calibrate.model import PARAM_NAMES, Array, WorkThreadsModel, predict_array
from schedlab.calibrate.signature import GROUPED_CLASS, UNBLOCKED_CLASS, base_class
from schedlab.graph import COMPUTE_CLASSES  # the fallback model is fitted on the other classes

MIN_SIGNATURES_FULL_FIT = 8  # fewer: the fallback's shape, scaled to the class
# A class whose shapes span less than this factor of work (bytes and FLOPs alike) gets the
# fallback's shape too: eight tiny `_unsafe_view`s spanning 2-14 KB once fitted a DRAM
# slope of 1.3 s per MB above 60 KB, and predicted 64 ms for one of 115 KB.
MIN_WORK_SPAN_FULL_FIT = 8.0
# The steepest memory slope a fit may take: 5,000 us per MB is 0.2 GB/s, slower than any
# memory-bound op of a CPU; a steeper one is a fit to the noise of a few small points.
MAX_US_PER_MB = 5000.0
# Variants that always take their plain class's shape times one factor (`fit_class`), however
# many cases calibration timed: a quick calibration times a grouped convolution a dozen times
# or so, at group counts from 2 to one per channel. Fitted in full on those (2026-12-07, 2-core
# Intel Xeon VM, session 52's profile fitted again from its own cases), its two models missed
# their held-out cases by 72% and 26% and put held-out depthwise-cnn's one-slot step 80% slow;
# as a factor of the dense fit (x1.9 for the backward, x1.4 forward), -1.9% where the dense fit
# read -12.7%.
SCALED_VARIANTS = (GROUPED_CLASS, UNBLOCKED_CLASS)
HOLDOUT_FRAC = 0.2
MIN_SIGNATURES_HOLDOUT = 5  # fewer: no held-out error (null)
CACHE_MB_RANGE = (0.05, 256.0)  # where the fitted cache cliff may lie


@dataclass(frozen=True)
class Point:
    """One measured (op signature, threads) point."""

    signature: str
    op_class: str
    flops: float
    nbytes: int
    threads: int
    call_us: float  # median time of the bare op call (floor + kernel)


# Beyond these (percent), a class fit is not used: the roofline stands in (see ClassFit.trusted).
UNTRUSTED_TRAIN_MAPE = 100.0
UNTRUSTED_UNSEEN_MAPE = 200.0


@dataclass(frozen=True)
class ClassFit:
    """A fitted model for one op class, and how well it predicts unseen shapes."""

    model_name: str  # "work_threads" (own fit) or "work_threads_scaled" (fallback shape)
    model: WorkThreadsModel
    heldout_mape: float | None  # percent, on the call time of held-out signatures
    heldout_wape: float | None  # percent, sum|error| / sum(time): weighted by time
    train_mape: float  # percent, on the points the parameters were fitted on
    n_points: int
    n_signatures: int
    n_heldout: int

    @property
    def trusted(self) -> bool:
        """Whether the fit describes its class: it misses its own training points by at most
        UNTRUSTED_TRAIN_MAPE and its held-out signatures by at most UNTRUSTED_UNSEEN_MAPE.
        A fit beyond either predicts unseen shapes worse than the measured roofline (a fit
        of 10 points that missed them by 117% put 0.07 GFLOP/s on gelu_backward)."""
        if self.train_mape > UNTRUSTED_TRAIN_MAPE:
            return False
        return self.heldout_mape is None or self.heldout_mape <= UNTRUSTED_UNSEEN_MAPE


def split_signatures(signatures: Sequence[str], seed: int, frac: float = HOLDOUT_FRAC) -> set[str]:
    """The held-out signatures: a seeded shuffle of the sorted distinct signatures."""
    distinct = sorted(set(signatures))
    if len(distinct) < MIN_SIGNATURES_HOLDOUT:
        return set()
    rng = random.Random(seed)
    rng.shuffle(distinct)
    n_out = max(1, round(frac * len(distinct)))
    return set(distinct[:n_out])


def _arrays(points: Sequence[Point]) -> tuple[Array, Array, Array, Array]:
    return (
        np.array([p.flops for p in points], dtype=np.float64),
        np.array([float(p.nbytes) for p in points], dtype=np.float64),
        np.array([float(p.threads) for p in points], dtype=np.float64),
        np.array([p.call_us for p in points], dtype=np.float64),
    )


def mape(pred: Array, meas: Array) -> float:
    """Mean absolute percentage error, percent."""
    return float(np.mean(np.abs(pred - meas) / meas) * 100.0)


def wape(pred: Array, meas: Array) -> float:
    """Weighted absolute percentage error, percent: sum|pred - meas| / sum(meas)."""
    return float(np.sum(np.abs(pred - meas)) / np.sum(meas) * 100.0)


def fit_work_threads(points: Sequence[Point], floor_us: float) -> WorkThreadsModel:
    """Least-squares fit of the eight model parameters to call times (log residuals)."""
    flops, nbytes, threads, call = _arrays(points)
    log_call = np.log(call)
    lo_log, hi_log = math.log(1e-7), math.log(1e7)

    def unpack(x: Array) -> Array:
        a, f, b, b_dram, cache, p_max, h, c = x
        return np.array(
            [math.exp(a), math.exp(f), math.exp(b), math.exp(b_dram), math.exp(cache), p_max, math.exp(h), math.exp(c)]
        )

    def residuals(x: Array) -> Array:
        pred = floor_us + predict_array(unpack(x), flops, nbytes, threads)
        return np.asarray(np.log(np.maximum(pred, 1e-9)) - log_call, dtype=np.float64)

    # Starting points: per-unit costs from the median of the points, split both ways.
    kernel = np.maximum(call - floor_us, 1e-3)
    f0 = float(np.median(kernel / np.maximum(flops * 1e-9, 1e-12)))
    b0 = float(np.median(kernel / np.maximum(nbytes * 1e-6, 1e-12)))
    starts = []
    for fs, bs in ((0.5, 0.5), (1.0, 1e-3), (1e-3, 1.0)):
        for h_us, cache0 in ((3.0, 1.0), (100.0, 8.0)):
            starts.append(
                [
                    math.log(max(float(np.min(kernel)), 1e-3)),
                    math.log(min(max(f0 * fs, 1e-6), 1e6)),
                    math.log(min(max(b0 * bs * 0.3, 1e-6), 1e6)),
                    math.log(min(max(b0 * bs, 1e-6), 1e6)),
                    math.log(cache0),  # cache_mb
                    0.8,
                    math.log(h_us),
                    math.log(1.0),
                ]
            )
    # The cache hinge must lie where the data can pin its slope down: at least a fifth of
    # the points above it (else a slope fitted to nothing extrapolates wildly).
    cache_hi = min(CACHE_MB_RANGE[1], max(2 * CACHE_MB_RANGE[0], float(np.quantile(nbytes * 1e-6, 0.8))))
    lower = [lo_log, lo_log, lo_log, lo_log, math.log(CACHE_MB_RANGE[0]), 0.0, lo_log, lo_log]
    mb_hi = math.log(MAX_US_PER_MB)
    # Where not a fifth of the points lie at or above the highest hinge allowed, nothing
    # pins a slope beyond it: no hinge (the in-cache slope extrapolates).
    dram_hi = mb_hi if float(np.mean(nbytes * 1e-6 >= cache_hi)) >= 0.2 else lo_log + 1e-6
    upper = [hi_log, hi_log, mb_hi, dram_hi, math.log(cache_hi), 1.0, hi_log, hi_log]
    best = None
    for x0 in starts:
        x0 = [min(max(v, lo + 1e-9), hi - 1e-9) for v, lo, hi in zip(x0, lower, upper, strict=True)]
        res = least_squares(residuals, x0, bounds=(lower, upper), loss="soft_l1", f_scale=0.1, max_nfev=2000)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    theta = unpack(best.x)
    return WorkThreadsModel(**{k: float(v) for k, v in zip(PARAM_NAMES, theta, strict=True)})


def fit_scale(points: Sequence[Point], floor_us: float, shape: WorkThreadsModel) -> WorkThreadsModel:
    """The factor s minimising log error of floor + s * shape(points); `shape` scaled by s."""
    flops, nbytes, threads, call = _arrays(points)
    base = predict_array(np.array([getattr(shape, k) for k in PARAM_NAMES]), flops, nbytes, threads)
    log_call = np.log(call)

    def loss(log_s: float) -> float:
        pred = floor_us + math.exp(log_s) * base
        return float(np.sum((np.log(np.maximum(pred, 1e-9)) - log_call) ** 2))

    res = minimize_scalar(loss, bounds=(math.log(1e-4), math.log(1e4)), method="bounded")
    return shape.scaled(math.exp(float(res.x)))


def _predict_call(model: WorkThreadsModel, points: Sequence[Point], floor_us: float) -> Array:
    flops, nbytes, threads, _ = _arrays(points)
    theta = np.array([getattr(model, k) for k in PARAM_NAMES])
    return floor_us + predict_array(theta, flops, nbytes, threads)


def work_span(points: Sequence[Point]) -> float:
    """The larger of max/min bytes and max/min FLOPs over `points` (1.0 for one shape)."""
    spans = []
    for values in ([float(p.nbytes) for p in points], [p.flops for p in points]):
        lo = min((v for v in values if v > 0), default=0.0)
        spans.append(max(values) / lo if lo > 0 else 1.0)
    return max(spans)


def at_floor(points: Sequence[Point], floor_us: float) -> list[Point]:
    """`points` with every call time raised to at least the call floor.

    The model's call time is the floor plus a kernel of at least zero, so a point under the
    floor (an op that ran faster in the step than its benchmark, less the executor's
    dispatch as measured at the start of calibration) says only that its kernel is about
    zero, and the signature table stores it so. Left under the floor (at the 1e-3 us a
    call time is clamped to), such points pulled every parameter to its lower bound in log
    space: the two quick profiles of 13 on 2026-11-28 whose dispatch read 1.8-1.9 us above
    the bare call (the others 0-1.3 us) fitted `add` with no fixed or memory cost (train
    MAPE 11,508% and 23,551%), and one with the dispatch read 1.9 us high on purpose had
    536 of 2,242 points under the floor and 15 classes untrusted (1 with them raised to it)."""
    return [p if p.call_us >= floor_us else replace(p, call_us=floor_us) for p in points]


def fit_class(
    points: Sequence[Point],
    floor_us: float,
    seed: int,
    fallback: WorkThreadsModel | None = None,
    scaled: bool = False,
) -> ClassFit:
    """Fit one class (or the fallback pool when `fallback` is None), with held-out error;
    points under the call floor count as at it (`at_floor`). `scaled`: the class takes
    `fallback`'s shape scaled to its points whatever their number (`SCALED_VARIANTS`)."""
    points = at_floor(points, floor_us)
    sigs = [p.signature for p in points]
    n_sigs = len(set(sigs))
    held = split_signatures(sigs, seed)
    train = [p for p in points if p.signature not in held] or list(points)
    test = [p for p in points if p.signature in held]
    if fallback is not None and (scaled or n_sigs < MIN_SIGNATURES_FULL_FIT or work_span(points) < MIN_WORK_SPAN_FULL_FIT):
        name, model = "work_threads_scaled", fit_scale(train, floor_us, fallback)
    else:
        name, model = "work_threads", fit_work_threads(train, floor_us)
    _, _, _, train_call = _arrays(train)
    heldout_mape = heldout_wape = None
    if test:
        _, _, _, test_call = _arrays(test)
        pred = _predict_call(model, test, floor_us)
        heldout_mape, heldout_wape = mape(pred, test_call), wape(pred, test_call)
    return ClassFit(
        model_name=name,
        model=model,
        heldout_mape=heldout_mape,
        heldout_wape=heldout_wape,
        train_mape=mape(_predict_call(model, train, floor_us), train_call),
        n_points=len(points),
        n_signatures=n_sigs,
        n_heldout=len({p.signature for p in test}),
    )


def fit_all(points: Sequence[Point], floor_us: float, seed: int) -> tuple[ClassFit, dict[str, ClassFit]]:
    """The fallback (fitted on every memory-bound class) and one fit per op class.

    A class too small for a fit of its own takes a shape scaled to its points
    (`fit_class`): a variant (``native_layer_norm_backward[strided]``) its plain class's,
    where that has a trusted fit of its own, else the fallback's. Calibration times most
    variants at one tiny shape (a strided layer-norm backward of 624 elements), and the
    pooled shape scaled to it predicted held-out mixer's strided one of 262 thousand at
    1,116 us (339 measured in its step, 174 predicted for the contiguous one): the plain
    class's shape is fitted over the sizes the sweep spans, and a variant costs about a
    factor of it. A grouped convolution (`SCALED_VARIANTS`) takes that form however many
    cases it has (see there)."""
    pool = [p for p in points if base_class(p.op_class) not in COMPUTE_CLASSES] or list(points)
    fallback = fit_class(pool, floor_us, seed)
    by_class: dict[str, list[Point]] = {}
    for p in points:
        by_class.setdefault(p.op_class, []).append(p)
    classes: dict[str, ClassFit] = {}
    for cls in sorted(by_class, key=lambda c: (base_class(c) != c, c)):  # plain classes first
        plain, shape = classes.get(base_class(cls)), fallback.model
        if plain is not None and plain.model_name == "work_threads" and plain.trusted:
            shape = plain.model
        classes[cls] = fit_class(by_class[cls], floor_us, seed, fallback=shape, scaled=cls.endswith(SCALED_VARIANTS))
    return fallback, dict(sorted(classes.items()))
