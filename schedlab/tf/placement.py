"""A schedlab Plan's placement as TensorFlow device assignments on logical CPU devices.

TensorFlow splits one host into N logical CPU devices (`TFThreads.cpu_devices`), each with
its own intra-op pool (`TF_OVERRIDE_GLOBAL_THREADPOOL=1`, `schedlab.tf.runtime`); the
session's one inter-op pool runs ready nodes of every device. schedlab's devices
``cpu0..cpu{N-1}`` are TensorFlow's ``/device:CPU:0..N-1``.

A plan places ops of a Graph: by layer (`placement.layers`) or by op id (`placement.ops`)
of the graph TensorFlow executes unplaced. So placement takes two steps:

1. capture the unplaced step (`schedlab.tf.capture`) and resolve the plan on it with the
   same `schedlab.plan.place` the torch backend uses: a device per executed node;
2. set those devices on a fresh step graph before its session starts. Nodes Grappler
   fused or pruned away (a MatMul inside a fused MatMul + BiasAdd + Relu, constants) take
   the device of the node that consumes them, else of the node that feeds them; a
   resource variable goes where its update runs. TensorFlow's colocation rules come last
   (an optimizer's slots and apply op with their variable; `tf.gradients` colocates some
   of its nodes with the forward op), since TF refuses to break them.

TensorFlow then inserts a `_Send`/`_Recv` pair on every edge between devices: capture
keeps them as ops. How much of the plan ran as asked is `placement_honoured`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, TensorMeta
from schedlab.machine import Device, Machine, cpu_index
from schedlab.plan import Plan, place

_TF_CPU = re.compile(r"(?:^|/)device:CPU:(\d+)$")
_UPDATE_TYPES = ("ResourceApply", "AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp")


def plan_devices(plan: Plan) -> int:
    """How many logical CPU devices `plan` places onto (1 without placement): one more than
    the highest ``cpuK`` it names. Any other name is refused."""
    named = {*plan.layer_devices.values(), *plan.op_devices.values()}
    if plan.device is not None:
        named.add(plan.device)
    if not (plan.layer_devices or plan.op_devices):
        return 1
    top = 0
    for dev in sorted(named):
        k = cpu_index(dev)
        if k is None:
            raise SchedlabError(f"plan {plan.name or plan.describe()!r} places ops on {dev!r}: the TensorFlow backend "
                                "places on logical CPU devices cpu0, cpu1, ... (TensorFlow's /device:CPU:K)")
        top = max(top, k)
    return top + 1


def tf_cpu_machine(n: int, cores: int) -> Machine:
    """N logical CPU devices of one TensorFlow process, as a Machine to resolve a plan on.
    Each device's pool may use every core of the host: the devices share them."""
    return Machine(
        name=f"tensorflow-{n}cpu",
        devices=tuple(Device(id=f"cpu{i}", kind="cpu", cores=cores, memory_bytes=2**62, process=0) for i in range(n)),
    )


def device_index(tf_device: str) -> int:
    """"/job:localhost/replica:0/task:0/device:CPU:1" -> 1; an unplaced node ("") is 0."""
    if not tf_device:
        return 0
    m = _TF_CPU.search(tf_device)
    if m is None:
        raise SchedlabError(f"TensorFlow ran a node on {tf_device!r}, not a CPU device; the TensorFlow backend "
                            "places on CPU devices only")
    return int(m.group(1))


def node_devices(unplaced: Graph, plan: Plan, n_devices: int) -> dict[str, int]:
    """The device index the plan gives each node of the unplaced executed graph, by name."""
    machine = tf_cpu_machine(n_devices, cores=1)
    devs = place(unplaced, plan, machine)
    return {op.name: cpu_index(dev) or 0 for op, dev in zip(unplaced.ops, devs, strict=True)}


