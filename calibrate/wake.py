"""What a co-running op pays to wake its OpenMP helper threads (libgomp's throttled wait).

ATen's CPU ops run their parallel regions on an OpenMP team per calling thread (threads.py).
Between regions, libgomp's helper threads spin for a while (about 300,000 iterations,
milliseconds) and then sleep, but it spins only about 100 iterations once the threads it
manages outnumber the cores (the documented `GOMP_SPINCOUNT` defaults with
`OMP_WAIT_POLICY` unset). The co-run executor gives each worker its own team, and the
main thread keeps the team it ran the eager step with: as soon as a worker runs an op with
two or more threads, the process manages more OpenMP threads than there are cores, and every
helper goes to sleep right after its region. Its next region must wake it. On the 2-core
development VM, whose idle virtual CPUs halt, that costs about 40-90 us per region, and an op
with many regions (an LSTM layer runs a few per time step) pays it many times over.

Measured there (2026-11-27, lstm-lm, mixer and encoder-classifier, the executor with one
slot and two threads while an idle thread held a second team): steps 1.27x to 1.75x slower,
`mm` 66-86 us more per call, `mkldnn_rnn_layer` 2.3 ms more; with two slots and two threads
the held-out models' steps were predicted 22-30% fast on average before this model (saved
runs re-scored with and without it). The same
op timed back to back pays nothing (its helper is still awake), so `time_wake` times each
call after `GAP_US` of work on the calling thread alone, as a step's smaller ops leave it.

A helper that lands on an idle core pays it all. One that shares a core busy with another
kernel is time-sliced, not woken from a halt, and processor sharing charges that, except
for the call's first region, which waits out the other team's turn: one region's wake, the
pooled fit's at a small call (`Profile.region_wake_us`). The simulator therefore adds this
cost to an op with two or more threads of a co-run plan in proportion to the idle share of
the other cores, and one region's worth of it in proportion to their busy share
(`sim.wake`).

A class's cost is fitted as ``region_share * (base_us + per_work * work_us)``
(`WakeFit`): ``region_share`` (0..1) is how far the op is into its class model's parallel
regime (ATen runs small ops on the calling thread, so they have no helper to wake), and
``work_us`` its one-thread work, for classes whose regions grow with the work (a recurrent
layer's time steps). Each class's two figures are the non-negative fit of least absolute deviation over its
cases, not of least squares: a case's wake is timed as the difference of two medians of a
few calls, and a helper that stays halted through one of them makes it tens of times its
class's typical figure. On the 2-core Intel Xeon VM (2026-12-02, a quick calibration) 45
of `convolution_backward`'s 47 cases paid 55-1,000 us and two paid 4.0 and 17.1 ms; least
squares read 2,202 us + 0.093 x work off them (another calibration of that hour 2,268 +
0.082, which charged `dev:conv-bn`'s largest convolution backward, 25 ms of work at 2
threads, 4.3 ms where the same call timed alone paid 0.7-1.0 ms); least absolute deviation reads 617 us + 0.0085 x work, and the pooled
fit 68 us + 0.041 x work against 194 us + 0.041 x work. Re-scored on the dev set
(`fidelity --rescore`, the same measurements): `conv-bn` 7.9% to 3.2% profile-only, all
eight models 19.8% to 19.3% (trace-calibrated 14.1% to 13.9%); the held-out run O of that
night re-scored on its own profile both ways (the co-run waits fitted again on each):
profile-only 13.8% (least squares) against 13.9%, trace-calibrated 9.3% against 8.3%
(depthwise-cnn 12.5% to 8.0%, grouped-resnet 8.1% to 4.6%).

The region share comes from the class's thread scaling, and some classes fork whatever it
says. oneDNN's LSTM layer is no faster at two threads than at one, yet opens a region per
time step: in a quick calibration of 2026-12-06 its 13 cases paid 316-5,502 us each to wake
their helpers, where a share of at most 0.28 left them the pooled fit's few microseconds,
and `nll_loss_backward` (share 0.01) paid 67 us in each of its 7. So a class with at least
`MIN_UNGATED_POINTS` cases is also fitted without the share (``base_us + per_work *
work_us``, at most its cases' largest extra: `WakeFit.cap_us`), and keeps that form where it
misses its cases by at most `UNGATED_GAIN` of the gated form's miss; such a class forks at
any size (`Profile.forks_at_any_size`: the simulator holds its team, `team_basis_us`). That
calibration chose the form for 14 of 53 classes, the LSTM layer and its backward, the layer
norms and `nll_loss_backward` among them; `tanh`, `convolution` and `convolution_backward`
(0.89, 0.69 and 0.86 of the gated miss) kept the share. Re-scored on the dev run of that
hour (`fidelity --rescore`, the co-run waits fitted again): profile-only 15.2% to 13.9%,
trace-calibrated 11.9% to 10.6%, `dev:lstm` 32.4% to 22.2% (two slots of two threads -62% to
-81% before, -37% to -50% after), no other model more than 0.3 points worse.

That rule still left the convolutions share-gated (their forms' misses 0.82-0.93 apart: the
cases are noisy), though their small calls fork as surely. A direct test reads it off the
small calls themselves (`forks_small`): the median wake of a class's cases below a tenth of
its grain (region share under `SMALL_SHARE`), which ATen would run inline if the class
respected it. On two quick profiles of 2026-12-07 those medians split cleanly: 0.0-2.1 us
for `add`, `mm`, `addmm`, `relu`, `sum`, `cat`, `lerp` and the rest, 27-1,168 us for the
convolutions (142-374), the LSTM layer and its backward (785-1,168), the norms, the pools'
and softmax's backward, `gelu`, `sqrt` and `tanh`. A class whose small calls paid at least
`FORK_EXTRA_US` gets a floor that every call pays under the share-gated part
(``floor_us + region_share * (base_us + per_work * work_us)``, capped), fitted the same way;
one whose small calls paid nothing is share-gated whatever the misses say (`lerp` and
`select_backward` had been taken as forking); the miss rule decides only where a class has
fewer than `MIN_SMALL_POINTS` small cases. Re-scored (the waits fitted again): the dev runs
of that night 14.0% / 12.6% to 13.3% / 11.8% and 15.8% / 12.0% to 14.7% / 10.8%
(`dev:lstm` 25.7% to 20.5%, `dev:dwconv` 24.4% to 22.1%); the held-out runs 8.9% / 8.7% to
8.8% / 8.6% and 10.4% / 10.3% to 10.7% / 10.7%.

The fits are timed at the most threads calibration benchmarks (all
the cores: 2 here). On a host of more cores every fourth case is timed at each smaller
count of two or more too, and `fit_wake_scale` gives the wake there as a share of the fits'
(`wake_share`), since a larger team has more helpers to wake and the region ends with
the last. Whether that matters is open: on a 16-core Xeon (2026-11-27,
`scripts/wake_threads.py`, six ops, one run) its three small ops paid 2-43 us at 2 and 4
threads and 37-76 us at 16, but against the 16-thread fits the median share at 2, 4 and 8 threads was
0.87, 0.77 and 1.33.
"""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import linprog

