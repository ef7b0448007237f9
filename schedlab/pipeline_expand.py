"""A pipelined step as one graph: micro-batch copies of the step, gradient accumulation,
one update per parameter, and each device's ops in the order of a pipeline schedule.

`pipeline_graph(graph, split, schedule, devices)` takes the step captured at the
micro-batch size, cut into stages (`pipeline_stages.split_stages`), and a schedule whose
row d runs on device `devices[d]`, and builds:

- micro-batch m's copy of every forward and backward op (micro-batch 0 keeps the
  captured ops and ids; the others follow, named ``NAME@mM``), reading micro-batch m's
  user inputs (``NAME@mM``) and the *same* parameters, buffers and optimizer state: unlike
  data-parallel replicas, micro-batches share one copy of the model;
- per parameter gradient, and for the loss, a chain of ``aten.add`` ops summing the
  micro-batches' values in the order the schedule makes them, then one ``aten.div`` by M:
  the mean, which equals the full batch's gradient (and loss) of a loss that is a mean
  over the batch, up to rounding;
- the captured optimizer ops once, reading the mean gradients: one update per parameter,
  on its stage's device.

The order: each device runs, for each action of its row of the schedule (stage s, kind,
micro-batch m), the ops of stage s and micro-batch m of that kind's parts (F: part F; B:
parts I then W; I: part I; W: part W), a gradient's accumulation right after the action
that made it, and a stage's updates right after its last backward action. Updates that
need nothing of the step (Adam's bias corrections from its step counter) run first. The
graph has no communication ops yet: `distribute.expand` adds them, as for any placement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schedlab.distribute import rewire
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.pipeline import Kind, Schedule
from schedlab.pipeline_stages import Part, StageSplit, topological

SHARED_ROLES = (InputRole.PARAM, InputRole.BUFFER, InputRole.OPT_STATE, InputRole.CONST)
PARTS_OF_ACTION = {Kind.F: (Part.F,), Kind.B: (Part.I, Part.W), Kind.I: (Part.I,), Kind.W: (Part.W,)}
NO_ACTION = ""  # the action tag of an op outside every action: updates and step-shared work

GroupKey = tuple[int, int, Part]  # (stage, micro-batch, part)


@dataclass(frozen=True)
class Pipelined:
    """A pipelined step with no communication ops yet."""

    graph: Graph
    device: tuple[str, ...]  # per op
    orders: dict[str, tuple[int, ...]]  # device -> every op it runs, in run order
    action: tuple[str, ...]  # per op: the schedule action it runs in ("1F3"), or NO_ACTION
    copy_of: tuple[int, ...]  # per op: the captured op it copies, or -1 (accumulation)
    base_ops: int  # ops of the captured graph (micro-batch 0's keep their ids)
    stage: tuple[int, ...] = ()  # per op: the stage whose work or update it is


def micro_name(name: str, m: int) -> str:
    """The name of micro-batch m's copy of a value, input or op (micro-batch 0 keeps its own)."""
    return name if m == 0 else f"{name}@m{m}"


def pipeline_graph(graph: Graph, split: StageSplit, schedule: Schedule, devices: tuple[str, ...]) -> Pipelined:
    """`graph` (one micro-batch's step) as `schedule.n_microbatches` micro-batches run by
    `schedule`, whose row d runs on device `devices[d]` (each stage on one device); see
    the module docstring."""
    n = len(graph.ops)
    b = _copies(graph, split, schedule.n_microbatches)
    groups = _device_groups(schedule, devices)
    extra, mean = _accumulate(b, graph, split, groups)
    for i in range(n):  # the optimizer reads the mean gradients
        if split.part[i] is Part.OPT and any(v in mean for v in b.ops[i].inputs):
            b.ops[i] = rewire(b.ops[i], mean)
    stage_device = tuple(devices[st.devices[0]] for st in schedule.shape.stages)
    stage = tuple(b.key_of[i][0] if i in b.key_of else split.stage[i] for i in range(len(b.ops)))
    device = tuple(stage_device[s] for s in stage)
    orders, action = _orders(b, graph, split, groups, extra, device)
    out = Graph(
        name=graph.name,
        inputs=tuple(b.inputs),
        outputs=tuple(GraphOutput(mean.get(o.value, o.value), o.name, o.role) for o in graph.outputs),
        ops=tuple(b.ops),
        values=tuple(b.values),
        meta={**graph.meta, "expanded_from": graph.hash, "base_ops": n, "micro_batches": schedule.n_microbatches},
    )
    out.validate()
    copy_of = (*b.copy_of, *[-1] * (len(b.ops) - len(b.copy_of)))
    return Pipelined(graph=out, device=device, orders=orders, action=action, copy_of=copy_of, base_ops=n, stage=stage)


