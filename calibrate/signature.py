"""Op signatures: the key under which a measured kernel time is stored in a Profile.

An Op carries value ids, not shapes, so the signature is built from what the Op itself
carries and what pins its shapes down: the aten target, the FLOP count, the bytes moved
and the non-tensor arguments (dims, strides, padding, scalars), with every tensor
argument written as "T":

    aten.sum.dim_IntList|f=10.0|b=360|a=["T",[0],true]

Two ops with equal signatures do the same arithmetic on the same amount of data. Of its
inputs' strides a signature sees one thing: a memory-bound op that reads a permuted view
(`Op.strided`, `schedlab.capture.reads_strided`) ends in "|strided", since a transposed
`add` reads as many bytes as a contiguous one and takes several times as long. Other
layouts it cannot see, which is one reason a measurement from a real trace
(`Profile.with_trace`) beats one from a microbenchmark. Computing it needs the Op only, so
the simulator can call `kernel_us(op, threads)` without the Graph.
"""

from __future__ import annotations

import json
from typing import Any

from schedlab.graph import Graph, Op, kept_on

STRIDED_MARK = "|strided"
STRIDED_CLASS = "[strided]"  # a class model's name for the strided cases of a class (`Profile.class_key`)


def _strip_values(a: Any) -> Any:
    if isinstance(a, dict):
        if "v" in a and len(a) == 1:
            return "T"
        return {k: _strip_values(v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [_strip_values(x) for x in a]
    return a


def signature_of(
    target: str, flops: float, nbytes: int, args: Any, kwargs: dict[str, Any], strided: bool = False
) -> str:
    """The signature of a call of `target` on arguments in the Graph's JSON encoding;
    ``|strided`` ends that of a call that reads a permuted input (`Op.strided`)."""
    arg_key = json.dumps(_strip_values(list(args)), separators=(",", ":"), sort_keys=True)
    key = f"{target}|f={float(flops)!r}|b={int(nbytes)}|a={arg_key}"
    if kwargs:
        key += "|k=" + json.dumps(_strip_values(kwargs), separators=(",", ":"), sort_keys=True)
    return key + STRIDED_MARK if strided else key


def signature(op: Op) -> str:
    """The signature of `op` (see the module docstring)."""
    return signature_of(op.target, op.flops, op.bytes_moved, op.args, op.kwargs, op.strided)


CONV1D_CLASS = "[1d]"  # a class model's name for the convolutions over one spatial dimension
_CONV_STRIDE_ARG = {"convolution": 3, "convolution_backward": 4}  # where each call's stride list is


def is_conv1d(op_class: str, args: Any) -> bool:
    """Whether a call of `op_class` on `args` (as called, or in the Graph's encoding) is a
    convolution over one spatial dimension (`nn.Conv1d`): its stride list has one element.
    oneDNN runs those at another rate per FLOP than 2-D ones of the same work, so they get
    a model of their own (`fit_class`)."""
    at = _CONV_STRIDE_ARG.get(op_class)
    if at is None or len(args) <= at:
        return False
    stride = args[at]
    return isinstance(stride, (list, tuple)) and len(stride) == 1


def fit_class(op_class: str, strided: bool, args: Any = ()) -> str:
    """The class a measurement is fitted under: ``add``; for a call that reads a permuted
    input, ``add[strided]``; for a 1-D convolution, ``convolution[1d]``."""
    if strided:
        return op_class + STRIDED_CLASS
    return op_class + CONV1D_CLASS if is_conv1d(op_class, args) else op_class


def base_class(name: str) -> str:
    """`fit_class`'s op class: ``add[strided]`` -> ``add``, ``convolution[1d]`` -> ``convolution``."""
    return name.removesuffix(STRIDED_CLASS).removesuffix(CONV1D_CLASS)


def graph_signatures(graph: Graph) -> tuple[str, ...]:
    """`signature(op)` of every op of `graph`, in op order: computed once per graph object
    and kept on it, as the simulator keeps the graph's other derived structure
    (`sim.cost_table.content_keys`). Ops with equal content keys have equal signatures, so
    each content key is encoded once."""
    return kept_on(graph, "_cal_signatures", _signatures)


def _signatures(graph: Graph) -> tuple[str, ...]:
    from schedlab.sim.cost_table import content_keys

    by_key: dict[object, str] = {}
    out: list[str] = []
    for key, op in zip(content_keys(graph), graph.ops, strict=True):
        sig = by_key.get(key)
        if sig is None:
            sig = by_key[key] = signature(op)
        out.append(sig)
    return tuple(out)
