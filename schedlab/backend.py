"""One interface for everything that runs a training step: a Backend.

The executor (real torch kernels, `schedlab.exec.ExecBackend`) and the simulator
(`schedlab.sim.SimBackend`) are two implementations of it: the same arguments (a Graph,
a plan resolved against that Graph and a Machine, the Machine) and the same Trace schema
out (DESIGN.md, invariant 1). What differs between them is bound when a backend is made
(the executor's input tensors, the simulator's cost model), never what they are asked to
run. Several processes (one rank each) are a third implementation of the same call.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.trace import Trace


@dataclass(frozen=True)
class BackendRun:
    """What one call of `Backend.run` gives: step times (s), the Trace, memory peaks (bytes)."""

    step_times_s: tuple[float, ...]
    trace: Trace
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)  # per device; {} where not measured

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def source(self) -> str:
        return self.trace.source


@runtime_checkable
class Backend(Protocol):
    """Runs (or predicts) `steps` training steps of `graph` under `resolved` on `machine`."""

    source: str  # the Trace source it writes: "exec" or "sim"

    def run(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, *, steps: int = 1) -> BackendRun: ...
