"""Run an expanded (multi-device) graph in one process, op by op, as a reference.

A send/recv pair is a copy and an all-reduce the mean of its group's inputs, taken when
the last member of its bucket runs. It checks what expansion means (which values cross,
which gradients are averaged), apart from how the multi-process executor moves them.
"""

from __future__ import annotations

from typing import Any

import torch

from schedlab.aten import decode_enum
from schedlab.distribute import ALL_REDUCE, RECV, SEND
from schedlab.exec.program import resolve_target
from schedlab.graph import Graph


def run_one_process(graph: Graph, inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    V: dict[int, Any] = {v: t.clone() for v, t in inputs.items()}

    def arg(a: Any) -> Any:
        if isinstance(a, dict) and "v" in a:
            return V[int(a["v"])]
        if isinstance(a, dict):
            return decode_enum(a)
        if isinstance(a, list):
            return [arg(x) for x in a]
        return a

    sent: dict[int, torch.Tensor] = {}
    for unit in _units_in_order(graph):
        op = graph.ops[unit[0]]
        if op.target == ALL_REDUCE:
            for k in range(len(op.inputs)):
                mean = torch.stack([V[graph.ops[m].inputs[k]] for m in unit]).mean(0)
                for m in unit:
                    V[graph.ops[m].outputs[k]] = mean.clone()
            continue
        if op.target == SEND:
            sent[op.kwargs["tag"]] = V[op.inputs[0]].clone()
            V[op.outputs[0]] = None
        elif op.target == RECV:
            V[op.outputs[0]] = sent[op.kwargs["tag"]]
        else:
            fn, unpack = resolve_target(op.target)
            out = fn(*[arg(a) for a in op.args], **{k: arg(a) for k, a in op.kwargs.items()})
            for v, t in zip(op.outputs, out if unpack else (out,), strict=True):
                V[v] = t
    return {o.value: V[o.value] for o in graph.outputs}


def _units_in_order(graph: Graph) -> list[list[int]]:
    """Ops in a topological order, each bucket's all-reduce members together as one unit
    (ready when all of them are): the synchronisation a collective implies."""
    unit_of: dict[int, int] = {}
    units: list[list[int]] = []
    by_bucket: dict[int, int] = {}
    for op in graph.ops:
        if op.target == ALL_REDUCE:
            b = int(op.kwargs["bucket"])
            if b not in by_bucket:
                by_bucket[b] = len(units)
                units.append([])
            unit_of[op.id] = by_bucket[b]
        else:
            unit_of[op.id] = len(units)
            units.append([])
        units[unit_of[op.id]].append(op.id)
    indeg = [0] * len(units)
    succ: list[set[int]] = [set() for _ in units]
    for op in graph.ops:
        for p in graph.preds[op.id]:
            a, b = unit_of[p], unit_of[op.id]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
    ready = [u for u in range(len(units)) if indeg[u] == 0]
    out: list[list[int]] = []
    while ready:
        u = ready.pop(0)
        out.append(units[u])
        for s in sorted(succ[u]):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    assert len(out) == len(units), "collectives deadlock: a bucket's members wait on each other"
    return out
