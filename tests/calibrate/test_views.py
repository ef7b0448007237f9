"""View costs: the per-class fit, the table keyed by output count, and the Profile's dispatch."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.calibrate import Profile, signature
from schedlab.calibrate.views import NO_VIEW_COSTS, ViewCosts, ViewFit, ViewPoint, fit_views, view_key
from tests.calibrate.factories import DISPATCH, make_op, make_profile


def points(cls: str, a: float, b: float, outputs: list[int]) -> list[ViewPoint]:
    return [ViewPoint(f"{cls}{n}", cls, n, a + b * (n - 1)) for n in outputs]


def test_fit_recovers_fixed_and_per_output_cost_and_lends_the_slope_to_one_output_classes() -> None:
    pts = points("split", 1.5, 0.5, [2, 3, 4, 8]) + points("view", 1.0, 0.0, [1, 1, 1])
    pooled, classes = fit_views(pts)
    assert classes["split"].a_us == pytest.approx(1.5) and classes["split"].per_output_us == pytest.approx(0.5)
    assert classes["view"].a_us == pytest.approx(1.0)
    assert classes["view"].per_output_us == pooled.per_output_us  # one output count: the pooled slope
    assert classes["split"].extra_us(20) == pytest.approx(1.5 + 0.5 * 19)
    assert ViewFit(-5.0, 0.0, 1).extra_us(1) == 0.0  # never negative


def test_no_views_measured_means_no_extra() -> None:
    pooled, classes = fit_views([])
    assert classes == {} and pooled.extra_us(10) == 0.0
    assert NO_VIEW_COSTS.extra_us("x", "view", 3) == 0.0


def test_a_view_signature_holds_no_shape_so_the_table_keys_on_outputs_too() -> None:
    costs = ViewCosts({view_key("sig", 3): 2.0}, {"unbind": ViewFit(0.5, 1.0, 1)}, ViewFit(0.0, 0.0, 0))
    assert costs.extra_us("sig", "unbind", 3) == 2.0  # measured
    assert costs.extra_us("sig", "unbind", 20) == pytest.approx(0.5 + 19)  # same signature, other size: the class
    assert costs.extra_us("other", "squeeze", 1) == 0.0  # unknown class: the pooled fit
    assert ViewCosts.from_json(costs.to_json()) == costs


def test_profile_adds_the_view_extra_to_its_dispatch_with_one_and_two_slots() -> None:
    view = make_op(target="aten.split.Tensor", is_view=True, args=({"v": 0}, 4, 1))
    costs = ViewCosts({view_key(signature(view), 1): 3.0}, {}, ViewFit(0.0, 0.0, 0))
    p = dataclasses.replace(make_profile(), views=costs)
    assert p.kernel_us(view, 1) == 0.0
    assert p.dispatch_us(view) == pytest.approx(DISPATCH.view_us + 3.0)
    corun = DISPATCH.view_us * DISPATCH.corun_op_us / DISPATCH.op_us
    assert p.for_slots(2).dispatch_us(view) == pytest.approx(corun + 3.0)
    assert Profile.from_json(p.to_json()).dispatch_us(view) == pytest.approx(DISPATCH.view_us + 3.0)
