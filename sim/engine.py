"""`simulate()` and the `Simulator`: one plan's step predicted by the right engine.

Three engines follow one model of the executor (`sim.model`'s docstring spells it out):

- "simpy" (`sim.model`): the general model: processes (ranks) with their own
  interpreter lock, workers and ready queues, CPU and GPU devices, links, explicit
  send/recv and all-reduce ops of an expanded graph (`sim.comm`);
- "fast" (`sim.fast`): the same rules hand-inlined for every op on one CPU device;
- "compiled" (`sim.compiled`): the fast loop compiled with Numba, what a search runs.

With every op on one CPU device the three give identical traces (`tests/sim`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.sim.compiled import FlatStructure, LoopResult, run_compiled
from schedlab.sim.cost import CostModel, demand_rule, team_basis
from schedlab.sim.cost_table import CostTable
from schedlab.sim.device_cost import cost_source
from schedlab.sim.fast import run_fast
from schedlab.sim.flatgraph import flat_single_device
from schedlab.sim.memory import MemoryTracker
from schedlab.sim.model import run_simpy
from schedlab.sim.prepare import (
    Prepared,
    Structure,
    build_structure,
    comm_kernel_us,
    op_devices,
    prepare,
    slowdown_fns,
    wakes_on,
)
from schedlab.sim.result import RankStats, SimResult, Timeline, build_trace
from schedlab.sim.wake import cost_first_shares, wake_fractions, wake_table
from schedlab.steps import copied_op

__all__ = ["ENGINES", "Simulator", "run_simpy", "simulate"]

ENGINES = ("auto", "simpy", "fast", "compiled")


class Simulator:
    """A graph, a machine and a cost model bound once; `run(resolved)` simulates one plan.

    A search reuses one Simulator for thousands of plans: it keeps the structure (tokens,
    transfers, storages) of each placement it meets, and the cost model's dispatch time of
    each op, kernel time of each (op, threads) and co-run slowdowns, so a run only computes what the plan
    changes. The cost model must be a pure function of its arguments.

    A multi-device plan runs its expanded graph (`resolved.run_graph`). Its compute ops are
    copies of the bound graph's (ops 0..n-1 rewired to read received copies; replica r's
    op r*n+i a copy of op i): they are costed as the bound graph's ops they copy
    (`mirror_ops`), so the kept costs serve every placement, and a cost model bound to the
    graph (`Profile.for_graph`) charges first uses as in a one-device step. A COMM op's
    dispatch is asked of the cost model, and its kernel (`sim.prepare.comm_kernel_us`), unless
    the cost model measured what it costs its rank (`sim.prepare.comm_host_costs`).
    """

    def __init__(self, graph: Graph, machine: Machine, cost: CostModel, *, max_placements: int = 16) -> None:
        self.graph = graph
        self.machine = machine
        self.cost = cost
        self.max_placements = max_placements
        self._runs: dict[tuple[str, tuple[int, ...]], _RunGraph] = {}  # (expanded graph hash or "", placement)
        self._dispatch_us: list[float] | None = None
        self._stride = max(d.cores for d in machine.devices) + 1
        self._slowdown = slowdown_fns(graph, machine, cost, memo=True)
        # The compiled engine's per-graph arrays: dispatch µs per op, kernel µs per (op,
        # threads) and co-run slowdown per (op, busy cores of the others), asked as needed.
        self._flat_one: FlatStructure | None = None  # every op on one device (sim.flatgraph)
        self._costs = CostTable(graph, cost, self._stride - 1)
        self._sources: dict[int, str] = {}  # device index -> `cost_source`

    def run(self, resolved: ResolvedPlan, *, record: bool = True, engine: str = "auto") -> SimResult:
        """Predict one step under `resolved`; see `simulate`."""
        t0 = time.perf_counter()
        if engine not in ENGINES:
            raise SchedlabError(f"unknown simulator engine {engine!r}; use one of {', '.join(ENGINES)}")
        machine = self.machine
        graph = resolved.run_graph(self.graph)  # the expanded graph of a multi-device plan
        if len(resolved.device) != len(graph.ops):
            raise SchedlabError(f"resolved plan covers {len(resolved.device)} ops but graph {graph.name!r} has {len(graph.ops)}")
        if engine in ("auto", "compiled") and not record and graph is self.graph:
            dev = self._uniform_cpu_device(resolved)
            if dev is not None:
                return self._run_compiled(resolved, dev, t0)
        placement = op_devices(resolved, machine)
        run = self._run_graph(graph, placement)
        structure = run.structure
        teams = demand_rule(self.cost) is not None and max(resolved.threads, default=1) > 1
        prep = prepare(
            graph,
            resolved,
            machine,
            self.cost,
            structure=structure,
            kernel_us=self._kernels(resolved.threads, graph, run.mirror),
            dispatch_us=self._dispatches(graph, run.mirror),
            slowdown=run.slowdown,
            alone_us=self._kernels((1,) * len(graph.ops), graph, run.mirror, basis=True) if teams else None,
            basis_us=self._kernels(resolved.threads, graph, run.mirror, basis=True) if teams else None,
        )
        if engine in ("fast", "compiled") and not prep.single_cpu:
            raise SchedlabError(f"the {engine} simulator engine needs every op on one CPU device; use engine='simpy'")
        if engine == "fast":
            tl, mem, busy = run_fast(prep)
        elif prep.single_cpu and engine in ("auto", "compiled"):
            engine = "compiled"
            tl, mem, busy = self._compiled_timeline(prep, placement[0] if placement else 0, structure, graph)
        else:
            engine = "simpy"
            tl, mem, busy = run_simpy(prep, machine)
        step_us = max(max(tl.end_us, default=0.0), max((t[3] for t in tl.transfers), default=0.0))
        dev_ids = prep.device_ids
        oom = tuple(d for i, d in enumerate(dev_ids) if mem.peak[i] > prep.memory_bytes[i])
        name = engine
        trace = None
        if record:
            trace = build_trace(graph, resolved, machine, prep, tl, {"engine": name, "oom_devices": list(oom)})
        return SimResult(
            step_time_s=step_us / 1e6 / resolved.steps,  # an unrolled graph: per step of the sequence
            peak_memory_bytes={d: mem.peak[i] for i, d in enumerate(dev_ids)},
            trace=trace,
            sim_wall_s=time.perf_counter() - t0,
            busy_core_s={d: busy[i] / 1e6 for i, d in enumerate(dev_ids)},
            oom_devices=oom,
            engine=name,
            ranks=rank_stats(prep, tl, busy),
            transfer_count=len(tl.transfers) + len(tl.sends),
            transfer_bytes=sum(prep.structure.transfers[t[0]].nbytes for t in tl.transfers) + sum(t[2] for t in tl.sends),
            collective_count=len(tl.collectives),
            cost_sources={d: s for d, s in zip(dev_ids, prep.cost_sources, strict=True) if s},
        )

    # ---- the compiled engine (sim.compiled) ----------------------------------------------

    def _cost_source(self, dev: int) -> str:
        """`cost_source` of the machine's device `dev`, kept (a runtime Protocol check costs µs)."""
        src = self._sources.get(dev)
        if src is None:
            src = self._sources[dev] = cost_source(self.cost, self.machine.devices[dev])
        return src

    def _uniform_cpu_device(self, resolved: ResolvedPlan) -> int | None:
        """The index of the one CPU device every op runs on, or None."""
        devices = resolved.device
        if not devices or devices.count(devices[0]) != len(devices):
            return None
        for i, d in enumerate(self.machine.devices):
            if d.id == devices[0]:
                return i if d.kind == "cpu" and not d.core_pool else None
        raise SchedlabError(f"resolved plan places an op on device {devices[0]!r}, not in machine {self.machine.name!r}")

    def _flat(self, graph: Graph | None = None) -> FlatStructure:
        """The compiled loop's structure of the bound graph (kept), or of `graph` (an unrolled one)."""
        if graph is not None and graph is not self.graph:
            return flat_single_device(graph)
        if self._flat_one is None:
            self._flat_one = flat_single_device(self.graph)
        return self._flat_one

    def _loop(self, slots: int, priority: Sequence[int], dev: int, demand: np.ndarray, kernel_us: np.ndarray,
              dispatch_us: np.ndarray, threads: np.ndarray, graph: Graph | None = None) -> LoopResult:
        """`demand`: the cores each op's kernel occupies (`sim.prepare.Prepared.demand`);
        `threads`: each op's intra-op threads."""
        capacity = self.machine.devices[dev].cores
        slowdown = self._slowdowns(dev, capacity, slots, int(demand.max()) if len(demand) else 1)
        mirror = None
        if graph is not None and graph is not self.graph:  # an unrolled graph: each op as the op it copies
            mirror = np.asarray(mirror_ops(self.graph, graph), dtype=np.int64)
            slowdown = slowdown[mirror]
        held = None
        if wakes_on(self.machine, dev, slots):
            slowdown, held = self._waking(slowdown, threads, kernel_us, capacity, mirror, demand)
        return run_compiled(
            self._flat(graph),
            slots=slots,
            capacity=capacity,
            priority=np.asarray(priority, dtype=np.int64),
            dispatch_us=dispatch_us,
            kernel_us=kernel_us,
            demand=demand,
            slowdown=slowdown,
            slowdown_held=held,
        )

    def _run_compiled(self, resolved: ResolvedPlan, dev: int, t0: float) -> SimResult:
        """The search's path: one CPU device, no trace; per-op work happens in arrays only."""
        threads = np.asarray(resolved.threads, dtype=np.int64)
        kernel_us = self._kernels_arr(threads)
        demand = threads
        rule = demand_rule(self.cost)
        if rule is not None and threads.size and threads.max() > 1:
            basis = self._costs.team_basis_us  # `_kernels_arr` above checked the thread counts
            demand = rule(basis(np.ones_like(threads)), basis(threads), threads)
        res = self._loop(resolved.slots, resolved.priority, dev, demand, kernel_us, self._dispatches_arr(), threads)
        machine = self.machine
        peaks = {d.id: 0 for d in machine.devices}
        peaks[machine.devices[dev].id] = res.peak_bytes
        oom = tuple(d.id for d in machine.devices if peaks[d.id] > d.memory_bytes)
        busy = {d.id: 0.0 for d in machine.devices}
        busy[machine.devices[dev].id] = res.busy_unit_us / 1e6
        step_us = float(res.end_us.max()) if len(res.end_us) else 0.0
        device = machine.devices[dev]
        ranks = {device.process: RankStats(
            devices=(device.id,), ops=len(res.end_us), end_s=step_us / 1e6,
            lock_busy_s=float(self._dispatches_arr().sum()) / 1e6, busy_core_s=res.busy_unit_us / 1e6, sent_bytes=0,
        )}
        return SimResult(
            step_time_s=step_us / 1e6,
            peak_memory_bytes=peaks,
            trace=None,
            sim_wall_s=time.perf_counter() - t0,
            busy_core_s=busy,
            oom_devices=oom,
            engine="compiled",
            ranks=ranks,
            cost_sources={device.id: self._cost_source(dev)},
        )

    def _compiled_timeline(
        self, prep: Prepared, dev: int, structure: Structure, graph: Graph | None = None
    ) -> tuple[Timeline, MemoryTracker, list[float]]:
        """The compiled loop on a prepared one-device plan, as the engines' common Timeline (for traces)."""
        res = self._loop(prep.slots, prep.priority, dev, np.asarray(prep.demand, dtype=np.int64),
                         np.asarray(prep.kernel_us, dtype=np.float64), np.asarray(prep.dispatch_us, dtype=np.float64),
                         np.asarray(prep.threads, dtype=np.int64), graph)
        mem = MemoryTracker(list(structure.initial_live))
        mem.peak[dev] = res.peak_bytes
        busy = [0.0] * len(prep.device_ids)
        busy[dev] = res.busy_unit_us
        tl = Timeline(res.start_us.tolist(), res.end_us.tolist(), res.worker.tolist(), res.start_order.tolist())
        return tl, mem, busy

    def _waking(self, slowdown: np.ndarray, threads: np.ndarray, kernel_us: np.ndarray, capacity: int,
                mirror: np.ndarray | None, demand: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """`slowdown` with the wake factor of `sim.wake`, and the same while a worker holds the
        interpreter lock, or None where no op pays a wake (the floats `prepare.waking` gives)."""
        if threads.size == 0 or threads.max() < 2:
            return slowdown, None
        wake = self._costs.wake_us(threads, mirror)
        fractions = wake_fractions(wake, kernel_us, demand)
        if fractions is None:
            return slowdown, None
        firsts = cost_first_shares(self.cost, wake, threads)
        return (wake_table(slowdown, fractions, threads, capacity, firsts=firsts),
                wake_table(slowdown, fractions, threads, capacity, held=1, firsts=firsts))

    def _kernels_arr(self, threads: np.ndarray) -> np.ndarray:
        """Kernel µs of every op at its thread count (`sim.cost_table`)."""
        if threads.size and (threads.min() < 1 or threads.max() >= self._stride):
            raise SchedlabError(f"thread counts must be 1..{self._stride - 1} on machine {self.machine.name!r}")
        return self._costs.kernel_us(threads)

    def _dispatches_arr(self) -> np.ndarray:
        return self._costs.dispatch_us()

    def _slowdowns(self, dev: int, capacity: int, slots: int, max_threads: int) -> np.ndarray:
        """slowdown[op, busy cores of the others], filled for the columns this plan can read.

        The others are at most `slots - 1` kernels of at most `max_threads` threads each, so
        with one slot only column 0 is read, and two one-thread slots read columns 0 and 1.
        """
        return self._costs.slowdown(capacity, min(capacity, (slots - 1) * max_threads) + 1)

    def _run_graph(self, graph: Graph, placement: tuple[int, ...]) -> _RunGraph:
        key = (graph.hash if graph is not self.graph else "", placement)
        run = self._runs.get(key)
        if run is not None:
            return run
        machine = self.machine
        structure = build_structure(graph, placement, len(machine.devices), [d.id for d in machine.devices])
        if graph is self.graph:
            run = _RunGraph(structure, None, self._slowdown)
        else:
            mirror = mirror_ops(self.graph, graph)
            direct = slowdown_fns(graph, machine, self.cost)
            run = _RunGraph(structure, mirror, tuple(_mirrored(b, f, mirror) for b, f in zip(self._slowdown, direct, strict=True)))
        if len(self._runs) >= self.max_placements:
            self._runs.pop(next(iter(self._runs)))
        self._runs[key] = run
        return run

    def _dispatches(self, graph: Graph | None = None, mirror: Sequence[int] | None = None) -> list[float]:
        """Dispatch µs of every op of `graph` (default: the bound one, whose list is kept)."""
        if self._dispatch_us is None:
            self._dispatch_us = self._costs.dispatch_us().tolist()
        if graph is None or mirror is None:
            return self._dispatch_us
        base, ask = self._dispatch_us, self.cost.dispatch_us
        return [base[m] if m >= 0 else float(ask(op)) for m, op in zip(mirror, graph.ops, strict=True)]

    def _kernels(
        self, threads: tuple[int, ...], graph: Graph | None = None, mirror: Sequence[int] | None = None,
        basis: bool = False,
    ) -> list[float]:
        """Kernel µs of every op of `graph` (default: the bound one) at its thread count; an op
        that copies one of the bound graph's (`mirror`) is costed as that one (from the
        CostTable), a COMM op as `sim.prepare.comm_kernel_us` says. `basis`: what the
        demand rule compares instead (`sim.cost.team_basis`)."""
        k = np.asarray(threads, dtype=np.int64)
        table = self._costs.team_basis_us if basis else self._costs.kernel_us
        if k.size and (k.min() < 1 or k.max() >= self._stride):  # resolve() never gives this: ask each op
            ops, kernel = self.graph.ops, team_basis(self.cost) if basis else self.cost.kernel_us
            if mirror is None:
                return [float(kernel(op, t)) for op, t in zip(ops, threads, strict=True)]
            assert graph is not None
            return [float(kernel(ops[m], t)) if m >= 0 else comm_kernel_us(graph.ops[i], t, self.cost)
                    for i, (m, t) in enumerate(zip(mirror, threads, strict=True))]
        if mirror is None:
            return table(k).tolist()
        assert graph is not None
        m = np.asarray(mirror, dtype=np.int64)
        copies = np.flatnonzero(m >= 0)
        out = [0.0] * len(threads)
        for i, t in zip(copies.tolist(), table(k[copies], m[copies]).tolist(), strict=True):
            out[i] = t
        for i in np.flatnonzero(m < 0).tolist():
            out[i] = comm_kernel_us(graph.ops[i], threads[i], self.cost)
        return out


@dataclass(frozen=True)
class _RunGraph:
    """What a Simulator keeps for one graph it runs (the bound one or an expansion) and placement."""

    structure: Structure
    mirror: tuple[int, ...] | None  # per op: the bound graph's op it copies, or -1; None: the bound graph
    slowdown: tuple[Callable[[int, int], float], ...]  # per device


def mirror_ops(bound: Graph, graph: Graph) -> tuple[int, ...]:
    """For each op of `graph`, an expansion of `bound` (`schedlab.distribute`,
    `schedlab.data_parallel`): the op of `bound` it is a copy of (op id modulo the ops of
    `bound`, when target, FLOPs, bytes and view-ness agree), else -1 (COMM ops). In an
    unrolled graph (`schedlab.steps`) step s's op ``s*m + i`` copies the one-step op i."""
    n = len(bound.ops)
    out: list[int] = []
    for op in graph.ops:
        if op.kind is OpKind.COMM or n == 0:
            out.append(-1)
            continue
        b = bound.ops[copied_op(graph, op.id, n)]
        same = (b.target, b.flops, b.bytes_moved, b.is_view) == (op.target, op.flops, op.bytes_moved, op.is_view)
        out.append(b.id if same else -1)
    return tuple(out)


def _mirrored(
    base: Callable[[int, int], float], direct: Callable[[int, int], float], mirror: tuple[int, ...]
) -> Callable[[int, int], float]:
    def slowdown(op_id: int, busy_others: int) -> float:
        m = mirror[op_id]
        return base(m, busy_others) if m >= 0 else direct(op_id, busy_others)

    return slowdown


def rank_stats(prep: Prepared, tl: Timeline, busy_unit_us: Sequence[float]) -> dict[int, RankStats]:
    """Per process that ran ops: its devices, ops, last end, lock and core time, bytes sent.

    The lock is held exactly for each op's dispatch part, and for the done part of each
    COMM op that completes asynchronously (a recv's wait; an all-reduce's finish).
    """
    st = prep.structure
    ops: dict[int, int] = {}
    end: dict[int, float] = {}
    lock: dict[int, float] = {}
    devices: dict[int, list[int]] = {}
    sent: dict[int, int] = {}
    for o, d in enumerate(st.op_device):
        p = prep.device_process[d]
        if p not in ops:
            ops[p], end[p], lock[p], devices[p], sent[p] = 0, 0.0, 0.0, [], 0
        ops[p] += 1
        if d not in devices[p]:
            devices[p].append(d)
        if tl.end_us[o] > end[p]:
            end[p] = tl.end_us[o]
        lock[p] += prep.dispatch_us[o] + (prep.done_us[o] if prep.done_us else 0.0)
    for o, _link, nbytes, _start, _end in tl.sends:
        sent[prep.device_process[st.op_device[o]]] += nbytes
    for x, _link, _start, t_end in tl.transfers:
        spec = st.transfers[x]
        p = prep.device_process[spec.src]
        if p in sent:
            sent[p] += spec.nbytes
            end[p] = max(end[p], t_end)
    return {
        p: RankStats(
            devices=tuple(prep.device_ids[d] for d in sorted(devices[p])),
            ops=ops[p],
            end_s=end[p] / 1e6,
            lock_busy_s=lock[p] / 1e6,
            busy_core_s=sum(busy_unit_us[d] for d in devices[p]) / 1e6,
            sent_bytes=sent[p],
        )
        for p in sorted(ops)
    }


def simulate(
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    cost: CostModel,
    *,
    record: bool = True,
    engine: str = "auto",
) -> SimResult:
    """Predict one step of `graph` under `resolved` on `machine` with `cost`.

    `record`: also build the Trace (source "sim"); a search passes False. `engine`: "auto"
    takes the compiled loop (`sim.compiled`) when every op runs on one CPU device and the
    SimPy model otherwise; "simpy", "fast" (the Python reference of the compiled loop) and
    "compiled" force one (the tests compare them). To simulate many
    plans of one graph, bind a `Simulator` once instead.
    """
    return Simulator(graph, machine, cost).run(resolved, record=record, engine=engine)
