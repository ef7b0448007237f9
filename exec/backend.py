"""The executor as a `schedlab.backend.Backend`: real steps, measured.

A plan on one device runs in this process (`runner.py`); a plan spanning devices runs one
process per rank (`launch.py`), through `DistBackend`, which `ExecBackend` hands it to.
"""

from __future__ import annotations

import torch

from schedlab.backend import BackendRun
from schedlab.exec.launch import DEFAULT_TIMEOUT_S, run_ranks
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.runner import Executor, run_steps
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan


class DistBackend:
    """Runs steps of a multi-device plan, one process per rank of the machine (gloo).

    Each call starts the ranks afresh (a second or more of start-up, not timed) from the
    same inputs, runs `warmup` untimed steps, then `steps` timed ones; step times are as
    `launch.STEP_TIME_DEFINITION` says.
    """

    source = "exec"

    def __init__(
        self, input_values: dict[int, torch.Tensor], *, warmup: int = 1, workload: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.input_values = input_values
        self.warmup = warmup
        self.workload = workload
        self.timeout_s = timeout_s

    def run(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, *, steps: int = 1) -> BackendRun:
        res = run_ranks(
            graph, resolved, machine, self.input_values, steps=steps, warmup=self.warmup,
            timeout_s=self.timeout_s, workload=self.workload,
        )
        return BackendRun(step_times_s=res.step_times_s, trace=res.trace)


class ExecBackend:
    """Runs steps with torch kernels from `input_values` (graph input value id -> tensor).

    Each call starts from the same inputs, runs `warmup` untimed steps, then `steps` timed
    ones. The compiled program is kept per graph, so many plans of one graph compile once.
    A plan that spans devices runs on several processes (`DistBackend`).
    """

    source = "exec"

    def __init__(
        self, input_values: dict[int, torch.Tensor], *, warmup: int = 1, workload: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._ranks = DistBackend(input_values, warmup=warmup, workload=workload, timeout_s=timeout_s)  # holds them
        self._programs: dict[str, Program] = {}

    def run(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, *, steps: int = 1) -> BackendRun:
        if resolved.multi_device:
            return self._ranks.run(graph, resolved, machine, steps=steps)
        run = resolved.run_graph(graph)  # unrolled, for a steady-state plan
        program = self._programs.get(run.hash)
        if program is None:
            program = self._programs[run.hash] = compile_graph(run)
        shared = self._ranks
        res = run_steps(
            graph,
            shared.input_values,
            resolved.plan,
            machine,
            steps=steps,
            warmup=shared.warmup,
            workload=shared.workload,
            executor=Executor(run, resolved, program),
        )
        return BackendRun(step_times_s=res.step_times_s, trace=res.trace)
