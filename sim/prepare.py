"""Flat per-(graph, plan) arrays that both engines run on, built before each simulation.

Everything the event loop needs is looked up by integer index here, so the loop itself
never touches a Graph, an Op or a dict keyed by strings:

- per op: device, threads (the demand on the device, `sim.cost.demand_rule`: its team of
  threads, one core where it runs inline, or the cores it keeps busy where the cost model
  `shares_idle_threads`), dispatch and kernel time from the
  cost model (a kernel's by its device's kind: `sim.device_cost`), priority, how many
  *tokens* it waits for, and what it releases when done;
- tokens: an op waits for each local producer op and for each transfer that brings a
  remote value to its device (one transfer per value and destination device);
- storages: one per (alias root, device) with its bytes and reference count (see
  `sim.memory`).

The part that depends only on the graph and the placement of its ops (`Structure`) is
kept apart from the per-plan part (threads, costs, priorities), so that a `Simulator`
reused across plans builds it once.

Home device of a value: the device of the op that writes it; for a graph input, the
device of its first consumer (by op id), or the device of op 0 if nothing reads it.

Two kinds of graphs:

- an *expanded* graph (it has COMM ops: what `resolve()` gives for a multi-device plan)
  carries every crossing value through explicit send/recv ops (`sim.comm`). The only
  cross-device read allowed is a recv reading its send's token; anything else raises.
  A recv waits for one token, its transfer; an all-reduce op also waits for the issue of
  the previous bucket of its group on its device.
- a graph placed on several devices without expansion (tests' `sim.testing.place`) gets
  *implicit* transfers: one per (value, destination device), started when the value is
  ready (`TransferSpec`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from schedlab.distribute import ALL_REDUCE
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind, alias_roots
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.sim.collective import CollectiveTime, allreduce_time
from schedlab.sim.comm import CommHostCost, CommOpCost, CommStructure, Role, comm_structure, has_comm
from schedlab.sim.cost import CostModel, demand_rule, team_basis
from schedlab.sim.device_cost import (
    cost_source,
    device_contention_us,
    device_corun,
    device_dispatches_us,
    device_kernels_us,
)
from schedlab.sim.wake import cost_first_shares, wake_cost, wake_fractions, with_wake

PINNED = 1 << 60  # reference count of a storage that is never freed (graph inputs and outputs)


@dataclass(frozen=True)
class TransferSpec:
    """One value sent to one device: started when the value is ready on its home device."""

    value: int
    src: int  # device index
    dst: int
    nbytes: int
    consumers: tuple[int, ...]  # ops on dst that wait for it (ascending ids)
    src_storage: int  # released when the transfer ends
    dst_storage: int  # allocated when the transfer starts


@dataclass(frozen=True)
class Structure:
    """Tokens, transfers and storages of one graph with one placement of its ops."""

    op_device: tuple[int, ...]
    pending: tuple[int, ...]  # tokens each op waits for at the start of the step
    local_succs: tuple[tuple[int, ...], ...]  # op -> ops on its device waiting for it
    sends: tuple[tuple[int, ...], ...]  # op -> transfer ids to start when it finishes
    initial_sends: tuple[int, ...]  # transfers of graph inputs, started at time 0
    transfers: tuple[TransferSpec, ...]
    alloc_bytes: tuple[int, ...]  # op -> bytes its outputs allocate on its device at kernel start
    release: tuple[tuple[int, ...], ...]  # op -> storages it drops a reference to when done
    storage_bytes: tuple[int, ...]
    storage_device: tuple[int, ...]
    storage_refs: tuple[int, ...]  # reference counts at the start of the step
    initial_live: tuple[int, ...]  # per device: bytes of graph inputs
    comm: CommStructure | None = None  # the COMM ops of an expanded graph (None: none)
    issue_release: dict[int, tuple[int, ...]] = field(default_factory=dict)  # all_reduce op -> its inputs' storages

    def role(self, op: int) -> Role:
        return Role.COMPUTE if self.comm is None else self.comm.role[op]


@dataclass(frozen=True)
class Prepared:
    """Everything one simulation reads, as flat arrays indexed by op, device or storage."""

    device_ids: tuple[str, ...]
    device_is_gpu: tuple[bool, ...]
    capacity: tuple[int, ...]  # cores (cpu) or streams (gpu); a pooled device's: its pool's
    memory_bytes: tuple[int, ...]
    device_process: tuple[int, ...]  # the process (rank) that drives each device
    device_slots: tuple[int, ...]  # co-run slots (workers) of each device
    structure: Structure
    threads: list[int]
    demand: list[int]  # threads on a cpu, 1 (one stream) on a gpu
    dispatch_us: list[float]
    kernel_us: list[float]
    priority: list[int]
    slots: int
    slowdown: tuple[Callable[[int, int], float], ...]  # per device, for FluidShare
    sequence: tuple[int, ...] = ()  # the resolved list schedule (a one-slot rank runs its ops in this order)
    collective_time: tuple[CollectiveTime, ...] = ()  # per collective of structure.comm, alone
    # per op of an expanded graph (else empty): what a COMM op costs when it completes, under
    # the lock then on the cores (a recv's wait; an all-reduce's finish); `sim.comm.CommOpCost`
    done_us: tuple[float, ...] = ()
    done_kernel_us: tuple[float, ...] = ()
    # per op: a COMM op's cost as the cost model measured it (its collective's and transfer's
    # CPU, its cold cost), else None
    comm_costs: tuple[CommOpCost | None, ...] = ()
    cost_sources: tuple[str, ...] = ()  # per device that runs ops: which model costs its kernels (sim.device_cost)
    core_pool: tuple[int, ...] = ()  # per device: the index of the core pool it shares (Machine.core_pools), or -1
    # per device: its slowdown while a worker holds the interpreter lock (`FluidShare.hold`;
    # `sim.wake`), or None where nothing depends on it
    slowdown_held: tuple[Callable[[int, int], float] | None, ...] = ()
    # per device (else empty): host µs a heap worker's dispatch grows while another worker waits
    # for the lock, x log2(1 + workers queued) (`sim.device_cost.device_contention_us`; 0 on a CPU)
    contention_us: tuple[float, ...] = ()

    def pooled(self, device: int) -> bool:
        """Whether `device` shares a core pool with other devices' processes."""
        return bool(self.core_pool) and self.core_pool[device] >= 0

    @property
    def n_ops(self) -> int:
        return len(self.threads)

    @property
    def single_cpu(self) -> bool:
        """All ops on one CPU device and no transfers: the fast loop applies."""
        st = self.structure
        devs = set(st.op_device)
        return (not st.transfers and st.comm is None and len(devs) <= 1
                and not any(self.device_is_gpu[d] or self.pooled(d) for d in devs))


