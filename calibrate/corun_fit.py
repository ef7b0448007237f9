"""The executor's wait per op, fitted on real graphs with the simulator in the loop.

With several slots the executor's workers hand work to each other through a ready heap,
a condition variable and the interpreter lock. What that costs per op depends on the
machine's state more than on the op: on the 2-core development VM, idle, an unrolled
`nn.GRU` (1,987 ops, one slot 7.4 ms) took 39 ms with two slots of one thread each, 18 ms
with two slots of two threads, and 12 ms with the same two slots while other processes
kept both cores busy. An idle virtual CPU halts and takes tens of microseconds to wake
for a notified worker or a released lock; a busy one (neighbours, or OpenMP threads
spinning after a parallel region) wakes at once. No probe of negligible ops reproduces
that: two always-busy workers never let a CPU halt (3.5 us/op, about the one-chain
figure), and a worker that idles for a long chain between two forks is rare in a probe.

So calibration measures it where it happens: each calibration graph small enough to run
quickly is run on the executor with two slots at each thread count, and for each thread
count one latency per op (microseconds, added to the kernel time of every op of a
co-run plan, views included: `Profile.kernel_us`) is fitted so that the simulator's step
times match the measured ones (least absolute log error of predicted / measured, the
median of the timed steps), over a grid of latencies. Its residuals per graph are kept in
the Profile's meta, as the error of this part of the model on graphs it was fitted on,
with the fastest of the same steps beside each median (`measured_ms`), so that a fit on
either can be tried on a saved profile without calibrating again (`--refit-waits`).

The median, as fidelity scores a plan. On these 1-10 ms steps the median is 1.06-2.66x
the fastest (one quick calibration of 2026-11-29), and from 2026-11-29 to 2026-12-02 the
wait was fitted to the fastest: on the AMD EPYC VM of those days, with the executor
starting its workers anew each step, a fit on the median (27.0 / 42.1 us at one / two
threads against 12.8 / 25.7) put the recurrent held-out models of thousands of tiny ops
far too slow (gru-tagger's two slots of two threads +40% to +59% against +5% to +13%,
trace-calibrated), and fitting the one-thread wait alone to the median moved four held-out
runs' trace-calibrated MAPE from 9.65% to 9.63% (docs/heldout-fidelity-log.md, sessions 37
and 40). Judged on the dev set since the executor keeps its workers from step to step
(`exec.runner`; 2-core Intel Xeon VM, 2026-12-02, two quick calibrations each fitted both
ways from its own kept steps and `schedlab fidelity --dev --rescore`d): profile-only 24.2%
to 19.2% and 21.0% to 17.9%, trace-calibrated 17.2% to 12.7% and 15.2% to 12.2%, the
mean error of two slots of one thread -24.1% to -8.1% in the second. The fastest step is
the regime in which no idle virtual CPU halts between two ops; a step of thousands of
hand-offs is rarely all in it, and a measured plan's median is not.

Views wait too: the workers take every op from the ready heap, a reshape as a matmul.
Charged to non-view ops only, the wait fitted on the calibration graphs carried their
share of views (a third to a half of their ops) into every model, and the held-out models
with the most views were predicted fastest with two slots: re-scoring five saved held-out
runs of 2026-11-27/28 (2-core VM; latencies re-fitted on each profile's own calibration
steps), two slots of two threads had a mean error of -17.5% to -21.2% on the three models
of 53-55% views and +3.4% to +8.0% on the two of 5-7%. Charged to every op, the fitted
wait per op is smaller (10.9 / 22.2 us at one / two threads against 13.8 / 38.0 on one
profile) and the eleven models' MAPE fell in four runs of five (trace-calibrated 7.5 to
6.4%, 9.0 to 8.0%, 10.0 to 8.9%, 10.4 to 9.6%; 9.3 to 9.4% in the fifth).

One slot has a wait of its own at more than one intra-op thread (`CorunFigures.team_latency_us`,
`Profile.team_us`), fitted the same way on one-slot steps of the same graphs: between the
interpreter's ops a team costs more than a kernel timed back to back shows. The quick
calibration's small graphs (2026-11-28, 2-core VM) ran 5-85% slower at one slot of two
threads than at one thread (10 of 12 graphs), where a quick profile predicted them 0-9%
slower. This wait is fitted to the ratio of the one-slot step at n threads to the
one-thread step measured beside it (`TEAM_ROUNDS` rounds, each in turn), not to its
level: a quick profile calibrated while the host ran slow (the calibration took 216 s
where about 110 is usual) predicted those steps 5-94% slower than they measured even at
no wait, so a fit on the level read 0 us; the ratio of two steps timed a second apart
does not carry the host's level of the minutes before. Fitted so, three quick
calibrations of that day: 0.5 and 0.6 us an op at two threads in a slow spell of the host,
0.0 at its usual pace (the class fits' own thread costs then put those steps at their
measured ratio).

Since 2026-12-03 an op pays the team's wait in proportion to its parallel share under its
class model (`CorunFigures.team_share`, `Profile.team_wait_us`): an op below ATen's grain
size never forks its team, and the tiny calibration graphs are mostly such ops (a parallel
share of 0.15 on average, against 0.46-0.53 on the recurrent held-out models), so a wait
spread over all their ops came out near nothing. Judged on the dev set (2-core Intel Xeon
VM; a quick profile's waits fitted again both ways on its own kept steps, the same dev run
re-scored): the team's wait 0.1 us an op against 1.2 us times the share, one slot of two
threads -8.4% to -6.8% mean error profile-only (-6.5% to -5.0% trace-calibrated), all
17.2% to 17.0% and 13.5% to 13.2%; then measured on the held-out set, its run P re-scored
the same way, 12.3% to 12.1% and 10.0% to 9.8% (one slot of two threads -12.7% to -11.7%
profile-only). Still about a tenth fast there: the kernels' thread
scaling timed back to back matches the class fits (`dev:lstm` 0.80x from one thread to two
measured, 0.86x predicted), so what is left is paid in the step, not in the kernel.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph, same_capture
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve

MAX_LATENCY_US = 200.0
MAX_STEP_S = 0.05  # graphs whose one-slot step takes longer are left out (calibration time)
TEAM_ROUNDS = 3  # one-slot rounds, one thread and each team in turn, that share the timed steps


@dataclass(frozen=True)
class CorunRun:
    """One calibration graph measured on the executor: with two slots (the co-run wait), or
    with one slot at more than one thread (the team's wait)."""

    source: str
    graph: Graph
    threads: int
    measured_s: float  # the fastest timed step (the one-slot team wait's fit matches its ratio)
    slots: int = 2
    # one slot: the fastest one-thread step measured beside it; the fit matches the ratio
    one_thread_s: float | None = None
    # the median timed step: what the two-slot fit matches (the fastest where a row has none)
    median_s: float | None = None
    one_thread_median_s: float | None = None


def measure_corun_runs(
    captured: Sequence[tuple[str, Graph, dict[int, Any]]],
    threads: Sequence[int],
    machine: Machine,
    steps: int,
) -> list[CorunRun]:
    """Each graph (one-slot step under `MAX_STEP_S`) run with two slots at each thread
    count, and with one slot at each count above one."""
    from schedlab.exec import run_steps

    runs: list[CorunRun] = []
    if machine.default_device.cores < 2:
        return runs
    teams = [n for n in threads if n > 1]
    for source, graph, inputs in captured:
        one = run_steps(graph, inputs, Plan(slots=1, threads=1), machine, steps=1, warmup=1)
        if min(one.step_times_s) > MAX_STEP_S:
            continue

        def steps_s(slots: int, n: int, k: int, graph: Graph = graph, inputs: dict[int, Any] = inputs) -> list[float]:
            return list(run_steps(graph, inputs, Plan(slots=slots, threads=n), machine, steps=k, warmup=1).step_times_s)

        for n in threads:
            timed = steps_s(2, n, steps)
            runs.append(CorunRun(source, graph, n, min(timed), median_s=statistics.median(timed)))
        if teams:  # one thread and each team in turn, TEAM_ROUNDS times: the two steps' ratio is what is fitted
            per_round = max(1, steps // TEAM_ROUNDS)
            taken: dict[int, list[float]] = {n: [] for n in (1, *teams)}
            for _ in range(TEAM_ROUNDS):
                for n, timed in taken.items():
                    timed += steps_s(1, n, per_round)
            alone = taken[1]
            runs += [
                CorunRun(source, graph, n, min(taken[n]), slots=1, one_thread_s=min(alone),
                         median_s=statistics.median(taken[n]), one_thread_median_s=statistics.median(alone))
                for n in teams
            ]  # fmt: skip
    return runs


def _predict_s(profile: Profile, run: CorunRun, machine: Machine, threads: int | None = None) -> float:
    from schedlab.sim import simulate

    cost = profile.for_graph(run.graph).for_slots(run.slots)
    plan = resolve(run.graph, Plan(slots=run.slots, threads=threads or run.threads), machine)
    return simulate(run.graph, plan, machine, cost, record=False).step_time_s


def _target_s(profile: Profile, run: CorunRun, machine: Machine) -> float:
    """The step the fit matches: a two-slot run's median step (its fastest where none was
    kept), or for a run with a one-thread step beside it, the ratio of the fastest of each
    times the one-thread step predicted (no team there)."""
    if run.one_thread_s is None:
        return run.median_s if run.median_s is not None else run.measured_s
    return run.measured_s / run.one_thread_s * _predict_s(profile, run, machine, threads=1)


GRID_US = (0.0, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, MAX_LATENCY_US)  # simulated latencies


def _with_latency(profile: Profile, slots: int, latency: dict[int, float]) -> Profile:
    """`profile` with the co-run wait (`slots` > 1) or the one-slot team's wait set to `latency`."""
    c = profile.corun
    corun = dataclasses.replace(c, latency_us=latency) if slots > 1 else dataclasses.replace(c, team_latency_us=latency)
    return dataclasses.replace(profile, corun=corun)


def fit_corun_latency(profile: Profile, runs: Sequence[CorunRun], machine: Machine) -> tuple[Profile, list[dict[str, Any]]]:
    """`profile` with, per thread count, the co-run wait (`CorunFigures.latency_us`) that
    best fits the two-slot runs and the team's wait (`team_latency_us`) that best fits the
    one-slot runs; and each run's error with them. The two are fitted apart: neither
    changes the other's predictions.

    Each run is simulated at the latencies of `GRID_US` (a step grows smoothly with the
    latency), its step time interpolated linearly in between, and the sum of absolute
    log errors minimised over a 0.1 us grid (absolute, not squared: a run that a
    neighbour slowed tenfold must not drag every other graph's prediction).
    """
    # views wait too; the team's wait is paid in proportion to an op's parallel share
    profile = dataclasses.replace(profile, corun=dataclasses.replace(profile.corun, views_wait=True, team_share=True))
    fine = np.arange(0.0, MAX_LATENCY_US + 0.05, 0.1)
    target = {id(r): _target_s(profile, r, machine) for r in runs}
    fitted = profile
    for slots in sorted({r.slots for r in runs}, reverse=True):
        mine = [r for r in runs if r.slots == slots]
        curves = {
            id(r): np.array([_predict_s(_with_latency(profile, slots, {r.threads: x}), r, machine) for x in GRID_US])
            for r in mine
        }
        latency: dict[int, float] = {}
        for n in sorted({r.threads for r in mine}):
            loss = np.zeros_like(fine)
            for r in mine:
                if r.threads == n:
                    loss += np.abs(np.log(np.interp(fine, GRID_US, curves[id(r)]) / target[id(r)]))
            latency[n] = round(float(fine[int(np.argmin(loss))]), 3)
        fitted = _with_latency(fitted, slots, latency)
    return fitted, [_report_row(fitted, r, machine, target[id(r)]) for r in runs]


def runs_from_report(rows: Sequence[dict[str, Any]], graphs: dict[str, Graph]) -> list[CorunRun]:
    """The runs a fit's report rows (`fit_corun_latency`, kept in a Profile's meta as
    `corun_fit`) were measured as, on `graphs` (source -> the graph captured again): what
    re-fitting a saved profile reads. A row that names its graph's hash must match it, or
    name the same schedule (`Graph.schedule_hash`: a capture may read a gradient from
    another of a producer's equal outputs than the calibration's did)."""
    from schedlab.errors import SchedlabError

    runs = []
    for r in rows:
        g = graphs[r["source"]]
        kept = r.get("graph")
        if kept is not None and not same_capture(g, kept, r.get("schedule")):
            why = ("torch, schedlab or the workload changed since" if r.get("schedule") is not None else
                   "the profile keeps no schedule hash to compare (calibrated before 2026-12-02 evening), and a capture of a "
                   "recurrent model can differ between processes only in which equal output a gradient reads")
            raise SchedlabError(
                f"calibration graph {r['source']} captured now (hash {g.hash}) is not the one the profile measured "
                f"({kept}): {why}; calibrate again"
            )
        measured = _seconds(r, "measured_ms")
        if measured is None:
            raise SchedlabError(f"a co-run fit row of {r['source']} has no measured_ms")
        runs.append(CorunRun(
            r["source"], g, int(r["threads"]), measured, slots=int(r["slots"]),
            one_thread_s=_seconds(r, "one_thread_measured_ms"), median_s=_seconds(r, "median_ms"),
            one_thread_median_s=_seconds(r, "one_thread_median_ms"),
        ))  # fmt: skip
    return runs


def _seconds(row: dict[str, Any], key: str) -> float | None:
    """A report row's milliseconds at `key` in seconds, or None where it has none."""
    v = row.get(key)
    return None if v is None else float(v) / 1e3


def _report_row(fitted: Profile, r: CorunRun, machine: Machine, target_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "source": r.source,
        "graph": r.graph.hash,
        "schedule": r.graph.schedule_hash,
        "slots": r.slots,
        "threads": r.threads,
        "measured_ms": round(r.measured_s * 1e3, 3),
        "predicted_ms": round(_predict_s(fitted, r, machine) * 1e3, 3),
    }
    if r.median_s is not None:
        row["median_ms"] = round(r.median_s * 1e3, 3)
    if r.one_thread_s is not None:  # the team's ratio, at the predicted one-thread level
        row["one_thread_measured_ms"] = round(r.one_thread_s * 1e3, 3)
    row["target_ms"] = round(target_s * 1e3, 3)  # what the fit matched
    if r.one_thread_median_s is not None:
        row["one_thread_median_ms"] = round(r.one_thread_median_s * 1e3, 3)
    return row