def apply_placement(tf_graph: Any, devices: Mapping[str, int]) -> dict[str, int]:
    """Set a device on every node of `tf_graph` (not yet run by any session) from
    `devices` (node name -> index; see the module docstring for nodes it does not name).
    Returns the index each node got."""
    ops = list(tf_graph.get_operations())  # creation order: every node after its inputs
    got: dict[str, int] = {op.name: devices[op.name] for op in ops if op.name in devices}
    for op in reversed(ops):  # fused or pruned nodes follow their consumers
        if op.name in got or op.type == "VarHandleOp":
            continue
        consumers = [c for out in op.outputs for c in out.consumers()] + list(op._control_outputs)
        dev = next((got[c.name] for c in consumers if c.name in got), None)
        if dev is not None:
            got[op.name] = dev
    for op in ops:  # ... else their producers
        if op.name in got or op.type == "VarHandleOp":
            continue
        dev = next((got[i.op.name] for i in op.inputs if i.op.name in got), None)
        got[op.name] = 0 if dev is None else dev
    for op in ops:  # a variable lives where the step updates it, else where the step first reads it
        if op.type != "VarHandleOp":
            continue
        users = [c for c in op.outputs[0].consumers() if c.name in devices]  # the step's, not the initializer's
        update = next((c for c in users if c.type.startswith(_UPDATE_TYPES)), None)
        first = update or (users[0] if users else None)
        got[op.name] = devices[first.name] if first is not None else 0
    for op in ops:  # TensorFlow's colocation groups go with their root
        for group in op.colocation_groups():
            root = group.decode().removeprefix("loc:@")
            if root != op.name and root in got:
                got[op.name] = got[root]
    for op in ops:
        op._set_device(f"/device:CPU:{got[op.name]}")
    return got


def honoured(planned: Mapping[str, int], placed: Graph) -> float:
    """The share of the planned nodes that ran on the planned device in the placed run
    (nodes fused away in the placed run are not counted)."""
    ran = placed.meta.get("tf_devices", {})
    both = [name for name in planned if name in ran]
    if not both:
        return 0.0
    return sum(1 for name in both if ran[name] == f"cpu{planned[name]}") / len(both)


def with_transfers(graph: Graph, op_device: tuple[str, ...]) -> Graph:
    """`graph` placed on `op_device` (one device id per op) as TensorFlow runs it: every
    value read on a device other than its producer's goes through a `_Send` on the
    producer's device and a `_Recv` on the reader's (one pair per value and reading
    device), as capture records them (of the reader's kind), and `meta["tf_devices"]` names each op's
    device. What the simulator predicts a placement on, before TensorFlow has run it. A
    constant is not sent: TensorFlow makes a copy of it on each device that reads it.

    Between logical CPU devices of one process the pair moves no data (TensorFlow hands the
    buffer over), so the ops carry no FLOPs or bytes: each costs the executor's per-node time.
    """
    if len(op_device) != len(graph.ops):
        raise SchedlabError(f"placement covers {len(op_device)} ops but graph {graph.name!r} has {len(graph.ops)}")
    values: list[TensorMeta | None] = list(graph.values)
    producer = graph.producer
    device_of_value = {v: op_device[producer[v]] for v in producer}
    received: dict[tuple[int, str], int] = {}  # (value, device) -> the value its receive writes there
    ops: list[Op] = []
    devices: dict[str, str] = {}

    def add(op: Op, dev: str) -> None:
        ops.append(dataclasses.replace(op, id=len(ops)))
        devices[op.name] = dev

    for op in graph.ops:
        dev = op_device[op.id]
        inputs = []
        for v in op.inputs:
            src = device_of_value.get(v)
            if src is None or src == dev or graph.ops[producer[v]].target == "tf.Const":  # TF copies a constant to each device
                inputs.append(v)
                continue
            if (v, dev) not in received:
                token = len(values)
                values.append(None)
                meta = values[v]
                values.append(None if meta is None else TensorMeta(meta.shape, meta.dtype, meta.nbytes))
                received[(v, dev)] = token + 1
                base = f"{graph.ops[producer[v]].name}/_to_{dev}"
                add(_transfer(f"{base}/send", "tf._Send", v, token, op), src)
                add(_transfer(f"{base}/recv", "tf._Recv", token, token + 1, op), dev)
            inputs.append(received[(v, dev)])
        add(dataclasses.replace(op, inputs=tuple(inputs)), dev)
    placed = Graph(name=graph.name, inputs=graph.inputs, outputs=graph.outputs, ops=tuple(ops), values=tuple(values),
                   meta={**graph.meta, "tf_devices": devices})
    placed.validate()
    return placed


def _transfer(name: str, target: str, src: int, dst: int, reader: Op) -> Op:
    """A send or receive for `reader`'s input, of its kind and layer (as capture keeps them)."""
    return Op(id=0, name=name, target=target, kind=reader.kind, args=(), kwargs={}, inputs=(src,), outputs=(dst,),
              flops=0.0, bytes_moved=0, layer=reader.layer)


def place_for_tf(graph: Graph, plan: Plan) -> Graph:
    """The unplaced executed `graph` with `plan`'s placement, as `with_transfers` makes it."""
    n = plan_devices(plan)
    if n < 2:
        return graph
    return with_transfers(graph, place(graph, plan, tf_cpu_machine(n, cores=1)))