def op_devices(resolved: ResolvedPlan, machine: Machine) -> tuple[int, ...]:
    """Device index (position in machine.devices) of every op."""
    dev_index = {d.id: i for i, d in enumerate(machine.devices)}
    try:
        return tuple(dev_index[d] for d in resolved.device)
    except KeyError as e:
        raise SchedlabError(f"resolved plan places an op on device {e.args[0]!r}, not in machine {machine.name!r}") from None


def prepare(
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    cost: CostModel,
    *,
    structure: Structure | None = None,
    kernel_us: list[float] | None = None,
    dispatch_us: list[float] | None = None,
    slowdown: tuple[Callable[[int, int], float], ...] | None = None,
    alone_us: list[float] | None = None,
    basis_us: list[float] | None = None,
) -> Prepared:
    """Flat arrays for one simulation; `structure` and the cost lists may come from a
    cache (`alone_us` and `basis_us`: what the demand rule compares, `sim.cost.team_basis`,
    of every op at one thread and at its threads)."""
    ops = graph.ops
    n = len(ops)
    if len(resolved.threads) != n or len(resolved.priority) != n or len(resolved.device) != n:
        raise SchedlabError(f"resolved plan covers {len(resolved.threads)} ops but graph {graph.name!r} has {n}")
    if structure is None:
        structure = build_structure(graph, op_devices(resolved, machine), len(machine.devices),
                                    tuple(d.id for d in machine.devices))
    op_device = structure.op_device
    is_gpu = tuple(d.is_gpu for d in machine.devices)
    capacity = tuple(machine.pool_cores(d) for d in machine.devices)
    pools = list(machine.core_pools)
    threads = list(resolved.threads)
    if dispatch_us is None:
        dispatch_us = [float(cost.dispatch_us(op)) for op in ops]
    if kernel_us is None:
        kernel_us = [comm_kernel_us(op, threads[op.id], cost) for op in ops]
    demand = [1 if is_gpu[op_device[i]] else threads[i] for i in range(n)]
    rule = demand_rule(cost)
    teams = [i for i, d in enumerate(demand) if d > 1]
    if rule is not None and teams:
        basis, kernels = team_basis(cost), kernel_us  # a COMM op's: its kernel as costed above, the cost model's own at one thread

        def basis_at(i: int, k: int) -> float:
            if ops[i].kind is OpKind.COMM:
                return kernels[i] if k == threads[i] else float(cost.kernel_us(ops[i], k))
            return float(basis(ops[i], k))

        alone = [alone_us[i] for i in teams] if alone_us is not None else [basis_at(i, 1) for i in teams]
        at = [basis_us[i] for i in teams] if basis_us is not None else [basis_at(i, threads[i]) for i in teams]
        held = rule(alone, at, [demand[i] for i in teams])
        for i, cores in zip(teams, held.tolist(), strict=True):
            demand[i] = cores
    kernel_us = device_kernels_us(ops, op_device, machine.devices, cost, threads, kernel_us)  # by device kind
    dispatch_us = device_dispatches_us(ops, op_device, machine.devices, cost, dispatch_us)
    used = set(op_device)
    device_slots = tuple(resolved.slots_of(d.id) for d in machine.devices)
    if slowdown is None:
        slowdown = slowdown_fns(graph, machine, cost)
    slowdown, slowdown_held = waking(slowdown, cost, ops, threads, kernel_us, op_device, machine, device_slots, demand)
    done_us: tuple[float, ...] = ()
    done_kernel_us: tuple[float, ...] = ()
    comm_costs: tuple[CommOpCost | None, ...] = ()
    if structure.comm is not None:
        dispatch_us, kernel_us, done_us, done_kernel_us, comm_costs = comm_host_costs(
            graph, structure.comm, cost, dispatch_us, kernel_us, [not is_gpu[d] for d in op_device])
    return Prepared(
        device_ids=tuple(d.id for d in machine.devices),
        device_is_gpu=is_gpu,
        capacity=capacity,
        memory_bytes=tuple(d.memory_bytes for d in machine.devices),
        device_process=tuple(d.process for d in machine.devices),
        device_slots=device_slots,
        structure=structure,
        threads=threads,
        demand=demand,
        dispatch_us=dispatch_us,
        kernel_us=kernel_us,
        priority=list(resolved.priority),
        slots=resolved.slots,
        sequence=tuple(resolved.sequence),
        slowdown=slowdown,
        collective_time=collective_times(structure, machine, cost),
        done_us=done_us,
        done_kernel_us=done_kernel_us,
        comm_costs=comm_costs,
        cost_sources=tuple(cost_source(cost, d) if i in used else "" for i, d in enumerate(machine.devices)),
        core_pool=tuple(pools.index(d.core_pool) if d.core_pool else -1 for d in machine.devices),
        contention_us=tuple(device_contention_us(cost, d) for d in machine.devices),
        slowdown_held=slowdown_held,
    )


