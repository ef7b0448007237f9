"""The executor as a `schedlab.backend.Backend`: real steps, measured."""

from __future__ import annotations

import torch

from schedlab.backend import BackendRun
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.runner import Executor, run_steps
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan


class ExecBackend:
    """Runs steps with torch kernels from `input_values` (graph input value id -> tensor).

    Each call starts from the same inputs, runs `warmup` untimed steps, then `steps` timed
    ones. The compiled program is kept per graph, so many plans of one graph compile once.
    """

    source = "exec"

    def __init__(self, input_values: dict[int, torch.Tensor], *, warmup: int = 1, workload: str = "") -> None:
        self.input_values = input_values
        self.warmup = warmup
        self.workload = workload
        self._programs: dict[str, Program] = {}

    def run(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, *, steps: int = 1) -> BackendRun:
        program = self._programs.get(graph.hash)
        if program is None:
            program = self._programs[graph.hash] = compile_graph(graph)
        res = run_steps(
            graph,
            self.input_values,
            resolved.plan,
            machine,
            steps=steps,
            warmup=self.warmup,
            workload=self.workload,
            executor=Executor(graph, resolved, program),
        )
        return BackendRun(step_times_s=res.step_times_s, trace=res.trace)
