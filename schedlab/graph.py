"""The Graph of one training step: forward, backward and optimizer ops as one DAG.

A Graph is plain, frozen data. Every tensor in the step is a *value* with an integer id:
graph inputs (parameters, buffers, optimizer state, user inputs, constants) come first,
then the outputs of each op in program order. An op reads values and writes values; the
op-to-op dependencies are derived from that, once, and cached.

Op arguments are kept in a JSON-able encoding so that the Graph serialises without the
model and the executor can still run it (see `exec/program.py`):

- ``{"v": 7}``            the tensor value 7
- ``{"dtype": "float32"}``, ``{"device": "cpu"}``, ``{"layout": "strided"}``,
  ``{"memory_format": "contiguous_format"}``   torch enums
- lists, ints, floats, bools, strings and None as themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache, cached_property
from pathlib import Path
from typing import Any, TypeVar

from schedlab.errors import SchedlabError

T = TypeVar("T")

GRAPH_SCHEMA_VERSION = 1


class OpKind(StrEnum):
    """What part of the training step an op belongs to."""

    F = "F"  # forward
    B = "B"  # input gradient: backward work that earlier layers wait on
    W = "W"  # weight gradient: backward work that only one layer's parameter grads need
    OPT = "OPT"  # optimizer update
    COMM = "COMM"  # communication between devices


class InputRole(StrEnum):
    PARAM = "param"
    BUFFER = "buffer"
    OPT_STATE = "opt_state"
    USER = "user"
    CONST = "const"


class OutputRole(StrEnum):
    LOSS = "loss"
    GRAD = "grad"  # gradient of the parameter named by `name`
    PARAM = "param"  # updated parameter
    BUFFER = "buffer"  # updated buffer (e.g. batch-norm running stats)
    OPT_STATE = "opt_state"  # updated optimizer state


# Classes whose cost is mostly arithmetic (matmuls, convolutions, fused RNN layers,
# attention): they read a transposed operand at no extra cost (BLAS takes it as a flag), so
# capture marks only other ops `strided`; the cost model's fallback is fitted on the others.
COMPUTE_CLASSES = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "convolution_backward",
        "_convolution",
        "mkldnn_rnn_layer",
        "mkldnn_rnn_layer_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


@cache  # a step has a few dozen targets; cost models ask each op's class again in every cold simulation
def op_class_of(target: str) -> str:
    """"aten.addmm.default" -> "addmm"; a TensorFlow kernel ("tf.MatMul") -> the aten class it
    computes ("mm", `schedlab.tf.opcost`); other namespaces: the whole target."""
    parts = target.split(".")
    if len(parts) >= 3 and parts[0] == "aten":
        return parts[1]
    if parts[0] == "tf" and len(parts) == 2:
        from schedlab.tf.opcost import tf_op_class

        return tf_op_class(parts[1])
    return target


# Where a convolution call (aten.convolution, aten.convolution_backward) has its weight, its
# stride list and its group count, in aten's argument order
CONV_ARG = {
    "weight": {"convolution": 1, "convolution_backward": 2},
    "stride": {"convolution": 3, "convolution_backward": 4},
    "groups": {"convolution": 8, "convolution_backward": 9},
}


def conv_arg(op_class: str, args: Any, name: str) -> Any:
    """Argument `name` (a key of `CONV_ARG`) of a convolution call of `op_class` on `args`;
    None for another class or a call without it."""
    at = CONV_ARG[name].get(op_class)
    return None if at is None or len(args) <= at else args[at]


def conv_groups(op_class: str, args: Any) -> int:
    """The group count of a convolution call of `op_class` on `args` (as called, or in the
    Graph's encoding); 1 for another class, a call without it, or an argument that is no
    count (a flag)."""
    groups = conv_arg(op_class, args, "groups")
    return groups if isinstance(groups, int) and not isinstance(groups, bool) and groups > 1 else 1


def _channel_pair(d: Any) -> tuple[int, int]:
    """`Op.group_channels` from its JSON: two counts of channels, each 0 or more."""
    if not isinstance(d, (list, tuple)) or len(d) != 2 or not all(isinstance(n, int) and n >= 0 for n in d):
        raise ValueError(f"group_channels must be two channel counts (0 or more), not {d!r}")
    return int(d[0]), int(d[1])


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and size of one tensor value."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    alias_of: int | None = None  # value id whose storage this view shares

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes}
        if self.alias_of is not None:
            d["alias_of"] = self.alias_of
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> TensorMeta:
        return TensorMeta(
            shape=tuple(int(s) for s in d["shape"]),
            dtype=str(d["dtype"]),
            nbytes=int(d["nbytes"]),
            alias_of=d.get("alias_of"),
        )


@dataclass(frozen=True)
class GraphInput:
    value: int
    name: str
    role: InputRole


@dataclass(frozen=True)
class GraphOutput:
    value: int
    name: str
    role: OutputRole


@dataclass(frozen=True)
class Op:
    """One aten op of the step."""

    id: int
    name: str
    target: str  # e.g. "aten.addmm.default"
    kind: OpKind
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: tuple[int, ...]  # value ids read, in first-use order, no repeats
    outputs: tuple[int, ...]  # value ids written
    flops: float
    bytes_moved: int  # bytes read + written (0 for views)
    layer: str | None = None  # module path the op came from, where recoverable
    is_view: bool = False
    # A memory-bound op that reads a permuted view (a transpose, attention's head permute)
    # out of order (`schedlab.capture.reads_strided`); it costs more (`Profile.class_key`).
    strided: bool = False
    # A softmax (or its backward) over its innermost dimension: that dimension's length, the
    # row it normalises (`schedlab.capture.softmax_row_len`); 0 for every other op. ATen's
    # kernel is about ten times slower per element on a row shorter than the vector
    # (`calibrate.signature.fit_class`).
    row_len: int = 0
    # A grouped convolution (or its backward): its (input, output) channels per group, from
    # its weight (`schedlab.capture.conv_group_channels`); (0, 0) for every other op. oneDNN
    # runs groups of channels that are not multiples of its vector block on a slower path
    # (`calibrate.signature.fit_class`).
    group_channels: tuple[int, int] = (0, 0)

    @property
    def op_class(self) -> str:
        """The aten op name without overload, e.g. "addmm": what cost models key on."""
        return op_class_of(self.target)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "target": self.target,
            "kind": self.kind.value,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "layer": self.layer,
            "is_view": self.is_view,
            **({"strided": True} if self.strided else {}),
            **({"row_len": self.row_len} if self.row_len else {}),
            **({"group_channels": list(self.group_channels)} if any(self.group_channels) else {}),
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Op:
        return Op(
            id=int(d["id"]),
            name=str(d["name"]),
            target=str(d["target"]),
            kind=OpKind(d["kind"]),
            args=tuple(d["args"]),
            kwargs=dict(d["kwargs"]),
            inputs=tuple(int(v) for v in d["inputs"]),
            outputs=tuple(int(v) for v in d["outputs"]),
            flops=float(d["flops"]),
            bytes_moved=int(d["bytes_moved"]),
            layer=d.get("layer"),
            is_view=bool(d.get("is_view", False)),
            strided=bool(d.get("strided", False)),
            row_len=int(d.get("row_len", 0)),
            group_channels=_channel_pair(d.get("group_channels", (0, 0))),
        )


@dataclass(frozen=True)
class Graph:
    """A training step as a DAG of ops over values. Ops are stored in program order."""

    name: str
    inputs: tuple[GraphInput, ...]
    outputs: tuple[GraphOutput, ...]
    ops: tuple[Op, ...]
    values: tuple[TensorMeta | None, ...]  # indexed by value id
    meta: dict[str, Any] = field(default_factory=dict)  # size, optimizer, versions, ...

    # ---- derived structure (computed once, cached) -------------------------------------

    @cached_property
    def producer(self) -> dict[int, int]:
        """value id -> id of the op that writes it (graph inputs have none)."""
        return {v: op.id for op in self.ops for v in op.outputs}

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """op id -> ids of the ops it depends on (sorted, no repeats)."""
        prod = self.producer
        return tuple(
            tuple(sorted({prod[v] for v in op.inputs if v in prod})) for op in self.ops
        )

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.ops]
        for op in self.ops:
            for p in self.preds[op.id]:
                out[p].append(op.id)
        return tuple(tuple(s) for s in out)

    @cached_property
    def hash(self) -> str:
        """Content hash of the graph (structure, shapes, args), 16 hex digits."""
        body = json.dumps(self._json_body(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    @cached_property
    def schedule_hash(self) -> str:
        """Hash of what a step's schedule reads of the graph, 16 hex digits: each op's
        target, kind, layer, arguments other than values, FLOPs, bytes moved, whether it is a
        view, the shapes it writes and the ops it waits for (`preds`), not which output of
        a producer each input names. Two captures of one model can differ only there:
        aot_autograd gives an LSTM's bias gradient from either of mkldnn_rnn_layer_backward's
        two equal bias outputs, depending on what the process traced before (torch 2.13,
        2026-12-02), so their `hash` differs and their schedule does not."""
        def shapes(op: Op) -> list[list[int] | None]:
            metas = [self.values[v] for v in op.outputs]
            return [None if m is None else list(m.shape) for m in metas]
        body = [[op.target, op.kind.value, op.layer, _without_values(op.args), _without_values(op.kwargs), op.flops,
                 op.bytes_moved, op.is_view, shapes(op), list(self.preds[op.id])] for op in self.ops]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def kinds(self) -> dict[OpKind, int]:
        counts: dict[OpKind, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts

    def output(self, role: OutputRole, name: str | None = None) -> GraphOutput:
        for o in self.outputs:
            if o.role is role and (name is None or o.name == name):
                return o
        raise KeyError(f"graph has no {role.value} output {name or ''}".strip())

    def validate(self) -> None:
        """Check internal consistency; raise SchedlabError naming the first problem."""
        n_values = len(self.values)
        written: set[int] = {i.value for i in self.inputs}
        for idx, op in enumerate(self.ops):
            if op.id != idx:
                raise SchedlabError(f"graph op at position {idx} has id {op.id}; ids must be 0..n-1 in order")
            for v in op.outputs:
                if v < 0 or v >= n_values:
                    raise SchedlabError(f"graph op {op.id} ({op.name}) writes unknown value {v}")
                if v in written:
                    raise SchedlabError(f"graph op {op.id} ({op.name}) writes value {v}, which is already written")
                written.add(v)
        for op in self.ops:
            for v in op.inputs:
                if v < 0 or v >= n_values:
                    raise SchedlabError(f"graph op {op.id} ({op.name}) reads unknown value {v}")
                if v not in written:
                    raise SchedlabError(f"graph op {op.id} ({op.name}) reads value {v}, which nothing writes")
        # Captured ops come in program order; an expanded graph appends its COMM ops, so
        # what must hold is that the dependencies form a DAG.
        indeg = [len(p) for p in self.preds]
        ready = [i for i, d in enumerate(indeg) if d == 0]
        seen = 0
        while ready:
            i = ready.pop()
            seen += 1
            for s in self.succs[i]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if seen != len(self.ops):
            stuck = next(i for i, d in enumerate(indeg) if d > 0)
            raise SchedlabError(f"graph has a dependency cycle through op {stuck} ({self.ops[stuck].name})")
        for o in self.outputs:
            if o.value not in written:
                raise SchedlabError(f"graph output {o.name} refers to value {o.value}, never written")

    # ---- serialisation -------------------------------------------------------------------

    def _json_body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": [{"value": i.value, "name": i.name, "role": i.role.value} for i in self.inputs],
            "outputs": [{"value": o.value, "name": o.name, "role": o.role.value} for o in self.outputs],
            "ops": [op.to_json() for op in self.ops],
            "values": [None if m is None else m.to_json() for m in self.values],
        }

    def to_json(self) -> dict[str, Any]:
        return {"schema": "schedlab.graph", "version": GRAPH_SCHEMA_VERSION, **self._json_body(), "meta": self.meta}

    @staticmethod
    def from_json(d: Any) -> Graph:
        if not isinstance(d, dict) or d.get("schema") != "schedlab.graph":
            raise SchedlabError("not a schedlab graph file (missing \"schema\": \"schedlab.graph\")")
        if d.get("version") != GRAPH_SCHEMA_VERSION:
            raise SchedlabError(
                f"graph schema version {d.get('version')} is not supported (this schedlab reads {GRAPH_SCHEMA_VERSION})"
            )
        try:
            g = Graph(
                name=str(d["name"]),
                inputs=tuple(GraphInput(int(i["value"]), str(i["name"]), InputRole(i["role"])) for i in d["inputs"]),
                outputs=tuple(
                    GraphOutput(int(o["value"]), str(o["name"]), OutputRole(o["role"])) for o in d["outputs"]
                ),
                ops=tuple(Op.from_json(o) for o in d["ops"]),
                values=tuple(None if m is None else TensorMeta.from_json(m) for m in d["values"]),
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise SchedlabError(f"corrupt graph: {detail}") from None
        g.validate()
        return g

    def save(self, path: str | Path) -> Path:
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> Graph:
        from schedlab.io import read_json

        d = read_json(path, what="graph")
        try:
            return Graph.from_json(d)
        except SchedlabError as e:
            raise SchedlabError(f"graph file {path}: {e}") from None


def kept_on(graph: Graph, key: str, build: Callable[[Graph], T]) -> T:
    """`build(graph)`, computed on the first call and kept on the graph object under `key`
    (as `functools.cached_property` keeps its value): what the simulator and calibration
    derive from a graph alone (its flat arrays, content keys, signatures, first uses), so
    that every cold simulation of the same graph object finds it. A Graph is frozen; what
    is kept is not one of its fields, and a new Graph object (`dataclasses.replace`) starts
    without it."""
    kept = graph.__dict__.get(key)
    if kept is None:
        kept = graph.__dict__[key] = build(graph)
    return kept  # type: ignore[no-any-return]


def same_capture(graph: Graph, kept_hash: object, kept_schedule: object = None) -> bool:
    """Whether `graph`, captured now, is the graph kept elsewhere as `kept_hash` (its
    `Graph.hash`) and `kept_schedule` (its `schedule_hash`, where the keeper wrote one): the
    same hash, or the same schedule. Two captures of a model with an `nn.LSTM` differ in
    which of two equal outputs a gradient reads (`Graph.schedule_hash`); everything a
    plan, a trace or a simulation reads of them is the same."""
    return kept_hash == graph.hash or (kept_schedule is not None and kept_schedule == graph.schedule_hash)


def _without_values(a: Any) -> Any:
    """An op's args (or kwargs) with each value reference (``{"v": id}``) made the same."""
    if isinstance(a, dict):
        return "<value>" if a.keys() == {"v"} else {k: _without_values(x) for k, x in a.items()}
    if isinstance(a, (list, tuple)):
        return [_without_values(x) for x in a]
    return a


def storage_root(values: Sequence[TensorMeta | None], v: int) -> int:
    """The value whose storage value `v` uses: `v` itself unless its TensorMeta says it is
    a view (`alias_of`), followed to the end of the chain. Capture calls it while the value
    list grows; `alias_roots` is the same rule for a finished Graph."""
    return _follow_aliases(v, lambda u: _meta_parent(values, u), len(values))


def alias_roots(graph: Graph) -> list[int]:
    """value id -> the value whose storage it uses (itself unless it is a view).

    A value is a view when its TensorMeta says `alias_of`, or when an op marked `is_view`
    writes it without saying of what: it then aliases the op's first input.
    """
    values = graph.values
    parent = [_meta_parent(values, v) for v in range(len(values))]
    for op in graph.ops:
        if op.is_view and op.inputs:
            for v in op.outputs:
                meta = values[v]
                if meta is None or meta.alias_of is None:
                    parent[v] = op.inputs[0]
    return [_follow_aliases(v, parent.__getitem__, len(values)) for v in range(len(values))]


def _meta_parent(values: Sequence[TensorMeta | None], v: int) -> int:
    meta = values[v]
    if meta is not None and meta.alias_of is not None and 0 <= meta.alias_of < len(values):
        return meta.alias_of
    return v


def _follow_aliases(v: int, parent: Callable[[int], int], n_values: int) -> int:
    r, hops = v, 0
    while (p := parent(r)) != r:
        r = p
        hops += 1
        if hops > n_values:
            raise SchedlabError(f"graph value {v}: alias_of chain has a cycle")
    return r


def topo_order_ok(graph: Graph, order: Iterable[int]) -> tuple[bool, str]:
    """Whether `order` lists every op once with each op after all its predecessors."""
    seen: set[int] = set()
    order = list(order)
    if sorted(order) != list(range(len(graph.ops))):
        missing = set(range(len(graph.ops))) - set(order)
        extra = [o for o in order if not 0 <= o < len(graph.ops)]
        dup = len(order) - len(set(order))
        what = []
        if missing:
            what.append(f"{len(missing)} op(s) missing (e.g. {sorted(missing)[:3]})")
        if extra:
            what.append(f"unknown op id(s) {extra[:3]}")
        if dup:
            what.append(f"{dup} repeated id(s)")
        return False, "order must list every op id exactly once: " + "; ".join(what)
    for o in order:
        for p in graph.preds[o]:
            if p not in seen:
                return False, (
                    f"order breaks dependencies: op {o} ({graph.ops[o].name}) comes before "
                    f"its input op {p} ({graph.ops[p].name})"
                )
        seen.add(o)
    return True, ""