def comm_host_costs(
    graph: Graph, comm: CommStructure, cost: CostModel, dispatch_us: list[float], kernel_us: list[float],
    on_cpu: Sequence[bool],
) -> tuple[list[float], list[float], tuple[float, ...], tuple[float, ...], tuple[CommOpCost | None, ...]]:
    """(dispatch, kernel, done, done kernel) µs of every op and each COMM op's cost as
    measured (None where it was not; `sim.comm.CommOpCost`), the COMM ops' from the cost model
    when it measured them (`sim.comm.CommHostCost`) and the op runs on a CPU device
    (`on_cpu[op]`: the host costs are gloo's between CPU ranks, not a GPU's NCCL). Otherwise
    a COMM op keeps its dispatch and kernel, and an all-reduce pays them again when it
    finishes (done = dispatch, done kernel = kernel); a recv's done part is then 0. The
    lists given are not changed."""
    n = len(graph.ops)
    done, done_kernel = [0.0] * n, [0.0] * n
    measured: list[CommOpCost | None] = [None] * n
    dispatch, kernel = list(dispatch_us), list(kernel_us)
    host = cost if isinstance(cost, CommHostCost) else None
    for o in comm.comm_ops:
        c = host.comm_host_us(graph.ops[o]) if host is not None and on_cpu[o] else None
        if c is not None:
            dispatch[o], kernel[o], done[o], done_kernel[o] = c.post_us, c.post_kernel_us, c.done_us, c.done_kernel_us
            measured[o] = c
        elif comm.role[o] is Role.ALL_REDUCE:
            done[o], done_kernel[o] = dispatch[o], kernel[o]
    return dispatch, kernel, tuple(done), tuple(done_kernel), tuple(measured)


