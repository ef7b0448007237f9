"""A schedlab Plan's op order as TensorFlow control dependencies.

TensorFlow's executor runs ready nodes in its own order; the one way to make it run them
in another is a control dependency. With one inter-op thread nodes run one at a time, so
a chain of control edges along the plan's sequence runs exactly that sequence. With more
inter-op threads the same chain would run everything one at a time, so an order is
refused there (`schedlab.tf.plan_map`).

As with placement (`schedlab.tf.placement`), the order is resolved on the graph TF
executes (with `schedlab.plan.resolve`, as the torch backend resolves it) and set on a
fresh step graph by node name. Nodes Grappler made or renamed are not in that graph and
keep TF's order; `order_honoured` says how much of the sequence ran as planned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from schedlab.graph import Graph
from schedlab.plan import Plan, resolve
from schedlab.tf.placement import plan_devices, tf_cpu_machine


def order_sequence(graph: Graph, plan: Plan) -> list[str]:
    """The node names of the executed `graph` in the order `plan` runs them (one worker)."""
    machine = tf_cpu_machine(plan_devices(plan), cores=1)
    one_at_a_time = Plan(order=plan.order, slots=1, threads=1, device=plan.device, layer_devices=plan.layer_devices,
                         op_devices=plan.op_devices)
    resolved = resolve(graph, one_at_a_time, machine)
    ran = resolved.run_graph(graph)  # placed: with schedlab's transfers, which TF makes its own way
    return [ran.ops[i].name for i in resolved.sequence]


def apply_order(tf_graph: Any, sequence: Sequence[str]) -> int:
    """Chain the nodes of `tf_graph` named in `sequence` with control edges; returns how many
    nodes the chain holds.

    The sequence is a topological order of the graph Grappler made, not of `tf_graph`:
    Grappler folds and rewrites, so a node may precede in it one it depends on here, and
    chaining the sequence as it stands can close a cycle. So the chain follows a list
    schedule of `tf_graph` itself that takes ready nodes by their place in `sequence`
    (nodes it does not name first): a topological order of `tf_graph`, which the chain's
    edges cannot break, and the sequence wherever the two graphs agree."""
    import heapq

    ops = list(tf_graph.get_operations())
    rank = {name: i for i, name in enumerate(sequence)}
    index = {op.name: i for i, op in enumerate(ops)}
    preds = [{index[t.op.name] for t in op.inputs} | {index[c.name] for c in op.control_inputs} for op in ops]
    succs: list[list[int]] = [[] for _ in ops]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    waiting = [len(ps) for ps in preds]
    ready = [(rank.get(op.name, -1), i) for i, op in enumerate(ops) if waiting[i] == 0]
    heapq.heapify(ready)
    chain = []
    while ready:
        r, i = heapq.heappop(ready)
        if r >= 0:
            chain.append(ops[i])
        for j in succs[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (rank.get(ops[j].name, -1), j))
    for before, after in pairwise(chain):
        if before not in after.control_inputs:
            after._add_control_input(before)
    return len(chain)


def reversed_pairs(sequence: Sequence[str], ran: Sequence[str] | Mapping[str, int]) -> list[tuple[str, str]]:
    """The consecutive pairs of the planned `sequence` (nodes that also `ran`) whose second
    node started first.

    `ran` is the nodes in the order they started, or each node's start time (ns). Two nodes
    with one start time are not counted: a tie does not contradict the plan."""
    at, planned = _planned(sequence, ran)
    return [(a, b) for a, b in pairwise(planned) if at[a] > at[b]]


def order_honoured(sequence: Sequence[str], ran: Sequence[str] | Mapping[str, int]) -> float:
    """The share of consecutive pairs of the planned `sequence` (nodes that also `ran`) that
    ran in that order (`ran` as for `reversed_pairs`)."""
    n_pairs = len(_planned(sequence, ran)[1]) - 1
    return 1.0 if n_pairs <= 0 else 1.0 - len(reversed_pairs(sequence, ran)) / n_pairs


def _planned(sequence: Sequence[str], ran: Sequence[str] | Mapping[str, int]) -> tuple[Mapping[str, int], list[str]]:
    """Each node of `ran`'s start (its place, or its time), and the nodes of `sequence` that ran."""
    at: Mapping[str, int] = ran if isinstance(ran, Mapping) else {name: i for i, name in enumerate(ran)}
    return at, [name for name in sequence if name in at]
