"""Tag a training step's ops F, B or W, and give each a layer, from data flow alone.

Both captures use it: torch's joint aot graph (`schedlab.capture`) and TensorFlow's
executed graph (`schedlab.tf.capture`). Given the ops in program order, which values the
loss and updated buffers are, and which value is each parameter's gradient:

- F: work the loss or an updated buffer depends on.
- B: backward work that the gradients of two or more layers depend on (so earlier layers
  wait on it), including the loss gradient seed.
- W: backward work that feeds the parameter gradients of one layer only: nothing else
  waits on it, so it may be deferred (Oh et al., EuroSys 2022).

A layer is the module path that owns a parameter ("body.0" for "body.0.weight").
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.graph import Op, OpKind, TensorMeta, storage_root


def owner_of(param_name: str) -> str:
    """"body.0.weight" -> "body.0"; a top-level parameter ("pos_emb") -> ""."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else ""


def tag_kinds(
    ops: Sequence[Op],
    values: Sequence[TensorMeta | None],
    forward_outputs: Sequence[int],
    grads: dict[str, int],
    param_of_value: dict[int, str],
) -> list[Op]:
    """`ops` (ids 0..n-1 in program order) with `kind` F/B/W and `layer` set (see the module
    docstring). `grads`: parameter name -> its gradient value; `param_of_value`: parameter
    input value -> parameter name."""
    producer = {v: op.id for op in ops for v in op.outputs}
    consumers: list[list[int]] = [[] for _ in ops]
    for op in ops:
        for p in {producer[v] for v in op.inputs if v in producer}:
            consumers[p].append(op.id)
    # Forward: every op the loss or an updated buffer depends on; the rest is backward.
    forward = [False] * len(ops)
    stack = [producer[v] for v in forward_outputs if v in producer]
    while stack:
        i = stack.pop()
        if not forward[i]:
            forward[i] = True
            stack.extend(producer[v] for v in ops[i].inputs if v in producer)
    # Which layers' parameter gradients each op feeds, as a bitset over owner modules.
    owners = sorted({owner_of(n) for n in grads})
    bit = {o: 1 << k for k, o in enumerate(owners)}
    grad_bits: dict[int, int] = {}
    for name, v in grads.items():
        grad_bits[v] = grad_bits.get(v, 0) | bit[owner_of(name)]
    reach = [0] * len(ops)
    for op in reversed(ops):
        r = 0
        for v in op.outputs:
            r |= grad_bits.get(v, 0)
        for c in consumers[op.id]:
            r |= reach[c]
        reach[op.id] = r

    out: list[Op] = []
    layer: list[str | None] = [None] * len(ops)
    for op in ops:
        single = reach[op.id] != 0 and reach[op.id] & (reach[op.id] - 1) == 0
        kind = OpKind.F if forward[op.id] else (OpKind.W if single else OpKind.B)
        # Layer: the module of a parameter the op reads; for W work the one layer it
        # feeds; otherwise the layer of the op that produced its first input.
        lay = next(
            (owner_of(param_of_value[storage_root(values, v)]) for v in op.inputs if storage_root(values, v) in param_of_value),
            None,
        )
        if lay is None and kind is OpKind.W:
            lay = owners[reach[op.id].bit_length() - 1]
        if lay is None:
            lay = next((layer[producer[v]] for v in op.inputs if v in producer and layer[producer[v]]), None)
        layer[op.id] = lay or None
        out.append(Op(**{**op.__dict__, "kind": kind, "layer": layer[op.id]}))
    return out
