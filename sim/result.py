"""What a simulation returns, and the Trace it records (same schema as the executor's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.sim.prepare import Prepared
from schedlab.trace import Trace, TraceEvent, base_meta


@dataclass(frozen=True)
class RankStats:
    """One process (rank) of a simulated step."""

    devices: tuple[str, ...]  # the devices it drives that ran ops
    ops: int  # ops on its devices (COMM ops included)
    end_s: float  # when its last op ended
    lock_busy_s: float  # time its interpreter lock was held (dispatch, COMM completions)
    busy_core_s: float  # core-seconds (gpu: stream-seconds) its devices' kernels used
    sent_bytes: int  # bytes its sends put on links


@dataclass(frozen=True)
class SimResult:
    """One simulated step. Times in seconds, memory in bytes, keyed by device id."""

    step_time_s: float  # makespan: first op start (0) to last kernel or transfer end
    peak_memory_bytes: dict[str, int]  # every device of the machine; graph inputs included
    trace: Trace | None  # None when simulated with record=False
    sim_wall_s: float  # wall-clock time the simulation took (time.perf_counter)
    busy_core_s: dict[str, float] = field(default_factory=dict)  # core-seconds (gpu: stream-seconds) in use
    oom_devices: tuple[str, ...] = ()  # devices whose peak exceeds Device.memory_bytes
    engine: str = ""  # "compiled" or "fast" (one CPU device: compiled loop, its Python reference) or "simpy"
    ranks: dict[int, RankStats] = field(default_factory=dict)  # per process that ran ops
    transfer_count: int = 0  # point-to-point transfers on links (explicit sends and implicit ones)
    transfer_bytes: int = 0
    collective_count: int = 0  # all-reduces (one per bucket and group)
    cost_sources: dict[str, str] = field(default_factory=dict)  # device id -> which model costs its kernels (sim.device_cost)

    @property
    def ok(self) -> bool:
        return not self.oom_devices


@dataclass
class Timeline:
    """Raw times an engine fills in (µs); turned into a SimResult by `finish()`."""

    start_us: list[float]
    end_us: list[float]
    worker: list[int]
    start_order: list[int]  # op ids in the order their workers began them
    transfers: list[tuple[int, int, float, float]] = field(default_factory=list)  # (transfer id, link, start, end)
    sends: list[tuple[int, int, int, float, float]] = field(default_factory=list)  # (send op, link, bytes, start, end)
    collectives: list[tuple[int, float, float]] = field(default_factory=list)  # (collective id, start, end)


def _ns(t_us: float) -> int:
    return round(t_us * 1000.0)


def build_trace(
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    prep: Prepared,
    tl: Timeline,
    extra_meta: dict[str, Any],
) -> Trace:
    ops = graph.ops
    dev_ids = prep.device_ids
    op_device = prep.structure.op_device
    rank_of = [d.process for d in machine.devices]
    comm = prep.structure.comm
    events: list[TraceEvent] = []
    for o in tl.start_order:
        op = ops[o]
        events.append(
            TraceEvent(
                o,
                op.name,
                op.kind.value,
                dev_ids[op_device[o]],
                tl.worker[o],
                0 if comm is not None and comm.role[o] else prep.threads[o],  # COMM ops run no intra-op threads
                _ns(tl.start_us[o]),
                _ns(tl.end_us[o]),
                0,
                rank_of[op_device[o]],
            )
        )
    if comm is not None:
        events.sort(key=lambda e: e.start_ns)  # a recv starts with its transfer, an all-reduce with its collective
    if tl.transfers:
        for x, link, start, end in tl.transfers:
            spec = prep.structure.transfers[x]
            events.append(
                TraceEvent(
                    spec.consumers[0],
                    f"send {spec.value}",
                    "COMM",
                    dev_ids[spec.src],
                    -1 - link,
                    0,
                    _ns(start),
                    _ns(end),
                    0,
                    rank_of[spec.src],
                )
            )
        events.sort(key=lambda e: e.start_ns)  # stable: ops first among equal starts
    meta = base_meta(
        "sim",
        graph_hash=graph.hash,
        plan_hash=resolved.plan.hash,
        machine=machine.to_json(),
        workload=graph.name,
        plan=resolved.plan.to_json(),
        slots=resolved.slots,
        time_unit="ns",
        cost_sources={d: s for d, s in zip(dev_ids, prep.cost_sources, strict=True) if s},
        **extra_meta,
    )
    return Trace(events=tuple(events), meta=meta)
