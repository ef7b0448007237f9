"""Data parallelism as graph expansion: R replicas of the per-replica step, and gradient
all-reduce ops in buckets, the way DistributedDataParallel runs it.

The step is captured at the per-replica batch (`split_workload` slices every user input
along dim 0; `replica_graph` marks the captured graph). `replicate` then builds one graph
of R copies:

- replica r's ops are ops ``r*n .. r*n+n-1`` (replica 0 keeps the captured ids), its values
  are offset by ``r * len(values)``, and its inputs and outputs are named ``NAME@rR`` (plain
  names for replica 0), so each rank feeds its own next step;
- gradients are grouped into buckets in the order the plan's op order makes them ready
  (DDP rebuilds its buckets in ready order after the first iteration; its first guess,
  reverse parameter order, breaks ties): the first bucket holds at most 1 MiB
  (`FIRST_BUCKET_BYTES`, DDP's first-bucket cap), the others at most `bucket_mb`;
- per bucket and replica one ``schedlab.all_reduce`` op (kind COMM) reads that replica's
  gradients of the bucket and writes their average over the replicas (kwargs ``bucket``
  in issue order, ``group`` = one device per replica, ``reduce`` = "avg"); the optimizer
  reads the averaged gradients, so every replica applies the same update.

The numerics guard compares the whole distributed step with eager PyTorch on the full
batch (`full_batch_outputs`): the loss is the mean of the replicas' losses (equal halves
of a mean loss), the gradients and updated parameters are replica 0's. Batch statistics
(batch norm in training) over a split batch differ from the full batch's, so a plan with
replicas is refused on such a graph unless it sets ``split_batch_stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from schedlab.capture import Captured
from schedlab.distribute import ALL_REDUCE, Expanded, expand, rewire
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, GraphInput, GraphOutput, Op, OpKind, OutputRole, TensorMeta
from schedlab.workloads.loader import Workload

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
BATCH_NORM_CLASSES = ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional")


def split_workload(workload: Workload, replicas: int) -> list[Workload]:
    """The R per-replica workloads: every user input sliced into R equal parts along dim 0."""
    return split_batch(
        workload,
        replicas,
        too_few=f"replicas must be >= 1, got {replicas}",
        indivisible=f"replicas={replicas} must divide the batch: input {{k}} of {{name}} has {{size}}; "
        "use a replica count that divides it, or a larger --size",
    )


def split_batch(workload: Workload, parts: int, *, too_few: str, indivisible: str) -> list[Workload]:
    """`workload` as `parts` workloads, every user input sliced into equal parts along dim 0
    (replicas; micro-batches). `indivisible` is the error's text, formatted with the input's
    index `k`, the workload's `name` and the input's `size`."""
    if parts < 1:
        raise SchedlabError(too_few)
    pieces: list[list[torch.Tensor]] = [[] for _ in range(parts)]
    for k, t in enumerate(workload.inputs):
        if t.dim() == 0 or t.shape[0] % parts:
            size = "a scalar" if t.dim() == 0 else f"batch {t.shape[0]}"
            raise SchedlabError(indivisible.format(k=k, name=workload.name, size=size))
        for r, piece in enumerate(torch.chunk(t, parts, dim=0)):
            pieces[r].append(piece.clone())
    return [
        Workload(name=workload.name, size=workload.size, module=workload.module, inputs=tuple(p)) for p in pieces
    ]


def replica_graph(graph: Graph, replicas: int) -> Graph:
    """`graph` (captured at the per-replica batch) marked as the step of one of `replicas`."""
    return replace(graph, meta={**graph.meta, "replicas": replicas})


def uses_batch_stats(graph: Graph) -> bool:
    return any(op.op_class in BATCH_NORM_CLASSES for op in graph.ops)


def buckets(
    graph: Graph, bucket_bytes: int, ready_rank: Callable[[int], int] | None = None,
    bucket_key: Callable[[int], int] | None = None,
) -> list[list[GraphOutput]]:
    """GRAD outputs grouped into all-reduce buckets in the order they become ready.

    `ready_rank(op_id)` is where the plan's op order runs each op: gradients are taken in
    the order their producers run, as DDP rebuilds its buckets after the first iteration
    from the order it saw them ready. Without it, reverse parameter order (DDP's first
    guess). `bucket_key(op_id)` keeps gradients whose producers have different keys in
    different buckets, each key bucketed on its own as one DDP instance per pipeline
    stage does; the keys come in the order of their first ready gradient."""
    grads = list(reversed([o for o in graph.outputs if o.role is OutputRole.GRAD]))
    if ready_rank is not None:
        order = {o.value: k for k, o in enumerate(grads)}
        grads.sort(key=lambda o: (ready_rank(graph.producer[o.value]) if o.value in graph.producer else -1, order[o.value]))
    if bucket_key is None:
        return _bucketed(graph, grads, bucket_bytes)
    keyed: dict[int, list[GraphOutput]] = {}  # in order of each key's first gradient
    for o in grads:
        keyed.setdefault(bucket_key(graph.producer[o.value]) if o.value in graph.producer else -1, []).append(o)
    return [b for part in keyed.values() for b in _bucketed(graph, part, bucket_bytes)]


def _bucketed(graph: Graph, grads: Sequence[GraphOutput], bucket_bytes: int) -> list[list[GraphOutput]]:
    """`grads`, in order, cut into buckets: the first of at most 1 MiB, the others of at most `bucket_bytes`."""
    out: list[list[GraphOutput]] = []
    cur: list[GraphOutput] = []
    cur_bytes = 0
    cap = min(FIRST_BUCKET_BYTES, bucket_bytes)
    for o in grads:
        meta = graph.values[o.value]
        nbytes = 0 if meta is None else meta.nbytes
        if cur and cur_bytes + nbytes > cap:
            out.append(cur)
            cur, cur_bytes, cap = [], 0, bucket_bytes
        cur.append(o)
        cur_bytes += nbytes
    if cur:
        out.append(cur)
    return out


def replica_name(name: str, r: int) -> str:
    return name if r == 0 else f"{name}@r{r}"


def replicate(
    graph: Graph, op_device: Sequence[Sequence[str]], bucket_bytes: int, ready_rank: Callable[[int], int] | None = None
) -> Expanded:
    """R copies of `graph` (replica r's ops on `op_device[r]`), joined by gradient all-reduces;
    values crossing devices inside a replica then get send/recv ops (`distribute.expand`)."""
    joined, device = replica_copies(graph, op_device, bucket_bytes, ready_rank)
    n, R = len(graph.ops), len(op_device)
    ex = expand(joined, device, expanded_from=graph.hash)
    out = replace(ex.graph, meta={**ex.graph.meta, "base_ops": n, "replicas": R})
    return Expanded(graph=out, device=ex.device, base_ops=n)


def replica_copies(
    graph: Graph, op_device: Sequence[Sequence[str]], bucket_bytes: int, ready_rank: Callable[[int], int] | None = None,
    bucket_key: Callable[[int], int] | None = None,
) -> tuple[Graph, list[str]]:
    """`replicate`'s graph before its send/recv ops, and the device of each op. Replica r's
    copy of op i is op ``r * len(graph.ops) + i``; the all-reduces follow, bucket by bucket,
    one per replica (`buckets` with `ready_rank` and `bucket_key`)."""
    R = len(op_device)
    n, V = len(graph.ops), len(graph.values)
    ops: list[Op] = []
    device: list[str] = []
    values: list[TensorMeta | None] = []
    inputs: list[GraphInput] = []
    outputs: list[GraphOutput] = []
    for r in range(R):
        off = r * V
        values.extend(graph.values)
        inputs.extend(GraphInput(i.value + off, replica_name(i.name, r), i.role) for i in graph.inputs)
        for op in graph.ops:
            ops.append(_shifted(op, r * n, off, r))
            device.append(op_device[r][op.id])
    averaged: dict[int, int] = {}  # replica grad value -> its averaged value
    for b, bucket in enumerate(buckets(graph, bucket_bytes, ready_rank, bucket_key)):
        group = [op_device[r][graph.producer[bucket[0].value]] for r in range(R)]
        for r in range(R):
            ins = tuple(o.value + r * V for o in bucket)
            outs = []
            for o in bucket:
                values.append(graph.values[o.value])
                outs.append(len(values) - 1)
                averaged[o.value + r * V] = outs[-1]
            nbytes = sum(m.nbytes for m in (graph.values[o.value] for o in bucket) if m is not None)
            ops.append(Op(
                id=len(ops), name=f"all_reduce bucket{b}@r{r}", target=ALL_REDUCE, kind=OpKind.COMM,
                args=tuple({"v": v} for v in ins), kwargs={"bucket": b, "group": group, "reduce": "avg"},
                inputs=ins, outputs=tuple(outs), flops=0.0, bytes_moved=nbytes, layer=None,
            ))
            device.append(group[r])
    # The optimizer and the GRAD outputs read the averaged gradients; backward work that
    # reads a gradient (a fused LSTM's second bias gradient, `schedlab.recurrent`) reads
    # its replica's own, which its bucket averages in turn.
    for k, op in enumerate(ops):
        if op.kind is OpKind.OPT and any(v in averaged for v in op.inputs):
            ops[k] = rewire(op, averaged)
    for r in range(R):
        off = r * V
        for o in graph.outputs:
            v = o.value + off
            outputs.append(GraphOutput(averaged.get(v, v), replica_name(o.name, r), o.role))
    joined = Graph(
        name=graph.name, inputs=tuple(inputs), outputs=tuple(outputs), ops=tuple(ops), values=tuple(values),
        meta={**graph.meta, "expanded_from": graph.hash, "base_ops": n, "replicas": R},
    )
    return joined, device


def _shifted(op: Op, id_off: int, value_off: int, r: int) -> Op:
    if id_off == 0 and value_off == 0:
        return op
    remap = {v: v + value_off for v in op.inputs}
    moved = rewire(op, remap)
    return Op(
        id=op.id + id_off, name=op.name if r == 0 else f"{op.name}@r{r}", target=op.target, kind=op.kind,
        args=moved.args, kwargs=moved.kwargs, inputs=moved.inputs, outputs=tuple(v + value_off for v in op.outputs),
        flops=op.flops, bytes_moved=op.bytes_moved, layer=op.layer, is_view=op.is_view,
    )


REPLICA_SUFFIX = "@r"  # replica r >= 1's copy of an input NAME is NAME@rR


def replica_of(name: str) -> tuple[str, int]:
    """An input name of a replicated graph as (the name in one replica's graph, its replica)."""
    head, sep, tail = name.rpartition(REPLICA_SUFFIX)
    return (head, int(tail)) if sep and tail.isdigit() else (name, 0)


def replica_inputs(
    joined: Graph, per_replica: Sequence[dict[int, torch.Tensor]], base: Graph
) -> dict[int, torch.Tensor]:
    """Input tensors of the replicated graph `joined`, from each replica's captured inputs
    (matched by name: replica r's copy of input NAME is NAME@rR)."""
    by_name = {i.name: i.value for i in base.inputs}
    out: dict[int, torch.Tensor] = {}
    missing = []
    for i in joined.inputs:
        name, r = replica_of(i.name)
        if name in by_name and r < len(per_replica):
            out[i.value] = per_replica[r][by_name[name]]
        else:
            missing.append(i.name)
    if missing:
        raise SchedlabError(f"replicated graph inputs without values: {missing[:3]}")
    return out


def full_batch_outputs(joined: Graph, full: Graph, outputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """A replicated step's outputs as the full-batch graph's: the mean of the replicas'
    losses, replica 0's gradients, parameters, buffers and optimizer state."""
    by_name = {(o.role, o.name): o.value for o in joined.outputs}
    R = int(joined.meta.get("replicas", 1))
    out: dict[int, torch.Tensor] = {}
    for o in full.outputs:
        if o.role is OutputRole.LOSS:
            losses = [outputs[by_name[(o.role, replica_name(o.name, r))]] for r in range(R)]
            out[o.value] = torch.stack(losses).mean()
        else:
            out[o.value] = outputs[by_name[(o.role, o.name)]]
    return out


@dataclass(frozen=True)
class PlanStep:
    """What a command captures to run a plan: the full-batch step (what eager PyTorch and
    the numerics guard see) and, with replicas, the per-replica steps.

    `graph` is what `resolve()` takes: the full step, or replica 0's step marked for R
    replicas. `inputs_for(run_graph)` gives the input tensors of the graph a backend runs,
    `as_full(run_graph, outputs)` its outputs as the full step's, for the guard.
    """

    workload: Workload
    full: Captured
    parts: tuple[Captured, ...] = ()  # per replica; empty without replicas

    @property
    def graph(self) -> Graph:
        return replica_graph(self.parts[0].graph, len(self.parts)) if self.parts else self.full.graph

    def inputs_for(self, run_graph: Graph) -> dict[int, torch.Tensor]:
        if not self.parts:
            return self.full.input_values
        return replica_inputs(run_graph, [p.input_values for p in self.parts], self.parts[0].graph)

    def as_full(self, run_graph: Graph, outputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        return full_batch_outputs(run_graph, self.full.graph, outputs) if self.parts else outputs


def plan_step(workload: Workload, replicas: int, capture_fn: Callable[[Workload], Captured]) -> PlanStep:
    """Capture `workload` for a plan with `replicas` (through `capture_fn`, e.g. the graph cache)."""
    full = capture_fn(workload)
    if replicas == 1:
        return PlanStep(workload, full)
    return PlanStep(workload, full, tuple(capture_fn(p) for p in split_workload(workload, replicas)))
