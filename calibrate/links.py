"""Links between local ranks, measured and fitted: point-to-point and all-reduce (gloo).

    fits = measure_links(LinkConfig())             # ~30-60 s on 2 cores
    profile = dataclasses.replace(profile, links=fits)
    machine = apply_link_fit(host_ranks(2), profile)   # "loopback" links get the fit
    allreduce_time_s(fits, nbytes=4 << 20, n_ranks=2)

`measure_links` starts local gloo ranks (`calibrate.link_ranks`: env:// rendezvous, each
rank pinned to its share of the cores, one thread) and times, over message sizes (4 B to
64 MiB, powers of 4), a send/recv ping-pong between 2 ranks (half the round trip) and an
all-reduce (SUM, float32) on 2 ranks and on 3. On 2 cores, 3 ranks share the cores
(oversubscribed): that is measured anyway, and the sweep records its ranks' cores.

Fits (least squares, every size weighted by 1/time, so each size counts by its relative
error rather than the 64 MiB point by its milliseconds; the times span four orders of
magnitude, and an unweighted fit, as Baechi's ``a * bytes + b``, leaves the latency to
the residuals of the largest messages, often negative):

- point to point: ``time_s = latency_s + nbytes / bw_bytes_per_s`` (`schedlab.collectives.p2p_s`);
- all-reduce: the ring model ``time_s = 2(n-1) alpha_s + 2(n-1)/n * nbytes / bw``
  (`schedlab.collectives.ring_allreduce_s`), fitted **separately per world size**: with
  n ranks on fewer cores than n the ranks take turns on a core, which changes both terms,
  so one (alpha, bw) for every n would blur the world the executor runs (2 ranks) with an
  oversubscribed one. A fit over every measured world size (`allreduce_joint`) serves
  world sizes never measured; the fit error (MAPE over sizes, percent) of each is kept.
  Where the bandwidth drops beyond a size (a buffer that no longer fits the caches), the
  line becomes a hinge with a second bandwidth above a break size (`fit_ring`).

Both fits are non-negative (NNLS): a latency below zero would be a fitting artefact.
Each size enters a fit at its typical time, the median of its rounds' medians
(`Sweep.typical_s`); the sweep also keeps the lowest (`median_s`).

On 2 ranks the benchmark also times what each communication op costs its own rank's
thread (`calibrate.comm_host`: a send's call, a receive's post and wait, an all-reduce's
flatten, post, wait and average), which the simulator charges on the ranks; the link and
the collective then get the fitted time less those parts (`link_latency_bw`,
`collective_s`), so nothing is charged twice.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import nnls

from schedlab.calibrate.comm_host import HostCosts, host_cases, host_costs_of
from schedlab.calibrate.host_load import CpuSnapshot, snapshot
from schedlab.calibrate.link_ranks import RankTask, WorldResult, rank_cores, run_world
from schedlab.collectives import p2p_s, ring_allreduce_s
from schedlab.errors import SchedlabError
from schedlab.machine import LOOPBACK_LINK, Machine, detect_host, usable_cores

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile

LINKS_BACKEND = "gloo"
DEFAULT_SIZES = tuple(4**k for k in range(1, 14))  # 4 B .. 64 MiB
QUICK_SIZES = tuple(4**k for k in range(1, 13, 2))  # 4 B .. 4 MiB, powers of 16


@dataclass(frozen=True)
class LinkConfig:
    """What the link benchmark measures and how hard (`quick_link_config` is the short one)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES  # bytes, multiples of 4
    allreduce_ranks: tuple[int, ...] = (2, 3, 4)  # world sizes of the all-reduce sweeps
    target_s: float = 0.15  # timed repetitions of one size, all rounds together
    rounds: int = 3
    timeout_s: float = 120.0  # one world of ranks: start-up, rendezvous and measuring
    host_costs: bool = True  # also each communication op's cost on its rank (2 ranks; `calibrate.comm_host`)
    host_reps: int = 5  # repetitions of each host-cost case per round

    def worlds(self) -> list[tuple[int, bool, bool]]:
        """(ranks, ping-pong, all-reduce) of each world to start, ascending."""
        ns = sorted({2, *self.allreduce_ranks})
        return [(n, n == 2, n in self.allreduce_ranks) for n in ns]

    def steps(self) -> int:
        """Progress steps the whole benchmark reports (a pilot pass and each round, per size;
        the host costs' rounds per case, and their cold cost once)."""
        phases = sum(int(p) + int(a) for _, p, a in self.worlds())
        host = self.rounds * len(host_cases(self.sizes)) + 1 if self.host_costs else 0
        return phases * (self.rounds + 1) * len(self.sizes) + host


