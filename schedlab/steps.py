"""Steady state: S training steps back to back as one graph, so that steps may overlap.

Out-of-order backprop's data-parallel policy (`reverse-first-k:K`, `schedlab.order`)
gains only across a step boundary: layer 0's gradient is reduced and applied first, and
the next step's forward starts on it while later layers' gradients are still being
computed and reduced. Neither backend can show that one step at a time, so both run the
same *unrolled* graph (DESIGN.md, invariant 1):

- step s's copy of op i is op ``s*m + i`` (m: ops of the one-step graph, COMM ops
  included), with values offset by ``s * len(values)``; step 0 keeps the ids;
- step s > 0 reads, for each parameter, buffer and optimizer-state input, the value step
  s-1 wrote for it (matched by role and name): the next forward waits only for the
  updates of the parameters it uses, as the values say, and for nothing else;
- user inputs and constants are step 0's (every step trains on the same batch);
- the graph's outputs are the last step's, under their own names, so a caller feeding a
  next run (`exec.runner.next_inputs`) or checking numerics sees one step's outputs;
- COMM ops stay unique: a send/recv pair's ``tag`` and an all-reduce's ``bucket`` are
  offset per step, so every rank still issues its collectives in one global order.

A backend's step time over the sequence is its makespan divided by S.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from schedlab.collectives import p2p_s, ring_allreduce_s
from schedlab.distribute import ALL_REDUCE, RECV, SEND, rewire
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.machine import Link, Machine

MAX_STEPS = 64
CARRIED_ROLES = {InputRole.PARAM: OutputRole.PARAM, InputRole.BUFFER: OutputRole.BUFFER, InputRole.OPT_STATE: OutputRole.OPT_STATE}


def step_of(graph: Graph, op_id: int) -> int:
    """Which step of an unrolled graph op `op_id` belongs to (0 for a one-step graph)."""
    m = int(graph.meta.get("step_ops", len(graph.ops)) or 1)
    return op_id // m


def copied_op(graph: Graph, op_id: int, base_ops: int) -> int:
    """The op of the captured graph (`base_ops` ops) that op `op_id` of `graph` copies,
    when `graph` expands it: step s's op ``s*m + i`` of an unrolled graph copies one-step
    op i, and replica r's op ``r*n + j`` copies op j. (A COMM op maps to some op id too:
    callers tell COMM ops apart by their kind.)"""
    m = int(graph.meta.get("step_ops", 0)) or len(graph.ops)
    return (op_id % m) % base_ops


def unroll(graph: Graph, steps: int) -> Graph:
    """`graph` (one step, possibly expanded across devices) as `steps` steps back to back."""
    if not 1 <= steps <= MAX_STEPS:
        raise SchedlabError(f"steps must be between 1 and {MAX_STEPS}, got {steps}")
    if steps == 1:
        return graph
    if "step_ops" in graph.meta:
        raise SchedlabError(f"graph {graph.name!r} is already unrolled")
    m, V = len(graph.ops), len(graph.values)
    written: dict[OutputRole, dict[str, int]] = {}
    for o in graph.outputs:
        written.setdefault(o.role, {})[o.name] = o.value
    carried: dict[int, int] = {}  # an input value -> the output value of the same role and name
    for i in graph.inputs:
        role = CARRIED_ROLES.get(i.role)
        if role is not None and i.name in written.get(role, {}):
            carried[i.value] = written[role][i.name]
    tag_step = 1 + max((int(op.kwargs["tag"]) for op in graph.ops if op.target in (SEND, RECV)), default=-1)
    bucket_step = 1 + max((int(op.kwargs["bucket"]) for op in graph.ops if op.target == ALL_REDUCE), default=-1)
    input_ids = [i.value for i in graph.inputs]
    at: dict[int, int] = {v: v for v in input_ids}  # this step's value of each graph input
    ops: list[Op] = list(graph.ops)
    values: list[TensorMeta | None] = list(graph.values)

    def where(v: int, step_at: dict[int, int], off: int) -> int:
        """Value `v` of the one-step graph as the step at value offset `off` holds it."""
        return step_at[v] if v in step_at else v + off

    for s in range(1, steps):
        off = s * V
        prev = at
        at = {v: where(carried[v], prev, off - V) if v in carried else v for v in input_ids}
        values.extend(
            meta if meta is None or meta.alias_of is None else replace(meta, alias_of=where(meta.alias_of, at, off))
            for meta in graph.values
        )
        for op in graph.ops:
            new = rewire(op, {v: where(v, at, off) for v in op.inputs})
            kwargs = dict(new.kwargs)
            if op.target in (SEND, RECV):
                kwargs["tag"] = int(op.kwargs["tag"]) + s * tag_step
            elif op.target == ALL_REDUCE:
                kwargs["bucket"] = int(op.kwargs["bucket"]) + s * bucket_step
            ops.append(replace(
                new, id=op.id + s * m, name=f"{op.name}#s{s}", kwargs=kwargs,
                outputs=tuple(v + off for v in op.outputs),
            ))
    outputs = tuple(replace(o, value=where(o.value, at, (steps - 1) * V)) for o in graph.outputs)
    out = Graph(
        name=graph.name, inputs=graph.inputs, outputs=outputs,
        ops=tuple(ops), values=tuple(values),
        meta={**graph.meta, "unrolled_from": graph.hash, "steps": steps, "step_ops": m},
    )
    out.validate()
    return out



def as_step_outputs(step: Graph, run: Graph, outputs: dict[int, Any]) -> dict[int, Any]:
    """`outputs` of graph `run` (keyed by its value ids) keyed by the value ids of `step`'s
    outputs of the same role and name: an unrolled graph's last step as one step's."""
    if run is step:
        return outputs
    by_key = {(o.role, o.name): o.value for o in run.outputs}
    return {o.value: outputs[by_key[(o.role, o.name)]] for o in step.outputs if by_key.get((o.role, o.name)) in outputs}


def timed_sequence(
    graph: Graph,
    priority: Sequence[int],
    device: Sequence[str],
    dur_us: Sequence[float],
    comm_us: Callable[[Op], float],
    after: dict[int, int] | None = None,
) -> tuple[int, ...]:
    """A list schedule that knows communication takes time: the order a one-slot rank of a
    steady-state run follows (`schedlab.plan.resolve(..., steps=S)`).

    `list_schedule` treats every op as ready the moment its inputs' ops are *ordered*; a
    one-slot rank that follows it waits on an all-reduce or a recv even when other work is
    ready, so the next step's forward never overlaps this step's communication, which is
    the whole point of out-of-order backprop. Here each device has a clock: a compute op
    occupies its device for `dur_us[op]`; a COMM op is issued without occupying it and its
    value arrives `comm_us(op)` later (an all-reduce once every member of its group has
    issued it). A device takes, among the ops whose inputs have arrived by its clock, the
    one of lowest priority, else waits for the earliest arrival. Ops come out in the order
    they start (ties: priority). `after[b] = a`: op b also waits for op a.
    """
    n = len(graph.ops)
    preds = [list(p) for p in graph.preds]
    for b, a in (after or {}).items():
        preds[b].append(a)
    succs: list[list[int]] = [[] for _ in range(n)]
    for o in range(n):
        for p in preds[o]:
            succs[p].append(o)
    waiting = [len(p) for p in preds]
    arrive = [0.0] * n  # when op o's inputs are all there
    done = [0.0] * n  # when op o's outputs are there
    devs = sorted(set(device))
    dev_index = {d: k for k, d in enumerate(devs)}
    clock = [0.0] * len(devs)
    pending: list[list[tuple[float, int, int]]] = [[] for _ in devs]  # (arrival, priority, op) not yet arrived
    ready: list[list[tuple[int, int]]] = [[] for _ in devs]  # (priority, op) arrived by the clock
    group_left: dict[tuple[str, int], int] = {}
    group_issue: dict[tuple[str, int], float] = {}
    group_ops: dict[tuple[str, int], list[int]] = {}
    for op in graph.ops:
        if op.target == ALL_REDUCE:
            key = (str(op.kwargs.get("group")), int(op.kwargs["bucket"]))
            group_left[key] = group_left.get(key, 0) + 1
            group_ops.setdefault(key, []).append(op.id)
    for o in range(n):
        if not waiting[o]:
            heapq.heappush(pending[dev_index[device[o]]], (0.0, priority[o], o))
    out: list[tuple[float, int, int]] = []

    def finish(o: int, t: float) -> None:
        done[o] = t
        for s in succs[o]:
            arrive[s] = max(arrive[s], t)
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(pending[dev_index[device[s]]], (arrive[s], priority[s], s))

    while len(out) < n:
        best: tuple[float, int, int] | None = None  # (start, priority, device index)
        for k in range(len(devs)):
            while pending[k] and pending[k][0][0] <= clock[k]:
                _, p, o = heapq.heappop(pending[k])
                heapq.heappush(ready[k], (p, o))
            if ready[k]:
                cand = (clock[k], ready[k][0][0], k)
            elif pending[k]:
                cand = (pending[k][0][0], pending[k][0][1], k)
            else:
                continue
            if best is None or cand < best:
                best = cand
        if best is None:
            raise SchedlabError("steady-state order: ops are left that can never run (a dependency cycle)")
        start, _, k = best
        if ready[k]:
            _, o = heapq.heappop(ready[k])
        else:
            _, _, o = heapq.heappop(pending[k])
        clock[k] = max(clock[k], start)
        out.append((clock[k], priority[o], o))
        op = graph.ops[o]
        if op.kind is not OpKind.COMM:
            clock[k] += dur_us[o]
            finish(o, clock[k])
        elif op.target == ALL_REDUCE:
            key = (str(op.kwargs.get("group")), int(op.kwargs["bucket"]))
            group_issue[key] = max(group_issue.get(key, 0.0), clock[k])
            group_left[key] -= 1
            if not group_left[key]:
                t = group_issue[key] + comm_us(op)
                for member in group_ops[key]:
                    finish(member, t)
        else:
            finish(o, clock[k] + comm_us(op))
    return tuple(o for _, _, o in out)


def comm_time_us(op: Op, machine: Machine, device: str) -> float:
    """A COMM op's time on `machine`'s links in µs, by the closed forms of
    `schedlab.collectives` (0 for a send, whose cost its recv carries)."""
    if op.target == ALL_REDUCE:
        group = [str(d) for d in op.kwargs.get("group", [])]
        peer = next((d for d in group if d != device), device)
        link = _link(machine, device, peer)
        return 0.0 if link is None else 1e6 * ring_allreduce_s(op.bytes_moved, len(group), link.latency_s, link.bw_bytes_per_s)
    if op.target == RECV:
        link = _link(machine, str(op.kwargs.get("src")), device)
        return 0.0 if link is None else 1e6 * p2p_s(op.bytes_moved, link.latency_s, link.bw_bytes_per_s)
    return 0.0


def _link(machine: Machine, a: str, b: str) -> Link | None:
    for link in machine.links:
        if {link.src, link.dst} == {a, b}:
            return link
    return None