@dataclass
class _Building:
    """The pipelined graph's parts while they are built."""

    ops: list[Op]
    values: list[TensorMeta | None]
    inputs: list[GraphInput]
    copy_of: list[int]  # per copied op: the captured op (accumulation ops come after, -1)
    key_of: dict[int, GroupKey]  # per op of the micro-batches' work: its (stage, micro-batch, part)
    vmap: list[dict[int, int]]  # per micro-batch m >= 1: captured value -> its copy

    def at(self, v: int, m: int) -> int:
        """Captured value v as micro-batch m holds it (shared inputs are everyone's)."""
        return v if m == 0 else self.vmap[m].get(v, v)


def _copies(graph: Graph, split: StageSplit, M: int) -> _Building:
    """The captured ops (micro-batch 0's work and the updates), then micro-batches 1..M-1's
    copies of the forward and backward ops, on their own user inputs."""
    n = len(graph.ops)
    shared = {i.value for i in graph.inputs if i.role in SHARED_ROLES}
    work = [op for op in graph.ops if split.part[op.id] is not Part.OPT]
    b = _Building(
        ops=list(graph.ops),
        values=list(graph.values),
        inputs=list(graph.inputs),
        copy_of=list(range(n)),
        key_of={op.id: (split.stage[op.id], 0, split.part[op.id]) for op in work},
        vmap=[{} for _ in range(M)],
    )
    for m in range(1, M):
        vmap = b.vmap[m]
        for inp in graph.inputs:
            if inp.value not in shared:
                vmap[inp.value] = len(b.values)
                b.values.append(graph.values[inp.value])
                b.inputs.append(GraphInput(vmap[inp.value], micro_name(inp.name, m), inp.role))
        for op in work:
            for v in op.outputs:
                vmap[v] = len(b.values)
                b.values.append(graph.values[v])
        for c in vmap.values():
            meta = b.values[c]
            if meta is not None and meta.alias_of is not None:
                b.values[c] = replace(meta, alias_of=b.at(meta.alias_of, m))
        for op in work:
            new = rewire(op, {v: b.at(v, m) for v in op.inputs})
            b.key_of[len(b.ops)] = (split.stage[op.id], m, split.part[op.id])
            b.copy_of.append(op.id)
            outputs = tuple(b.at(v, m) for v in op.outputs)
            b.ops.append(replace(new, id=len(b.ops), name=micro_name(op.name, m), outputs=outputs))
    return b


def _accumulate(
    b: _Building, graph: Graph, split: StageSplit, groups: dict[str, list[_Slot | _Tail]]
) -> tuple[dict[GroupKey, list[int]], dict[int, int]]:
    """Per loss and gradient, the sum over micro-batches in the order the schedule makes
    them, then the mean. Returns the accumulation ops each group ends with, and the mean
    value of each captured loss or gradient value."""
    M = len(b.vmap)
    position = {e.key: k for entries in groups.values() for k, e in enumerate(entries) if isinstance(e, _Slot)}
    extra: dict[GroupKey, list[int]] = {}
    mean: dict[int, int] = {}
    for o in graph.outputs:
        if o.role not in (OutputRole.LOSS, OutputRole.GRAD) or M == 1 or o.value in mean:
            continue
        prod = graph.producer.get(o.value)
        if prod is None or split.part[prod] is Part.OPT:
            continue  # not made by the micro-batches' work (an unused parameter's zero gradient)
        s, p = split.stage[prod], split.part[prod]
        ms = sorted(range(M), key=lambda m: position[(s, m, p)])
        kind = OpKind.F if o.role is OutputRole.LOSS else OpKind.W
        layer = graph.ops[prod].layer
        acc = b.at(o.value, ms[0])
        for m in ms[1:]:
            add = ({"v": acc}, {"v": b.at(o.value, m)})
            acc = _append(
                b,
                "aten.add.Tensor",
                add,
                acc,
                f"accumulate {o.role.value} {micro_name(o.name, m)}",
                kind,
                layer,
                passes=3,
            )
            extra.setdefault((s, m, p), []).append(len(b.ops) - 1)
            b.key_of[len(b.ops) - 1] = (s, m, p)
        mean[o.value] = _append(
            b, "aten.div.Tensor", ({"v": acc}, M), acc, f"mean {o.role.value} {o.name}", kind, layer, passes=2
        )
        extra.setdefault((s, ms[-1], p), []).append(len(b.ops) - 1)
        b.key_of[len(b.ops) - 1] = (s, ms[-1], p)
    return extra, mean


