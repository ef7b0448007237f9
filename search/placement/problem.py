"""A placement problem: which device runs each co-location group of a graph's ops.

Every placement strategy (`schedlab search --space placement`) works on one
`PlacementProblem` and answers with one device per *group*; `to_plan` turns that answer
into a Plan that `schedlab.plan.place` resolves back to exactly the same op -> device map.

Groups are what Baechi calls co-location groups: ops that must share a device.

- By default a group is one layer (module path) with all its work: forward (F), input
  gradient (B), weight gradient (W) and optimizer update (OPT), as the placement paper's
  and Baechi's PyTorch placements keep a module whole.
- With ``split_fbw`` a group is one layer's ops of one kind, so a layer's backward can run
  elsewhere than its forward.
- An op with no layer (the loss, a reshape between layers) joins the group of the op that
  produced its first input, as `place` does; the ops with neither (reading only graph
  inputs) form the *default* group, which the Plan's default device holds.

Costs, in microseconds, are the simulator's own for the device's kind
(`sim.device_cost`): the calibrated CPU profile on ``cpu`` devices, a CUDA calibration or
the preset's roofline on ``cuda`` ones, each plus the op's dispatch. A transfer between two
devices costs Baechi's linear form ``latency + bytes / bandwidth`` of the machine's link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from schedlab.distribute import input_homes
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind, TensorMeta
from schedlab.layer_split import layers_in_order
from schedlab.machine import Device, Link, Machine
from schedlab.plan import Plan
from schedlab.sim.cost import CostModel
from schedlab.sim.device_cost import kind_kernel_us, op_dispatch_us

DEFAULT_GROUP = "<default>"  # key of the group of ops with no layer and no producer


@dataclass(frozen=True)
class Group:
    key: str  # layer path, "layer/KIND" with split_fbw, or DEFAULT_GROUP
    layer: str | None
    kind: OpKind | None  # with split_fbw: the one kind of its ops
    ops: tuple[int, ...]  # op ids, ascending


@dataclass(frozen=True)
class PlacementProblem:
    """What a placement strategy needs to know; see the module docstring.

    Indices: ops by op id, groups by position in `groups` (forward order of their first
    op), devices by position in `devices`.
    """

    graph: Graph
    machine: Machine
    devices: tuple[Device, ...]  # the devices a placement may use
    groups: tuple[Group, ...]
    op_group: tuple[int, ...]  # op id -> group index
    op_time_us: tuple[tuple[float, ...], ...]  # [op][device]: dispatch + kernel, alone, all cores
    op_out_bytes: tuple[int, ...]  # bytes of each op's outputs (what crosses a cut edge)
    group_mem_bytes: tuple[int, ...]  # resident bytes: inputs it holds (parameters, state) + forward outputs
    capacity_bytes: tuple[int, ...]  # per device
    split_fbw: bool = False
    _links: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict, repr=False)  # (a, b) -> (latency s, B/s)

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def transfer_us(self, src: int, dst: int, nbytes: float) -> float:
        """Time to move `nbytes` from device `src` to device `dst` (0 on one device)."""
        if src == dst:
            return 0.0
        lat_s, bw = self._links[(src, dst)]
        return 1e6 * (lat_s + max(0.0, float(nbytes)) / bw)

    @cached_property
    def group_time_us(self) -> tuple[tuple[float, ...], ...]:
        """[group][device]: the group's ops one after another on that device."""
        out = [[0.0] * self.n_devices for _ in self.groups]
        for op_id, g in enumerate(self.op_group):
            row = out[g]
            for d, t in enumerate(self.op_time_us[op_id]):
                row[d] += t
        return tuple(tuple(r) for r in out)

    @cached_property
    def group_edges(self) -> dict[tuple[int, int], int]:
        """(src group, dst group) -> bytes that cross when the two sit apart (one transfer
        per value and destination group, as `distribute.expand` sends one per device)."""
        out: dict[tuple[int, int], int] = {}
        seen: set[tuple[int, int]] = set()  # (value, dst group)
        producer = self.graph.producer
        for op in self.graph.ops:
            dst = self.op_group[op.id]
            for v in op.inputs:
                p = producer.get(v)
                if p is None:
                    continue
                src = self.op_group[p]
                if src == dst or (v, dst) in seen:
                    continue
                seen.add((v, dst))
                meta = self.graph.values[v]
                out[(src, dst)] = out.get((src, dst), 0) + (meta.nbytes if meta is not None else 0)
        return out

    def op_devices(self, group_device: Sequence[int]) -> tuple[str, ...]:
        """The device id of every op when group g runs on device group_device[g]."""
        self.check(group_device)
        return tuple(self.devices[group_device[g]].id for g in self.op_group)

    def check(self, group_device: Sequence[int]) -> None:
        if len(group_device) != self.n_groups:
            raise SchedlabError(f"a placement gives {len(group_device)} devices for {self.n_groups} groups")
        bad = [d for d in group_device if not 0 <= int(d) < self.n_devices]
        if bad:
            raise SchedlabError(f"a placement names device index {bad[0]}; this problem has {self.n_devices} devices")

    def memory_fits(self, group_device: Sequence[int]) -> bool:
        """Whether each device's groups' resident bytes fit its capacity (`group_mem_bytes`)."""
        return not self.over_memory(group_device)

    def over_memory(self, group_device: Sequence[int]) -> dict[int, int]:
        """device index -> bytes beyond its capacity, for the devices that overflow."""
        used = [0] * self.n_devices
        for g, d in enumerate(group_device):
            used[int(d)] += self.group_mem_bytes[g]
        return {d: used[d] - cap for d, cap in enumerate(self.capacity_bytes) if used[d] > cap}

    def to_plan(self, group_device: Sequence[int], base: Plan | None = None, name: str = "") -> Plan:
        """The Plan that places group g on device group_device[g]: the default group's device
        as the default, each layer by `layer_devices`, and with split_fbw the ops whose kind
        sits elsewhere than their layer's forward by `op_devices`. `base` gives the rest of
        the plan (slots, threads, order)."""
        self.check(group_device)
        dev = [self.devices[int(d)].id for d in group_device]
        default_dev = next((dev[g] for g, grp in enumerate(self.groups) if grp.key == DEFAULT_GROUP), dev[0] if dev else None)
        layer_dev: dict[str, str] = {}
        for g, grp in enumerate(self.groups):  # a layer's device is its F group's (first in forward order)
            if grp.layer is not None:
                layer_dev.setdefault(grp.layer, dev[g])
        op_dev: dict[int, str] = {}
        if self.split_fbw:
            for op in self.graph.ops:
                want = dev[self.op_group[op.id]]
                have = layer_dev.get(op.layer) if op.layer else None
                if have is not None and want != have:
                    op_dev[op.id] = want
        plan = base or Plan()
        placed = replace(plan, device=default_dev, layer_devices=layer_dev, op_devices=op_dev, name=name or plan.name)
        if not placed.multi_device:  # every group on one device: a one-device plan
            placed = replace(placed, layer_devices={}, op_devices={})
        return placed


