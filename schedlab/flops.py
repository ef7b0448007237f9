"""Work estimates of one aten op: FLOPs and bytes moved.

Matmuls, convolutions and attention use PyTorch's own FLOP formulas
(`torch.utils.flop_counter.flop_registry`, the ones `FlopCounterMode` counts with), but
for three kinds of op:

- torch registers no formula for the CPU's flash attention
  (`_scaled_dot_product_flash_attention_for_cpu` and its backward, what
  `nn.MultiheadAttention` and `scaled_dot_product_attention` lower to on a CPU), which
  came out at one FLOP per output element: an attention of 8 x 8 heads x 64 tokens x 32 at
  0.14 MFLOP for 34 MFLOP of work, linear in the tokens where the work is quadratic.
  `sdpa_cpu_flops` and `sdpa_cpu_backward_flops` count them with torch's formulas for the
  other attention kernels, a causal one as a full one: the CPU kernel took as long with
  `is_causal` as without (8 x 8 x 64 x 32: 781 and 817 us; 2 x 4 x 512 x 64: 7.5 and 7.8
  ms; one thread, 2-core development VM).
- torch counts a grouped convolution's backward weight gradient as if the convolution were
  dense, `groups` times too many (a depthwise convolution of 128 channels came out at 304
  MFLOP for 2.4 MFLOP of work), so `conv_backward_flops` counts it as the forward's
  multiply-adds, which it is.
- torch has no formula for oneDNN's fused LSTM layer (`schedlab.recurrent`);
  `lstm_layer_flops` and `lstm_layer_backward_flops` count its matmuls and cell arithmetic.

Every other op is costed as one FLOP per output element. Bytes moved are the bytes of the
tensors read plus the tensors written; views move nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from schedlab.graph import TensorMeta

# The version of the formulas here. A Profile records the one its class fits were fitted
# with (`calibrate.profile`); a fit made before a class was counted anew would be applied to
# FLOPs of another scale, so a Profile drops those classes' fits (their ops fall to the
# roofline) until calibration runs again.
FLOP_COUNTING = 2
RECOUNTED_CLASSES: dict[int, frozenset[str]] = {  # version -> the op classes it counts anew
    2: frozenset({"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"}),
}


def recounted_since(version: int) -> frozenset[str]:
    """The op classes whose FLOPs are counted otherwise now than by formulas of `version`."""
    return frozenset().union(*(classes for v, classes in RECOUNTED_CLASSES.items() if v > version))


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
    packet = target.overloadpacket
    formula = OWN_FORMULAS.get(packet) or flop_registry.get(packet)
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


def conv_backward_flops(
    grad_out: Any, x: Any, w: Any, _bias: Any, _stride: Any, _padding: Any, _dilation: Any, transposed: bool,
    _output_padding: Any, groups: int, output_mask: Sequence[bool], out_val: Any = None, **_: Any,
) -> int:
    """FLOPs of `aten.convolution_backward`, grouped convolutions counted right.

    The input gradient is a convolution of the output gradient with the weight, whose
    shape carries the groups (torch's formula, kept); the weight gradient does the
    forward's multiply-adds again: 2 x batch x each output position (input position, if
    transposed) x each weight element (`w.shape` is (out, in / groups, *kernel))."""
    from torch.utils.flop_counter import conv_flop_count

    flops = 0
    if output_mask[0]:
        grad_in = out_val[0] if isinstance(out_val, (list, tuple)) else out_val
        flops += conv_flop_count(list(grad_out.shape), list(w.shape), list(grad_in.shape), not transposed)
    if output_mask[1]:
        positions = 1
        for d in (x.shape if transposed else grad_out.shape)[2:]:
            positions *= int(d)
        flops += 2 * int(x.shape[0]) * positions * int(w.numel())
    return flops


# Elementwise FLOPs per hidden unit and time step of an LSTM cell: 3 sigmoids and 2 tanh
# (counted one each), the 4 gate bias adds, c = f*c + i*g (3), h = o*tanh(c) (1).
LSTM_CELL_ELEMWISE = 13


def _lstm_dims(inp: Any, w_ih: Any) -> tuple[int, int, int, int]:
    """(time steps, batch, input width, hidden width) of a fused LSTM layer, whose input is
    [T, B, I] (`schedlab.recurrent`: time first) and input weight [4H, I]."""
    t, b, i = (int(d) for d in inp.shape)
    return t, b, i, int(w_ih.shape[0]) // 4


def lstm_layer_flops(inp: Any, w_ih: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """FLOPs of `aten.mkldnn_rnn_layer` (one LSTM layer, one direction): the input and
    recurrent matmuls of every step, 2 T B 4H (I + H), and the cell's elementwise work."""
    t, b, i, h = _lstm_dims(inp, w_ih)
    return 2 * t * b * 4 * h * (i + h) + LSTM_CELL_ELEMWISE * t * b * h


def lstm_layer_backward_flops(inp: Any, w_ih: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """FLOPs of `aten.mkldnn_rnn_layer_backward`: the gradients of the input and the state
    (the forward's matmuls again) and of both weights (again), and the cell's elementwise
    work twice."""
    t, b, i, h = _lstm_dims(inp, w_ih)
    return 4 * t * b * 4 * h * (i + h) + 2 * LSTM_CELL_ELEMWISE * t * b * h


def sdpa_cpu_flops(query: Any, key: Any, value: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """FLOPs of `aten._scaled_dot_product_flash_attention_for_cpu`: the scores Q K^T and
    their product with V, as torch counts its other attention kernels (`sdpa_flop_count`)."""
    return int(sdpa_flop_count(tuple(query.shape), tuple(key.shape), tuple(value.shape)))


def sdpa_cpu_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *_: Any, out_val: Any = None, **__: Any
) -> int:
    """FLOPs of `aten._scaled_dot_product_flash_attention_for_cpu_backward`: the scores
    recomputed and the four products of the gradients (`sdpa_backward_flop_count`)."""
    shapes = (tuple(t.shape) for t in (grad_out, query, key, value))
    return int(sdpa_backward_flop_count(*shapes))


# The formulas counted here rather than by torch's registry (see the module docstring).
OWN_FORMULAS: dict[Any, Callable[..., int]] = {
    torch.ops.aten.convolution_backward: conv_backward_flops,
    torch.ops.aten.mkldnn_rnn_layer: lstm_layer_flops,
    torch.ops.aten.mkldnn_rnn_layer_backward: lstm_layer_backward_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa_cpu_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_cpu_backward_flops,
}


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
