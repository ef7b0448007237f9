"""TensorFlow's executed training step as a schedlab Graph, and its timings as a Trace.

What TensorFlow runs is not the graph the model built: Grappler and oneDNN rewrite it
(fusing MatMul + BiasAdd + Relu into one kernel, pruning input gradients nobody needs).
So capture reads the graph TensorFlow actually executed, the partition graphs a traced
`Session.run` returns, and the shapes each node produced (`step_stats`, full trace). Node
names there are the names `step_stats` times, so a timed step's events map onto the
captured ops one to one.

Mapping to the schedlab Graph (one schema for both frameworks):
- a resource variable (`VarHandleOp`) is a graph input: PARAM, BUFFER or USER by the
  model's name for it; `ReadVariableOp` output is a view of it;
- every other executed node is an op ("tf.<Type>"), with its data inputs as values and
  its control inputs as value-less ordering edges (a `None` value written by the source);
- an in-place update (`ResourceApplyGradientDescent`, a buffer's `AssignVariableOp`)
  writes a value aliasing its variable: the updated parameter or buffer output;
- kinds F/B/W from data flow (`schedlab.op_kinds`), OPT for the optimizer's scope and
  what runs only after it;
- on several devices (`schedlab.tf.placement`), the `_Send`/`_Recv` pair TensorFlow puts
  on an edge between devices is two ops ("tf._Send", "tf._Recv"), the receive waiting on
  its send (they are paired by rendezvous key, not by an edge), and `meta["tf_devices"]`
  names each node's device. They keep their data-flow kind: between logical CPU devices
  of one process they are executor nodes that hand a buffer over, not COMM (schedlab's
  own transfers over a link, which the simulator routes as such).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.op_kinds import tag_kinds
from schedlab.tf.opcost import is_view, tf_op_work
from schedlab.tf.placement import device_index
from schedlab.tf.step import OPTIMIZER_SCOPE, TFStep

_PLUMBING = {"_Retval", "_Arg", "_SOURCE", "_SINK"}  # the Session's fetch and feed plumbing
_APPLY = {"ResourceApplyGradientDescent", "ResourceApplyAdam"}  # an optimizer's fused update; its last input is the gradient
_SENDS = {"_Send", "_HostSend"}  # a value leaving its device (placement); paired with a receive by tensor_name
_RECVS = {"_Recv", "_HostRecv"}
_UPDATES = {"AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp", *_APPLY}
_ATTR_KEYS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "strides", "padding", "data_format", "dilations")


@dataclass(frozen=True)
class NodeRun:
    """One node's timing in a traced step: absolute start, duration, the thread that ran it."""

    name: str
    device: str
    start_ns: int
    end_ns: int
    thread: int


def node_runs(step_stats: Any) -> list[NodeRun]:
    """Every node a traced step ran, from `RunMetadata.step_stats`."""
    out: list[NodeRun] = []
    for dev in step_stats.dev_stats:
        for n in dev.node_stats:
            start = int(n.all_start_nanos) or int(n.all_start_micros) * 1000
            end_rel = int(n.all_end_rel_nanos) or int(n.all_end_rel_micros) * 1000
            out.append(NodeRun(n.node_name, dev.device, start, start + max(end_rel, 0), int(n.thread_id)))
    return out


def _output_metas(step_stats: Any, dtype_name: Any) -> dict[tuple[str, int], TensorMeta]:
    """(node, output slot) -> shape, dtype and bytes, as a fully traced step recorded them."""
    out: dict[tuple[str, int], TensorMeta] = {}
    for dev in step_stats.dev_stats:
        for n in dev.node_stats:
            for o in n.output:
                td = o.tensor_description
                if td.shape.unknown_rank:
                    continue
                shape = tuple(int(d.size) for d in td.shape.dim)
                if any(s < 0 for s in shape):
                    continue
                nbytes = int(td.allocation_description.requested_bytes)
                out[(n.node_name, int(o.slot))] = TensorMeta(shape, dtype_name(td.dtype), nbytes)
    return out


