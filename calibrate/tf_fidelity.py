"""How well the simulator predicts TensorFlow's own runtime: `schedlab fidelity --backend tensorflow`.

Per workload, every threading setting of a spread (intra-op 1 and all cores x inter-op 1
and all cores; a plan has at most a co-run slot per core) runs in a fresh TensorFlow process (`exec.tf_launch`), which
captures the graph TensorFlow executed and times its steps. The cost model is calibrated
on one plan shape, one inter-op thread at each intra-op count (`calibrate.tf_costs`), and
the simulator predicts every setting on that setting's own captured graph, TF's inter-op
pool as the plan's co-run slots. Rows are `calibrate.fidelity.FidelityRow`s, scored as
torch's are (MAPE, worst error, Kendall tau), on all plans and on the plans calibration
did not see.

With `rounds`, the whole spread runs that many times round-robin, each setting in a fresh
process every round: a TensorFlow step of a few milliseconds is at the mercy of the state
its process found the host in (two runs of one setting here differ by up to 2x), and a
slow spell then falls on every setting alike. Each setting is scored on the median of all
its rounds' steps and calibrates with its typical round (`calibrate.fidelity.pooled_steps`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedlab.calibrate.fidelity import TRACE_CALIBRATED, FidelityRow, pooled_steps
from schedlab.calibrate.host_load import foreign_cpu_frac, snapshot
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.tf_costs import TFCalibrationRun, TFCosts, tf_costs
from schedlab.errors import SchedlabError
from schedlab.exec.tf_job import TFRequest, TFResult
from schedlab.exec.tf_launch import DEFAULT_TF_TIMEOUT_S, run_tf_worker
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve
from schedlab.tf.runtime import TFThreads

PLAN_KIND = "tensorflow"


def tf_plan_spread(cores: int) -> list[TFThreads]:
    """Intra-op 1 and all cores x inter-op 1 and all cores."""
    counts = sorted({1, cores})
    return [TFThreads(i, e) for i in counts for e in counts]


def is_tf_calibration(threads: TFThreads) -> bool:
    """The one plan shape calibration runs: one inter-op thread (nodes one at a time)."""
    return threads.inter_op == 1


def plan_name(threads: TFThreads) -> str:
    return f"tf-intra{threads.intra_op}-inter{threads.inter_op}"


def as_plan(threads: TFThreads, cores: int) -> Plan:
    """The schedlab Plan the simulator runs for a TensorFlow threading (0: TF's default,
    one thread per core for both pools)."""
    return Plan(slots=threads.inter_op or cores, threads=threads.intra_op or cores, name=plan_name(threads))


@dataclass(frozen=True)
class TFPrediction:
    step_time_s: float
    sim_wall_s: float
    sim_cold_s: float


def predict_tf(graph: Graph, threads: TFThreads, costs: TFCosts, machine: Machine) -> TFPrediction:
    """The simulated TensorFlow step (the session's fixed cost added) under `threads`."""
    from schedlab.sim import Simulator, simulate

    resolved = resolve(graph, as_plan(threads, machine.default_device.cores), machine)
    simulator = Simulator(graph, machine, costs)
    simulator.run(resolved, record=False)  # the first run fills the caches, as in search
    warm = simulator.run(resolved, record=False)
    cold = simulate(graph, resolved, machine, costs, record=False)
    return TFPrediction(costs.step_time_s(warm.step_time_s), warm.sim_wall_s, cold.sim_wall_s)


@dataclass(frozen=True)
class TFFidelity:
    workload: str
    rows: list[FidelityRow]
    costs: TFCosts
    results: dict[str, TFResult]  # plan name -> what TensorFlow measured (every round's steps, the typical round's rest)
    foreign_cpu: dict[str, float | None]  # plan name -> share of the CPU other processes used meanwhile
    numerics_ok: bool = True  # every run of every round matched TF eager


def tf_fidelity(
    workload: str,
    size: str,
    plans: Sequence[TFThreads],
    base: Profile | None,
    machine: Machine,
    *,
    optimizer: str = "sgd",
    steps: int = 3,
    warmup: int = 1,
    rounds: int = 1,
    timeout_s: float = DEFAULT_TF_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> TFFidelity:
    """Measure every plan in TensorFlow (`rounds` times, round-robin), calibrate on the
    one-inter-op ones, predict all."""
    if not any(is_tf_calibration(t) for t in plans):
        raise ValueError("the spread needs a plan with one inter-op thread to calibrate on")
    if rounds < 1:
        raise SchedlabError(f"rounds must be at least 1, got {rounds}")
    taken: dict[str, list[TFResult]] = {plan_name(t): [] for t in plans}
    shares: dict[str, list[float]] = {plan_name(t): [] for t in plans}  # foreign CPU, per round where readable
    for _ in range(rounds):
        for threads in plans:
            req = TFRequest(workload=workload, size=size, threads=threads, steps=steps, warmup=warmup,
                            optimizer=optimizer)
            name = plan_name(threads)
            before = snapshot()
            taken[name].append(run_tf_worker(req, timeout_s=timeout_s))
            share = foreign_cpu_frac(before, snapshot())
            if share is not None:
                shares[name].append(share)
            if progress is not None:
                progress(f"{workload} {name}")
    foreign = {name: max(s, default=None) for name, s in shares.items()}  # the busiest round's
    results: dict[str, TFResult] = {}  # every round's steps, the typical round's graph and trace
    typical_run: dict[str, TFResult] = {}  # that round as it was: its trace's steps are its step times
    round_medians: dict[str, tuple[float, ...]] = {}
    for name, runs in taken.items():
        all_steps, typical, medians = pooled_steps([r.step_times_s for r in runs])
        typical_run[name] = runs[typical]
        results[name] = dataclasses.replace(runs[typical], step_times_s=all_steps)
        round_medians[name] = medians if rounds > 1 else ()
    cores = machine.default_device.cores
    cal_runs = [
        TFCalibrationRun(r.graph, r.trace, r.step_times_s, t.intra_op or cores, t.inter_op or cores)
        for t in plans if is_tf_calibration(t) for r in [typical_run[plan_name(t)]]
    ]
    costs = tf_costs(cal_runs, base)
    rows = []
    for threads in plans:
        res = results[plan_name(threads)]
        pred = predict_tf(res.graph, threads, costs, machine)
        rows.append(FidelityRow(
            workload=workload, plan=plan_name(threads), measured_s=res.step_time_s,
            measured_spread_s=(min(res.step_times_s), max(res.step_times_s)), predicted_s=pred.step_time_s,
            sim_wall_s=pred.sim_wall_s, sim_cold_s=pred.sim_cold_s, ops=len(res.graph),
            in_calibration=is_tf_calibration(threads), method=TRACE_CALIBRATED,
            foreign_cpu_frac=foreign[plan_name(threads)], plan_kind=PLAN_KIND,
            round_medians_s=round_medians[plan_name(threads)],
        ))
    numerics_ok = all(bool(r.check.get("numerics_ok")) for runs in taken.values() for r in runs)
    return TFFidelity(workload, rows, costs, results, foreign, numerics_ok)
