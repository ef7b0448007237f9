"""A full calibration: dispatch, microbenchmarks of the workloads' ops and a shape sweep,
co-run slowdowns, fits; the result is a Profile, saved atomically.

    run_calibration(quick=True, out=Path("traces/profile.json"))

`quick` (tests, CI; about a minute on 2 cores): the built-in workloads at size tiny and a
small sweep. Full (`make calibrate`; a few minutes): sizes tiny and default, a wider
sweep, more repetitions. Progress goes to stderr as tqdm bars when `progress` is true.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from schedlab.calibrate.cases import Case, new_signatures, workload_cases
from schedlab.calibrate.corun import measure_corun
from schedlab.calibrate.dispatch import measure_dispatch
from schedlab.calibrate.fit import Point, fit_all
from schedlab.calibrate.host_load import foreign_cpu_frac, snapshot
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.sweep import SweepConfig, sweep_cases, sweep_specs
from schedlab.calibrate.threads import thread_counts
from schedlab.calibrate.timing import RetryBudget, TimingConfig, time_point
from schedlab.errors import SchedlabError
from schedlab.exec.threads import set_intra_op_threads
from schedlab.workloads import BUILTIN_WORKLOADS


@dataclass(frozen=True)
class CalibrationConfig:
    """What to measure and how hard. `quick_config()` and `full_config()` are the presets."""

    quick: bool
    workloads: tuple[str, ...] = BUILTIN_WORKLOADS
    sizes: tuple[str, ...] = ("tiny",)
    optimizers: tuple[str, ...] = ("sgd", "adam")
    sweep: SweepConfig = field(default_factory=SweepConfig)
    threads: tuple[int, ...] | None = None  # None: 1..cores of this machine
    max_threads: int | None = None  # cap on the default thread list
    timing: TimingConfig = field(default_factory=TimingConfig)
    dispatch_ops: int = 1000  # ops per chain of the executor probe (see dispatch.py)
    corun_s: float = 0.25  # per alone/together run of each co-run op
    corun_rounds: int = 3
    seed: int = 0


def quick_config() -> CalibrationConfig:
    return CalibrationConfig(
        quick=True,
        sweep=SweepConfig(per_class=20, max_flops=3e8, max_elems=1 << 22),
        timing=TimingConfig(budget_s=0.01, min_reps=3, max_reps=30),
    )


def full_config() -> CalibrationConfig:
    return CalibrationConfig(
        quick=False,
        sizes=("tiny", "default"),
        sweep=SweepConfig(per_class=40, max_flops=2e9, max_elems=1 << 24),
        timing=TimingConfig(budget_s=0.03, min_reps=5, max_reps=100, warmup=2, retry_budget_s=60.0),
        dispatch_ops=2000,
        corun_s=0.5,
        corun_rounds=5,
    )


class _Progress:
    """One tqdm bar per phase on stderr, or nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def bar(self, total: int, desc: str, unit: str) -> tqdm[Any]:
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not self.enabled, leave=True)


def _capture_all(cfg: CalibrationConfig, progress: _Progress, failures: list[str]) -> list[tuple[str, Any]]:
    """Capture every (workload, size, optimizer); one that fails is noted and skipped."""
    from schedlab.capture import capture
    from schedlab.workloads import load_workload

    jobs = [(w, s, o) for s in cfg.sizes for w in cfg.workloads for o in cfg.optimizers]
    out = []
    with progress.bar(len(jobs), "capture workloads", "graph") as bar:
        for w, s, o in jobs:
            bar.set_postfix_str(f"{w}/{s}/{o}")
            try:
                out.append((f"{w}/{s}/{o}", capture(load_workload(w, s, seed=cfg.seed), o)))
            except SchedlabError as e:
                failures.append(f"capture {w}/{s}/{o}: {e}")
            bar.update()
    return out


