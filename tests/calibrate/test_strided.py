"""Memory-bound ops on transposed inputs: capture marks them, the sweep times them, and the
Profile costs them with their own class model (`Op.strided`, `Profile.class_key`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from schedlab.calibrate.run import quick_config
from schedlab.calibrate.signature import STRIDED_MARK, fit_class, signature
from schedlab.calibrate.sweep import sweep_cases, sweep_specs
from schedlab.capture import capture, is_transposed
from schedlab.graph import Graph, Op
from schedlab.workloads.loader import Workload
from tests.calibrate.factories import FALLBACK_MODEL, fit, make_op, make_profile


class TokenMixer(nn.Module):
    """An MLP-Mixer-like block: mixing across tokens through a transpose, a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Linear(8, 8)
        self.gates = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, 8 tokens, 16 channels)
        mixed = self.tokens(x.transpose(1, 2)).transpose(1, 2)  # a matmul on a transposed input
        y = x + mixed  # an add reading a transposed view
        flat = y.transpose(1, 2).contiguous()  # a transposing copy
        heads = y.view(4, 8, 4, 4).permute(0, 2, 1, 3).contiguous()  # attention's head permute, copied
        a, b, c, d = self.gates(y).chunk(4, dim=-1)  # row slices: contiguous rows, not strided
        return flat.sum() + heads.sum() + (torch.sigmoid(a) * torch.tanh(b) + c * d).sum()


def _graph() -> Graph:
    torch.manual_seed(0)
    return capture(Workload("mixer", "tiny", TokenMixer(), (torch.randn(4, 8, 16),))).graph  # type: ignore[arg-type]


def test_capture_marks_memory_ops_that_read_a_transposed_input() -> None:
    g = _graph()
    strided = {op.op_class for op in g.ops if op.strided}
    assert {"add", "clone"} <= strided  # the residual add and the transposing copy
    assert sum(op.op_class == "clone" and op.strided for op in g.ops) >= 2  # the head permute's copy too
    assert not strided & {"mm", "addmm", "bmm"}  # BLAS reads a transposed operand as it is
    assert not strided & {"sigmoid", "tanh", "mul"}  # the gate chunks keep their rows contiguous
    assert all(signature(op).endswith(STRIDED_MARK) == op.strided for op in g.ops)
    again = Graph.from_json(g.to_json())
    assert [op.strided for op in again.ops] == [op.strided for op in g.ops] and again.hash == g.hash
    old = Op.from_json({k: v for k, v in next(op for op in g.ops if op.strided).to_json().items() if k != "strided"})
    assert old.strided is False  # a graph saved before the mark loads as contiguous


def test_the_sweep_times_transposed_cases_under_their_own_classes() -> None:
    cases = list(sweep_cases(sweep_specs(quick_config().sweep), set()))
    strided = [c for c in cases if c.op_class.endswith("[strided]")]
    assert {c.op_class for c in strided} == {fit_class(k, True) for k in ("clone", "gelu", "add", "mul")}
    for c in strided:
        assert c.signature.endswith(STRIDED_MARK) and is_transposed(c.args[0])
    copies = [c for c in strided if c.op_class == "clone[strided]"]
    assert copies and all(c.kwargs == {"memory_format": torch.contiguous_format} for c in copies)
    assert all(c.fn(*c.args, **c.kwargs).is_contiguous() for c in copies[:3])  # `.contiguous()`: a real transpose
    plain = [c for c in cases if not c.op_class.endswith("[strided]")]
    assert not any(c.signature.endswith(STRIDED_MARK) for c in plain)


def test_a_strided_op_takes_its_class_strided_model_where_the_profile_has_one() -> None:
    add = make_op("aten.add.Tensor", flops=1e6, nbytes=12_000_000)
    strided = dataclasses.replace(add, strided=True)
    slow = dataclasses.replace(FALLBACK_MODEL, us_per_mb=FALLBACK_MODEL.us_per_mb * 5)
    without = make_profile()
    with_model = dataclasses.replace(without, classes={**without.classes, "add": fit(FALLBACK_MODEL),
                                                       "add[strided]": fit(slow)})
    assert without.class_key(strided) == "add"  # no strided model: the contiguous one
    assert with_model.class_key(strided) == "add[strided]" and with_model.class_key(add) == "add"
    assert with_model.kernel_us(strided, 1) > 2 * with_model.kernel_us(add, 1)
    assert signature(strided) == signature(add) + STRIDED_MARK


def test_permuted_means_strides_out_of_order_not_merely_non_contiguous() -> None:
    x = torch.randn(2, 5, 3, 4)
    assert is_transposed(x.transpose(-1, -2)) and is_transposed(x.permute(0, 2, 1, 3))
    assert not is_transposed(x) and not is_transposed(torch.randn(6, 16).chunk(4, dim=-1)[1])  # a row slice
    assert not is_transposed(torch.randn(3, 1, 5).expand(3, 4, 5))  # a broadcast


def test_a_copy_of_long_contiguous_rows_is_not_strided_but_an_elementwise_op_on_them_is() -> None:
    """A head-permute copy of rows of 16 floats or more ran at a contiguous copy's speed
    (21-27 us against 20.6 for 1 MiB; 61-142 us at rows of 1-8, a transpose 152-464): it
    takes the contiguous class. `gelu` or `add` on the same view stays strided."""
    from schedlab.capture import MIN_COPY_ROW, contiguous_run, reads_strided

    def heads(d: int) -> torch.Tensor:  # (B, T, H, D) read as (B, H, T, D)
        return torch.randn(2, 6, 4, d).permute(0, 2, 1, 3)

    assert contiguous_run(heads(32)) == 32 and contiguous_run(torch.randn(3, 5).t()) == 1
    assert contiguous_run(torch.randn(2, 3, 4)) == 24 and contiguous_run(torch.randn(2, 1, 4)) == 8
    assert not reads_strided("clone", [heads(MIN_COPY_ROW)]) and not reads_strided("clone", [heads(64)])
    assert reads_strided("clone", [heads(MIN_COPY_ROW // 2)]) and reads_strided("clone", [torch.randn(8, 64).t()])
    assert reads_strided("gelu", [heads(64)]) and reads_strided("add", [heads(64), torch.randn(2, 4, 6, 64)])
    assert not reads_strided("bmm", [heads(4)]) and not reads_strided("clone", [torch.randn(4, 4), 3])


def test_capture_marks_a_head_permute_copy_by_its_row_length() -> None:
    class Heads(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.proj = nn.Linear(4 * d, 4 * d)
            self.d = d

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, tokens, 4 heads x d)
            b, t, _ = x.shape
            y = self.proj(x).view(b, t, 4, self.d).permute(0, 2, 1, 3).contiguous()
            return y.sum()

    for d, marked in ((32, False), (4, True)):
        torch.manual_seed(0)
        g = capture(Workload("heads", "tiny", Heads(d), (torch.randn(2, 6, 4 * d),))).graph  # type: ignore[arg-type]
        copies = [op for op in g.ops if op.op_class == "clone" and not op.is_view]
        assert copies and copies[0].strided is marked, (d, [op.strided for op in copies])