def _split_input(s: str) -> tuple[str, int, bool]:
    """"name:1" -> (name, 1, False); "^name" -> (name, -1, True); "name" -> (name, 0, False)."""
    if s.startswith("^"):
        return s[1:], -1, True
    name, _, slot = s.rpartition(":")
    if name and slot.isdigit():
        return name, int(slot), False
    return s, 0, False


def _attrs(node: Any) -> dict[str, Any]:
    """The node attributes that cost formulas read, as plain JSON values."""
    out: dict[str, Any] = {}
    for k in _ATTR_KEYS:
        if k not in node.attr:
            continue
        a = node.attr[k]
        which = a.WhichOneof("value")
        if which == "b":
            out[k] = bool(a.b)
        elif which == "s":
            out[k] = a.s.decode()
        elif which == "list":
            out[k] = [int(i) for i in a.list.i]
        elif which == "i":
            out[k] = int(a.i)
    return out


def _inputs_with_transfers(nodes: Sequence[Any]) -> dict[str, list[str]]:
    """Each node's inputs, a `_Recv` also waiting on its `_Send`: TensorFlow pairs them by
    `tensor_name` (the rendezvous key), not by an edge, when the graph spans devices."""
    sends = {n.attr["tensor_name"].s: n.name for n in nodes if n.op in _SENDS}
    out: dict[str, list[str]] = {}
    for n in nodes:
        ins = list(n.input)
        if n.op in _RECVS:
            send = sends.get(n.attr["tensor_name"].s)
            if send is None:
                raise SchedlabError(f"captured TF graph: {n.name} receives {n.attr['tensor_name'].s.decode()!r}, "
                                    "which no partition sends")
            ins.append(f"^{send}")
        out[n.name] = ins
    return out


def _topological(nodes: Sequence[Any], first_start: dict[str, int], node_inputs: dict[str, list[str]]) -> list[Any]:
    """Nodes in an order that respects data and control edges, ties by when they ran."""
    import heapq

    by_name = {n.name: n for n in nodes}
    indeg = {n.name: 0 for n in nodes}
    succs: dict[str, list[str]] = {n.name: [] for n in nodes}
    for n in nodes:
        for s in {_split_input(i)[0] for i in node_inputs[n.name]}:
            if s in by_name:
                indeg[n.name] += 1
                succs[s].append(n.name)
    big = 1 << 62
    ready = [(first_start.get(n, big), n) for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order: list[Any] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(by_name[name])
        for s in succs[name]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (first_start.get(s, big), s))
    if len(order) != len(nodes):
        raise SchedlabError("the executed TensorFlow graph has a cycle; it cannot be captured")
    return order


