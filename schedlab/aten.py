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


def fast_callable(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The op's C++ entry point, skipping `OpOverload.__call__`'s Python frame: what the
    executor calls, and so what the calibration's microbenchmarks must time."""
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
