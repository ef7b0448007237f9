"""The "human expert" placement: contiguous layers, balanced by cost, one block per device.

This is the split the placement paper (Liu et al., HP3C 2019) and Baechi compare against:
the model's layers in forward order, cut into as many contiguous blocks as there are
devices so that the costliest block is as cheap as it can be. A layer's cost is the sum
over its ops of every kind (forward, both backward parts, optimizer), in the calibrated
cost model's times when the caller has them, else the rough roofline of `schedlab.order`.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.order import OpCostUs, rough_cost_us


def layers_in_order(graph: Graph) -> list[str]:
    """Layer paths in the order their forward ops first run (then any backward-only ones)."""
    seen: dict[str, None] = {}
    for kind_first in (True, False):
        for op in graph.ops:
            if op.layer and (op.kind is OpKind.F) == kind_first:
                seen.setdefault(op.layer, None)
    return list(seen)


def layer_costs_us(graph: Graph, op_cost_us: OpCostUs | None = None, threads: int = 1) -> dict[str, float]:
    cost: dict[str, float] = {}
    for op in graph.ops:
        if op.layer:
            t = rough_cost_us(op) if op_cost_us is None else op_cost_us(op, threads)
            cost[op.layer] = cost.get(op.layer, 0.0) + t
    return cost


def balanced_blocks(costs: Sequence[float], k: int) -> list[int]:
    """Cut points of `costs` into at most `k` contiguous blocks minimising the largest
    block sum (exact dynamic programme); returns each item's block index."""
    n = len(costs)
    if n == 0:
        return []
    k = max(1, min(k, n))
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the least largest block over the first i items in j blocks
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(1, n + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], prefix[i] - prefix[s])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, s
    blocks: list[int] = [0] * n
    i = n
    for j in range(k, 0, -1):
        s = cut[j][i]
        for t in range(s, i):
            blocks[t] = j - 1
        i = s
    return blocks


def balanced_stage_cuts(graph: Graph, n_stages: int, op_cost_us: OpCostUs | None = None) -> tuple[int, ...]:
    """The index (in `layers_in_order`) of each later stage's first layer when the layers are
    cut into `n_stages` contiguous stages balanced by cost (a pipeline plan's `stages`)."""
    order = layers_in_order(graph)
    if n_stages > len(order):
        raise SchedlabError(f"{n_stages} stages need as many layers; graph {graph.name!r} has {len(order)}")
    cost = layer_costs_us(graph, op_cost_us, threads=1)
    blocks = balanced_blocks([cost.get(lay, 0.0) for lay in order], n_stages)
    return tuple(k for k in range(1, len(order)) if blocks[k] != blocks[k - 1])


def layer_split(
    graph: Graph, devices: Sequence[str], op_cost_us: OpCostUs | None = None, threads: int = 1
) -> dict[str, str]:
    """layer path -> device: contiguous layers balanced by cost over `devices`, in order."""
    if not devices:
        raise SchedlabError("a layer split needs at least one device")
    order = layers_in_order(graph)
    if not order:
        raise SchedlabError(f"graph {graph.name!r} has no layer information to split by")
    cost = layer_costs_us(graph, op_cost_us, threads)
    blocks = balanced_blocks([cost.get(lay, 0.0) for lay in order], len(devices))
    return {lay: devices[b] for lay, b in zip(order, blocks, strict=True)}