def quick_link_config() -> LinkConfig:
    return LinkConfig(sizes=QUICK_SIZES, target_s=0.05, rounds=2)


# ---- measurements and fits ---------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """One kind of call timed over message sizes on one world of ranks."""

    n_ranks: int
    rank_cores: tuple[tuple[int, ...], ...]  # the cores each rank was pinned to
    sizes: tuple[int, ...]  # bytes, ascending
    median_s: tuple[float, ...]  # per size: the lowest of its round medians
    round_medians_s: tuple[tuple[float, ...], ...]  # per size, per round
    reps_per_round: tuple[int, ...]

    @property
    def typical_s(self) -> tuple[float, ...]:
        """Per size, the median of its round medians: the time a step meets (the lowest
        where no rounds were recorded). Fits are made to it, not to the lowest round: on
        the shared development VM an all-reduce is bimodal (1 MiB: 1.7 ms in one round,
        3.7 in the two others), slow rounds are the host's, not a neighbour's, and a step
        meets them (fitted to the lowest round, data-parallel plans were predicted 14.9%
        fast on 2 ranks; to this one, 12.3%, on the same measurements)."""
        if len(self.round_medians_s) != len(self.sizes):
            return self.median_s
        return tuple(
            statistics.median(rounds) if rounds else low
            for rounds, low in zip(self.round_medians_s, self.median_s, strict=True)
        )

    @property
    def oversubscribed(self) -> bool:
        """Whether some ranks shared a core."""
        pinned = [c for cs in self.rank_cores for c in cs]
        return len(set(pinned)) < len(pinned) or len(pinned) < self.n_ranks

    def to_json(self) -> dict[str, Any]:
        return {
            "n_ranks": self.n_ranks,
            "rank_cores": [list(cs) for cs in self.rank_cores],
            "oversubscribed": self.oversubscribed,
            "sizes": list(self.sizes),
            "median_s": [float(f"{t:.6g}") for t in self.median_s],
            "round_medians_s": [[float(f"{t:.6g}") for t in ts] for ts in self.round_medians_s],
            "reps_per_round": list(self.reps_per_round),
        }

    @staticmethod
    def from_json(d: Any) -> Sweep:
        _need_object(d, "sweep")
        sizes = tuple(_int(x, "sizes", 1) for x in _list(d, "sizes"))
        median = tuple(_float(x, "median_s", 0.0, strict=True) for x in _list(d, "median_s"))
        if len(sizes) < 2 or len(median) != len(sizes) or list(sizes) != sorted(set(sizes)):
            raise ValueError("'sizes' must be at least 2 ascending distinct sizes, one 'median_s' each")
        rounds = tuple(tuple(_float(t, "round_medians_s", 0.0) for t in ts) for ts in d.get("round_medians_s", []))
        reps = tuple(_int(x, "reps_per_round", 1) for x in d.get("reps_per_round", []))
        cores = tuple(tuple(_int(c, "rank_cores", 0) for c in cs) for cs in _list(d, "rank_cores"))
        return Sweep(_int(d.get("n_ranks"), "n_ranks", 2), cores, sizes, median, rounds, reps)


