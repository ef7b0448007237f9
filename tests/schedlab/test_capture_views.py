"""Capture's views: `_unsafe_view`, whose schema declares no alias, is a view of its input
that moves nothing."""

from __future__ import annotations

import torch
from torch import nn

from schedlab.capture import UNANNOTATED_VIEWS, capture
from schedlab.workloads import Workload


class BatchedMatmul(nn.Module):
    """`x @ w` on a 3-D input: matmul folds the batch into `mm` and reshapes the product
    back with `_unsafe_view`."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.matmul(x, self.w)).square().mean()


def test_unsafe_view_is_a_view_of_its_input_that_moves_nothing() -> None:
    assert "aten::_unsafe_view" in UNANNOTATED_VIEWS
    graph = capture(Workload("batched-matmul", "tiny", BatchedMatmul(), (torch.randn(4, 5, 16),))).graph
    views = [op for op in graph.ops if op.target == "aten._unsafe_view.default"]
    assert views, "matmul on a 3-D input no longer reshapes with _unsafe_view: pick another module"
    for op in views:
        assert op.is_view and op.bytes_moved == 0 and op.flops == 0.0
        out = graph.values[op.outputs[0]]
        assert out is not None and out.alias_of is not None  # shares its input's storage
        assert out.alias_of in (op.inputs[0], graph.values[op.inputs[0]].alias_of)  # type: ignore[union-attr]
