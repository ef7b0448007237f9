"""Expanding a step across devices: every value that crosses a device becomes explicit
communication ops of the graph (DESIGN.md, "A resolved plan is a graph per rank").

`expand(graph, op_device)` keeps the captured ops at their ids (0..n-1, so plans, traces
and profiles keyed by op id still hold) and appends the COMM ops after them:

- ``schedlab.send``: on the value's home device; reads the value, writes a zero-byte
  *token* (kwargs ``dst``, ``tag``). A send never blocks its worker.
- ``schedlab.recv``: on the consumer's device; reads the token (the cross-device edge of
  the DAG), writes a fresh copy of the value (kwargs ``src``, ``tag``). Every consumer on
  that device reads the copy: one transfer per (value, destination device).
- ``schedlab.all_reduce``: added by `replicate` (data parallel); see there.

A graph input's home is the device of the op that writes its next-step value (a
parameter's optimizer update), else of its first reader; a value's home is the device of
its producer. Op order inside the expanded graph is no longer program order for the COMM
ops: dependencies come from values, as everywhere else (`Graph.preds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta

SEND = "schedlab.send"
RECV = "schedlab.recv"
ALL_REDUCE = "schedlab.all_reduce"
COMM_TARGETS = (SEND, RECV, ALL_REDUCE)
TOKEN_DTYPE = "token"  # dtype of the zero-byte value a send writes


@dataclass(frozen=True)
class Expanded:
    """A graph whose ops each run on one device, with COMM ops for every crossing value."""

    graph: Graph
    device: tuple[str, ...]  # per op of `graph`
    base_ops: int  # ops 0..base_ops-1 are the input graph's; the rest are COMM ops

    @property
    def comm_ops(self) -> range:
        return range(self.base_ops, len(self.graph.ops))


def input_homes(graph: Graph, op_device: Sequence[str]) -> dict[int, str]:
    """Graph input value -> the device that holds it at the start of a step."""
    updater: dict[tuple[str, str], str] = {}  # (role, name) of a next-step output -> device
    for o in graph.outputs:
        if o.role in (OutputRole.PARAM, OutputRole.BUFFER, OutputRole.OPT_STATE) and o.value in graph.producer:
            updater[(o.role.value, o.name)] = op_device[graph.producer[o.value]]
    first_reader: dict[int, int] = {}
    for op in graph.ops:
        for v in op.inputs:
            first_reader.setdefault(v, op.id)
    homes: dict[int, str] = {}
    fallback = op_device[0] if op_device else ""
    for i in graph.inputs:
        role = i.role.value if i.role is not InputRole.USER and i.role is not InputRole.CONST else ""
        home = updater.get((role, i.name)) if role else None
        if home is None:
            reader = first_reader.get(i.value)
            home = op_device[reader] if reader is not None else fallback
        homes[i.value] = home
    return homes


def expand(graph: Graph, op_device: Sequence[str], expanded_from: str | None = None) -> Expanded:
    """`graph` with a send/recv pair for each value read on a device other than its home.
    `expanded_from`: the hash its meta names as the origin (default `graph.hash`); a caller
    that built `graph` from another names that one, and the large built graph is not hashed."""
    n = len(graph.ops)
    if len(op_device) != n:
        raise SchedlabError(f"placement covers {len(op_device)} ops but graph {graph.name!r} has {n}")
    home: dict[int, str] = input_homes(graph, op_device)
    for op in graph.ops:
        for v in op.outputs:
            home[v] = op_device[op.id]
    values: list[TensorMeta | None] = list(graph.values)
    copy_of: dict[tuple[int, str], int] = {}  # (value, device) -> the value received there
    comm: list[Op] = []
    comm_device: list[str] = []

    def new_value(meta: TensorMeta | None) -> int:
        values.append(meta)
        return len(values) - 1

    def received(v: int, dst: str) -> int:
        key = (v, dst)
        if key in copy_of:
            return copy_of[key]
        src = home[v]
        meta = values[v]
        nbytes = 0 if meta is None else meta.nbytes
        tag = len(copy_of)
        token = new_value(TensorMeta(shape=(), dtype=TOKEN_DTYPE, nbytes=0))
        copy = new_value(None if meta is None else TensorMeta(shape=meta.shape, dtype=meta.dtype, nbytes=meta.nbytes))
        label = f"v{v}:{src}->{dst}"
        comm.append(Op(
            id=n + len(comm), name=f"send {label}", target=SEND, kind=OpKind.COMM, args=({"v": v},),
            kwargs={"dst": dst, "tag": tag}, inputs=(v,), outputs=(token,), flops=0.0, bytes_moved=nbytes,
            layer=None,
        ))
        comm_device.append(src)
        comm.append(Op(
            id=n + len(comm), name=f"recv {label}", target=RECV, kind=OpKind.COMM, args=({"v": token},),
            kwargs={"src": src, "tag": tag}, inputs=(token,), outputs=(copy,), flops=0.0, bytes_moved=nbytes,
            layer=None,
        ))
        comm_device.append(dst)
        copy_of[key] = copy
        return copy

    ops: list[Op] = []
    for op in graph.ops:
        dev = op_device[op.id]
        remap = {v: received(v, dev) for v in op.inputs if home[v] != dev}
        ops.append(op if not remap else rewire(op, remap))
    if not comm:
        return Expanded(graph=graph, device=tuple(op_device), base_ops=n)
    out = Graph(
        name=graph.name,
        inputs=graph.inputs,
        outputs=graph.outputs,
        ops=tuple(ops) + tuple(comm),
        values=tuple(values),
        meta={**graph.meta, "expanded_from": expanded_from or graph.hash, "base_ops": n},
    )
    return Expanded(graph=out, device=tuple(op_device) + tuple(comm_device), base_ops=n)


def rewire(op: Op, remap: dict[int, int]) -> Op:
    """`op` reading `remap[v]` wherever it read `v`."""

    def sub(a: Any) -> Any:
        if isinstance(a, dict) and "v" in a and len(a) == 1:
            return {"v": remap.get(int(a["v"]), int(a["v"]))}
        if isinstance(a, list):
            return [sub(x) for x in a]
        if isinstance(a, tuple):
            return tuple(sub(x) for x in a)
        return a

    return Op(
        id=op.id, name=op.name, target=op.target, kind=op.kind, args=tuple(sub(a) for a in op.args),
        kwargs={k: sub(a) for k, a in op.kwargs.items()}, inputs=tuple(remap.get(v, v) for v in op.inputs),
        outputs=op.outputs, flops=op.flops, bytes_moved=op.bytes_moved, layer=op.layer, is_view=op.is_view,
    )


def outputs_on(graph: Graph, device: Sequence[str], dev: str) -> tuple[GraphOutput, ...]:
    """The graph outputs whose values are written on device `dev` (graph inputs by their home)."""
    homes = input_homes(graph, device)
    prod = graph.producer
    return tuple(o for o in graph.outputs if (device[prod[o.value]] if o.value in prod else homes.get(o.value)) == dev)
