"""The co-run executor's wait per op, fitted on real graphs with the simulator in the loop.

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
co-run plan: `Profile.kernel_us`) is fitted so that the simulator's step times match the
measured ones (least absolute log error of predicted / measured, fastest of the timed
steps), over a grid of latencies. Its residuals per graph are kept in the Profile's meta, as the error of this
part of the model on graphs it was fitted on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve

MAX_LATENCY_US = 200.0
MAX_STEP_S = 0.05  # graphs whose one-slot step takes longer are left out (calibration time)


@dataclass(frozen=True)
class CorunRun:
    """One calibration graph measured on the co-run executor."""

    source: str
    graph: Graph
    threads: int
    measured_s: float  # fastest timed step, two slots


def measure_corun_runs(
    captured: Sequence[tuple[str, Graph, dict[int, Any]]],
    threads: Sequence[int],
    machine: Machine,
    steps: int,
) -> list[CorunRun]:
    """Each graph (one-slot step under `MAX_STEP_S`) run with two slots at each thread count."""
    from schedlab.exec import run_steps

    runs: list[CorunRun] = []
    if machine.default_device.cores < 2:
        return runs
    for source, graph, inputs in captured:
        one = run_steps(graph, inputs, Plan(slots=1, threads=1), machine, steps=1, warmup=1)
        if min(one.step_times_s) > MAX_STEP_S:
            continue
        for n in threads:
            res = run_steps(graph, inputs, Plan(slots=2, threads=n), machine, steps=steps, warmup=1)
            runs.append(CorunRun(source, graph, n, min(res.step_times_s)))
    return runs


def _predict_s(profile: Profile, run: CorunRun, machine: Machine) -> float:
    from schedlab.sim import simulate

    cost = profile.for_graph(run.graph).for_slots(2)
    return simulate(run.graph, resolve(run.graph, Plan(slots=2, threads=run.threads), machine), machine, cost,
                    record=False).step_time_s


GRID_US = (0.0, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, MAX_LATENCY_US)  # simulated latencies


def _with_latency(profile: Profile, latency: dict[int, float]) -> Profile:
    return dataclasses.replace(profile, corun=dataclasses.replace(profile.corun, latency_us=latency))


def fit_corun_latency(
    profile: Profile, runs: Sequence[CorunRun], machine: Machine
) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """Per thread count, the latency that best fits the runs; and each run's error with it.

    Each run is simulated at the latencies of `GRID_US` (a step grows smoothly with the
    latency), its step time interpolated linearly in between, and the sum of absolute
    log errors minimised over a 0.1 us grid (absolute, not squared: a run that a
    neighbour slowed tenfold must not drag every other graph's prediction).
    """
    curves = {id(r): np.array([_predict_s(_with_latency(profile, {r.threads: x}), r, machine) for x in GRID_US]) for r in runs}
    fine = np.arange(0.0, MAX_LATENCY_US + 0.05, 0.1)
    latency: dict[int, float] = {}
    for n in sorted({r.threads for r in runs}):
        loss = np.zeros_like(fine)
        for r in runs:
            if r.threads == n:
                loss += np.abs(np.log(np.interp(fine, GRID_US, curves[id(r)]) / r.measured_s))
        latency[n] = round(float(fine[int(np.argmin(loss))]), 3)
    fitted = _with_latency(profile, latency)
    report = [
        {
            "source": r.source,
            "threads": r.threads,
            "measured_ms": round(r.measured_s * 1e3, 3),
            "predicted_ms": round(_predict_s(fitted, r, machine) * 1e3, 3),
        }
        for r in runs
    ]
    return latency, report