def _orders(
    b: _Building,
    graph: Graph,
    split: StageSplit,
    groups: dict[str, list[_Slot | _Tail]],
    extra: dict[GroupKey, list[int]],
    device: tuple[str, ...],
) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """Each device's ops in run order, and each op's action tag (module docstring)."""
    n = len(graph.ops)
    rank = {i: k for k, i in enumerate(topological(graph))}
    members: dict[GroupKey, list[int]] = {}
    for i in sorted((i for i in b.key_of if i < len(b.copy_of)), key=lambda i: rank[b.copy_of[i]]):
        members.setdefault(b.key_of[i], []).append(i)
    needs_step = [False] * n  # whether an update depends on the micro-batches' work
    head: dict[str, list[int]] = {}
    tail: dict[int, list[int]] = {}
    for i in sorted(range(n), key=rank.__getitem__):
        needs_step[i] = split.part[i] is not Part.OPT or any(needs_step[p] for p in graph.preds[i])
        if split.part[i] is Part.OPT:
            (tail.setdefault(split.stage[i], []) if needs_step[i] else head.setdefault(device[i], [])).append(i)
    action = [NO_ACTION] * len(b.ops)
    orders: dict[str, tuple[int, ...]] = {}
    for dev, entries in groups.items():
        out = list(head.get(dev, ()))
        for e in entries:
            if isinstance(e, _Tail):
                out.extend(tail.get(e.stage, ()))
                continue
            ids = [*members.get(e.key, ()), *extra.get(e.key, ())]
            for i in ids:
                action[i] = e.action
            out.extend(ids)
        orders[dev] = tuple(out)
    placed = sorted(i for order in orders.values() for i in order)
    if placed != list(range(len(b.ops))):  # pragma: no cover - a checked schedule covers every stage's work
        missing = sorted(set(range(len(b.ops))) - set(placed))
        raise SchedlabError(f"the pipeline order leaves out ops {missing[:5]}; this is a schedlab bug")
    return orders, tuple(action)


@dataclass(frozen=True)
class _Tail:
    """The place of a stage's updates in its device's order."""

    stage: int


@dataclass(frozen=True)
class _Slot:
    """One part of one action in a device's order: its ops' group, and the action's text."""

    key: GroupKey
    action: str


def _device_groups(schedule: Schedule, devices: tuple[str, ...]) -> dict[str, list[_Slot | _Tail]]:
    """Per device, the parts of its actions in order, each stage's updates after its last
    backward action."""
    out: dict[str, list[_Slot | _Tail]] = {}
    for d, row in enumerate(schedule.orders):
        last_backward = {a.stage: k for k, a in enumerate(row) if a.kind is not Kind.F}
        entries: list[_Slot | _Tail] = []
        for k, a in enumerate(row):
            entries.extend(_Slot((a.stage, a.mb, part), str(a)) for part in PARTS_OF_ACTION[a.kind])
            if last_backward.get(a.stage) == k:
                entries.append(_Tail(a.stage))
        out[devices[d]] = entries
    return out


def _append(
    b: _Building,
    target: str,
    args: tuple[object, ...],
    like: int,
    name: str,
    kind: OpKind,
    layer: str | None,
    passes: int,
) -> int:
    """Append an elementwise op writing a fresh value shaped as value `like` (`passes` over
    its bytes); the new value's id."""
    meta = b.values[like]
    b.values.append(None if meta is None else TensorMeta(shape=meta.shape, dtype=meta.dtype, nbytes=meta.nbytes))
    numel = 1
    for size in () if meta is None else meta.shape:
        numel *= size
    reads = tuple(a["v"] for a in args if isinstance(a, dict))
    b.ops.append(
        Op(
            id=len(b.ops),
            name=name,
            target=target,
            kind=kind,
            args=args,
            kwargs={},
            inputs=tuple(dict.fromkeys(reads)),
            outputs=(len(b.values) - 1,),
            flops=float(numel),
            bytes_moved=passes * (0 if meta is None else meta.nbytes),
            layer=layer,
        )
    )
    return len(b.values) - 1
