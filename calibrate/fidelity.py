"""Fidelity: how well the simulator predicts the executor, over workloads and plans.

For each workload and each plan of a spread (co-run slots 1 and 2, intra-op threads 1
and 2, every order policy), the executor measures the step time and the simulator
predicts it. Reported: per plan the two times and the error, per workload the MAPE, the
worst error and the Kendall rank correlation between predicted and measured, and the
simulator's speed (simulated ops per second; measured step seconds per simulation
second).

Trace-driven calibration (on by default): before the measured runs, each workload is run
under two calibration plans (one slot, program order, 1 thread and all threads), and the
Profile learns each op signature's measured time from those traces. The measured runs
are separate executions; plans with two slots never appear in calibration.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy.stats import kendalltau

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve

DEFAULT_ORDERS = ("topo", "critical-path", "w-last", "random:0")


def plan_spread(cores: int, orders: Sequence[str] = DEFAULT_ORDERS) -> list[Plan]:
    """Slots 1 and 2 x threads 1 and 2 (capped by cores) x every order policy."""
    counts = sorted({1, min(2, cores)})
    return [
        Plan(slots=s, threads=t, order=o, name=f"s{s}-t{t}-{o}")
        for s in counts
        for t in counts
        for o in orders
    ]


@dataclass(frozen=True)
class FidelityRow:
    workload: str
    plan: str
    measured_s: float  # median over timed steps
    measured_spread_s: tuple[float, float]  # min, max
    predicted_s: float
    sim_wall_s: float  # one simulation, record=False, by the search's reused Simulator
    sim_cold_s: float  # one `simulate()` call from scratch (graph structure built anew)
    ops: int
    in_calibration: bool  # whether this plan's thread count and slots were calibration runs

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class WorkloadSummary:
    workload: str
    mape: float
    worst_error: float  # signed, largest in magnitude
    kendall_tau: float
    sim_ops_per_s: float  # reused Simulator (as in search)
    exec_over_sim: float  # measured step seconds / simulation seconds (median over plans)
    exec_over_sim_cold: float  # the same against a `simulate()` call from scratch


def summarise(rows: Sequence[FidelityRow]) -> list[WorkloadSummary]:
    out: list[WorkloadSummary] = []
    for w in dict.fromkeys(r.workload for r in rows):
        rs = [r for r in rows if r.workload == w]
        errs = [r.error for r in rs]
        tau = kendalltau([r.predicted_s for r in rs], [r.measured_s for r in rs]).statistic if len(rs) > 1 else 1.0
        out.append(
            WorkloadSummary(
                workload=w,
                mape=statistics.fmean(abs(e) for e in errs),
                worst_error=max(errs, key=abs),
                kendall_tau=float(tau),
                sim_ops_per_s=statistics.median(r.ops / r.sim_wall_s for r in rs),
                exec_over_sim=statistics.median(r.measured_s / r.sim_wall_s for r in rs),
                exec_over_sim_cold=statistics.median(r.measured_s / r.sim_cold_s for r in rs),
            )
        )
    return out


def measure_and_predict(
    workload: str,
    graph: Graph,
    input_values: dict,  # type: ignore[type-arg]
    plans: Sequence[Plan],
    profile: Profile,
    machine: Machine,
    steps: int = 3,
    warmup: int = 1,
    calibration_threads: Sequence[int] = (),
    progress: Callable[[], None] | None = None,
) -> list[FidelityRow]:
    from schedlab.exec import ExecBackend
    from schedlab.sim import SimBackend, simulate

    # The two backends of one interface, asked the same thing (graph, resolved plan, machine).
    costs = {False: profile.for_slots(1), True: profile.for_slots(2)}  # one-slot or co-running executor
    predictor = SimBackend(lambda r: costs[r.slots > 1])
    executor = ExecBackend(input_values, warmup=warmup, workload=workload)
    rows: list[FidelityRow] = []
    for plan in plans:
        resolved = resolve(graph, plan, machine)
        simulator = predictor.simulator(graph, resolved, machine)
        simulator.run(resolved, record=False)  # the first run of a plan fills the caches
        sim = simulator.run(resolved, record=False)
        cold = simulate(graph, resolved, machine, costs[plan.slots > 1], record=False)
        meas = executor.run(graph, resolved, machine, steps=steps)
        rows.append(
            FidelityRow(
                workload=workload,
                plan=plan.name or plan.describe(),
                measured_s=meas.step_time_s,
                measured_spread_s=(min(meas.step_times_s), max(meas.step_times_s)),
                predicted_s=sim.step_time_s,
                sim_wall_s=sim.sim_wall_s,
                sim_cold_s=cold.sim_wall_s,
                ops=len(graph),
                in_calibration=plan.slots == 1 and plan.order == "topo" and (plan.threads in calibration_threads),
            )
        )
        if progress is not None:
            progress()
    return rows