@dataclass
class _Bench:
    """What benchmarking collected: (case, threads, call_us), failures, contended points."""

    retry: RetryBudget
    results: list[tuple[Case, int, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    contended: int = 0


def _bench(
    cases: Iterator[Case], threads: tuple[int, ...], timing: TimingConfig, on_done: Callable[[], None], acc: _Bench
) -> None:
    """Time every case at every thread count into `acc`; contended points are left out."""
    for case in cases:
        try:
            times, contended = time_point(
                case.fn, case.args, case.kwargs, threads, timing, set_intra_op_threads, acc.retry
            )
            light = _light(case)
            acc.results += [(light, k, call_us) for k, call_us in times.items() if k not in contended]
            acc.contended += len(contended)
        except Exception as e:  # one op failing must not lose the calibration
            acc.failures.append(f"{case.target} ({case.source}): {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        on_done()


def _light(case: Case) -> Case:
    """The case without its tensors (results outlive the replay)."""
    return replace(case, args=(), kwargs={})


def _benchmark_all(cfg: CalibrationConfig, threads: tuple[int, ...], bars: _Progress, acc: _Bench) -> None:
    """Capture the workloads, then time their distinct ops and the sweep into `acc`."""
    captured = _capture_all(cfg, bars, acc.failures)
    specs = sweep_specs(replace(cfg.sweep, seed=cfg.seed))
    counted: set[str] = set()
    for _, c in captured:
        counted.update(new_signatures(c.graph, counted))
    seen: set[str] = set()
    with bars.bar(len(counted) + len(specs), f"benchmark ops x {len(threads)} thread counts", "op") as bar:
        for source, c in captured:
            bar.set_postfix_str(source)
            _bench(workload_cases(c.graph, c.input_values, seen, source), threads, cfg.timing, bar.update, acc)
        bar.set_postfix_str("sweep")
        _bench(sweep_cases(specs, seen), threads, cfg.timing, bar.update, acc)
        bar.total = bar.n  # sweep cases already seen in a workload were skipped
        bar.refresh()


def run_calibration(
    quick: bool, out: Path, progress: bool = True, config: CalibrationConfig | None = None
) -> Profile:
    """Measure this machine, fit, save the Profile to `out` and return it.

    `config` overrides the preset that `quick` selects (tests use tiny ones).
    """
    from schedlab.machine import detect_host

    cfg = config or (quick_config() if quick else full_config())
    t_start = time.perf_counter()
    cpu_start = snapshot()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    host = detect_host()
    cores = host.default_device.cores
    threads = cfg.threads or thread_counts(cores, cfg.max_threads)
    if max(threads) > cores:
        raise SchedlabError(f"cannot benchmark {max(threads)} intra-op threads on {cores} cores")
    bars = _Progress(progress)
    acc = _Bench(retry=RetryBudget(cfg.timing.retry_budget_s))
    before = set_intra_op_threads(1)
    try:
        with bars.bar(1, "dispatch", "step") as bar:
            dispatch = measure_dispatch(host, n_ops=cfg.dispatch_ops)
            bar.update()
        # Co-run before the op benchmarks: after thousands of benchmark calls in this
        # process, the oversubscription slowdown measured ~1.0 instead of the ~2x a fresh
        # process measures (and the executor sees).
        with bars.bar(1, "co-run", "step") as bar:
            corun = measure_corun(cores, cfg.corun_s, cfg.corun_rounds)
            bar.update()
        _benchmark_all(cfg, threads, bars, acc)
    finally:
        set_intra_op_threads(before)
    if not acc.results:
        raise SchedlabError("calibration measured no ops; nothing to fit" + "".join(f"\n  {f}" for f in acc.failures))
    floor = dispatch.call_floor_us
    points = [Point(c.signature, c.op_class, c.flops, c.nbytes, k, max(t, 1e-3)) for c, k, t in acc.results]
    with bars.bar(1, "fit", "step") as bar:
        fallback, classes = fit_all(points, floor, cfg.seed)
        bar.update()
    signatures: dict[str, dict[int, float]] = {}
    for c, k, call_us in acc.results:
        signatures.setdefault(c.signature, {})[k] = max(0.0, call_us - floor)
    meta: dict[str, Any] = {
        "workloads": list(cfg.workloads),
        "sizes": list(cfg.sizes),
        "optimizers": list(cfg.optimizers),
        "threads": list(threads),
        "n_cases": len(signatures),
        "n_points": len(points),
        "failures": acc.failures,
        "contended_points": acc.contended,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "foreign_cpu_frac": _round(foreign_cpu_frac(cpu_start, snapshot())),
        "loadavg_1m_start": _round(load_start),
        "host": {k: host.host.get(k) for k in ("hostname", "cpu_model", "python", "torch", "platform")},
    }
    profile = Profile(
        machine=host.fingerprint,
        created_unix_s=time.time(),
        quick=cfg.quick,
        dispatch=dispatch,
        classes=classes,
        fallback=fallback,
        signatures=signatures,
        corun=corun,
        meta=meta,
    )
    profile.save(out)
    return profile


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
