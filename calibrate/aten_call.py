"""Calling an Op's aten function on live tensors, from the Graph's argument encoding.

The encoding (schedlab/graph.py): ``{"v": id}`` is tensor value `id`; ``{"dtype": ...}``,
``{"device": ...}``, ``{"layout": ...}``, ``{"memory_format": ...}`` are torch enums;
lists and scalars are themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from schedlab.aten import decode_enum, resolve_overload


def resolve_target(target: str) -> Callable[..., Any]:
    """"aten.addmm.default" -> torch.ops.aten.addmm.default."""
    return resolve_overload(target)


def fast_callable(op: Callable[..., Any]) -> Callable[..., Any]:
    """The C++ entry point of an OpOverload (skips `OpOverload.__call__`'s Python frame),
    which is what the executor calls (`exec/program.py`); timings must use the same."""
    return getattr(op, "_op", op)  # type: ignore[no-any-return]


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
