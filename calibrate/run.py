"""A full calibration: dispatch, co-run figures, the roofline, microbenchmarks of the ops of
the built-in workloads and of the coverage models (`coverage.py`) and a shape sweep, the
ops as they run in a step (`context.py`), the co-run executor's wait per op
(`corun_fit.py`), fits, and last the links between local ranks (`links.py`: gloo
ping-pong and all-reduce); the result is a Profile, saved atomically.

    run_calibration(quick=True, out=Path("traces/profile.json"))

`quick` (tests, CI; under a minute on 2 cores when idle): the built-in workloads at
size tiny, the coverage models at their small shape and a small sweep. Full (`make
calibrate`; a few minutes): sizes tiny and default, every coverage shape, a wider sweep,
more repetitions, every link message size. A link benchmark that cannot start its ranks
is noted in `meta.failures` and the Profile has no link fits. Progress goes to stderr as tqdm bars when `progress` is true.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from schedlab.calibrate.cases import Case, new_signatures, workload_cases
from schedlab.calibrate.cold import (
    MIN_INPUT_BYTES,
    ColdCosts,
    ColdPoint,
    Evictor,
    ReplayedOp,
    cold_from,
    share_points,
    tensor_bytes,
    time_cold,
)
from schedlab.calibrate.context import ContextCosts, Occurrence, bounded_warm, first_uses, fit_context
from schedlab.calibrate.corun import measure_corun_quiet
from schedlab.calibrate.corun_fit import CorunRun, fit_corun_latency, measure_corun_runs, runs_from_report
from schedlab.calibrate.coverage import COLD_PROBE, COVERAGE_MODELS, SHAPES, Shape
from schedlab.calibrate.coverage import build as build_coverage
from schedlab.calibrate.dispatch import DispatchFigures, measure_dispatch
from schedlab.calibrate.fit import ClassFit, Point, fit_all
from schedlab.calibrate.host_load import foreign_cpu_frac, snapshot, steal_frac
from schedlab.calibrate.host_scaling import probe_host_scaling
from schedlab.calibrate.in_turn import IN_TURN_ROUNDS, InTurnCurve, in_turn_factor, measure_in_turn
from schedlab.calibrate.links import LinkConfig, LinkFits, measure_links, quick_link_config
from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.roofline import Roofline, measure_roofline
from schedlab.calibrate.signature import base_class, short_row_floats, signature
from schedlab.calibrate.sweep import SWEEP_SOURCE, SweepConfig, sweep_cases, sweep_specs
from schedlab.calibrate.team_stall import StallLevel, measure_team_stall
from schedlab.calibrate.thread_wake import WakeLevel, idle_state, measure_thread_wake
from schedlab.calibrate.threads import thread_counts
from schedlab.calibrate.timing import RetryBudget, TimingConfig, time_point
from schedlab.calibrate.trace_cal import robust_mean
from schedlab.calibrate.views import ViewCosts, ViewPoint, fit_views, view_key
from schedlab.calibrate.wake import WAKE_REPS, WakePoint, fit_wake, fit_wake_scale, time_wake, wake_reps
from schedlab.errors import SchedlabError
from schedlab.exec.threads import set_intra_op_threads
from schedlab.flops import FLOP_COUNTING
from schedlab.graph import COMPUTE_CLASSES, Graph
from schedlab.machine import Machine
from schedlab.workloads import BUILTIN_WORKLOADS, Workload


@dataclass(frozen=True)
class CalibrationConfig:
    """What to measure and how hard. `quick_config()` and `full_config()` are the presets."""

    quick: bool
    workloads: tuple[str, ...] = BUILTIN_WORKLOADS
    sizes: tuple[str, ...] = ("tiny",)
    optimizers: tuple[str, ...] = ("sgd", "adam")
    coverage: tuple[str, ...] = COVERAGE_MODELS  # calibration-only models of stock nn layers (coverage.py)
    coverage_shapes: tuple[str, ...] = ("small",)  # names in coverage.SHAPES
    sweep: SweepConfig = field(default_factory=SweepConfig)
    threads: tuple[int, ...] | None = None  # None: 1..cores of this machine
    max_threads: int | None = None  # cap on the default thread list
    timing: TimingConfig = field(default_factory=TimingConfig)
    # views: microseconds each, one thread; many reps fit in a short budget
    view_timing: TimingConfig = field(default_factory=lambda: TimingConfig(budget_s=0.002, min_reps=20, max_reps=500, rounds=2))
    replay_rounds: int = 3  # timed executor steps of each graph (calibrate.context)
    # Timed two-slot executor steps of each small graph, and one-slot steps at each thread
    # count above one (calibrate.corun_fit); 0: none. The two-slot fit reads their median,
    # the team's their fastest: over 4 repeats of 1-13 ms graphs (tiny cnn, nmt,
    # transformer), the fastest of 3 steps varied up to 1.73x, of 15 steps up to 1.32x.
    corun_steps: int = 15
    wake_reps: int = WAKE_REPS  # timed calls per round of each op's wake cost (calibrate.wake); 0: none
    wake_scale_every: int = 4  # every Nth case's wake is timed at the smaller thread counts too; 0: none
    in_turn_rounds: int = IN_TURN_ROUNDS  # timed rounds of the in-turn convolutions (calibrate.in_turn); 0: none
    cold_per_class: int = 0  # sweep calls per op class timed cold (calibrate.cold, `with_cold`); 0: no cold costs
    dispatch_ops: int = 1000  # ops per chain of the executor probe (see dispatch.py)
    corun_s: float = 0.25  # per alone/together run of each co-run op
    corun_rounds: int = 3
    # time the wakes of a blocked co-run worker (calibrate.thread_wake), a host condition kept
    # in the Profile's meta beside the co-run figures
    thread_wake: bool = True
    # time a small call's stall beside another worker's busy team (calibrate.team_stall), recorded
    team_stall: bool = True
    links: LinkConfig | None = None  # the link benchmark between local ranks (links.py); None: none
    seed: int = 0


# Sweep calls per op class timed cold in the presets (`calibrate.cold`). On by default since
# 2026-12-03: on the 2-core Intel Xeon VM three pairs of quick profiles, with and without,
# scored the dev set 16.9 -> 12.7% and 17.9 -> 13.7% profile-only and the held-out set
# 17.9-18.5 -> 11.6-12.4%, trace-calibrated 0.4-1.2 points worse (two-slot plans); on the
# AMD EPYC VM of 2026-11-27 it had scored the held-out set worse (README, "Cold data").
COLD_PER_CLASS_QUICK = 4
COLD_PER_CLASS_FULL = 8


def quick_config() -> CalibrationConfig:
    return CalibrationConfig(
        quick=True,
        cold_per_class=COLD_PER_CLASS_QUICK,
        links=quick_link_config(),
        # the coverage models add real shapes; big matmuls as held-out models have them; 40
        # convolutions per class, as the full sweep has (12 gave a backward fit 2-3x slow on dense 3x3 ones)
        sweep=SweepConfig(per_class=12, max_flops=3e8, max_elems=1 << 22, big_matmul_flops=1.5e9, extra_convs=28,
                          big_conv_flops=3e9),
        timing=TimingConfig(budget_s=0.01, min_reps=3, max_reps=30),
    )


def with_cold(cfg: CalibrationConfig) -> CalibrationConfig:
    """`cfg` measuring cold costs (`calibrate.cold`), as the presets do: the cold-probe
    coverage model replayed, its calls and up to 4 (quick) or 8 sweep calls per class
    timed cold."""
    return replace(cfg, cold_per_class=COLD_PER_CLASS_QUICK if cfg.quick else COLD_PER_CLASS_FULL)


def without_cold(cfg: CalibrationConfig) -> CalibrationConfig:
    """`cfg` with no cold costs (`schedlab calibrate --no-cold`): the Profile charges none."""
    return replace(cfg, cold_per_class=0)


def full_config() -> CalibrationConfig:
    return CalibrationConfig(
        quick=False,
        cold_per_class=COLD_PER_CLASS_FULL,
        sizes=("tiny", "default"),
        coverage_shapes=tuple(s.name for s in SHAPES),
        sweep=SweepConfig(per_class=40, max_flops=2e9, max_elems=1 << 24),
        timing=TimingConfig(budget_s=0.03, min_reps=5, max_reps=100, warmup=2, retry_budget_s=60.0),
        dispatch_ops=2000,
        replay_rounds=5,
        corun_s=0.5,
        corun_rounds=5,
        links=LinkConfig(),
    )


class _Progress:
    """One tqdm bar per phase on stderr, or nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def bar(self, total: int, desc: str, unit: str) -> tqdm[Any]:
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not self.enabled, leave=True)


