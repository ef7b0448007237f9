"""The simulator: a SimPy model of processes (ranks), devices, threads, streams, links,
collectives and memory.

`simulate(graph, resolved_plan, machine, cost)` predicts one training step and returns a
`SimResult` whose Trace has the executor's schema (source "sim"). A multi-device plan
runs its expanded graph, with its send/recv and all-reduce ops, one interpreter lock per
process (`sim.model`); `SimResult.ranks` has each rank's figures. Time inside the model
is in microseconds; results are in seconds and bytes.
"""

from __future__ import annotations

from schedlab.sim.backend import SimBackend
from schedlab.sim.engine import ENGINES, Simulator, simulate
from schedlab.sim.fluid import FluidShare
from schedlab.sim.interconnect import Network, TransferRecord, link_time_us
from schedlab.sim.result import RankStats, SimResult
from schedlab.sim.server import SimServer

__all__ = [
    "ENGINES",
    "FluidShare",
    "Network",
    "RankStats",
    "SimBackend",
    "SimResult",
    "SimServer",
    "Simulator",
    "TransferRecord",
    "link_time_us",
    "simulate",
]
