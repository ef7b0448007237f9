"""Calling an Op's aten function on live tensors, from the Graph's argument encoding.

The encoding (schedlab/graph.py): ``{"v": id}`` is tensor value `id`; ``{"dtype": ...}``,
``{"device": ...}``, ``{"layout": ...}``, ``{"memory_format": ...}`` are torch enums;
lists and scalars are themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from schedlab.aten import decode_enum, fast_callable, resolve_overload

__all__ = ["decode", "decode_call", "fast_callable", "resolve_target"]


def resolve_target(target: str) -> torch._ops.OpOverload:
    """"aten.addmm.default" -> torch.ops.aten.addmm.default."""
    return resolve_overload(target)


def decode(a: Any, values: Mapping[int, Any]) -> Any:
    """One encoded argument -> the Python object the aten op takes."""
    if isinstance(a, dict):
        return values[int(a["v"])] if "v" in a else decode_enum(a)
    if isinstance(a, (list, tuple)):
        return [decode(x, values) for x in a]
    return a


def decode_call(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], values: Mapping[int, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return tuple(decode(a, values) for a in args), {k: decode(v, values) for k, v in kwargs.items()}
