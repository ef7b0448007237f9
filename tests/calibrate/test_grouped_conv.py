"""Grouped and depthwise convolutions get class models of their own, a factor of the dense
convolution's (`calibrate.signature.is_grouped_conv`, `calibrate.fit.SCALED_VARIANTS`), one for
groups of channels on oneDNN's blocks and one for the rest (`is_unblocked_groups`), and pay
their plain class's wake where calibration fitted none of theirs (`Profile.class_wake_fit`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from schedlab.calibrate.cases import workload_cases
from schedlab.calibrate.fit import Point, fit_all
from schedlab.calibrate.run import quick_config
from schedlab.calibrate.signature import base_class, fit_class, is_grouped_conv, is_unblocked_groups, op_fit_class
from schedlab.calibrate.sweep import sweep_cases, sweep_specs
from schedlab.calibrate.wake import POOLED, WakeFit
from schedlab.capture import Captured, capture, conv_group_channels
from schedlab.graph import Graph, Op
from schedlab.workloads.loader import Workload
from tests.calibrate.factories import MM_MODEL, fit, make_op, make_profile

DENSE_ARGS = ({"v": 0}, {"v": 1}, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


class Blocks(nn.Module):
    """A dense, a depthwise, a blocked grouped (8 channels per group) and an unblocked grouped
    (4 per group) 2-D convolution, and a grouped 1-D one."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Conv2d(8, 16, 3, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.blocked = nn.Conv2d(16, 16, 1, groups=2)
        self.unblocked = nn.Conv2d(16, 16, 1, groups=4)
        self.line = nn.Conv1d(4, 4, 3, padding=1, groups=2)

    def forward(self, img: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.unblocked(self.blocked(self.depthwise(self.dense(img)))).sum() + self.line(x).sum()


def _blocks() -> Captured:
    torch.manual_seed(0)
    return capture(Workload("blocks", "tiny", Blocks(), (torch.randn(2, 8, 8, 8), torch.randn(2, 4, 16))), "sgd")


def test_captured_and_swept_grouped_convolutions_fit_their_own_classes() -> None:
    c = _blocks()
    cases = list(workload_cases(c.graph, c.input_values, set(), "blocks/tiny/sgd"))
    convs = {k.op_class for k in cases if base_class(k.op_class).startswith("convolution")}
    # a grouped 1-D convolution is a 1-D one: that model first
    assert convs == {"convolution", "convolution[grouped]", "convolution[grouped-unblocked]", "convolution[1d]",
                     "convolution_backward", "convolution_backward[grouped]",
                     "convolution_backward[grouped-unblocked]", "convolution_backward[1d]"}
    swept = [k for k in sweep_cases(sweep_specs(quick_config().sweep), set()) if "[grouped" in k.op_class]
    assert {k.op_class for k in swept} == {"convolution[grouped]", "convolution_backward[grouped]",
                                           "convolution[grouped-unblocked]", "convolution_backward[grouped-unblocked]"}
    blocked = [k for k in swept if k.op_class.endswith("[grouped]")]
    weights = [k.args[1] if k.op_class.startswith("convolution[") else k.args[2] for k in blocked]
    depthwise = [w for w in weights if w.shape[1] == 1]
    # the sweep's own blocked cases, beside the depthwise ones its grouped draws give
    assert len(weights) - len(depthwise) >= quick_config().sweep.per_class * 2
    for k in swept[:4]:
        assert is_grouped_conv(base_class(k.op_class), k.args)
        k.fn(*k.args, **k.kwargs)  # each case runs on its own tensors


def test_capture_records_a_grouped_convolutions_channels_per_group() -> None:
    g = _blocks().graph
    by_class: dict[str, set[tuple[int, int]]] = {}
    for op in g.ops:
        if op.op_class.startswith("convolution"):
            by_class.setdefault(op_fit_class(op), set()).add(op.group_channels)
    assert by_class["convolution"] == {(0, 0)}  # dense: no groups
    assert by_class["convolution[grouped]"] == {(1, 1), (8, 8)}  # depthwise and blocked
    assert by_class["convolution[grouped-unblocked]"] == {(4, 4)}
    assert by_class["convolution_backward[grouped-unblocked]"] == {(4, 4)}
    assert all(op.group_channels == (0, 0) for op in g.ops if not op.op_class.startswith("convolution"))
    again = Graph.from_json(g.to_json())
    assert [op.group_channels for op in again.ops] == [op.group_channels for op in g.ops] and again.hash == g.hash
    grouped = next(op for op in g.ops if op.group_channels == (4, 4))
    old = Op.from_json({k: v for k, v in grouped.to_json().items() if k != "group_channels"})
    assert old.group_channels == (0, 0)  # a graph saved before the field loads as ungrouped
    with pytest.raises(ValueError, match="group_channels must be two channel counts"):
        Op.from_json({**grouped.to_json(), "group_channels": [4, -1]})


def test_groups_are_unblocked_where_either_side_falls_off_the_block() -> None:
    assert not is_unblocked_groups((0, 0)) and not is_unblocked_groups((1, 1)) and not is_unblocked_groups((1, 4))
    assert not is_unblocked_groups((8, 8)) and not is_unblocked_groups((16, 32))
    assert is_unblocked_groups((4, 4)) and is_unblocked_groups((8, 4)) and is_unblocked_groups((12, 8))
    w = torch.zeros(16, 4, 3, 3)  # 16 out, 4 in per group: 4 groups of 16 in
    assert conv_group_channels("convolution", (None, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4)) == (4, 4)
    assert conv_group_channels("convolution", (None, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)) == (0, 0)
    backward = (None, None, w, [16], [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [True, True, False])
    assert conv_group_channels("convolution_backward", backward) == (4, 8)
    assert conv_group_channels("add", (w, w)) == (0, 0)
    assert fit_class("convolution", False, (*DENSE_ARGS[:8], 4), 0, (4, 4)) == "convolution[grouped-unblocked]"
    assert fit_class("convolution", False, (*DENSE_ARGS[:8], 4), 0, (8, 8)) == "convolution[grouped]"
    assert base_class("convolution_backward[grouped-unblocked]") == "convolution_backward"


def test_the_group_count_is_read_where_each_class_keeps_it() -> None:
    assert not is_grouped_conv("convolution", DENSE_ARGS)
    assert is_grouped_conv("convolution", (*DENSE_ARGS[:8], 4))
    backward = ({"v": 0}, {"v": 1}, {"v": 2}, [8], [1, 1], [1, 1], [1, 1], False, [0, 0], 8, [True, True, False])
    assert is_grouped_conv("convolution_backward", backward)
    assert not is_grouped_conv("convolution_backward", (*backward[:9], 1, backward[10]))
    assert not is_grouped_conv("convolution", DENSE_ARGS[:5])  # too few arguments to tell
    assert not is_grouped_conv("convolution", (*DENSE_ARGS[:8], True))  # a flag is no group count
    assert not is_grouped_conv("add", ({"v": 0}, {"v": 1}, 1, 2, 3, 4, 5, 6, 8))
    assert fit_class("convolution", True, (*DENSE_ARGS[:8], 4)) == "convolution[strided]"
    assert base_class("convolution_backward[grouped]") == "convolution_backward"


def test_a_grouped_class_is_the_dense_shape_times_one_factor_however_many_cases() -> None:
    pts = [Point(f"d{i}", "convolution", 1e7 * (i + 1), 100_000 * (i + 1), t, 20.0 * (i + 1) / t)
           for i in range(12) for t in (1, 2)]
    grouped = [Point(f"g{i}", "convolution[grouped]", 1e6 * (i + 1), 100_000 * (i + 1), t, 90.0 * (i + 1) ** 0.5 / t)
               for i in range(12) for t in (1, 2)]  # twelve cases: enough for a fit of their own
    _, classes = fit_all(pts + grouped, 1.0, 0)
    dense, own = classes["convolution"], classes["convolution[grouped]"]
    assert dense.model_name == "work_threads" and own.model_name == "work_threads_scaled"
    ratio = own.model.us_per_gflop / dense.model.us_per_gflop
    assert ratio > 1.0 and own.model.us_per_mb == pytest.approx(dense.model.us_per_mb * ratio)  # one factor on all
    assert own.model.h_us == pytest.approx(dense.model.h_us * ratio)  # so the dense parallel share at each size
    assert own.model.p_max == dense.model.p_max


def test_a_variant_without_a_wake_fit_pays_its_plain_class_s() -> None:
    conv = make_op("aten.convolution.default", flops=2e7, nbytes=400_000, args=(*DENSE_ARGS[:8], 4))
    slow = dataclasses.replace(MM_MODEL, us_per_gflop=MM_MODEL.us_per_gflop * 3)
    base = make_profile()
    plain_wake = WakeFit(base_us=300.0, per_work=0.0, threads=2, n_points=8)
    pooled = WakeFit(base_us=20.0, per_work=0.0, threads=2, n_points=40)
    prof = dataclasses.replace(base, classes={**base.classes, "convolution": fit(MM_MODEL),
                                              "convolution[grouped]": fit(slow)},
                               wake={"convolution": plain_wake, POOLED: pooled})
    assert prof.class_key(conv) == "convolution[grouped]"
    assert prof.class_wake_fit("convolution[grouped]") is plain_wake
    assert prof.class_wake_fit("mm") is pooled and prof.class_wake_fit("mm", pooled=False) is None
    own = WakeFit(base_us=900.0, per_work=0.0, threads=2, n_points=4)
    with_own = dataclasses.replace(prof, wake={**prof.wake, "convolution[grouped]": own})
    assert with_own.class_wake_fit("convolution[grouped]") is own
    assert with_own.wake_us(conv, 2) > prof.wake_us(conv, 2) > 0.0