def comm_kernel_us(op: Op, threads: int, cost: CostModel) -> float:
    """Kernel µs of `op`; a COMM op's is what runs on its device's cores around the link:
    nothing for a send or a recv (the link carries them); for an all-reduce, one pass over
    its bucket, paid when it is issued (flattening the gradients into one buffer) and
    again when it ends (averaging), as `kernel_us` of the all_reduce op."""
    if op.kind is not OpKind.COMM:
        return float(cost.kernel_us(op, threads))
    return float(cost.kernel_us(op, threads)) if op.target == ALL_REDUCE else 0.0


def collective_times(structure: Structure, machine: Machine, cost: CostModel) -> tuple[CollectiveTime, ...]:
    """How long each all-reduce of the structure takes alone (`sim.collective`)."""
    if structure.comm is None:
        return ()
    ids = [d.id for d in machine.devices]
    return tuple(
        allreduce_time(machine, [ids[d] for d in c.group], c.nbytes, cost) for c in structure.comm.collectives
    )


def build_structure(
    graph: Graph, op_device: tuple[int, ...], n_devices: int, device_ids: Sequence[str] | None = None
) -> Structure:
    """Tokens, transfers and storages of `graph` with op i on device `op_device[i]`
    (`device_ids`: the id of each device index, which the COMM ops of an expanded graph name)."""
    ops = graph.ops
    n = len(ops)
    if len(op_device) != n:
        raise SchedlabError(f"placement covers {len(op_device)} ops but graph {graph.name!r} has {n}")
    comm = None
    if has_comm(graph):
        comm = comm_structure(graph, op_device, device_ids or [f"device{i}" for i in range(n_devices)])
    roots = alias_roots(graph)
    values = graph.values
    producer = graph.producer
    default_dev = op_device[0] if n else 0

    # Home device of every value.
    home: dict[int, int] = {}
    for gi in graph.inputs:
        home[gi.value] = -1
    for op in ops:
        d = op_device[op.id]
        for v in op.inputs:
            if home.get(v) == -1:
                home[v] = d
        for v in op.outputs:
            home[v] = d
    for v, h in home.items():
        if h == -1:
            home[v] = default_dev

    # Storages: (alias root, device) -> index.
    sid_of: dict[tuple[int, int], int] = {}
    storage_bytes: list[int] = []
    storage_device: list[int] = []
    storage_refs: list[int] = []

    def sid(root: int, device: int) -> int:
        key = (root, device)
        s = sid_of.get(key)
        if s is None:
            s = len(storage_bytes)
            sid_of[key] = s
            storage_bytes.append(0)
            storage_device.append(device)
            storage_refs.append(0)
        return s

    def nbytes(v: int) -> int:
        m = values[v]
        return 0 if m is None else m.nbytes

    initial_live = [0] * n_devices
    for gi in graph.inputs:
        v = gi.value
        s = sid(roots[v], home[v])
        storage_refs[s] = PINNED
        if roots[v] == v:
            storage_bytes[s] += nbytes(v)
            initial_live[home[v]] += nbytes(v)
    for go in graph.outputs:
        if go.value in home:
            storage_refs[sid(roots[go.value], home[go.value])] = PINNED

    # Transfers, tokens and references.
    xfer_of: dict[tuple[int, int], int] = {}
    xfer_keys: list[tuple[int, int, int]] = []  # (value, src, dst)
    xfer_consumers: list[list[int]] = []
    waits: list[list[int]] = [[] for _ in range(n)]  # op -> local producer ops
    xwaits: list[list[int]] = [[] for _ in range(n)]  # op -> transfers
    release: list[tuple[int, ...]] = []
    issue_release: dict[int, tuple[int, ...]] = {}
    alloc_bytes = [0] * n
    for op in ops:
        o, d = op.id, op_device[op.id]
        rel: list[int] = []
        for v in op.inputs:
            if v not in home:
                raise SchedlabError(f"graph op {o} ({op.name}) reads value {v}, which no op writes and is no input")
            token = comm is not None and home[v] != d  # a recv reading its send's token
            if token:
                p = producer.get(v)
                if p is None or comm is None or comm.recv_of.get(p) != o:
                    raise SchedlabError(
                        f"expanded graph {graph.name!r}: op {o} ({op.name}) on device index {d} reads value {v} "
                        f"that lives on device index {home[v]} without a send/recv pair (a bug in the expansion)"
                    )
            s = sid(roots[v], home[v] if token else d)
            if s not in rel:
                rel.append(s)
            if home[v] == d:
                p = producer.get(v)
                if p is not None and p not in waits[o]:
                    waits[o].append(p)
            elif token:
                pass  # the recv waits for its transfer (a token added below), not for the send
            else:
                x = xfer_of.get((v, d))
                if x is None:
                    x = len(xfer_keys)
                    xfer_of[(v, d)] = x
                    xfer_keys.append((v, home[v], d))
                    xfer_consumers.append([])
                xfer_consumers[x].append(o)
                if x not in xwaits[o]:
                    xwaits[o].append(x)
        for v in op.outputs:
            if roots[v] == v:
                s = sid(v, d)
                storage_bytes[s] += nbytes(v)
                alloc_bytes[o] += nbytes(v)
                if s not in rel:
                    rel.append(s)  # the producer's own reference, dropped when it finishes
        for s in rel:
            if storage_refs[s] != PINNED:
                storage_refs[s] += 1
        if comm is not None and comm.role[o] is Role.ALL_REDUCE:  # it reads its inputs when issued
            n_in = len({sid_of[(roots[v], d)] for v in op.inputs})
            issue_release[o] = tuple(rel[:n_in])
            rel = rel[n_in:]
        release.append(tuple(rel))

    transfers: list[TransferSpec] = []
    sends: list[list[int]] = [[] for _ in range(n)]
    initial_sends: list[int] = []
    for x, (v, src, dst) in enumerate(xfer_keys):
        consumers = xfer_consumers[x]
        src_s = sid(roots[v], src)
        dst_s = sid(roots[v], dst)
        if storage_refs[src_s] != PINNED:
            storage_refs[src_s] += 1
        storage_bytes[dst_s] += nbytes(v)
        transfers.append(TransferSpec(v, src, dst, nbytes(v), tuple(sorted(set(consumers))), src_s, dst_s))
        p = producer.get(v)
        if p is None:
            initial_sends.append(x)
        else:
            sends[p].append(x)

    local_succs: list[list[int]] = [[] for _ in range(n)]
    for o in range(n):
        for p in waits[o]:
            local_succs[p].append(o)
    pending = [len(waits[o]) + len(xwaits[o]) for o in range(n)]
    if comm is not None:
        for r in comm.recv_of.values():
            pending[r] += 1  # its transfer
        for nxt in comm.issue_next.values():
            pending[nxt] += 1  # the issue of the previous bucket on its device

    return Structure(
        op_device=tuple(op_device),
        pending=tuple(pending),
        local_succs=tuple(tuple(s) for s in local_succs),
        sends=tuple(tuple(s) for s in sends),
        initial_sends=tuple(initial_sends),
        transfers=tuple(transfers),
        alloc_bytes=tuple(alloc_bytes),
        release=tuple(release),
        storage_bytes=tuple(storage_bytes),
        storage_device=tuple(storage_device),
        storage_refs=tuple(storage_refs),
        initial_live=tuple(initial_live),
        comm=comm,
        issue_release=issue_release,
    )