@dataclass(frozen=True)
class P2PFit:
    """time_s = latency_s + nbytes / bw_bytes_per_s, and its error over the sizes fitted."""

    latency_s: float
    bw_bytes_per_s: float
    mape_pct: float

    def time_s(self, nbytes: float) -> float:
        return p2p_s(nbytes, self.latency_s, self.bw_bytes_per_s)

    def to_json(self) -> dict[str, Any]:
        return {k: float(f"{v:.6g}") for k, v in dataclasses.asdict(self).items()}

    @staticmethod
    def from_json(d: Any) -> P2PFit:
        _need_object(d, "fit")
        return P2PFit(
            _float(d.get("latency_s"), "latency_s", 0.0),
            _float(d.get("bw_bytes_per_s"), "bw_bytes_per_s", 0.0, strict=True),
            _float(d.get("mape_pct"), "mape_pct", 0.0),
        )


@dataclass(frozen=True)
class RingFit:
    """time_s = 2(n-1) alpha_s + 2(n-1)/n bytes_s(nbytes), and its error (percent).

    Linear (`break_bytes` None): bytes_s = nbytes / bw_bytes_per_s. Piecewise, a hinge at
    `break_bytes`: the first `break_bytes` of a buffer move at `bw_bytes_per_s`, the rest at
    `bw_above_bytes_per_s` (continuous at the break; `fit_ring` says why and when).
    """

    alpha_s: float
    bw_bytes_per_s: float
    mape_pct: float
    break_bytes: float | None = None
    bw_above_bytes_per_s: float | None = None

    def time_s(self, nbytes: float, n_ranks: int) -> float:
        if self.break_bytes is None or self.bw_above_bytes_per_s is None:
            return ring_allreduce_s(nbytes, n_ranks, self.alpha_s, self.bw_bytes_per_s)
        if n_ranks <= 1:
            return 0.0
        x = max(0.0, float(nbytes))
        below, above = min(x, self.break_bytes), max(0.0, x - self.break_bytes)
        bytes_s = below / self.bw_bytes_per_s + above / self.bw_above_bytes_per_s
        return 2 * (n_ranks - 1) * self.alpha_s + 2 * (n_ranks - 1) / n_ranks * bytes_s

    @property
    def piecewise(self) -> bool:
        return self.break_bytes is not None

    def to_json(self) -> dict[str, Any]:
        return {k: float(f"{v:.6g}") for k, v in dataclasses.asdict(self).items() if v is not None}

    @staticmethod
    def from_json(d: Any) -> RingFit:
        """A fit without "break_bytes" (written before piecewise fits) is linear."""
        _need_object(d, "fit")
        brk = d.get("break_bytes")
        above = d.get("bw_above_bytes_per_s")
        if (brk is None) != (above is None):
            raise ValueError("a piecewise fit needs both break_bytes and bw_above_bytes_per_s")
        return RingFit(
            _float(d.get("alpha_s"), "alpha_s", 0.0),
            _float(d.get("bw_bytes_per_s"), "bw_bytes_per_s", 0.0, strict=True),
            _float(d.get("mape_pct"), "mape_pct", 0.0),
            None if brk is None else _float(brk, "break_bytes", 0.0, strict=True),
            None if above is None else _float(above, "bw_above_bytes_per_s", 0.0, strict=True),
        )