def _capture_jobs(cfg: CalibrationConfig) -> list[tuple[str, Callable[[], Workload], str]]:
    """(source, workload factory, optimizer) of every graph to replay: the built-in
    workloads at each size and optimizer, then the coverage models at each shape (SGD:
    the optimizers' ops are the built-ins' business)."""
    from schedlab.workloads import load_workload

    jobs: list[tuple[str, Callable[[], Workload], str]] = [
        (f"{w}/{s}/{o}", partial(load_workload, w, s, seed=cfg.seed), o)
        for s in cfg.sizes
        for w in cfg.workloads
        for o in cfg.optimizers
    ]
    shapes = {s.name: s for s in SHAPES}
    for shape_name in cfg.coverage_shapes:
        if shape_name not in shapes:
            raise SchedlabError(f"unknown coverage shape {shape_name!r}; known: {', '.join(shapes)}")
        models = (*cfg.coverage, COLD_PROBE) if cfg.cold_per_class > 0 else cfg.coverage
        jobs += [
            (f"coverage:{m}/{shape_name}/sgd", partial(_coverage_workload, m, shapes[shape_name], cfg.seed), "sgd")
            for m in models
        ]
    return jobs


def refit_waits(profile: Profile, machine: Machine, progress: bool = False) -> Profile:
    """`profile` with the executor's waits fitted again (`corun_fit.fit_corun_latency`) on
    the calibration steps it kept (`meta["corun_fit"]`), by the simulator as it is now: its
    graphs captured again, nothing run. A change to the simulator's co-run model is judged
    so on the measurements that fitted the old one (then `schedlab fidelity --rescore`)."""
    from schedlab.capture import capture

    rows = profile.meta.get("corun_fit")
    if not rows:
        raise SchedlabError("the profile kept no co-run calibration steps (meta.corun_fit) to fit again: calibrate again")
    cfg = quick_config() if profile.quick else full_config()
    jobs = {source: (make, optimizer) for source, make, optimizer in _capture_jobs(cfg)}
    sources = list(dict.fromkeys(r["source"] for r in rows))
    unknown = [s for s in sources if s not in jobs]
    if unknown:
        raise SchedlabError(f"the profile's co-run steps ran graphs this version does not calibrate: {', '.join(unknown)}")
    graphs = {}
    with _Progress(progress).bar(len(sources), "capture calibration graphs", "graph") as bar:
        for source in sources:
            make, optimizer = jobs[source]
            graphs[source] = capture(make(), optimizer).graph
            bar.update()
    fitted, report = fit_corun_latency(profile, runs_from_report(rows, graphs), machine)
    was = profile.corun.to_json()
    before = {k: was[k] for k in ("latency_us", "team_latency_us")}
    return replace(fitted, meta={**profile.meta, "corun_fit": report, "refit_from": before})


