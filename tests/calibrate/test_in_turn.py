"""Convolutions taking turns in a step (calibrate.in_turn) and the Profile that charges it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from schedlab.calibrate.context import ContextCosts, Occurrence, fit_context
from schedlab.calibrate.in_turn import InTurnCurve, curve_of, distinct_in_turn, measure_in_turn
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, make_profile

CURVE = curve_of([(2, 1.1), (4, 1.2), (8, 1.4)], cap_us=300.0)


def test_the_curve_is_one_alone_interpolated_in_log_calls_and_flat_past_its_last_point() -> None:
    assert CURVE.factor(1) == 1.0 and CURVE.factor(0) == 1.0
    assert CURVE.factor(2) == pytest.approx(1.1) and CURVE.factor(8) == pytest.approx(1.4)
    assert CURVE.factor(3) == pytest.approx(1.1 + 0.1 * math.log(1.5) / math.log(2.0))
    assert CURVE.factor(40) == pytest.approx(1.4)
    assert InTurnCurve(()).factor(8) == 1.0


def test_a_measured_curve_is_made_valid_and_survives_json() -> None:
    made = curve_of([(8, 1.3), (2, 0.9), (4, 1.5)], cap_us=120.0)  # unsorted, a factor under 1, a dip
    assert made.points == ((2, 1.0), (4, 1.5), (8, 1.5))
    assert InTurnCurve.from_json(made.to_json()) == made
    assert InTurnCurve.from_json(curve_of([(2, 1.2)]).to_json()).cap_us == math.inf
    with pytest.raises(TypeError, match="points"):
        InTurnCurve.from_json([[2, 1.2]])


def test_the_extra_is_a_share_of_the_call_up_to_the_cap_and_kernel_of_inverts_it() -> None:
    assert CURVE.extra_us(100.0, 1.4) == pytest.approx(40.0)
    assert CURVE.extra_us(3000.0, 1.4) == pytest.approx(120.0)  # a long call pays a 300 us call's extra
    for kernel in (0.0, 50.0, 300.0, 2500.0):
        for f in (1.0, 1.2, 1.4):
            assert CURVE.kernel_of(kernel + CURVE.extra_us(kernel, f), f) == pytest.approx(kernel)


def _conv_graph(n_convs: int) -> Graph:
    """`n_convs` convolutions of distinct shapes (signatures) on one input, and a relu."""
    x = TensorMeta((2, 3, 8, 8), "float32", 1536)
    values: list[TensorMeta | None] = [x]
    ops: list[Op] = []
    for i in range(n_convs):
        w = TensorMeta((4 + i, 3, 3, 3), "float32", 4 * (4 + i) * 27)
        values += [w, TensorMeta((2, 4 + i, 8, 8), "float32", 4 * 2 * (4 + i) * 64)]
        args = ({"v": 0}, {"v": len(values) - 2}, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        ops.append(Op(i, f"conv{i}", "aten.convolution.default", OpKind.F, args, {}, (0, len(values) - 2),
                      (len(values) - 1,), 1e6 * (i + 1), 10_000 * (i + 1)))
    values.append(values[-1])
    ops.append(Op(n_convs, "relu", "aten.relu.default", OpKind.F, ({"v": len(values) - 2},), {},
                  (len(values) - 2,), (len(values) - 1,), 32.0, 256))
    inputs = [GraphInput(0, "x", InputRole.USER)] + [GraphInput(1 + 2 * i, f"w{i}", InputRole.PARAM) for i in range(n_convs)]
    return Graph(name="convs", inputs=tuple(inputs), outputs=(GraphOutput(len(values) - 1, "loss", OutputRole.LOSS),),
                 ops=tuple(ops), values=tuple(values))


def _with_curve(curve: InTurnCurve | None):  # type: ignore[no-untyped-def]
    return dataclasses.replace(make_profile(), context=ContextCosts({}, 0.0, {}, 0.0, curve))


def test_a_bound_profile_charges_its_convolutions_the_factor_at_their_distinct_count() -> None:
    g = _conv_graph(8)
    assert distinct_in_turn(g) == 8
    plain, turned = _with_curve(None).for_graph(g), _with_curve(CURVE).for_graph(g)
    conv, relu = g.ops[0], g.ops[-1]
    base = plain.kernel_us(conv, 1)
    assert turned.kernel_us(conv, 1) == pytest.approx(base + CURVE.extra_us(base, 1.4))
    assert turned.kernel_us(relu, 1) == pytest.approx(plain.kernel_us(relu, 1))  # not a convolution
    assert _with_curve(CURVE).kernel_us(conv, 1) == pytest.approx(base)  # bound to no graph: nothing
    assert _with_curve(CURVE).for_graph(_conv_graph(1)).kernel_us(_conv_graph(1).ops[0], 1) == pytest.approx(
        _with_curve(None).for_graph(_conv_graph(1)).kernel_us(_conv_graph(1).ops[0], 1))  # one alone: none
    ids = np.arange(len(g.ops))
    column = turned.kernel_column(g, ids, 1)  # the simulator's column path agrees with the scalar one
    assert column == pytest.approx([turned.kernel_us(op, 1) for op in g.ops])


def test_trace_calibration_keeps_the_kernel_without_the_turns_and_gives_the_event_back() -> None:
    g = _conv_graph(8)
    p = _with_curve(CURVE)
    event_us = 500.0
    events = tuple(
        TraceEvent(0, "conv0", "F", "cpu0", 0, 1, 0, int(1e3 * (DISPATCH.op_us + event_us)), step) for step in range(3)
    )
    trace = Trace(events=events, meta={"source": "exec", "graph_hash": g.hash, "plan": {"slots": 1}})
    traced = p.with_trace(trace, g)
    kernel = traced.kernel_us(g.ops[0], 1)
    assert kernel == pytest.approx(CURVE.kernel_of(event_us, 1.4))
    assert traced.for_graph(g).kernel_us(g.ops[0], 1) == pytest.approx(event_us)


def test_fit_context_takes_the_turns_off_before_it_fits_the_extras() -> None:
    hot = {"conv/a": 100.0}
    occ = [Occurrence("conv/a", "convolution", False, 150.0, 0, 1.4), Occurrence("conv/a", "convolution", False, 150.0, 0, 1.4)]
    plain, _ = fit_context(occ, hot)
    turned, sig = fit_context(occ, hot, turn_us=lambda o, hot_us: CURVE.extra_us(hot_us, o.in_turn))
    assert plain.warm("convolution") == pytest.approx(50.0)
    assert turned.warm("convolution") == pytest.approx(10.0) and sig == {"conv/a": pytest.approx(10.0)}


def test_measure_in_turn_gives_a_valid_curve() -> None:
    import torch

    curve = measure_in_turn(torch, sizes=(1, 2, 4), rounds=2, repeats=1)
    assert [n for n, _ in curve.points] == [2, 4]
    assert all(f >= 1.0 for _, f in curve.points) and curve.points[0][1] <= curve.points[1][1]
    assert 0.0 < curve.cap_us < math.inf
