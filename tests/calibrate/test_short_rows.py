"""Softmax over rows shorter than the host's vector: capture records the row, the sweep times
such rows, and the Profile costs them with their class's own model (`Op.row_len`,
`calibrate.signature.fit_class`, ``_softmax[short]``)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from schedlab.calibrate.run import quick_config
from schedlab.calibrate.signature import SHORT_ROW_CLASS, base_class, op_fit_class, short_row_floats, signature
from schedlab.calibrate.sweep import SHORT_ROW_TARGETS, sweep_cases, sweep_specs
from schedlab.capture import capture, softmax_row_len
from schedlab.graph import Graph, Op, op_class_of
from schedlab.workloads.loader import Workload
from tests.calibrate.factories import FALLBACK_MODEL, fit, make_op, make_profile


class ShortAttention(nn.Module):
    """Attention weights over 6 tokens (short rows) and a loss over 40 classes (long rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = nn.Linear(16, 32)
        self.out = nn.Linear(16, 40)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # x: (4, 6 tokens, 16); y: (4,)
        q, k = self.qk(x).chunk(2, dim=-1)
        weights = torch.softmax(q @ k.transpose(1, 2), dim=-1)  # (4, 6, 6): rows of 6
        return nn.functional.cross_entropy(self.out((weights @ x).mean(1)), y)  # log_softmax over rows of 40


def _graph() -> Graph:
    torch.manual_seed(0)
    model, inputs = ShortAttention(), (torch.randn(4, 6, 16), torch.randint(40, (4,)))
    return capture(Workload("short", "tiny", model, inputs)).graph  # type: ignore[arg-type]


def test_capture_records_the_row_a_softmax_normalises() -> None:
    g = _graph()
    rows = {(op.op_class, op.row_len) for op in g.ops if op.row_len}
    assert ("_softmax", 6) in rows and ("_softmax_backward_data", 6) in rows
    assert ("_log_softmax", 40) in rows and ("_log_softmax_backward_data", 40) in rows
    assert all(op.row_len == 0 for op in g.ops if "softmax" not in op.op_class)
    assert short_row_floats() in (8, 16)
    for op in g.ops:  # rows of 6 are short on every host, rows of 40 on none
        assert op_fit_class(op).endswith(SHORT_ROW_CLASS) == (op.row_len == 6)
        assert signature(op).endswith(f"|row={op.row_len}") == bool(op.row_len)
    again = Graph.from_json(g.to_json())
    assert [op.row_len for op in again.ops] == [op.row_len for op in g.ops] and again.hash == g.hash
    old = Op.from_json({k: v for k, v in next(op for op in g.ops if op.row_len).to_json().items() if k != "row_len"})
    assert old.row_len == 0  # a graph saved before the field loads as a row of no length


def test_only_a_softmax_over_its_innermost_dimension_has_a_row() -> None:
    x = torch.randn(3, 12, 5)
    assert softmax_row_len("_softmax", (x, -1, False)) == 5 and softmax_row_len("_softmax", (x, 2, False)) == 5
    assert softmax_row_len("_softmax", (x, 1, False)) == 0  # ATen's other kernel: vectorised along the inner dim
    assert softmax_row_len("_softmax", (torch.randn(3, 12, 1), 1, False)) == 12  # only size-1 dimensions after it
    assert softmax_row_len("_softmax_backward_data", (x, x, -1, torch.float32)) == 5
    assert softmax_row_len("sum", (x, [-1], True)) == 0 and softmax_row_len("_softmax", (torch.tensor(1.0), 0)) == 0


def test_the_sweep_times_short_rows_under_their_own_classes() -> None:
    cases = list(sweep_cases(sweep_specs(quick_config().sweep), set()))
    short = [c for c in cases if c.op_class.endswith(SHORT_ROW_CLASS)]
    classes = {op_class_of(t) for t, _ in SHORT_ROW_TARGETS}
    assert {base_class(c.op_class) for c in short} == classes
    for c in short:
        assert c.args[0].shape[-1] < short_row_floats() and c.signature.endswith(f"|row={c.args[0].shape[-1]}")
    long = [c for c in cases if base_class(c.op_class) in classes and not c.op_class.endswith(SHORT_ROW_CLASS)]
    assert long and all(c.args[0].shape[-1] >= short_row_floats() for c in long)  # the memory sweep's rows


def test_a_short_row_softmax_takes_its_class_short_model_where_the_profile_has_one() -> None:
    softmax = make_op("aten._softmax.default", flops=1e5, nbytes=400_000)
    short = dataclasses.replace(softmax, row_len=4)
    slow = dataclasses.replace(FALLBACK_MODEL, us_per_mb=FALLBACK_MODEL.us_per_mb * 10)
    without = make_profile()
    with_model = dataclasses.replace(without, classes={**without.classes, "_softmax": fit(FALLBACK_MODEL),
                                                       "_softmax[short]": fit(slow)})
    assert without.class_key(short) == "_softmax"  # a profile calibrated before: the class's model
    assert with_model.class_key(short) == "_softmax[short]"
    assert with_model.class_key(dataclasses.replace(softmax, row_len=64)) == "_softmax"
    assert with_model.kernel_us(short, 1) > 5 * with_model.kernel_us(softmax, 1)