def _coverage_workload(name: str, shape: Shape, seed: int) -> Workload:
    import torch

    torch.manual_seed(seed)
    module, inputs = build_coverage(name, shape)
    return Workload(f"coverage:{name}", shape.name, module, inputs)


def _capture_all(cfg: CalibrationConfig, progress: _Progress, failures: list[str]) -> list[tuple[str, Any]]:
    """Capture every graph of `_capture_jobs`; one that fails is noted and skipped."""
    from schedlab.capture import capture

    jobs = _capture_jobs(cfg)
    out = []
    with progress.bar(len(jobs), "capture workloads", "graph") as bar:
        for source, make, optimizer in jobs:
            bar.set_postfix_str(source)
            try:
                out.append((source, capture(make(), optimizer)))
            except SchedlabError as e:
                failures.append(f"capture {source}: {e}")
            bar.update()
    return out


@dataclass
class _Bench:
    """What benchmarking collected: (case, threads, call_us), failures, contended points."""

    retry: RetryBudget
    results: list[tuple[Case, int, float]] = field(default_factory=list)
    occurrences: list[Occurrence] = field(default_factory=list)  # ops as they ran in a step
    corun_runs: list[CorunRun] = field(default_factory=list)  # graphs run with two slots
    wake: list[WakePoint] = field(default_factory=list)  # ops' cost of waking throttled helpers
    failures: list[str] = field(default_factory=list)
    contended: int = 0
    # the cold extras (calibrate.cold): what evicts the caches, the calls timed cold
    evict: Callable[[], None] | None = None
    cold: list[ColdPoint] = field(default_factory=list)
    in_turn: InTurnCurve | None = None  # convolutions taking turns (calibrate.in_turn), measured first


