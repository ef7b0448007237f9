"""Work estimates of one aten op: FLOPs and bytes moved.

Matmuls, convolutions and attention use PyTorch's own FLOP formulas
(`torch.utils.flop_counter.flop_registry`, the ones `FlopCounterMode` counts with);
every other op is costed as one FLOP per output element. Bytes moved are the bytes of
the tensors read plus the tensors written; views move nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from schedlab.graph import TensorMeta


def op_cost(
    target: torch._ops.OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    out_vals: Sequence[Any],
    in_metas: Sequence[TensorMeta | None],
    out_metas: Sequence[TensorMeta | None],
    is_view: bool,
) -> tuple[float, int]:
    if is_view:
        return 0.0, 0
    nbytes = sum(m.nbytes for m in in_metas if m is not None) + sum(m.nbytes for m in out_metas if m is not None)
    formula = flop_registry.get(target.overloadpacket)
    if formula is not None:
        try:
            fx_args = tuple(_val(a) for a in args)
            fx_kwargs = {k: _val(v) for k, v in kwargs.items()}
            out = out_vals[0] if len(out_vals) == 1 else tuple(out_vals)
            return float(formula(*fx_args, out_val=out, **fx_kwargs)), nbytes
        except Exception:
            pass
    elems = sum(_numel(m) for m in out_metas if m is not None)
    return float(elems), nbytes


def _numel(m: TensorMeta) -> int:
    n = 1
    for s in m.shape:
        n *= s
    return n


def _val(a: Any) -> Any:
    """fx.Node arguments -> their example values (the flop formulas only read shapes)."""
    import torch.fx as fx

    if isinstance(a, fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_val(x) for x in a)
    return a
