"""Benchmark cases from a captured workload: its distinct ops, on the step's real tensors.

Rather than rebuilding inputs from shapes, the Graph is replayed once in program order
on the tensors of its first step (`Captured.input_values`), so every op is benchmarked
on exactly the tensors it gets in a real step: the same strides (a transposed view stays
transposed), valid embedding and loss indices, real batch-norm statistics. Values are
freed after their last use, so a replay holds what the eager step holds.

Views are cases too (`Case.is_view`): they move no data, but their call costs differ by
op (`calibrate.views`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from schedlab.calibrate.aten_call import decode_call, fast_callable, resolve_target
from schedlab.calibrate.signature import op_fit_class, signature
from schedlab.graph import Graph, Op


@dataclass(frozen=True)
class Case:
    """One op call to benchmark: a function, its arguments, and the work it does."""

    signature: str
    op_class: str
    target: str
    flops: float
    nbytes: int
    fn: Callable[..., Any]  # the op's C++ entry point, as the executor calls it
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    source: str  # "mlp/tiny/sgd", "sweep"
    is_view: bool = False
    outputs: int = 1  # tensors the op returns (split, unbind: several)


def new_signatures(graph: Graph, seen: set[str]) -> list[str]:
    """Distinct signatures of `graph`'s ops (views included) not in `seen`, in order."""
    out: list[str] = []
    local = set(seen)
    for op in graph.ops:
        sig = signature(op)
        if sig not in local:
            local.add(sig)
            out.append(sig)
    return out


def _last_use(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for op in graph.ops:
        for v in op.inputs:
            last[v] = op.id
    return last


def _store(op: Op, out: Any, values: dict[int, Any]) -> None:
    if isinstance(out, (tuple, list)):
        for v, o in zip(op.outputs, out, strict=False):
            values[v] = o
    elif op.outputs:
        values[op.outputs[0]] = out


def workload_cases(graph: Graph, input_values: dict[int, Any], seen: set[str], source: str) -> Iterator[Case]:
    """Replay `graph`, yielding a Case for each op whose signature is not in `seen`.

    `seen` is updated as cases are yielded, so several graphs can share one set and
    each signature is benchmarked once. The Case's tensors are live values of the replay;
    benchmark the case before asking for the next one.
    """
    values: dict[int, Any] = dict(input_values)
    last = _last_use(graph)
    for op in graph.ops:
        fn = fast_callable(resolve_target(op.target))
        args, kwargs = decode_call(op.args, op.kwargs, values)
        sig = signature(op)
        if sig not in seen:
            seen.add(sig)
            yield Case(
                sig, op_fit_class(op), op.target, op.flops, op.bytes_moved, fn, args, kwargs, source,
                is_view=op.is_view, outputs=len(op.outputs),
            )
        out = fn(*args, **kwargs)
        del args, kwargs
        _store(op, out, values)
        del out
        for v in (*op.inputs, *op.outputs):
            if last.get(v, -1) <= op.id:
                values.pop(v, None)
