"""FLOP counts: a convolution's backward counts its weight gradient by the groups it has; the CPU
flash attention counts its quadratic work."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import flop_registry

from schedlab.flops import conv_backward_flops, op_cost


def _backward(groups: int, cin: int, cout: int, transposed: bool) -> tuple[tuple[object, ...], object, int]:
    """The call's arguments, its outputs, and the forward convolution's FLOPs (2 x MACs)."""
    x = torch.randn(2, cin, 9, 7)
    if transposed:
        w = torch.randn(cin, cout // groups, 3, 3)
        y = torch.nn.functional.conv_transpose2d(x, w, padding=1, groups=groups)
        forward = 2 * 2 * 9 * 7 * w.numel()  # every input position meets every weight
    else:
        w = torch.randn(cout, cin // groups, 3, 3)
        y = torch.nn.functional.conv2d(x, w, padding=1, groups=groups)
        forward = 2 * 2 * y.shape[2] * y.shape[3] * w.numel()  # every output position meets every weight
    args = (torch.randn_like(y), x, w, [0], [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups, [True, True, False])
    return args, torch.ops.aten.convolution_backward(*args), forward


@pytest.mark.parametrize("transposed", [False, True])
def test_dense_convolution_backward_counts_as_torch_does(transposed: bool) -> None:
    args, out, forward = _backward(1, 8, 12, transposed)
    assert conv_backward_flops(*args, out_val=out) == flop_registry[torch.ops.aten.convolution_backward](*args, out_val=out)
    assert conv_backward_flops(*args, out_val=out) == 2 * forward  # input grad + weight grad, each a forward's work


@pytest.mark.parametrize(("groups", "transposed"), [(4, False), (16, False), (4, True)])
def test_grouped_convolution_backward_is_twice_its_forward(groups: int, transposed: bool) -> None:
    args, out, forward = _backward(groups, 16, 16, transposed)
    assert conv_backward_flops(*args, out_val=out) == 2 * forward
    assert flop_registry[torch.ops.aten.convolution_backward](*args, out_val=out) > 2 * forward  # torch's overcount


def test_weight_gradient_alone_is_one_forward() -> None:
    args, out, forward = _backward(8, 16, 16, False)
    only_w = (*args[:-1], [False, True, False])
    assert conv_backward_flops(*only_w, out_val=out) == forward


def _attention(b: int, h: int, s: int, d: int, causal: bool) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The CPU flash attention's forward and backward calls on [b, h, s, d] tensors."""
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    fwd = (q, k, v, 0.0, causal)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*fwd)
    return fwd, (torch.randn_like(out), q, k, v, out, lse, 0.0, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_attention_counts_its_quadratic_work(causal: bool) -> None:
    """Forward: Q K^T and (scores) V, 2 x 2 b h s^2 d; backward: five such products."""
    fwd, bwd = _attention(2, 4, 48, 16, causal)
    forward = 2 * 2 * 2 * 4 * 48 * 48 * 16
    f, nbytes = op_cost(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, fwd, {}, [], [], [], False)
    assert f == forward and nbytes == 0
    b, _ = op_cost(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default, bwd, {}, [], [], [],
                   False)
    assert b == 5 * forward // 2
    longer, _ = _attention(2, 4, 96, 16, causal)
    f2, _ = op_cost(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, longer, {}, [], [], [], False)
    assert f2 == 4 * f  # twice the tokens, four times the work (not twice, as one FLOP per output element was)
