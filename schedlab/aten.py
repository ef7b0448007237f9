"""From the Graph's JSON encoding back to torch: op names to aten ops, enums to torch objects.

The encoding is defined in `schedlab/graph.py`; the executor and the calibration's
microbenchmarks both call ops through this module, so they time the same entry point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from schedlab.errors import SchedlabError


def resolve_overload(target: str) -> torch._ops.OpOverload:
    """"aten.addmm.default" -> torch.ops.aten.addmm.default."""
    parts = target.split(".")
    if len(parts) != 3:
        raise SchedlabError(f"op target {target!r} is not of the form namespace.op.overload")
    ns, name, overload = parts
    try:
        op: torch._ops.OpOverload = getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        raise SchedlabError(f"unknown op {target!r} in this torch {torch.__version__}") from None
    return op


def _public_bindings() -> dict[Any, Callable[..., Any]]:
    """Overloads whose public torch function takes the same positional arguments and the
    same keyword names, and binds them to that same overload: its generated argument
    parser costs 0.4-0.6 us a call less than the overload's boxed `_op` (mm 1.15 against
    1.58 us, add 1.13 against 1.72, view 1.38 against 1.79; 2-core VM, 2026-11-26), which
    is most of what the executor spends per op beyond the kernel.
    `tests/schedlab/test_aten.py` checks, for each, that a call dispatches to exactly its overload."""
    aten = torch.ops.aten
    return {
        aten.mm.default: torch.mm,
        aten.bmm.default: torch.bmm,
        aten.addmm.default: torch.addmm,
        aten.add.Tensor: torch.add,
        aten.sub.Tensor: torch.sub,
        aten.mul.Tensor: torch.mul,
        aten.div.Tensor: torch.div,
        aten.neg.default: torch.neg,
        aten.exp.default: torch.exp,
        aten.sigmoid.default: torch.sigmoid,
        aten.tanh.default: torch.tanh,
        aten.relu.default: torch.relu,
        aten.addcmul.default: torch.addcmul,
        aten.clone.default: torch.clone,
        aten.cat.default: torch.cat,
        aten.stack.default: torch.stack,
        aten.t.default: torch.t,
        aten.transpose.int: torch.transpose,
        aten.permute.default: torch.permute,
        aten.unsqueeze.default: torch.unsqueeze,
        aten.select.int: torch.select,
        aten.unbind.int: torch.unbind,
        aten.view.default: torch.Tensor.view,
        aten.expand.default: torch.Tensor.expand,
        aten.sum.dim_IntList: torch.sum,
        aten.mean.dim: torch.mean,
    }


PUBLIC_BINDINGS = _public_bindings()


def fast_callable(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The cheapest way to call the op: its public torch function where one binds exactly
    this overload (`PUBLIC_BINDINGS`), else its C++ entry point, skipping
    `OpOverload.__call__`'s Python frame. What the executor calls, and so what the
    calibration's microbenchmarks must time."""
    public = PUBLIC_BINDINGS.get(op)
    if public is not None:
        return public
    fn: Callable[..., Any] = getattr(op, "_op", op)
    return fn


def decode_enum(a: dict[str, Any]) -> Any:
    """{"dtype": "float32"} -> torch.float32, and the same for device, layout, memory_format."""
    if "dtype" in a:
        return getattr(torch, a["dtype"])
    if "device" in a:
        return torch.device(a["device"])
    if "layout" in a:
        return getattr(torch, a["layout"])
    if "memory_format" in a:
        return getattr(torch, a["memory_format"])
    raise SchedlabError(f"unknown op argument encoding {a!r}")