def _bench(
    cases: Iterator[Case], threads: tuple[int, ...], cfg: CalibrationConfig, on_done: Callable[[], None], acc: _Bench,
    cores: int,
) -> None:
    """Time every case at every thread count (a view: at one) into `acc`; contended points
    are left out. Each op's cost of waking throttled OpenMP helpers (`calibrate.wake`) is
    timed at the most threads, and every `wake_scale_every`-th case's at each smaller count
    of two or more, on a machine of `cores` cores."""
    for i, case in enumerate(cases):
        k_threads, timing = ((1,), cfg.view_timing) if case.is_view else (threads, cfg.timing)
        try:
            times, contended = time_point(
                case.fn, case.args, case.kwargs, k_threads, timing, set_intra_op_threads, acc.retry
            )
            light = _light(case)
            acc.results += [(light, k, call_us) for k, call_us in times.items() if k not in contended]
            acc.contended += len(contended)
            most = max(k_threads)
            every = cfg.wake_scale_every
            for k in sorted(k_threads, reverse=True):
                if k < 2 or k in contended or cfg.wake_reps <= 0 or (k < most and (every <= 0 or i % every)):
                    continue
                extra = time_wake(case.fn, case.args, case.kwargs, k, cores, reps=wake_reps(times[k], cfg.wake_reps))
                acc.wake.append(WakePoint(case.op_class, case.flops, case.nbytes, k, extra))
            _time_cold(case, {k: t for k, t in times.items() if k not in contended}, cfg, acc)
        except Exception as e:  # one op failing must not lose the calibration
            acc.failures.append(f"{case.target} ({case.source}): {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        on_done()


COLD_ALWAYS_US = 2000.0  # longer replayed calls, mostly compute-bound, are timed cold only up to the class quota


def _time_cold(case: Case, hot_us: dict[int, float], cfg: CalibrationConfig, acc: _Bench) -> None:
    """Time `case` cold (`calibrate.cold.time_cold`) if its inputs hold at least
    `MIN_INPUT_BYTES`: a call of a replayed graph of at most `COLD_ALWAYS_US` (the in-step
    share is fitted on such calls), any other while its class has fewer than
    `cfg.cold_per_class` cold calls. `hot_us`: its call time per thread count to time."""
    if acc.evict is None or case.is_view or not hot_us or cfg.cold_per_class <= 0:
        return
    threads = tuple(sorted(hot_us))
    cls = base_class(case.op_class)
    always = case.source != SWEEP_SOURCE and max(hot_us.values()) <= COLD_ALWAYS_US
    if not always and sum(1 for p in acc.cold if p.op_class == cls and p.threads == threads[0]) >= cfg.cold_per_class:
        return
    if tensor_bytes(case.args) + tensor_bytes(case.kwargs.values()) < MIN_INPUT_BYTES:
        return
    extra = time_cold(case.fn, case.args, case.kwargs, threads, set_intra_op_threads, acc.evict)
    acc.cold += [ColdPoint(cls, case.nbytes, k, us, case.signature) for k, us in extra.items()]


def _light(case: Case) -> Case:
    """The case without its tensors (results outlive the replay)."""
    return replace(case, args=(), kwargs={})


# The cold probe (`coverage.COLD_PROBE`), whose replayed ops the in-step share is fitted on,
# replays more steps after more untimed ones than the other graphs: its megabyte outputs
# take fresh pages from the allocator for the first steps. Replayed in a fresh process on
# the 2-core AMD EPYC VM (2026-12-08, one thread, ten timed steps after one untimed): its
# 8-12 MiB `pow`, `mul` and `add` took 1,300-1,760 us in the first one or two timed steps
# and 74-215 us after (a spike of 1,300-1,600 us now and then later). Timed over three
# steps after one, as the other graphs are, the share of seven quick calibrations of two
# days read 0.28-1.0, its 14 ops' ratios -0.01 to 5.81 within one calibration.
COLD_PROBE_WARMUP = 3
COLD_PROBE_STEPS = 9


def replay_steps(source: str, replay_rounds: int) -> tuple[int, int]:
    """(timed steps, untimed steps first) a calibration graph named `source` is replayed
    with: the cold probe's `COLD_PROBE_STEPS` (at least `replay_rounds`) after
    `COLD_PROBE_WARMUP`, any other graph's `replay_rounds` after one."""
    if source.startswith(f"coverage:{COLD_PROBE}/"):
        return max(replay_rounds, COLD_PROBE_STEPS), COLD_PROBE_WARMUP
    return replay_rounds, 1


def _occurrences(
    graph: Graph, input_values: dict[int, Any], machine: Machine, dispatch: DispatchFigures, steps: int,
    in_turn: InTurnCurve | None = None, warmup: int = 1,
) -> list[Occurrence]:
    """Every op of `graph` as it runs in a step of the executor (one slot, one thread),
    as a bare call's time (`calibrate.context`); views as "view:<class>".

    An event of the straight-line step holds the executor's dispatch and the call; the
    dispatch figure less the bare call floor (of a view: the view figures) is taken off.
    """
    from schedlab.exec import run_steps
    from schedlab.plan import Plan

    res = run_steps(graph, input_values, Plan(slots=1, threads=1), machine, steps=steps, warmup=warmup)
    durs: list[list[float]] = [[] for _ in graph.ops]
    for e in res.trace.events:
        durs[e.op].append(e.dur_ns / 1e3)
    first = first_uses(graph)
    out = []
    for op, ds in zip(graph.ops, durs, strict=True):
        if op.is_view:
            cls, less = f"view:{op.op_class}", dispatch.view_us - dispatch.view_call_floor_us
        else:
            cls, less = op.op_class, dispatch.op_us - dispatch.call_floor_us
        factor = 1.0 if op.is_view else in_turn_factor(in_turn, graph, op.op_class)
        out.append(Occurrence(signature(op), cls, op.id in first, robust_mean(ds) - less, op.bytes_moved, factor))
    return out


def _benchmark_all(
    cfg: CalibrationConfig,
    threads: tuple[int, ...],
    machine: Machine,
    dispatch: DispatchFigures,
    bars: _Progress,
    acc: _Bench,
) -> None:
    """Capture the workloads, run them with two slots, then time their distinct ops and
    the sweep into `acc`."""
    captured = _capture_all(cfg, bars, acc.failures)
    if cfg.corun_steps > 0:
        with bars.bar(1, "executor steps, two slots and one-slot teams", "step") as bar:
            graphs = [(source, c.graph, c.input_values) for source, c in captured]
            acc.corun_runs = measure_corun_runs(graphs, threads, machine, cfg.corun_steps)
            bar.update()
    specs = sweep_specs(replace(cfg.sweep, seed=cfg.seed))
    cores = machine.default_device.cores
    counted: set[str] = set()
    for _, c in captured:
        counted.update(new_signatures(c.graph, counted))
    seen: set[str] = set()
    with bars.bar(len(counted) + len(specs), f"benchmark ops x {len(threads)} thread counts", "op") as bar:
        for source, c in captured:
            bar.set_postfix_str(source)
            steps, warmup = replay_steps(source, cfg.replay_rounds)
            acc.occurrences += _occurrences(c.graph, c.input_values, machine, dispatch, steps, acc.in_turn, warmup)
            _bench(workload_cases(c.graph, c.input_values, seen, source), threads, cfg, bar.update, acc, cores)
        bar.set_postfix_str("sweep")
        _bench(sweep_cases(specs, seen), threads, cfg, bar.update, acc, cores)
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
            corun, corun_foreign = measure_corun_quiet(cores, cfg.corun_s, cfg.corun_rounds)
            bar.update()
        wake_levels: list[WakeLevel] = []
        if cfg.thread_wake and cores > 1:  # how long a blocked co-run worker takes to run again (recorded)
            with bars.bar(1, "thread wake", "step") as bar:
                wake_levels = measure_thread_wake()
                bar.update()
        stall_levels: list[StallLevel] = []
        if cfg.team_stall and cores > 1:  # what a call waits beside a busy team (recorded)
            with bars.bar(1, "team stall", "step") as bar:
                stall_levels = measure_team_stall(threads, cores)
                bar.update()
        scaling = probe_host_scaling(max(threads))  # the host's two-core state this hour (host_scaling.py)
        with bars.bar(1, "roofline", "step") as bar:
            roofline = measure_roofline(threads, set_intra_op_threads)
            bar.update()
        if cfg.in_turn_rounds > 0:  # before the op benchmarks, at one thread (see co-run above)
            import torch

            with bars.bar(1, "convolutions in turn", "step") as bar:
                acc.in_turn = measure_in_turn(torch, rounds=cfg.in_turn_rounds)
                bar.update()
        if cfg.cold_per_class > 0:
            import torch

            acc.evict = Evictor(torch)
        _benchmark_all(cfg, threads, host, dispatch, bars, acc)
    finally:
        set_intra_op_threads(before)
    if not acc.results:
        raise SchedlabError("calibration measured no ops; nothing to fit" + "".join(f"\n  {f}" for f in acc.failures))
    floor = dispatch.call_floor_us
    cold, cold_kept = _fit_cold(acc) if acc.evict is not None else (None, None)
    acc.evict = None  # frees the eviction buffer
    context, in_step = _in_step(acc, roofline, cold)
    context = replace(context, in_turn=acc.in_turn)
    ops = [(c, k, t) for c, k, t in in_step if not c.is_view]
    points = [Point(c.signature, c.op_class, c.flops, c.nbytes, k, max(t, 1e-3)) for c, k, t in ops]
    with bars.bar(1, "fit", "step") as bar:
        fallback, classes = fit_all(points, floor, cfg.seed)
        def model_of(cls: str) -> WorkThreadsModel | None:
            return classes[cls].model if cls in classes else None

        wake = fit_wake(acc.wake, model_of)
        wake_scale = fit_wake_scale(acc.wake, wake, model_of)
        views = _view_costs(in_step, dispatch.view_call_floor_us)
        bar.update()
    signatures: dict[str, dict[int, float]] = {}
    for c, k, call_us in ops:
        signatures.setdefault(c.signature, {})[k] = max(0.0, call_us - floor)
    cpu_end = snapshot()
    meta: dict[str, Any] = {
        "workloads": list(cfg.workloads),
        "sizes": list(cfg.sizes),
        "optimizers": list(cfg.optimizers),
        "coverage": [f"{m}/{s}" for s in cfg.coverage_shapes for m in cfg.coverage],
        "threads": list(threads),
        "n_cases": len(signatures),
        "n_view_cases": len(views.signatures),
        "n_points": len(points),
        "flop_counting": FLOP_COUNTING,  # the formulas the class fits saw (schedlab.flops)
        "points_under_floor": sum(p.call_us < floor for p in points),  # fitted as at it (fit.at_floor)
        "failures": acc.failures,
        "contended_points": acc.contended,
        # the replayed ops with a cold extra, which the cold share is fitted on (class, excess, cold extra, hot us;
        # `fit_share` keeps those whose extra is large enough): a fit can be tried again offline
        "cold_share_points": None if cold_kept is None else [[c, round(x, 2), round(k, 2), round(h, 2)]
                                                             for c, x, k, h in cold_kept if k > 0],
        # other processes' CPU share during each reading of the co-run figures (`measure_corun_quiet`)
        "corun_foreign_readings": [_round(f) for f in corun_foreign],
        "n_wake_points": len(acc.wake),
        # each case's wake as timed (class, flops, bytes, threads, extra us): a fit can be tried again offline
        "wake_points": [[p.op_class, p.flops, p.nbytes, p.threads, round(p.extra_us, 2)] for p in acc.wake],
        "thread_wake": {"levels": [lv.to_json() for lv in wake_levels], "idle_state": idle_state()} if wake_levels else None,
        "team_stall": [lv.to_json() for lv in stall_levels] or None,
        "host_scaling": None if scaling is None else scaling.to_json(),
        "foreign_cpu_frac": _round(foreign_cpu_frac(cpu_start, cpu_end)),
        "steal_frac": _round(steal_frac(cpu_start, cpu_end)),  # the hypervisor's share meanwhile
        "loadavg_1m_start": _round(load_start),
        "host": {k: host.host.get(k) for k in ("hostname", "cpu_model", "python", "torch", "platform")},
        "short_row_floats": short_row_floats(),  # a softmax row shorter than this is fitted as `[short]`
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
        views=views,
        roofline=_with_fixed_cost(roofline, classes),
        context=context,
        wake=wake,
        wake_scale=wake_scale,
        cold=cold,
    )
    if acc.corun_runs:
        with bars.bar(1, "fit the executor's waits", "step") as bar:
            fitted, report = fit_corun_latency(profile, acc.corun_runs, host)
            profile = replace(fitted, meta={**meta, "corun_fit": report})
            bar.update()
    if cfg.links is not None:
        links, failure = _measure_links(cfg.links, bars)
        failures = profile.meta["failures"] + ([failure] if failure else [])
        profile = replace(profile, links=links, meta={**profile.meta, "failures": failures})
    profile = replace(profile, meta={**profile.meta, "wall_s": round(time.perf_counter() - t_start, 2)})
    profile.save(out)
    return profile


def _measure_links(cfg: LinkConfig, bars: _Progress) -> tuple[LinkFits | None, str | None]:
    """The link fits, or None and why the ranks could not be started or measured."""
    with bars.bar(cfg.steps(), "links between ranks", "step") as bar:

        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        try:
            return measure_links(cfg, on_progress=step), None
        except SchedlabError as e:
            return None, f"links: {e}"


def _hot_us(acc: _Bench) -> dict[str, float]:
    """Each benchmarked signature's one-thread call time."""
    return {c.signature: t for c, k, t in acc.results if k == 1}


def _replayed(acc: _Bench) -> list[ReplayedOp]:
    """The replayed ops the in-step share is fitted on: those that ran in a step after their
    target's first use, not compute-bound (a view moves no bytes)."""
    hot = _hot_us(acc)
    return [
        ReplayedOp(o.signature, o.op_class, o.nbytes, o.in_seq_us - hot[o.signature], hot[o.signature])
        for o in acc.occurrences
        if o.signature in hot and not o.first_use and o.op_class not in COMPUTE_CLASSES
    ]


def _fit_cold(acc: _Bench) -> tuple[ColdCosts, list[tuple[str, float, float, float]]]:
    """The cold costs (`calibrate.cold`): slopes from the calls timed cold, the in-step share
    from the replayed ops (`_replayed`); and those ops as the share was fitted on them
    (`cold.share_points`), which the Profile's meta keeps."""
    kept = share_points(acc.cold, _replayed(acc))
    return cold_from(acc.cold, kept), kept


def _in_step(
    acc: _Bench, roofline: Roofline, cold: ColdCosts | None
) -> tuple[ContextCosts, list[tuple[Case, int, float]]]:
    """The context extras, and every benchmarked call time as it would run in a step: plus
    its signature's warm extra, else its class's (at most what moving its bytes from memory
    costs, `calibrate.context.bounded_warm`), else the median over all. The replayed ops'
    cold extras (`cold`) are taken off before the context extras are fitted."""
    hot = _hot_us(acc)

    def cold_us(o: Occurrence) -> float:
        return cold.extra_us(o.op_class, o.nbytes, 1) if cold is not None else 0.0

    curve = acc.in_turn
    context, sig_warm = fit_context(acc.occurrences, hot, cold_us,
                                    None if curve is None else lambda o, hot_us: curve.extra_us(hot_us, o.in_turn))

    def warm(c: Case) -> float:
        if c.signature in sig_warm:
            return sig_warm[c.signature]
        if c.is_view:
            return context.warm(f"view:{c.op_class}")
        return bounded_warm(context, base_class(c.op_class), c.nbytes, lambda b: roofline.mem_us(b, 1))

    return context, [(c, k, max(0.0, t + warm(c))) for c, k, t in acc.results]


def _view_costs(results: list[tuple[Case, int, float]], view_floor_us: float) -> ViewCosts:
    """Each measured view's call time beyond the probe view's, and the fits over them."""
    points = [
        ViewPoint(c.signature, c.op_class, c.outputs, max(0.0, call_us - view_floor_us))
        for c, _, call_us in results
        if c.is_view
    ]
    fallback, classes = fit_views(points)
    return ViewCosts({view_key(p.signature, p.outputs): p.extra_us for p in points}, classes, fallback)


def _with_fixed_cost(roofline: Roofline, classes: dict[str, ClassFit]) -> Roofline:
    """The roofline with the median fixed cost of the classes that have their own fit."""
    own = sorted(f.model.a_us for f in classes.values() if f.model_name == "work_threads")
    return replace(roofline, a_us=own[len(own) // 2] if own else 0.0)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
