"""Calling an Op's aten function on live tensors, from the Graph's argument encoding.

The encoding (schedlab/graph.py): ``{"v": id}`` is tensor value `id`; ``{"dtype": ...}``,
``{"device": ...}``, ``{"layout": ...}``, ``{"memory_format": ...}`` are torch enums;
lists and scalars are themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from schedlab.errors import SchedlabError


def resolve_target(target: str) -> Callable[..., Any]:
    """"aten.addmm.default" -> torch.ops.aten.addmm.default."""
    parts = target.split(".")
    if len(parts) != 3:
        raise SchedlabError(f"cannot resolve op target {target!r} (expected namespace.op.overload)")
    ns, name, overload = parts
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        fn: Callable[..., Any] = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise SchedlabError(f"torch {torch.__version__} has no op {target!r}") from None
    return fn


def fast_callable(op: Callable[..., Any]) -> Callable[..., Any]:
    """The C++ entry point of an OpOverload (skips `OpOverload.__call__`'s Python frame),
    which is what the executor calls (`exec/program.py`); timings must use the same."""
    return getattr(op, "_op", op)  # type: ignore[no-any-return]


def decode(a: Any, values: Mapping[int, Any]) -> Any:
    """One encoded argument -> the Python object the aten op takes."""
    if isinstance(a, dict):
        if "v" in a:
            return values[int(a["v"])]
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a:
            return torch.device(a["device"])
        if "layout" in a:
            return getattr(torch, a["layout"])
        if "memory_format" in a:
            return getattr(torch, a["memory_format"])
        raise SchedlabError(f"unknown argument encoding {a!r}")
    if isinstance(a, (list, tuple)):
        return [decode(x, values) for x in a]
    return a


def decode_call(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], values: Mapping[int, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return tuple(decode(a, values) for a in args), {k: decode(v, values) for k, v in kwargs.items()}
