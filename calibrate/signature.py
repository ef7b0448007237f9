"""Op signatures: the key under which a measured kernel time is stored in a Profile.

An Op carries value ids, not shapes, so the signature is built from what the Op itself
carries and what pins its shapes down: the aten target, the FLOP count, the bytes moved
and the non-tensor arguments (dims, strides, padding, scalars), with every tensor
argument written as "T":

    aten.sum.dim_IntList|f=10.0|b=360|a=["T",[0],true]

Two ops with equal signatures do the same arithmetic on the same amount of data. Of its
inputs' strides a signature sees one thing: a memory-bound op that reads a permuted view
(`Op.strided`, `schedlab.capture.reads_strided`) ends in "|strided", since a transposed
`add` reads as many bytes as a contiguous one and takes several times as long. A softmax
(or its backward) over its innermost dimension ends in "|row=12", that dimension's length
(`Op.row_len`): rows of 12 and of 16 can move equal bytes and differ tenfold. Other
layouts it cannot see, which is one reason a measurement from a real trace
(`Profile.with_trace`) beats one from a microbenchmark. Computing it needs the Op only, so
the simulator can call `kernel_us(op, threads)` without the Graph.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from schedlab.graph import Graph, Op, conv_arg, conv_groups, kept_on

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
    target: str, flops: float, nbytes: int, args: Any, kwargs: dict[str, Any], strided: bool = False, row_len: int = 0
) -> str:
    """The signature of a call of `target` on arguments in the Graph's JSON encoding;
    ``|strided`` ends that of a call that reads a permuted input (`Op.strided`), ``|row=n``
    that of a softmax over rows of n (`Op.row_len`)."""
    arg_key = json.dumps(_strip_values(list(args)), separators=(",", ":"), sort_keys=True)
    key = f"{target}|f={float(flops)!r}|b={int(nbytes)}|a={arg_key}"
    if kwargs:
        key += "|k=" + json.dumps(_strip_values(kwargs), separators=(",", ":"), sort_keys=True)
    if row_len:
        key += f"|row={int(row_len)}"
    return key + STRIDED_MARK if strided else key


def signature(op: Op) -> str:
    """The signature of `op` (see the module docstring)."""
    return signature_of(op.target, op.flops, op.bytes_moved, op.args, op.kwargs, op.strided, op.row_len)


CONV1D_CLASS = "[1d]"  # a class model's name for the convolutions over one spatial dimension


def is_conv1d(op_class: str, args: Any) -> bool:
    """Whether a call of `op_class` on `args` (as called, or in the Graph's encoding) is a
    convolution over one spatial dimension (`nn.Conv1d`): its stride list has one element.
    oneDNN runs those at another rate per FLOP than 2-D ones of the same work, so they get
    a model of their own (`fit_class`)."""
    stride = conv_arg(op_class, args, "stride")
    return isinstance(stride, (list, tuple)) and len(stride) == 1


GROUPED_CLASS = "[grouped]"  # a class model's name for grouped (and depthwise) 2-D and 3-D convolutions


def is_grouped_conv(op_class: str, args: Any) -> bool:
    """Whether a call of `op_class` on `args` (as called, or in the Graph's encoding) is a
    convolution of more than one group (`groups` > 1: ResNeXt's grouped, MobileNet's
    depthwise). Its FLOPs are a group's share of a dense one's on the same tensors, and
    oneDNN runs it at another rate: on a quick profile of 2026-12-07 (2-core Intel Xeon VM)
    the class model fitted over every 2-D convolution put the 13 grouped backward cases at a
    median 0.38x their time (the dense ones 1.05x) and the 16 grouped forward ones at 0.89x,
    so they get a model of their own (`fit_class`)."""
    return conv_groups(op_class, args) > 1


UNBLOCKED_CLASS = "[grouped-unblocked]"  # ... those whose groups fall off oneDNN's channel blocks
CHANNEL_BLOCK = 8  # channels per group that oneDNN's fast grouped kernels take in multiples of (measured, below)


def is_unblocked_groups(group_channels: tuple[int, int]) -> bool:
    """Whether a grouped convolution of `group_channels` (`Op.group_channels`: input and
    output channels per group) runs oneDNN's slow path: channels per group, in or out, not a
    multiple of `CHANNEL_BLOCK`. A depthwise one (one input channel per group) has its own
    kernel and is not. Measured on the 2-core AMD EPYC VM (AVX-512; 2026-12-07, torch 2.13, two
    threads, 3x3 over 32x32, batch 8, 4 groups): forward 13-59 GFLOP/s at 2, 3, 4, 6, 10 and
    12 channels per group against 87-157 at 8, 16 and 32; the backward (input and weight
    gradients) 9-61 against 77-214, and it paid 990-1,774 us to wake its helpers with spinning
    throttled (`calibrate.wake`) against 280-374; 8 in and 4, 6 or 10 out (or the reverse)
    paid 1,814-2,674. So the two kinds of grouped convolution get a model each."""
    c_in, c_out = group_channels
    if c_in <= 1:
        return False
    return c_in % CHANNEL_BLOCK != 0 or c_out % CHANNEL_BLOCK != 0


SHORT_ROW_CLASS = "[short]"  # a class model's name for a softmax over rows shorter than the vector


@functools.cache
def short_row_floats() -> int:
    """The float32 lanes of this host's ATen vector (16 with AVX-512, else 8): a softmax row
    shorter than that runs ATen's last-dimension kernel about ten times slower per element
    (measured 2026-12-03 on the Intel Xeon VM at one thread: `_softmax` over 3,840 rows 15 ns
    a row of 1, 177 of 12, 216 of 15, then 14 of 16 and 30 of 17; its backward 268 us
    against 16 for rows of 12 and 16)."""
    import torch

    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def fit_class(
    op_class: str, strided: bool, args: Any = (), row_len: int = 0, group_channels: tuple[int, int] = (0, 0),
) -> str:
    """The class a measurement is fitted under: ``add``; for a call that reads a permuted
    input, ``add[strided]``; for a 1-D convolution, ``convolution[1d]``; for a softmax over
    rows shorter than this host's vector (`Op.row_len`, `short_row_floats`),
    ``_softmax[short]``; for a grouped 2-D convolution, ``convolution[grouped]``, or
    ``convolution[grouped-unblocked]`` where its channels per group (`Op.group_channels`)
    fall off oneDNN's blocks (`is_unblocked_groups`)."""
    if strided:
        return op_class + STRIDED_CLASS
    if 0 < row_len < short_row_floats():
        return op_class + SHORT_ROW_CLASS
    if is_conv1d(op_class, args):
        return op_class + CONV1D_CLASS
    if not is_grouped_conv(op_class, args):
        return op_class
    return op_class + (UNBLOCKED_CLASS if is_unblocked_groups(group_channels) else GROUPED_CLASS)


def op_fit_class(op: Op) -> str:
    """`fit_class` of `op`."""
    return fit_class(op.op_class, op.strided, op.args, op.row_len, op.group_channels)


def base_class(name: str) -> str:
    """`fit_class`'s op class: ``add[strided]`` -> ``add``, ``convolution[1d]`` -> ``convolution``."""
    return (name.removesuffix(STRIDED_CLASS).removesuffix(CONV1D_CLASS).removesuffix(GROUPED_CLASS)
            .removesuffix(UNBLOCKED_CLASS).removesuffix(SHORT_ROW_CLASS))


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