def build_problem(
    graph: Graph,
    machine: Machine,
    cost: CostModel,
    *,
    devices: Sequence[str] | None = None,
    split_fbw: bool = False,
) -> PlacementProblem:
    """The placement problem of `graph` over `devices` of `machine` (default: all of them)."""
    ids = list(devices) if devices is not None else [d.id for d in machine.devices]
    if not ids:
        raise SchedlabError("a placement needs at least one device")
    devs = tuple(machine.device(d) for d in ids)
    groups, op_group = _groups(graph, split_fbw)
    times = tuple(tuple(_op_time_us(cost, op, d) for d in devs) for op in graph.ops)
    out_bytes = tuple(sum(_nbytes(graph.values[v]) for v in op.outputs) for op in graph.ops)
    mem = _group_memory(graph, groups, op_group, out_bytes)
    links: dict[tuple[int, int], tuple[float, float]] = {}
    for a, da in enumerate(devs):
        for b, db in enumerate(devs):
            if a != b:
                link = _link(machine, da.id, db.id)
                links[(a, b)] = (link.latency_s, link.bw_bytes_per_s)
    return PlacementProblem(
        graph=graph, machine=machine, devices=devs, groups=groups, op_group=op_group, op_time_us=times,
        op_out_bytes=out_bytes, group_mem_bytes=mem, capacity_bytes=tuple(d.memory_bytes for d in devs),
        split_fbw=split_fbw, _links=links,
    )


