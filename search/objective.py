"""The objective of a search: one Plan simulated on this host's Machine with a cost model.

An `Evaluator` binds a Graph, a Machine and a cost model (a calibrated `Profile`) once and
reuses the simulator's per-graph preparation for every plan, as a search asks thousands
of times. A plan that fails validation or does not fit in memory is *infeasible*: the
evaluation says why instead of raising, and the search records it as a failed or pruned
trial.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op
from schedlab.machine import Machine
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.sim import SimResult
from schedlab.sim.cost import CostModel, op_cost_us

OBJECTIVES = ("time", "memory")  # what a search may minimise: step time, peak memory


@dataclass(frozen=True)
class Evaluation:
    """One simulated plan. `error` set: infeasible (the plan is invalid or does not fit)."""

    plan: Plan
    step_time_s: float
    peak_memory_bytes: int  # on the plan's device (max over devices)
    error: str | None = None
    oom: bool = False
    sim_wall_s: float = 0.0
    result: SimResult | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def values(self, objectives: tuple[str, ...]) -> list[float]:
        """The objective values in the order of `objectives` (seconds, bytes)."""
        out: list[float] = []
        for name in objectives:
            if name == "time":
                out.append(self.step_time_s)
            elif name == "memory":
                out.append(float(self.peak_memory_bytes))
            else:
                raise SchedlabError(f"unknown objective {name!r}; use {', '.join(OBJECTIVES)}")
        return out


class Evaluator:
    """Simulates plans of one graph on one machine; `evaluate(plan)` never raises for a bad plan."""

    def __init__(self, graph: Graph, machine: Machine, cost: CostModel) -> None:
        self.graph = graph
        self.machine = machine
        self._base_cost = cost
        self._sims: dict[bool, Any] = {}  # co-running (slots > 1) or not -> bound simulator
        self._weights_us: dict[tuple[int, int], float] = {}  # (op id, threads) -> op_cost_us
        self._op_cost_us = op_cost_us(cost)

    def _simulator(self, slots: int) -> Any:
        """The simulator for plans with `slots` workers: the executor's per-op cost differs
        between one worker (straight-line code) and several (a shared ready heap)."""
        corun = slots > 1
        if corun not in self._sims:
            cost = self._base_cost
            for_graph = getattr(cost, "for_graph", None)
            if for_graph is not None:  # a Profile charges each op target's first use in the step
                cost = for_graph(self.graph)
            for_slots = getattr(cost, "for_slots", None)
            if for_slots is not None:
                cost = for_slots(slots)
            self._sims[corun] = _make_simulator(self.graph, self.machine, cost)
        return self._sims[corun]

    def resolve(self, plan: Plan) -> ResolvedPlan:
        """`resolve` with the cost model's op times as critical-path weights (as validate
        resolves the plans it runs), looked up once per op and thread count."""
        return resolve(self.graph, plan, self.machine, op_cost_us=self._weight_us)

    def _weight_us(self, op: Op, threads: int) -> float:
        key = (op.id, threads)
        w = self._weights_us.get(key)
        if w is None:
            w = self._weights_us[key] = self._op_cost_us(op, threads)
        return w

    def simulate(self, resolved: ResolvedPlan, record: bool = False) -> SimResult:
        result: SimResult = self._simulator(resolved.slots).run(resolved, record=record)
        return result

    def evaluate(self, plan: Plan, record: bool = False) -> Evaluation:
        t0 = time.perf_counter()
        try:
            result = self.simulate(self.resolve(plan), record=record)
        except SchedlabError as e:
            return Evaluation(plan, math.inf, 0, error=f"invalid plan: {e}", sim_wall_s=time.perf_counter() - t0)
        peak = max(result.peak_memory_bytes.values(), default=0)
        error = None
        if result.oom_devices:
            cap = {d.id: d.memory_bytes for d in self.machine.devices}
            dev = result.oom_devices[0]
            error = (
                f"out of memory on {dev}: simulated peak {result.peak_memory_bytes[dev] / 2**20:.1f} MiB "
                f"> {cap[dev] / 2**20:.1f} MiB"
            )
        return Evaluation(
            plan,
            result.step_time_s,
            peak,
            error=error,
            oom=bool(result.oom_devices),
            sim_wall_s=time.perf_counter() - t0,
            result=result,
        )


def _make_simulator(graph: Graph, machine: Machine, cost: CostModel) -> Any:
    """The simulator bound once to this graph (sim.Simulator)."""
    from schedlab.sim import Simulator

    return Simulator(graph, machine, cost)
