"""FLOP counts: a convolution's backward counts its weight gradient by the groups it has."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import flop_registry

from schedlab.flops import conv_backward_flops


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