from schedlab.calibrate.model import WorkThreadsModel
from schedlab.exec.threads import set_intra_op_threads

GAP_US = 300.0  # work on the calling thread alone before each timed call
WAKE_REPS = 7  # timed calls per round, at most
WAKE_BUDGET_US = 20_000.0  # what one side of one round may take: long calls get fewer reps (at least 2)
WAKE_ROUNDS = 2  # rounds, alternating plain and throttled; each keeps its best round median
MIN_FIT_POINTS = 3  # cases in a class's parallel regime for the class to get its own fit
MIN_UNGATED_POINTS = 6  # cases of a class for a fit without the region share (`fit_wake`)
UNGATED_GAIN = 0.5  # ... taken where it misses them by at most this share of the gated form's miss
# The direct test of forking at any size (`forks_small`): a class's cases below this region
# share, which ATen would run on the calling thread, ...
SMALL_SHARE = 0.1
MIN_SMALL_POINTS = 3  # ... at least this many of them ...
FORK_EXTRA_US = 10.0  # ... paying at least this much (median) to wake helpers: they forked
POOLED = "*"  # the key of the fit over every class, for classes without their own


@dataclass(frozen=True)
class WakeFit:
    """extra_us = region_share * (base_us + per_work * work_us), or without the share where
    the class's cases fit better so (`share_gated` False); see the module docstring."""

    base_us: float
    per_work: float
    threads: int  # the intra-op thread count it was measured at
    n_points: int
    # whether the charge is times the op's region share (the form of every fit before
    # 2026-12-06, and of the pooled one); False: the class forks its regions at any size
    share_gated: bool = True
    cap_us: float | None = None  # the most it charges (a class that forks at any size: its cases' largest extra)
    # what every call pays whatever its share, before the share-gated part: a class whose
    # small calls were seen to fork (`forks_small`; fitted so since 2026-12-07)
    floor_us: float = 0.0

    def extra_us(self, region_share: float, work_us: float) -> float:
        extra = self.floor_us + (region_share if self.share_gated else 1.0) * (self.base_us + self.per_work * work_us)
        return extra if self.cap_us is None else min(extra, self.cap_us)

    @property
    def forks_at_any_size(self) -> bool:
        """Whether a call of any size pays: a fit without the share, or with a floor."""
        return not self.share_gated or self.floor_us > 0.0

    def to_json(self) -> dict[str, Any]:
        return {"base_us": self.base_us, "per_work": self.per_work, "threads": self.threads, "n_points": self.n_points,
                "share_gated": self.share_gated, "cap_us": self.cap_us, "floor_us": self.floor_us}

    @staticmethod
    def from_json(d: Any) -> WakeFit:
        if not isinstance(d, dict):
            raise TypeError("a wake fit must be an object")
        base, per_work = float(d["base_us"]), float(d["per_work"])
        if not (base >= 0.0 and per_work >= 0.0):  # also refuses NaN
            raise ValueError(f"a wake fit's base_us and per_work must be >= 0, got {base} and {per_work}")
        gated = d.get("share_gated", True)
        if not isinstance(gated, bool):
            raise TypeError(f"a wake fit's share_gated must be true or false, got {gated!r}")
        cap = d.get("cap_us")
        if cap is not None and not float(cap) >= 0.0:
            raise ValueError(f"a wake fit's cap_us must be >= 0 or null, got {cap}")
        floor = float(d.get("floor_us", 0.0))
        if not floor >= 0.0:
            raise ValueError(f"a wake fit's floor_us must be >= 0, got {floor}")
        return WakeFit(base_us=base, per_work=per_work, threads=int(d["threads"]), n_points=int(d["n_points"]),
                       share_gated=gated, cap_us=None if cap is None else float(cap), floor_us=floor)


