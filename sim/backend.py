"""The simulator as a `schedlab.backend.Backend`: predicted steps, from a cost model."""

from __future__ import annotations

from collections.abc import Callable

from schedlab.backend import BackendRun
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.sim.cost import CostModel
from schedlab.sim.engine import Simulator


class SimBackend:
    """Predicts a step with the cost model `cost_for(resolved)` gives for each plan.

    A simulated step is deterministic, so `steps` identical steps are one simulated step
    repeated. One `Simulator` is kept per (graph, machine, cost model), so a backend that
    predicts many plans of one graph pays the set-up once, as the search does.
    """

    source = "sim"

    def __init__(self, cost_for: Callable[[ResolvedPlan], CostModel], *, engine: str = "auto") -> None:
        self.cost_for = cost_for
        self.engine = engine
        self._sims: dict[tuple[str, str, int], Simulator] = {}

    def simulator(self, graph: Graph, resolved: ResolvedPlan, machine: Machine) -> Simulator:
        cost = self.cost_for(resolved)
        key = (graph.hash, machine.name, id(cost))
        sim = self._sims.get(key)
        if sim is None or sim.cost is not cost:
            sim = self._sims[key] = Simulator(graph, machine, cost)
        return sim

    def run(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, *, steps: int = 1) -> BackendRun:
        res = self.simulator(graph, resolved, machine).run(resolved, record=True, engine=self.engine)
        assert res.trace is not None
        return BackendRun(step_times_s=(res.step_time_s,) * max(1, steps), trace=res.trace, peak_memory_bytes=res.peak_memory_bytes)
