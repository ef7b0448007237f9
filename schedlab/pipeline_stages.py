"""Which pipeline stage, and which part of a schedule's action, each op of a step is.

A pipeline cuts the model's layers (`layer_split.layers_in_order`) into contiguous
stages: equal shares of layers by default, or at explicit cut points (the index, in that
order, of the first layer of each stage after the first). An op's layer names its stage.
Capture's layer tags are hints, though, not a partition the data respects: a residual
add is tagged with the block that opened it, the sum of two gradient paths with the
last layer that touched one. A schedule can only run a split where

- forward work flows forward: a forward op is in no earlier stage than the forward ops
  it reads (it moves up to the latest of them), and
- gradients flow backward: a backward op is in no later stage than the backward ops it
  reads (it moves down to the earliest of them),

because a stage's forward of micro-batch m waits only for earlier stages' forwards of m,
and its backward for later stages' backwards of m (`pipeline.timing.dependencies`). An
op with no layer follows its producers the same way; one with no producer (a view of a
label input, Adam's step counter) goes with its consumers, and an optimizer op with the
latest stage it reads from, so a parameter is updated where its gradient is made.

Parts: a forward op is part F; a backward op is part I (input gradient) when the
gradient an earlier stage waits for needs it, else part W (weight gradient); an
optimizer op is part OPT (it runs once per step, not per micro-batch). A full backward
action B runs parts I and W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from schedlab.graph import Graph, OpKind
from schedlab.layer_split import layers_in_order
from schedlab.plan import PlanError


class Part(StrEnum):
    F = "F"
    I = "I"  # noqa: E741 - the input-gradient part, as torch's action letter
    W = "W"
    OPT = "OPT"


@dataclass(frozen=True)
class StageSplit:
    """Stages of one step's graph: per stage its layers, per op its stage and part."""

    layers: tuple[tuple[str, ...], ...]  # per stage, in forward order
    stage: tuple[int, ...]  # per op
    part: tuple[Part, ...]  # per op

    @property
    def n_stages(self) -> int:
        return len(self.layers)


def stage_layers(graph: Graph, stages: int | Sequence[int]) -> tuple[tuple[str, ...], ...]:
    """The layers of each stage: `stages` equal shares (the first stages take one more
    when they do not divide), or cut at the given layer indices."""
    order = layers_in_order(graph)
    n = len(order)
    if n == 0:
        raise PlanError("stages", f"graph {graph.name!r} has no layer information to cut into stages")
    if isinstance(stages, int):
        if stages < 1:
            raise PlanError("stages", f"must be >= 1, got {stages}")
        if stages > n:
            raise PlanError(
                "stages",
                f"{stages} stages need at least {stages} layers; {graph.name!r} has {n} "
                f"({', '.join(order)}): use {n} stages or fewer",
            )
        bounds = [n * s // stages for s in range(stages + 1)]
    else:
        cuts = list(stages)
        if any(not 0 < c < n for c in cuts) or cuts != sorted(set(cuts)):
            raise PlanError(
                "stages",
                f"cut points {cuts} must rise strictly within 1..{n - 1}: each is the index of the first "
                f"layer of a stage, in forward order ({', '.join(f'{k}:{lay}' for k, lay in enumerate(order))})",
            )
        bounds = [0, *cuts, n]
    return tuple(tuple(order[a:b]) for a, b in pairwise(bounds))


def split_stages(graph: Graph, stages: int | Sequence[int]) -> StageSplit:
    """Cut `graph` (one micro-batch's step) into stages; see the module docstring."""
    layers = stage_layers(graph, stages)
    hint = {lay: s for s, group in enumerate(layers) for lay in group}
    order = topological(graph)
    kinds = [op.kind for op in graph.ops]
    if OpKind.COMM in kinds:
        raise PlanError("stages", "a pipeline splits a captured step, not one already expanded across devices")
    backward = [k in (OpKind.B, OpKind.W) for k in kinds]
    stage: list[int | None] = [None] * len(graph.ops)
    for i in order:
        op = graph.ops[i]
        known = [(p, st) for p in graph.preds[i] if (st := stage[p]) is not None]
        s = hint.get(op.layer) if op.layer else None
        if op.kind is OpKind.F:
            fwd = [st for p, st in known if kinds[p] is OpKind.F]
            if fwd:
                s = max(fwd) if s is None else max(s, max(fwd))
        elif backward[i]:
            bwd = [st for p, st in known if backward[p]]
            if bwd:
                s = min(bwd) if s is None else min(s, min(bwd))
            elif s is None and known:
                s = known[0][1]  # reads forward values only: with the first of them
        else:
            s = max((st for _, st in known), default=None)  # an update goes with what it reads
        stage[i] = s
    for i in reversed(order):  # no producer and no layer: with the consumers
        if stage[i] is None:
            after = [st for c in graph.succs[i] if (st := stage[c]) is not None]
            stage[i] = (max(after) if backward[i] else min(after)) if after else 0
    final = tuple(s or 0 for s in stage)
    return StageSplit(layers=layers, stage=final, part=_parts(graph, final, order))


def _parts(graph: Graph, stage: tuple[int, ...], order: list[int]) -> tuple[Part, ...]:
    """Each op's part. Backward work is part I when the input gradient needs it: capture's
    kind B, or anything a backward op of an earlier stage reads (the gradient the stage
    passes down, even where capture saw only weight gradients beneath it), or anything
    part-I work reads; the rest of the backward is part W."""
    ops = graph.ops
    part: list[Part] = [Part.OPT] * len(ops)
    for i in reversed(order):  # consumers first
        kind = ops[i].kind
        if kind is OpKind.F:
            part[i] = Part.F
        elif kind in (OpKind.B, OpKind.W):
            needed = kind is OpKind.B or any(
                ops[c].kind in (OpKind.B, OpKind.W) and (stage[c] < stage[i] or part[c] is Part.I)
                for c in graph.succs[i]
            )
            part[i] = Part.I if needed else Part.W
    return tuple(part)


def topological(graph: Graph) -> list[int]:
    """Op ids in an order where every op comes after the ops it reads from."""
    indeg = [len(p) for p in graph.preds]
    ready = [i for i in range(len(graph.ops)) if indeg[i] == 0]
    ready.reverse()
    out: list[int] = []
    while ready:
        i = ready.pop()
        out.append(i)
        for s in reversed(graph.succs[i]):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return out