def _op_time_us(cost: CostModel, op: Op, device: Device) -> float:
    threads = max(1, device.cores)
    kernel = kind_kernel_us(cost, op, threads, device)
    if kernel is None:
        kernel = float(cost.kernel_us(op, threads))
    return op_dispatch_us(cost, op, device) + float(kernel)


def _nbytes(meta: TensorMeta | None) -> int:
    return 0 if meta is None else int(meta.nbytes)


def _link(machine: Machine, a: str, b: str) -> Link:
    for link in machine.links:
        if link.src == a and link.dst == b:
            return link
    for link in machine.links:
        if {link.src, link.dst} == {a, b}:
            return link
    raise SchedlabError(f"machine {machine.name!r} has no link between {a} and {b}; a placement over both needs one")


def _groups(graph: Graph, split_fbw: bool) -> tuple[tuple[Group, ...], tuple[int, ...]]:
    """Co-location groups (module docstring), ordered by the forward order of their layer
    and then by kind; the default group first."""
    key_of: list[str] = []
    layer_kind: dict[str, tuple[str | None, OpKind | None]] = {}
    producer = graph.producer
    for op in graph.ops:
        if op.layer:
            key = f"{op.layer}/{op.kind.value}" if split_fbw else op.layer
            layer_kind.setdefault(key, (op.layer, op.kind if split_fbw else None))
        else:
            src = next((producer[v] for v in op.inputs if v in producer), None)
            key = key_of[src] if src is not None else DEFAULT_GROUP
            layer_kind.setdefault(key, (None, None))
        key_of.append(key)
    layer_pos = {lay: i for i, lay in enumerate(layers_in_order(graph))}
    kind_pos = {k: i for i, k in enumerate(OpKind)}

    def rank(key: str) -> tuple[int, int, str]:
        layer, kind = layer_kind[key]
        if layer is None:
            return (-1, 0, key)
        return (layer_pos.get(layer, len(layer_pos)), kind_pos[kind] if kind is not None else 0, key)

    keys = sorted(layer_kind, key=rank)
    index = {k: i for i, k in enumerate(keys)}
    members: dict[str, list[int]] = {k: [] for k in keys}
    for op_id, k in enumerate(key_of):
        members[k].append(op_id)
    groups = tuple(Group(k, layer_kind[k][0], layer_kind[k][1], tuple(members[k])) for k in keys)
    return groups, tuple(index[k] for k in key_of)


def _group_memory(
    graph: Graph, groups: tuple[Group, ...], op_group: tuple[int, ...], out_bytes: tuple[int, ...]
) -> tuple[int, ...]:
    """Per group: the graph inputs it would hold (parameters, buffers, optimizer state, as
    `distribute.input_homes` homes them) plus its forward ops' outputs (activations kept
    for the backward pass, an upper bound)."""
    mem = [0] * len(groups)
    homes = input_homes(graph, tuple(str(g) for g in op_group))
    for i in graph.inputs:
        meta = graph.values[i.value]
        if meta is not None:
            mem[int(homes[i.value])] += meta.nbytes
    for op in graph.ops:
        if op.kind is OpKind.F and not op.is_view:
            mem[op_group[op.id]] += out_bytes[op.id]
    return tuple(mem)