def _weighted_nnls(rows: np.ndarray, times_s: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum(((rows @ x) - t) / t)^2."""
    coef, _ = nnls(rows / times_s[:, None], np.ones_like(times_s))
    return np.asarray(coef, dtype=float)


def mape_pct(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> float:
    """Mean absolute percentage error of `predicted` against `measured`."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(p - m) / m) * 100.0)


def _check_points(sizes: Sequence[object], times_s: Sequence[float], what: str) -> None:
    if len(sizes) != len(times_s) or len(set(sizes)) < 2:
        raise SchedlabError(f"{what}: need times of at least 2 distinct message sizes to fit, got {len(set(sizes))}")
    if any(not (math.isfinite(t) and t > 0) for t in times_s):
        raise SchedlabError(f"{what}: every measured time must be a positive number")


def fit_p2p(sizes: Sequence[int], times_s: Sequence[float]) -> P2PFit:
    """Latency and bandwidth of one-way times over message sizes (module docstring)."""
    _check_points(sizes, times_s, "point-to-point fit")
    x, t = np.asarray(sizes, dtype=float), np.asarray(times_s, dtype=float)
    latency_s, s_per_byte = _weighted_nnls(np.column_stack([np.ones_like(x), x]), t)
    if s_per_byte <= 0:
        raise SchedlabError("point-to-point fit: times do not grow with the message size; no bandwidth to fit")
    fit = P2PFit(float(latency_s), 1.0 / float(s_per_byte), 0.0)
    return dataclasses.replace(fit, mape_pct=mape_pct([fit.time_s(s) for s in sizes], times_s))


# A hinge must earn its two extra parameters (the break and a second bandwidth): it is kept
# only when it lowers the fit error by at least this many percentage points and this share.
HINGE_MIN_GAIN_PCT = 2.0
HINGE_MIN_GAIN_FRAC = 0.2


def fit_ring(points: Sequence[tuple[int, int, float]], piecewise: bool = True) -> RingFit:
    """The ring all-reduce model fitted on (n_ranks, nbytes, time_s) points.

    Linear first (module docstring). With `piecewise`, also a hinge: gloo's all-reduce on
    CPU ranks moves a buffer that fits the caches faster than one that does not (2 local
    ranks here: about 2.4 GB/s up to 1 MiB, 1.1-1.6 GB/s beyond), which one straight line
    misses by 25-35% (it bends the latency up and the large sizes down). Every measured size
    with at least 3 sizes at or below it and 2 above is tried as the break; each side gets
    its own bandwidth, continuous at the break, alpha shared; all three non-negative (NNLS,
    weighted by 1/time as the linear fit), and the bandwidth above the break no higher than
    below it (the drop this models; a rise would be a latency step fitted as bandwidth). The best hinge is kept when it beats the line by
    `HINGE_MIN_GAIN_PCT` points and `HINGE_MIN_GAIN_FRAC` of its error; else the line.
    """
    _check_points([(n, s) for n, s, _ in points], [t for _, _, t in points], "all-reduce fit")
    if any(n < 2 for n, _, _ in points):
        raise SchedlabError("all-reduce fit: every point needs at least 2 ranks")
    t = np.array([t for _, _, t in points], dtype=float)
    steps = np.array([2.0 * (n - 1) for n, _, _ in points])
    share = np.array([2.0 * (n - 1) / n for n, _, _ in points])
    x = np.array([float(s) for _, s, _ in points])
    alpha_s, s_per_byte = _weighted_nnls(np.column_stack([steps, share * x]), t)
    if s_per_byte <= 0:
        raise SchedlabError("all-reduce fit: times do not grow with the message size; no bandwidth to fit")
    fit = RingFit(float(alpha_s), 1.0 / float(s_per_byte), 0.0)
    fit = dataclasses.replace(fit, mape_pct=mape_pct([fit.time_s(s, n) for n, s, _ in points], t))
    if not piecewise:
        return fit
    best = fit
    sizes = sorted(set(x.tolist()))
    for brk in sizes[2:-2]:  # at least 3 sizes at or below it, 2 above
        rows = np.column_stack([steps, share * np.minimum(x, brk), share * np.maximum(0.0, x - brk)])
        a, below, above = _weighted_nnls(rows, t)
        if below <= 0 or above < below:  # a drop beyond the break, not a rise
            continue
        hinge = RingFit(float(a), 1.0 / float(below), 0.0, float(brk), 1.0 / float(above))
        hinge = dataclasses.replace(hinge, mape_pct=mape_pct([hinge.time_s(s, n) for n, s, _ in points], t))
        if hinge.mape_pct < best.mape_pct:
            best = hinge
    gain = fit.mape_pct - best.mape_pct
    if best is fit or gain < HINGE_MIN_GAIN_PCT or gain < HINGE_MIN_GAIN_FRAC * fit.mape_pct:
        return fit
    return best


# ---- the fits of one machine -------------------------------------------------------------


@dataclass(frozen=True)
class LinkFits:
    """Link and collective measurements between local ranks, and their fits (a Profile's
    `links` section)."""

    backend: str  # "gloo"
    host: dict[str, Any]  # Machine.fingerprint plus hostname: where it was measured
    measured_unix_s: float
    p2p: Sweep
    p2p_fit: P2PFit
    allreduce: dict[int, Sweep]  # world size -> sweep
    allreduce_fits: dict[int, RingFit]  # world size -> its own fit
    allreduce_joint: RingFit  # over every world size measured: for the others
    conditions: dict[str, Any] = field(default_factory=dict)  # load, cores, wall time
    # what each communication op costs its rank (`calibrate.comm_host`); None in files
    # written before it was measured: the simulator then charges its dispatch cost
    host_costs: HostCosts | None = None

    def allreduce_s(self, nbytes: float, n_ranks: int) -> float:
        """The fitted time of an all-reduce of `nbytes` on `n_ranks` ranks: the fit of that
        world size where measured, else the joint fit."""
        fit = self.allreduce_fits.get(n_ranks, self.allreduce_joint)
        return fit.time_s(nbytes, n_ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "host": dict(self.host),
            "measured_unix_s": self.measured_unix_s,
            "conditions": dict(self.conditions),
            "p2p": {**self.p2p.to_json(), "fit": self.p2p_fit.to_json()},
            "allreduce": {
                str(n): {**s.to_json(), "fit": self.allreduce_fits[n].to_json()} for n, s in sorted(self.allreduce.items())
            },
            "allreduce_joint": self.allreduce_joint.to_json(),
            "host_costs": None if self.host_costs is None else self.host_costs.to_json(),
        }

    @staticmethod
    def from_json(d: Any) -> LinkFits:
        """Parse; a problem raises ValueError naming the field (the Profile wraps it)."""
        _need_object(d, "links")
        where = "backend"
        try:
            backend = d.get("backend")
            if backend not in ("gloo", "nccl"):
                raise ValueError(f"unknown backend {backend!r} (known: gloo, nccl)")
            where = "p2p"
            p2p = Sweep.from_json(d.get("p2p"))
            where = "p2p.fit"
            p2p_fit = P2PFit.from_json(_get(d, "p2p").get("fit"))
            sweeps: dict[int, Sweep] = {}
            fits: dict[int, RingFit] = {}
            where = "allreduce"
            _need_object(d.get("allreduce"), "allreduce")
            for key, sd in d["allreduce"].items():
                where = f"allreduce.{key}"
                n = _int(int(key) if str(key).isdigit() else key, "world size", 2)
                sweeps[n] = Sweep.from_json(sd)
                where = f"allreduce.{key}.fit"
                fits[n] = RingFit.from_json(sd.get("fit"))
            if not sweeps:
                raise ValueError("no all-reduce sweep")
            where = "allreduce_joint"
            joint = RingFit.from_json(d.get("allreduce_joint"))
            where = "host"
            where_measured = dict(_get(d, "host"))
            where = "measured_unix_s"
            measured = _float(d.get("measured_unix_s"), "measured_unix_s", 0.0)
            where = "conditions"
            conditions = dict(d.get("conditions") or {})
            where = "host_costs"
            host_costs = HostCosts.from_json(d["host_costs"]) if d.get("host_costs") is not None else None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{where}: {detail}") from None
        return LinkFits(str(backend), where_measured, measured, p2p, p2p_fit, sweeps, fits, joint, conditions, host_costs)


def _get(d: dict[str, Any], key: str) -> Any:
    if key not in d:
        raise KeyError(key)
    return d[key]


def _need_object(d: Any, what: str) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be an object, got {type(d).__name__}")


def _list(d: dict[str, Any], key: str) -> list[Any]:
    v = _get(d, key)
    if not isinstance(v, list):
        raise TypeError(f"field {key!r} must be a list, got {type(v).__name__}")
    return v


def _int(v: Any, what: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return v


def _float(v: Any, what: str, minimum: float, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number, got {v!r}")
    if v < minimum or (strict and v <= minimum):
        raise ValueError(f"{what} must be {'>' if strict else '>='} {minimum:g}, got {v!r}")
    return float(v)


# ---- uses ---------------------------------------------------------------------------------


def allreduce_time_s(fits: LinkFits, nbytes: float, n_ranks: int) -> float:
    """The fitted all-reduce time (s) of `nbytes` over `n_ranks` ranks (`LinkFits.allreduce_s`)."""
    return fits.allreduce_s(nbytes, n_ranks)


# What is left of a fitted time for the link once the ranks' own parts are taken off it is
# kept at least this share of the fit (a rank's part measured alone can exceed what it adds
# to a whole transfer, whose two ends overlap).
MIN_LINK_SHARE = 0.1


def link_latency_bw(fits: LinkFits) -> tuple[float, float]:
    """(latency_s, bw_bytes_per_s) of a loopback link in the simulator.

    The point-to-point fit times a whole one-way transfer, the send's call and the
    receive's wait included. With host costs (`calibrate.comm_host`) the simulator charges
    the fixed part of those two on the ranks, so the link's latency is the fit's less them
    (at least `MIN_LINK_SHARE` of it); its bandwidth is the fit's. Without host costs, the
    fit as it is.
    """
    fit = fits.p2p_fit
    if fits.host_costs is None:
        return fit.latency_s, fit.bw_bytes_per_s
    latency = max(MIN_LINK_SHARE * fit.latency_s, fit.latency_s - fits.host_costs.p2p_overlap_s())
    return latency, fit.bw_bytes_per_s


def collective_s(fits: LinkFits, nbytes: float, n_ranks: int) -> float:
    """The time of an all-reduce on its links in the simulator: the fitted time less the
    fixed part of its post and wait, which the simulator charges on the ranks when host
    costs were measured (at least `MIN_LINK_SHARE` of the fit); without host costs, the
    fitted time itself."""
    total = fits.allreduce_s(nbytes, n_ranks)
    if fits.host_costs is None:
        return total
    return max(MIN_LINK_SHARE * total, total - fits.host_costs.allreduce_overlap_s())


def apply_link_fit(machine: Machine, profile: Profile) -> Machine:
    """`machine` with its "loopback" links (local ranks: `host_ranks`) given the Profile's
    fitted point-to-point latency and bandwidth (less what the ranks' own host costs
    already charge: `link_latency_bw`); other links, and any machine when the Profile has
    no link fits, unchanged."""
    if profile.links is None:
        return machine
    latency_s, bw = link_latency_bw(profile.links)
    return machine.with_link_fit(latency_s, bw, name=LOOPBACK_LINK)


# ---- measuring ----------------------------------------------------------------------------


def _sweep(n: int, cores: tuple[tuple[int, ...], ...], medians: dict[int, float], result: WorldResult, kind: str) -> Sweep:
    sizes = tuple(sorted(medians))
    return Sweep(
        n_ranks=n,
        rank_cores=cores,
        sizes=sizes,
        median_s=tuple(medians[s] for s in sizes),
        round_medians_s=tuple(tuple(result.rounds_s[kind][s]) for s in sizes),
        reps_per_round=tuple(result.reps[kind][s] for s in sizes),
    )


def _busy_frac(start: CpuSnapshot | None, end: CpuSnapshot | None, children_s: float) -> float | None:
    """Share of the CPU used by processes other than this one and its ranks."""
    if start is None or end is None or end.total_s <= start.total_s:
        return None
    foreign = (end.busy_s - start.busy_s) - (end.own_s - start.own_s) - children_s
    return min(1.0, max(0.0, foreign / (end.total_s - start.total_s)))


def measure_links(cfg: LinkConfig | None = None, on_progress: Callable[[str], None] | None = None) -> LinkFits:
    """Start the worlds of `cfg` one after another (ping-pong and all-reduce on 2 ranks,
    all-reduce on the other world sizes) and fit (module docstring). Each world must
    finish within `cfg.timeout_s`; a failure is one SchedlabError naming the rank."""
    cfg = cfg or LinkConfig()
    if any(s < 4 or s % 4 for s in cfg.sizes):
        raise SchedlabError(f"link message sizes must be multiples of 4 bytes (float32), got {list(cfg.sizes)}")
    if len(set(cfg.sizes)) < 2:
        raise SchedlabError("the link benchmark needs at least 2 message sizes to fit")
    if any(n < 2 for n in cfg.allreduce_ranks):
        raise SchedlabError(f"all-reduce world sizes must be >= 2, got {list(cfg.allreduce_ranks)}")
    host = detect_host()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(usable_cores()))
    t0, cpu0, times0 = time.perf_counter(), snapshot(), os.times()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    p2p: Sweep | None = None
    host_costs: HostCosts | None = None
    allreduce: dict[int, Sweep] = {}
    for n, ping, reduce in cfg.worlds():
        pinned = rank_cores(n, cores)
        task = RankTask(
            sizes=tuple(sorted(set(cfg.sizes))), p2p=ping, allreduce=reduce, cores=pinned,
            target_s=cfg.target_s, rounds=cfg.rounds, collective_timeout_s=cfg.timeout_s,
            host=ping and cfg.host_costs, host_reps=cfg.host_reps,
        )
        result = run_world(n, task, cfg.timeout_s, _labelled(on_progress, f"{n} ranks: "))
        if ping:
            p2p = _sweep(n, pinned, result.p2p_s, result, "p2p")
            host_costs = host_costs_of(result.host_us) if cfg.host_costs else None
        if reduce:
            allreduce[n] = _sweep(n, pinned, result.allreduce_s, result, "allreduce")
    assert p2p is not None and allreduce
    times1 = os.times()
    children_s = (times1.children_user + times1.children_system) - (times0.children_user + times0.children_system)
    conditions = {
        "cores": len(cores),
        "threads_per_rank": 1,
        "loadavg_1m_start": None if load0 is None else round(load0, 2),
        "loadavg_1m_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "foreign_cpu_frac": _round(_busy_frac(cpu0, snapshot(), children_s)),
        "wall_s": round(time.perf_counter() - t0, 1),
        "target_s": cfg.target_s,
        "rounds": cfg.rounds,
    }
    fits = {n: fit_ring([(n, s, t) for s, t in zip(sw.sizes, sw.typical_s, strict=True)]) for n, sw in allreduce.items()}
    joint = fit_ring([(n, s, t) for n, sw in allreduce.items() for s, t in zip(sw.sizes, sw.typical_s, strict=True)])
    return LinkFits(
        backend=LINKS_BACKEND,
        host={**host.fingerprint, "hostname": socket.gethostname()},
        measured_unix_s=time.time(),
        p2p=p2p,
        p2p_fit=fit_p2p(p2p.sizes, p2p.typical_s),
        allreduce=allreduce,
        allreduce_fits=fits,
        allreduce_joint=joint,
        conditions=conditions,
        host_costs=host_costs,
    )


def _labelled(on_progress: Callable[[str], None] | None, prefix: str) -> Callable[[str], None] | None:
    if on_progress is None:
        return None
    report = on_progress
    return lambda label: report(prefix + label)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
