"""The simulator: a SimPy model of devices, threads, streams, interconnect and memory.

`simulate(graph, resolved_plan, machine, cost)` predicts one training step and returns a
`SimResult` whose Trace has the executor's schema (source "sim"). Time inside the model is
in microseconds; results are in seconds and bytes.
"""

from __future__ import annotations

from schedlab.sim.backend import SimBackend
from schedlab.sim.engine import ENGINES, Simulator, simulate
from schedlab.sim.fluid import FluidShare
from schedlab.sim.interconnect import Network, TransferRecord, link_time_us
from schedlab.sim.result import SimResult
from schedlab.sim.server import SimServer

__all__ = [
    "ENGINES",
    "FluidShare",
    "Network",
    "SimBackend",
    "SimResult",
    "SimServer",
    "Simulator",
    "TransferRecord",
    "link_time_us",
    "simulate",
]
