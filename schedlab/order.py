"""Op-order policies: each turns a Graph into per-op priorities (lower runs first).

Priorities only choose among *ready* ops, so every policy yields a valid schedule; an
explicit order must itself respect the dependencies and is checked.

- ``topo``           program order (what eager PyTorch does)
- ``critical-path``  longest remaining path first (HEFT-style upward rank), in the
                     calibrated cost model's times when the caller has one
- ``w-last``         weight-gradient (W) work deferred until nothing else is ready, as in
                     out-of-order backprop (Oh et al., EuroSys 2022)
- ``reverse-first-k:K``  out-of-order backprop's data-parallel policy: the weight-gradient
                     work of the model's first K layers is deferred and done last, in
                     ascending layer order, so layer 0's gradient is ready (and all-reduced,
                     and applied) first and overlaps the next step's forward; pair it with
                     steady-state steps (`schedlab.steps`)
- ``random:SEED``    a seeded random topological order
- a list of op ids   an explicit total order
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind, topo_order_ok

ORDER_HELP = (
    "op order: topo (program order, default), critical-path (longest remaining path first), "
    "w-last (weight-gradient work deferred), reverse-first-k:K (the first K layers' weight gradients last, "
    "in ascending layer order; runs steps back to back), random:SEED"
)
REVERSE_FIRST_K = "reverse-first-k:"

# An op's time in µs with the given intra-op threads: the weight critical-path ranks by.
# Commands with a calibrated Profile pass its times (`schedlab.sim.cost.op_cost_us`) to
# `resolve`; without one, critical-path weighs ops with a rough roofline of this machine class.
OpCostUs = Callable[[Op, int], float]

_ROUGH_FLOPS_PER_S = 50e9
_ROUGH_BYTES_PER_S = 10e9
_ROUGH_DISPATCH_US = 5.0


def rough_cost_us(op: Op) -> float:
    """A profile-free cost guess: roofline of a small CPU plus a dispatch cost."""
    if op.is_view:
        return _ROUGH_DISPATCH_US
    return _ROUGH_DISPATCH_US + 1e6 * max(op.flops / _ROUGH_FLOPS_PER_S, op.bytes_moved / _ROUGH_BYTES_PER_S)


def ranks(keys: Sequence[float]) -> tuple[int, ...]:
    """Priorities 0..n-1 from sort keys (ties broken by op id)."""
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i))
    rank = [0] * len(keys)
    for r, i in enumerate(order):
        rank[i] = r
    return tuple(rank)


def _positions(seq: Sequence[int]) -> tuple[int, ...]:
    """op id -> its position in `seq` (a permutation of the op ids)."""
    pos = [0] * len(seq)
    for r, i in enumerate(seq):
        pos[i] = r
    return tuple(pos)


def upward_rank_us(graph: Graph, cost_us: Callable[[Op], float]) -> list[float]:
    """Longest path (in cost) from each op to the end of the step, the op included."""
    up = [0.0] * len(graph.ops)
    for op in reversed(graph.ops):
        tail = max((up[s] for s in graph.succs[op.id]), default=0.0)
        up[op.id] = cost_us(op) + tail
    return up


def random_topo_order(graph: Graph, seed: int) -> list[int]:
    rng = random.Random(seed)
    indeg = [len(p) for p in graph.preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    out: list[int] = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        out.append(i)
        for s in graph.succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return out


def priorities(
    graph: Graph,
    order: str | Sequence[int],
    cost_us: Callable[[Op], float] | None = None,
) -> tuple[int, ...]:
    n = len(graph.ops)
    if not isinstance(order, str):
        ok, why = topo_order_ok(graph, order)
        if not ok:
            raise SchedlabError(why)  # resolve() says "plan order: "
        return _positions(order)
    if order == "topo":
        return tuple(range(n))
    if order == "critical-path":
        up = upward_rank_us(graph, cost_us or rough_cost_us)
        return ranks([-u for u in up])
    if order == "w-last":
        return ranks([float(op.id + (n if op.kind is OpKind.W else 0)) for op in graph.ops])
    if order.startswith(REVERSE_FIRST_K):
        return _reverse_first_k(graph, _policy_int(order, REVERSE_FIRST_K, "K", minimum=1))
    if order.startswith("random:"):
        return _positions(random_topo_order(graph, _policy_int(order, "random:", "the seed", minimum=-(2**63))))
    raise SchedlabError(
        f"unknown order policy {order!r}; use topo, critical-path, w-last, reverse-first-k:K, random:SEED "
        "or a list of op ids"
    )


def _policy_int(order: str, prefix: str, what: str, minimum: int) -> int:
    try:
        k = int(order[len(prefix):])
    except ValueError:
        raise SchedlabError(f"order {order!r}: {what} after {prefix!r} must be an integer") from None
    if k < minimum:
        raise SchedlabError(f"order {order!r}: {what} must be >= {minimum}")
    return k


def weight_layers(graph: Graph) -> list[str]:
    """Layers with weight-gradient (W) ops, in the order their forward ops first run."""
    from schedlab.layer_split import layers_in_order

    has_w = {op.layer for op in graph.ops if op.kind is OpKind.W and op.layer}
    return [layer for layer in layers_in_order(graph) if layer in has_w]


def _reverse_first_k(graph: Graph, k: int) -> tuple[int, ...]:
    """Program order, except that the W ops of the first `k` weight layers come after
    everything else, layer 0's first (Oh et al.'s reverse first-k)."""
    layers = weight_layers(graph)
    if not layers:
        raise SchedlabError("order reverse-first-k: the graph has no layer with weight-gradient ops")
    first = {layer: idx for idx, layer in enumerate(layers[:k])}
    n = len(graph.ops)
    keys = [
        float(op.id + n * (1 + first[op.layer]) if op.kind is OpKind.W and op.layer in first else op.id)
        for op in graph.ops
    ]
    return ranks(keys)


