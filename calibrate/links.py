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

Both fits are non-negative (NNLS): a latency below zero would be a fitting artefact.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import nnls

from schedlab.calibrate.host_load import CpuSnapshot, snapshot
from schedlab.calibrate.link_ranks import RankTask, WorldResult, rank_cores, run_world
from schedlab.collectives import p2p_s, ring_allreduce_s
from schedlab.errors import SchedlabError
from schedlab.machine import Machine, detect_host, usable_cores

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile

LINKS_BACKEND = "gloo"
DEFAULT_SIZES = tuple(4**k for k in range(1, 14))  # 4 B .. 64 MiB
QUICK_SIZES = tuple(4**k for k in range(1, 13, 2))  # 4 B .. 4 MiB, powers of 16


@dataclass(frozen=True)
class LinkConfig:
    """What the link benchmark measures and how hard (`quick_link_config` is the short one)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES  # bytes, multiples of 4
    allreduce_ranks: tuple[int, ...] = (2, 3)  # world sizes of the all-reduce sweeps
    target_s: float = 0.15  # timed repetitions of one size, all rounds together
    rounds: int = 3
    timeout_s: float = 120.0  # one world of ranks: start-up, rendezvous and measuring

    def worlds(self) -> list[tuple[int, bool, bool]]:
        """(ranks, ping-pong, all-reduce) of each world to start, ascending."""
        ns = sorted({2, *self.allreduce_ranks})
        return [(n, n == 2, n in self.allreduce_ranks) for n in ns]

    def steps(self) -> int:
        """Progress steps the whole benchmark reports (a pilot pass and each round, per size)."""
        phases = sum(int(p) + int(a) for _, p, a in self.worlds())
        return phases * (self.rounds + 1) * len(self.sizes)


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
    """time_s = 2(n-1) alpha_s + 2(n-1)/n nbytes / bw_bytes_per_s, and its error (percent)."""

    alpha_s: float
    bw_bytes_per_s: float
    mape_pct: float

    def time_s(self, nbytes: float, n_ranks: int) -> float:
        return ring_allreduce_s(nbytes, n_ranks, self.alpha_s, self.bw_bytes_per_s)

    def to_json(self) -> dict[str, Any]:
        return {k: float(f"{v:.6g}") for k, v in dataclasses.asdict(self).items()}

    @staticmethod
    def from_json(d: Any) -> RingFit:
        _need_object(d, "fit")
        return RingFit(
            _float(d.get("alpha_s"), "alpha_s", 0.0),
            _float(d.get("bw_bytes_per_s"), "bw_bytes_per_s", 0.0, strict=True),
            _float(d.get("mape_pct"), "mape_pct", 0.0),
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


def fit_ring(points: Sequence[tuple[int, int, float]]) -> RingFit:
    """The ring all-reduce model fitted on (n_ranks, nbytes, time_s) points (module docstring)."""
    _check_points([(n, s) for n, s, _ in points], [t for _, _, t in points], "all-reduce fit")
    if any(n < 2 for n, _, _ in points):
        raise SchedlabError("all-reduce fit: every point needs at least 2 ranks")
    rows = np.array([[2.0 * (n - 1), 2.0 * (n - 1) / n * s] for n, s, _ in points])
    t = np.array([t for _, _, t in points], dtype=float)
    alpha_s, s_per_byte = _weighted_nnls(rows, t)
    if s_per_byte <= 0:
        raise SchedlabError("all-reduce fit: times do not grow with the message size; no bandwidth to fit")
    fit = RingFit(float(alpha_s), 1.0 / float(s_per_byte), 0.0)
    return dataclasses.replace(fit, mape_pct=mape_pct([fit.time_s(s, n) for n, s, _ in points], t))


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
            host = dict(_get(d, "host"))
            where = "measured_unix_s"
            measured = _float(d.get("measured_unix_s"), "measured_unix_s", 0.0)
            where = "conditions"
            conditions = dict(d.get("conditions") or {})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{where}: {detail}") from None
        return LinkFits(str(backend), host, measured, p2p, p2p_fit, sweeps, fits, joint, conditions)


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


def apply_link_fit(machine: Machine, profile: Profile) -> Machine:
    """`machine` with its "loopback" links (local ranks: `host_ranks`) given the Profile's
    fitted point-to-point latency and bandwidth; other links, and any machine when the
    Profile has no link fits, unchanged."""
    if profile.links is None:
        return machine
    fit = profile.links.p2p_fit
    return machine.with_link_fit(fit.latency_s, fit.bw_bytes_per_s, name="loopback")


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
    allreduce: dict[int, Sweep] = {}
    for n, ping, reduce in cfg.worlds():
        pinned = rank_cores(n, cores)
        task = RankTask(
            sizes=tuple(sorted(set(cfg.sizes))), p2p=ping, allreduce=reduce, cores=pinned,
            target_s=cfg.target_s, rounds=cfg.rounds, collective_timeout_s=cfg.timeout_s,
        )
        result = run_world(n, task, cfg.timeout_s, _labelled(on_progress, f"{n} ranks: "))
        if ping:
            p2p = _sweep(n, pinned, result.p2p_s, result, "p2p")
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
    fits = {n: fit_ring([(n, s, t) for s, t in zip(sw.sizes, sw.median_s, strict=True)]) for n, sw in allreduce.items()}
    joint = fit_ring([(n, s, t) for n, sw in allreduce.items() for s, t in zip(sw.sizes, sw.median_s, strict=True)])
    return LinkFits(
        backend=LINKS_BACKEND,
        host={**host.fingerprint, "hostname": socket.gethostname()},
        measured_unix_s=time.time(),
        p2p=p2p,
        p2p_fit=fit_p2p(p2p.sizes, p2p.median_s),
        allreduce=allreduce,
        allreduce_fits=fits,
        allreduce_joint=joint,
        conditions=conditions,
    )


def _labelled(on_progress: Callable[[str], None] | None, prefix: str) -> Callable[[str], None] | None:
    if on_progress is None:
        return None
    report = on_progress
    return lambda label: report(prefix + label)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
