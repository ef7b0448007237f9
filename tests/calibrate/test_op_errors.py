"""The Profile against a real trace, op class by op class, on the ops it never measured."""

from __future__ import annotations

import dataclasses
import math

import pytest

from schedlab.calibrate.fit import ClassFit
from schedlab.calibrate.op_errors import ClassError, op_class_errors, pooled
from schedlab.calibrate.signature import graph_signatures
from schedlab.exec import run_steps
from schedlab.graph import Graph
from schedlab.plan import Plan
from schedlab.trace import Trace
from tests.calibrate.factories import DISPATCH, make_profile
from tests.conftest import captured_workload


@pytest.fixture(scope="module")
def traced() -> tuple[Graph, Trace]:
    _, c = captured_workload("heldout:conv1d-two-branch", "sgd", "tiny")
    res = run_steps(c.graph, c.input_values, Plan(slots=1, threads=1), steps=2, warmup=1)
    return c.graph, res.trace


def test_every_unseen_kernel_op_is_counted_once_per_run_and_predicted_by_the_profile(traced) -> None:  # type: ignore[no-untyped-def]
    graph, trace = traced
    # No event floor: the factory's 3 us floor would clamp a tiny mm that a fast host
    # runs in under 3 us to 0 (CI saw it), and each class must show a measured time.
    prof = dataclasses.replace(make_profile(), dispatch=dataclasses.replace(DISPATCH, op_us=0.0))
    errors = op_class_errors(graph, trace, prof)
    kernels = [op for op in graph.ops if not op.is_view]
    assert sum(c.n_ops for c in errors) == len(kernels)
    for c in errors:
        ops = [op for op in kernels if op.op_class == c.op_class]
        assert c.n_ops == len(ops)
        assert c.predicted_us == pytest.approx(sum(prof.kernel_us(op, 1) for op in ops))
        assert c.measured_us > 0 and c.ratio == pytest.approx(c.predicted_us / c.measured_us)
    assert [c.measured_us for c in errors] == sorted((c.measured_us for c in errors), reverse=True)


def test_seen_signatures_are_left_out_and_a_slower_model_shows_in_the_ratio(traced) -> None:  # type: ignore[no-untyped-def]
    graph, trace = traced
    base = make_profile()
    conv = next(op for op in graph.ops if op.op_class == "convolution")
    sig = graph_signatures(graph)[conv.id]
    seen = make_profile(signatures={sig: {1: 5.0}})
    n_conv = sum(1 for op in graph.ops if graph_signatures(graph)[op.id] == sig)
    before = {c.op_class: c for c in op_class_errors(graph, trace, base)}
    after = {c.op_class: c for c in op_class_errors(graph, trace, seen)}
    assert n_conv >= 1
    assert sum(c.n_ops for c in after.values()) == sum(c.n_ops for c in before.values()) - n_conv
    assert after.get("convolution", ClassError("convolution", 0, 0.0, 0.0, 0.0)).n_ops == before["convolution"].n_ops - n_conv
    model = base.fallback.model
    slow = dataclasses.replace(base, fallback=ClassFit("work_threads", model.scaled(2.0), None, None, 5.0, 20, 10, 0))
    doubled = {c.op_class: c for c in op_class_errors(graph, trace, slow)}
    relu = before["relu"]
    assert doubled["relu"].predicted_us == pytest.approx(2 * relu.predicted_us)
    # The ratio shows it. (Not necessarily the mean |log ratio|: CI once measured half the
    # relus at twice and half at half their prediction, and doubling it kept that mean.)
    assert doubled["relu"].ratio == pytest.approx(2 * relu.ratio)


def test_pooled_sums_class_by_class_and_round_trips() -> None:
    a = [ClassError("mm", 2, 100.0, 150.0, 2 * math.log(1.5)), ClassError("add", 1, 10.0, 5.0, math.log(2.0))]
    b = [ClassError("mm", 1, 300.0, 300.0, 0.0)]
    (mm, add) = pooled([a, b])
    assert (mm.op_class, mm.n_ops, mm.measured_us, mm.predicted_us) == ("mm", 3, 400.0, 450.0)
    assert mm.mean_abs_log == pytest.approx(2 * math.log(1.5) / 3) and add.ratio == 0.5
    assert ClassError.from_json(mm.to_json()).mean_abs_log == pytest.approx(round(mm.mean_abs_log, 4))