def graph_from_run(step: TFStep, partition_graphs: Iterable[Any], step_stats: Any, tf_version: str) -> Graph:
    """The schedlab Graph of what TensorFlow executed (see the module docstring)."""
    import tensorflow as tf

    def dtype_name(enum: int) -> str:
        return str(tf.dtypes.as_dtype(enum).name)

    nodes = [n for g in partition_graphs for n in g.node]
    if not nodes:
        raise SchedlabError("TensorFlow returned no partition graph: run the step with output_partition_graphs=True")
    node_inputs = _inputs_with_transfers(nodes)
    metas = _output_metas(step_stats, dtype_name)
    first_start: dict[str, int] = {}
    for r in node_runs(step_stats):
        first_start.setdefault(r.name, r.start_ns)
    model = step.model
    var_name = step.variable_names()  # TF op name -> model tensor name
    state = dict(step.state or {})  # TF op name -> the optimizer's variable
    role = {p.name: InputRole.PARAM for p in model.params}
    role |= {b.name: InputRole.BUFFER for b in model.buffers}
    role |= {x.name: InputRole.USER for x in model.inputs}
    spec_of = {s.name: s for s in (*model.params, *model.buffers, *model.inputs)}
    consumed = {_split_input(i)[0] for n in nodes for i in node_inputs[n.name]}
    waited_on = {i[1:] for n in nodes for i in node_inputs[n.name] if i.startswith("^")}  # sources of ordering edges

    values: list[TensorMeta | None] = []
    inputs: list[GraphInput] = []
    value_of: dict[tuple[str, int], int] = {}  # (node, slot; -1 = its ordering edge) -> value id

    def new_value(meta: TensorMeta | None) -> int:
        values.append(meta)
        return len(values) - 1

    kept = []
    for n in nodes:
        if n.op == "VarHandleOp" and n.name in state:  # the optimizer's own (Adam's moments, beta powers)
            var = state[n.name]
            shape = tuple(int(d) for d in var.shape)
            dtype = np.dtype(var.dtype.base_dtype.as_numpy_dtype)
            v = new_value(TensorMeta(shape, dtype.name, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))
            value_of[(n.name, 0)] = v
            inputs.append(GraphInput(v, n.name, InputRole.OPT_STATE))
        elif n.op == "VarHandleOp":
            name = var_name.get(n.name)
            if name is None:
                raise SchedlabError(f"captured TF graph has a variable {n.name!r} the model does not declare")
            arr = spec_of[name].value
            v = new_value(TensorMeta(tuple(int(s) for s in arr.shape), str(arr.dtype), int(arr.nbytes)))
            value_of[(n.name, 0)] = v
            inputs.append(GraphInput(v, name, role[name]))
        elif n.op in _PLUMBING or (n.op == "NoOp" and n.name not in consumed):
            continue
        else:
            kept.append(n)

    # Output slots per node: those traced with a shape, and those any node reads.
    slots: dict[str, int] = {}
    for name, slot in metas:
        slots[name] = max(slots.get(name, 0), slot + 1)
    for m in kept:
        for i in node_inputs[m.name]:
            src, slot, _ = _split_input(i)
            slots[src] = max(slots.get(src, 0), slot + 1)

    ops: list[Op] = []
    resource_var: dict[int, str] = {i.value: i.name for i in inputs}
    updated: dict[str, int] = {}  # variable name -> value its in-place update writes
    delta_of: dict[str, int] = {}  # parameter name -> its gradient value
    op_device: dict[str, str] = {}
    for n in _topological(kept, first_start, node_inputs):
        op_device[n.name] = f"cpu{device_index(n.device)}"
        op_id = len(ops)
        in_vals: list[int] = []
        for s in node_inputs[n.name]:
            src, slot, control = _split_input(s)
            key = (src, -1 if control else slot)
            if key not in value_of:
                if (src, 0) in value_of and control:
                    continue  # an ordering edge on a variable: the variable is there from the start
                value_of[key] = -1  # filled in when the producer is placed (cannot happen in topo order)
            v = value_of[key]
            if v < 0:
                raise SchedlabError(f"captured TF graph: node {n.name} reads {s} before it is written")
            if v not in in_vals:
                in_vals.append(v)
        in_metas = [values[v] for v in in_vals]
        n_slots = slots.get(n.name, 0)
        out_vals: list[int] = []
        view = is_view(n.op)
        for slot in range(n_slots):
            meta = metas.get((n.name, slot))
            if view and n.op == "ReadVariableOp" and in_vals and in_vals[0] in resource_var:
                base = values[in_vals[0]]
                meta = TensorMeta(base.shape, base.dtype, base.nbytes, alias_of=in_vals[0]) if base else None
            v = new_value(meta)
            value_of[(n.name, slot)] = v
            out_vals.append(v)
        if n.op in _UPDATES and in_vals and in_vals[0] in resource_var:
            name = resource_var[in_vals[0]]
            base = values[in_vals[0]]
            assert base is not None
            v = new_value(TensorMeta(base.shape, base.dtype, base.nbytes, alias_of=in_vals[0]))
            out_vals.append(v)
            updated[name] = v
            if n.op in _APPLY:
                delta_of[name] = in_vals[-1]
        if n.name in waited_on:
            v = new_value(None)  # ordering edge: `^name` consumers wait for this op
            value_of[(n.name, -1)] = v
            out_vals.append(v)
        flops, nbytes = tf_op_work(n.op, in_metas, [values[v] for v in out_vals], _attrs(n))
        ops.append(Op(
            id=op_id, name=n.name, target=f"tf.{n.op}", kind=OpKind.F, args=(), kwargs=_attrs(n),
            inputs=tuple(in_vals), outputs=tuple(out_vals), flops=flops, bytes_moved=nbytes, layer=None, is_view=view,
        ))

    loss_key = (step.loss.op.name, step.loss.value_index)
    if loss_key not in value_of:
        raise SchedlabError(f"the loss {step.loss.name} is not in the executed TF graph (was it fetched?)")
    missing = [p.name for p in model.params if p.name not in delta_of]
    if missing:
        raise SchedlabError(f"captured TF graph has no optimizer update for parameter(s) {missing[:3]}")
    outputs = [GraphOutput(value_of[loss_key], "loss", OutputRole.LOSS)]
    outputs += [GraphOutput(updated[b.name], b.name, OutputRole.BUFFER) for b in model.buffers if b.name in updated]
    outputs += [GraphOutput(delta_of[p.name], p.name, OutputRole.GRAD) for p in model.params]
    outputs += [GraphOutput(updated[p.name], p.name, OutputRole.PARAM) for p in model.params]

    forward_outputs = [o.value for o in outputs if o.role in (OutputRole.LOSS, OutputRole.BUFFER)]
    grads = {p.name: delta_of[p.name] for p in model.params}
    param_of_value = {i.value: i.name for i in inputs if i.role is InputRole.PARAM}
    tagged = tag_kinds(ops, values, forward_outputs, grads, param_of_value)
    ops = _tag_optimizer(tagged)
    placed = len(set(op_device.values())) > 1
    # The model's tensors in the order it declares them, then the optimizer's state by name:
    # the partition graph's node order is TensorFlow's own (a fresh environment of
    # 2026-12-02, tensorflow-cpu 2.21.0 with ml_dtypes 0.7.0 and protobuf 7.36.2, gave the
    # variables in another order than before), and a graph's inputs should not move with it.
    declared = {t.name: k for k, t in enumerate((*model.params, *model.buffers, *model.inputs))}
    inputs.sort(key=lambda i: (i.role is InputRole.OPT_STATE, declared.get(i.name, 0), i.name))
    graph = Graph(
        name=model.name,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        ops=tuple(ops),
        values=tuple(values),
        meta={
            "size": model.size,
            "optimizer": step.optimizer,
            "lr": step.lr,
            "backend": "tensorflow",
            "tensorflow": tf_version,
            "params": len(model.params),
            "param_elements": int(sum(p.value.size for p in model.params)),
            **({"tf_devices": op_device} if placed else {}),  # node -> the logical CPU device it ran on
        },
    )
    graph.validate()
    return graph


def _tag_optimizer(ops: list[Op]) -> list[Op]:
    """OPT: the optimizer's name scope, and anything that only follows OPT work."""
    producer = {v: op.id for op in ops for v in op.outputs}
    opt = [op.name.startswith(f"{OPTIMIZER_SCOPE}/") for op in ops]
    for op in ops:
        preds = {producer[v] for v in op.inputs if v in producer}
        if not opt[op.id] and preds and all(opt[p] for p in preds):
            opt[op.id] = True
    return [Op(**{**op.__dict__, "kind": OpKind.OPT}) if opt[op.id] else op for op in ops]