def region_share(model: WorkThreadsModel, flops: float, nbytes: float) -> float:
    """How far (0..1) an op is into its class's parallel regime: its parallel share over
    the class's largest (``p / p_max``, which is work / (work + h_us))."""
    work = model.work_us(flops, nbytes)
    return work / (work + model.h_us) if work > 0.0 else 0.0


@contextmanager
def side_thread(run: Callable[[threading.Event, threading.Event], None], name: str) -> Iterator[None]:
    """While inside, `run(ready, stop)` runs on a daemon thread called `name`: it sets `ready`
    once its team is up (within 10 s, else RuntimeError) and returns soon after `stop` is
    set, which leaving the block does (joined for at most 10 s)."""
    ready, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=run, args=(ready, stop), name=name, daemon=True)
    worker.start()
    try:
        if not ready.wait(timeout=10.0):
            raise RuntimeError(f"the side thread {name!r} did not start within 10 s")
        yield
    finally:
        stop.set()
        worker.join(timeout=10.0)


@contextmanager
def throttled_omp(cores: int) -> Iterator[None]:
    """While inside, another thread holds an idle OpenMP team of `cores` threads, as the
    executor's main thread does: with any other team of two or more threads, libgomp then
    manages more threads than there are cores and throttles its helpers' spinning, as the
    co-run executor's workers find it."""

    def hold(ready: threading.Event, stop: threading.Event) -> None:
        set_intra_op_threads(cores)
        torch.add(torch.ones(1 << 18), torch.ones(1 << 18))  # a parallel region: the team exists
        ready.set()
        stop.wait()

    with side_thread(hold, "schedlab-idle-team"):
        yield


