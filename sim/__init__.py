"""The simulator: a SimPy model of devices, threads, streams, interconnect and memory.

`simulate(graph, resolved_plan, machine, cost)` predicts one training step and returns a
`SimResult` whose Trace has the executor's schema (source "sim"). Time inside the model is
in microseconds; results are in seconds and bytes.
"""

from __future__ import annotations

from sim.engine import ENGINES, Simulator, simulate
from sim.fluid import FluidShare
from sim.interconnect import Network, TransferRecord, link_time_us
from sim.result import SimResult
from sim.server import SimServer

__all__ = [
    "ENGINES",
    "FluidShare",
    "Network",
    "SimResult",
    "SimServer",
    "Simulator",
    "TransferRecord",
    "link_time_us",
    "simulate",
]