def wakes_on(machine: Machine, device: int, slots: int) -> bool:
    """Whether ops on `device` with two or more threads pay to wake their helpers
    (`sim.wake`): a CPU device of its own cores (not a pool shared by ranks) whose
    executor runs two or more slots."""
    d = machine.devices[device]
    return slots >= 2 and not d.is_gpu and not d.core_pool


def waking(
    slowdown: tuple[Callable[[int, int], float], ...], cost: CostModel, ops: Sequence[Op], threads: Sequence[int],
    kernel_us: Sequence[float], op_device: Sequence[int], machine: Machine, device_slots: Sequence[int],
    demand: Sequence[int],
) -> tuple[tuple[Callable[[int, int], float], ...], tuple[Callable[[int, int], float] | None, ...]]:
    """`slowdown` with the wake factor (`sim.wake`) on each device where it applies, and per
    device the same while a worker holds the interpreter lock (None where none applies);
    `demand`: the cores each kernel holds (one: it ran inline and wakes no helper)."""
    ask = wake_cost(cost)
    devices = [d for d in range(len(machine.devices)) if wakes_on(machine, d, device_slots[d])]
    none: tuple[Callable[[int, int], float] | None, ...] = (None,) * len(slowdown)
    if ask is None or not devices:
        return slowdown, none
    on = set(devices)
    wake = [float(ask(op, threads[i])) if op_device[i] in on and demand[i] >= 2 and op.kind is not OpKind.COMM else 0.0
            for i, op in enumerate(ops)]
    wake_arr = np.asarray(wake, dtype=np.float64)
    fractions = wake_fractions(wake_arr, np.asarray(kernel_us, dtype=np.float64), np.asarray(demand, dtype=np.int64))
    if fractions is None:
        return slowdown, none
    per_op = fractions.tolist()
    shares = cost_first_shares(cost, wake_arr, threads)
    firsts = None if shares is None else shares.tolist()
    cores = [d.cores for d in machine.devices]
    return (tuple(with_wake(fn, per_op, threads, cores[d], firsts=firsts) if d in on else fn for d, fn in enumerate(slowdown)),
            tuple(with_wake(fn, per_op, threads, cores[d], held=1, firsts=firsts) if d in on else None
                  for d, fn in enumerate(slowdown)))


def slowdown_fns(
    graph: Graph, machine: Machine, cost: CostModel, memo: bool = False
) -> tuple[Callable[[int, int], float], ...]:
    """Per device: (op id, busy units of the others) -> co-run slowdown, on the cores its
    kernels run on (a pooled device's: its pool's).

    A FluidShare memoises within one run; `memo` keeps the values across runs too, for a
    Simulator that simulates many plans with one cost model.
    """
    return tuple(_slowdown_fn(graph, device_corun(cost, d), machine.pool_cores(d), memo) for d in machine.devices)


def _slowdown_fn(
    graph: Graph, corun: Callable[[Op, int, int], float], total: int, memo: bool
) -> Callable[[int, int], float]:
    ops = graph.ops
    if not memo:
        return lambda op_id, busy_others: float(corun(ops[op_id], busy_others, total))
    seen: dict[tuple[int, int], float] = {}

    def slowdown(op_id: int, busy_others: int) -> float:
        key = (op_id, busy_others)
        s = seen.get(key)
        if s is None:
            s = seen[key] = float(corun(ops[op_id], busy_others, total))
        return s

    return slowdown