def busy_wait_us(us: float) -> None:
    """Spin `us` on the calling thread, in Python (holding the interpreter lock)."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def gapped_median_us(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], reps: int) -> float:
    """Median us of `reps` calls of `fn`, each after `GAP_US` of work on the calling thread
    alone (one more call first, untimed, to warm up)."""
    times = []
    for _ in range(reps + 1):  # the first call warms up
        busy_wait_us(GAP_US)
        t0 = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        times.append(time.perf_counter_ns() - t0)
        del out
    return statistics.median(times[1:]) / 1e3


def wake_reps(call_us: float, most: int = WAKE_REPS) -> int:
    """Timed calls per round for an op whose call takes `call_us`: as many as fit in
    `WAKE_BUDGET_US` with their gaps, between 2 and `most`."""
    return max(2, min(most, int(WAKE_BUDGET_US // (call_us + GAP_US))))


def time_wake(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], threads: int, cores: int,
    reps: int = WAKE_REPS, rounds: int = WAKE_ROUNDS,
) -> float:
    """The call's extra time (us, >= 0) at `threads` intra-op threads on a machine of
    `cores` cores with libgomp's spinning throttled (`throttled_omp`), over the same gapped
    calls without: best round median each."""
    plain_us, throttled_us = time_wake_pair(fn, args, kwargs, threads, cores, reps, rounds)
    return max(0.0, throttled_us - plain_us)


def time_wake_pair(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], threads: int, cores: int,
    reps: int = WAKE_REPS, rounds: int = WAKE_ROUNDS,
) -> tuple[float, float]:
    """`time_wake`'s two sides (us): the gapped call plain, and with spinning throttled."""
    plain, throttled = float("inf"), float("inf")
    before = set_intra_op_threads(threads)
    try:
        for _ in range(max(1, rounds)):
            plain = min(plain, gapped_median_us(fn, args, kwargs, reps))
            with throttled_omp(cores):
                throttled = min(throttled, gapped_median_us(fn, args, kwargs, reps))
    finally:
        set_intra_op_threads(before)
    return plain, throttled


@dataclass(frozen=True)
class WakePoint:
    """One case's measured wake cost."""

    op_class: str  # the class model it is fitted under (`signature.fit_class`)
    flops: float
    nbytes: float
    threads: int
    extra_us: float


def fit_wake(points: Sequence[WakePoint], model_of: Callable[[str], WorkThreadsModel | None]) -> dict[str, WakeFit]:
    """Per class with at least `MIN_FIT_POINTS` cases in its parallel regime (region share
    >= 0.5), the non-negative share-gated `WakeFit` of least absolute deviation; under
    `POOLED`, one such fit of every class's points (each scored with its own class model),
    for the classes without. A class with at least `MIN_UNGATED_POINTS` cases whose small
    calls fork (`forks_small`) takes instead the fit with a floor (`WakeFit.floor_us`); one
    with too few small calls to tell takes its fit without the share (`WakeFit.share_gated`
    False) where that misses its cases by at most `UNGATED_GAIN` of what its gated fit (its
    own, else the pooled one) misses."""
    rows: dict[str, list[tuple[float, float, float]]] = {}
    threads = max((p.threads for p in points), default=0)
    for p in points:
        if p.threads != threads:  # fewer threads: `fit_wake_scale`'s
            continue
        model = model_of(p.op_class)
        if model is None:
            continue
        share = region_share(model, p.flops, p.nbytes)
        rows.setdefault(p.op_class, []).append((share, model.work_us(p.flops, p.nbytes), p.extra_us))
    fits: dict[str, WakeFit] = {}
    every: list[tuple[float, float, float]] = []
    for cls, rs in sorted(rows.items()):
        every += rs
        if sum(1 for s, _, _ in rs if s >= 0.5) >= MIN_FIT_POINTS:
            fits[cls] = _lad_fit(rs, threads, gated=True)
    if every:
        fits[POOLED] = _lad_fit(every, threads, gated=True)
    for cls, rs in sorted(rows.items()):
        if len(rs) < MIN_UNGATED_POINTS:
            continue
        forks = forks_small(rs)
        if forks:  # its small calls fork: a floor, and the share-gated part above it
            fits[cls] = _lad_fit(rs, threads, gated=True, floor=True)
        elif forks is None:  # too few small calls to tell: the form that fits its cases better
            gated = fits.get(cls) or fits[POOLED]
            ungated = _lad_fit(rs, threads, gated=False)
            if _deviation_us(ungated, rs) <= UNGATED_GAIN * _deviation_us(gated, rs):
                fits[cls] = ungated
    return fits


def forks_small(rows: Sequence[tuple[float, float, float]]) -> bool | None:
    """Whether a class's small calls fork, from its cases `rows` of (region share, work us,
    extra us): the median wake of those below `SMALL_SHARE` is at least `FORK_EXTRA_US`;
    None with fewer than `MIN_SMALL_POINTS` of them (the module docstring has how the
    medians split)."""
    small = [e for s, _, e in rows if s < SMALL_SHARE]
    if len(small) < MIN_SMALL_POINTS:
        return None
    return float(np.median(small)) >= FORK_EXTRA_US


