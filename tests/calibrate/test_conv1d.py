"""Convolutions over one spatial dimension (`nn.Conv1d`) get class models of their own:
the sweep times them, captured ones are fitted with them, and the Profile costs them with
them where it has a trusted fit (`calibrate.signature.is_conv1d`, `Profile.class_key`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from schedlab.calibrate.cases import workload_cases
from schedlab.calibrate.fit import Point, fit_all
from schedlab.calibrate.run import quick_config
from schedlab.calibrate.signature import base_class, fit_class, is_conv1d
from schedlab.calibrate.sweep import sweep_cases, sweep_specs
from schedlab.capture import capture
from schedlab.workloads.loader import Workload
from tests.calibrate.factories import MM_MODEL, fit, make_op, make_profile


class Signal(nn.Module):
    """A 1-D and a 2-D convolution side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 5, padding=2, dilation=1)
        self.c2 = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        return self.c1(x).sum() + self.c2(img).sum()


def test_captured_and_swept_1d_convolutions_fit_their_own_classes() -> None:
    torch.manual_seed(0)
    c = capture(Workload("signal", "tiny", Signal(), (torch.randn(2, 3, 32), torch.randn(2, 3, 8, 8))), "sgd")
    cases = list(workload_cases(c.graph, c.input_values, set(), "signal/tiny/sgd"))
    convs = {k.op_class for k in cases if base_class(k.op_class).startswith("convolution")}
    assert convs == {"convolution", "convolution[1d]", "convolution_backward", "convolution_backward[1d]"}
    swept = [k for k in sweep_cases(sweep_specs(quick_config().sweep), set()) if k.op_class.endswith("[1d]")]
    assert {k.op_class for k in swept} == {"convolution[1d]", "convolution_backward[1d]"}
    for k in swept[:6]:
        x = k.args[1] if k.op_class.startswith("convolution_backward") else k.args[0]
        assert x.dim() == 3 and is_conv1d(base_class(k.op_class), k.args)
        k.fn(*k.args, **k.kwargs)  # each case runs on its own tensors
    flops = sorted(k.flops for k in swept if k.op_class == "convolution[1d]")
    assert flops[-1] > 1000 * flops[0]  # banded over the range of work
    assert fit_class("convolution", False, ({"v": 0}, {"v": 1}, None, [1, 1])) == "convolution"
    assert fit_class("add", False, ({"v": 0}, [1])) == "add"


def test_a_1d_convolution_takes_its_own_model_only_where_trusted() -> None:
    conv2d = make_op("aten.convolution.default", flops=2e7, nbytes=400_000,
                     args=({"v": 0}, {"v": 1}, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    conv1d = dataclasses.replace(conv2d, args=({"v": 0}, {"v": 1}, None, [1], [1], [1], False, [0], 1))
    slow = dataclasses.replace(MM_MODEL, us_per_gflop=MM_MODEL.us_per_gflop * 3)
    base = make_profile()
    both = dataclasses.replace(base, classes={**base.classes, "convolution": fit(MM_MODEL),
                                              "convolution[1d]": fit(slow)})
    assert both.class_key(conv1d) == "convolution[1d]" and both.class_key(conv2d) == "convolution"
    assert both.kernel_us(conv1d, 1) > 2 * both.kernel_us(conv2d, 1)
    untrusted = dataclasses.replace(both, classes={**both.classes, "convolution[1d]": dataclasses.replace(
        fit(slow), train_mape=150.0)})
    assert untrusted.class_key(conv1d) == "convolution"  # a fit that misses its own points: the class's
    assert base.class_key(conv1d) == "convolution"  # a profile calibrated before 1-D cases


def test_1d_convolution_points_stay_out_of_the_memory_bound_fallback() -> None:
    pts = [Point(f"s{i}", cls, 1e6 * (i + 1), 10_000 * (i + 1), 1, 10.0 + i)
           for i in range(10) for cls in ("relu", "convolution[1d]")]
    slow = [dataclasses.replace(p, call_us=p.call_us * 1000) for p in pts if p.op_class == "convolution[1d]"]
    fallback, _ = fit_all([p for p in pts if p.op_class == "relu"], 0.0, 0)
    with_conv, classes = fit_all([p for p in pts if p.op_class == "relu"] + slow, 0.0, 0)
    assert with_conv.model == fallback.model and "convolution[1d]" in classes