def _deviation_us(fit: WakeFit, rows: Sequence[tuple[float, float, float]]) -> float:
    """How far `fit` misses `rows` of (region share, work us, extra us): the summed |error|."""
    return sum(abs(fit.extra_us(s, w) - e) for s, w, e in rows)


def fit_wake_scale(
    points: Sequence[WakePoint], fits: Mapping[str, WakeFit], model_of: Callable[[str], WorkThreadsModel | None],
) -> dict[int, float]:
    """At each thread count below the fits' own, the wake as a share of what the fits charge:
    the median, over the cases in their class's parallel regime (region share >= 0.5) that
    the fits charge anything, of measured over charged; a count with fewer than
    `MIN_FIT_POINTS` such cases gets none (`wake_share` then interpolates)."""
    ratios: dict[int, list[float]] = {}
    for p in points:
        model = model_of(p.op_class)
        fit = fits.get(p.op_class) or fits.get(POOLED)
        if model is None or fit is None or p.threads >= fit.threads:
            continue
        share = region_share(model, p.flops, p.nbytes)
        charged = fit.extra_us(share, model.work_us(p.flops, p.nbytes))
        if share >= 0.5 and charged > 0.0:
            ratios.setdefault(p.threads, []).append(p.extra_us / charged)
    return {k: round(float(np.median(r)), 4) for k, r in sorted(ratios.items()) if len(r) >= MIN_FIT_POINTS}


def wake_share(scale: Mapping[int, float], fit_threads: int, threads: int) -> float:
    """The share of a fit measured at `fit_threads` that an op of `threads` threads pays:
    `scale`'s (`fit_wake_scale`) at a count it holds, interpolated in log2(threads) between
    the counts around it (the fits' own count is 1.0), the nearest below the least; 1.0 with
    no scale or at the fits' count and above."""
    if not scale or threads >= fit_threads:
        return 1.0
    knots = [*sorted((k, v) for k, v in scale.items() if k < fit_threads), (fit_threads, 1.0)]
    if threads <= knots[0][0]:
        return knots[0][1]
    for (k0, v0), (k1, v1) in itertools.pairwise(knots):
        if threads <= k1:
            t = (math.log2(threads) - math.log2(k0)) / (math.log2(k1) - math.log2(k0))
            return v0 + t * (v1 - v0)
    return 1.0


def _lad_fit(rows: Sequence[tuple[float, float, float]], threads: int, gated: bool = True, floor: bool = False) -> WakeFit:
    """The non-negative (base, per-work) of least absolute deviation over `rows` of
    (region share, work us, extra us), times the share or not (`gated`): a linear program
    (HiGHS). Absolute, not squared: a case that a neighbour or a halted helper slowed
    tenfold must not set the class's charge (module docstring)."""
    a = np.array([([1.0] if floor else []) + ([s, s * w] if gated else [1.0, w]) for s, w, _ in rows],
                 dtype=np.float64)
    b = np.array([e for _, _, e in rows], dtype=np.float64)
    scale = np.maximum(a.max(axis=0), 1e-12)  # columns of similar size for the solver
    n, k = len(b), a.shape[1]
    # minimise sum(up + down) subject to (a / scale) coef + up - down = b, everything >= 0
    cost = np.concatenate([np.zeros(k), np.ones(2 * n)])
    eq = np.hstack([a / scale, np.eye(n), -np.eye(n)])
    res = linprog(cost, A_eq=eq, b_eq=b, bounds=[(0.0, None)] * (k + 2 * n), method="highs")
    if not res.success:  # cannot happen for a feasible, bounded program; say so if it does
        raise RuntimeError(f"the wake fit's linear program failed: {res.message}")
    coef = np.maximum(res.x[:k], 0.0) / scale
    floor_us, (base, per_work) = (float(coef[0]), coef[1:]) if floor else (0.0, coef)
    # rounded as saved, so a Profile predicts the same before and after a round trip
    cap = None if gated and not floor else round(float(b.max()), 3)
    return WakeFit(base_us=round(float(base), 3), per_work=round(float(per_work), 6), threads=threads, n_points=n,
                   share_gated=gated, cap_us=cap, floor_us=round(floor_us, 3))
