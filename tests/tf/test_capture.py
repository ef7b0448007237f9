"""The TensorFlow step captured as a schedlab Graph, and its timed steps as a Trace."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from schedlab.graph import InputRole, OpKind, OutputRole
from tests.tf import IN_PROCESS, tiny_models


@pytest.fixture(scope="module")
def mlp_run():  # type: ignore[no-untyped-def]
    from schedlab.exec.tf_run import run_tensorflow

    return run_tensorflow(tiny_models.mlp(), IN_PROCESS, steps=3, warmup=1)


def test_captured_graph_has_every_parameter_gradient_update_and_the_loss(mlp_run) -> None:  # type: ignore[no-untyped-def]
    g = mlp_run.graph
    g.validate()
    params = [i.name for i in g.inputs if i.role is InputRole.PARAM]
    assert params == ["body.0.weight", "body.0.bias", "head.weight", "head.bias"]
    assert {i.name for i in g.inputs if i.role is InputRole.USER} == {"input0", "input1"}
    for role in (OutputRole.GRAD, OutputRole.PARAM):
        assert sorted(o.name for o in g.outputs if o.role is role) == sorted(params)
    assert g.output(OutputRole.LOSS).name == "loss"
    assert g.meta["backend"] == "tensorflow"


def test_kinds_and_layers_follow_data_flow(mlp_run) -> None:  # type: ignore[no-untyped-def]
    g = mlp_run.graph
    by_name = {op.name: op for op in g.ops}
    updates = [op for op in g.ops if op.target == "tf.ResourceApplyGradientDescent"]
    assert len(updates) == 4 and all(op.kind is OpKind.OPT for op in updates)
    assert {op.layer for op in updates} == {"body.0", "head"}
    # The weight gradient of the first layer feeds only that layer: W, and deferrable.
    grad_w0 = g.ops[g.producer[g.output(OutputRole.GRAD, "body.0.weight").value]]
    assert grad_w0.kind is OpKind.W and grad_w0.layer == "body.0"
    assert grad_w0.op_class == "mm"
    # The loss and everything before it is forward.
    loss_op = g.ops[g.producer[g.output(OutputRole.LOSS).value]]
    assert loss_op.kind is OpKind.F
    assert any(op.kind is OpKind.B for op in g.ops)  # the loss gradient seeds both layers
    assert "body.0/Relu" in by_name or any(op.layer == "body.0" and op.kind is OpKind.F for op in g.ops)


def test_matmul_work_comes_from_shapes(mlp_run) -> None:  # type: ignore[no-untyped-def]
    g = mlp_run.graph
    mms = [op for op in g.ops if op.op_class in ("mm", "addmm") and op.kind is OpKind.F and op.layer == "body.0"]
    assert mms, "no forward matmul in body.0"
    assert mms[0].flops == 2.0 * 8 * 32 * 64  # batch x in x hidden multiply-adds


def test_numerics_match_tf_eager(mlp_run) -> None:  # type: ignore[no-untyped-def]
    assert mlp_run.check.numerics_ok, mlp_run.check.describe()
    assert mlp_run.check.max_abs_grad_diff < 1e-4
    assert mlp_run.torch_check is None  # no torch module behind this model


def test_trace_events_are_the_captured_ops_once_per_step(mlp_run) -> None:  # type: ignore[no-untyped-def]
    g, trace = mlp_run.graph, mlp_run.trace
    assert len(mlp_run.step_times_s) == 3
    assert trace.meta["backend"] == "tensorflow" and trace.source == "exec"
    for step in range(3):
        ops = [e.op for e in trace.step_events(step)]
        assert len(ops) == len(set(ops))
        assert set(ops) <= set(range(len(g)))
        heavy = {op.id for op in g.ops if op.flops > 1000}
        assert heavy <= set(ops)  # every kernel that computes something was timed
        assert all(e.end_ns >= e.start_ns >= 0 for e in trace.step_events(step))
    for e in trace.events:
        assert e.name == g.ops[e.op].name and e.kind == g.ops[e.op].kind.value


def test_buffer_updates_are_forward_outputs() -> None:
    from schedlab.exec.tf_run import run_tensorflow

    run = run_tensorflow(tiny_models.with_running_mean(), IN_PROCESS, steps=1, warmup=0)
    g = run.graph
    buf = g.output(OutputRole.BUFFER, "norm.running_mean")
    writer = g.ops[g.producer[buf.value]]
    assert writer.target == "tf.AssignVariableOp" and writer.kind is OpKind.F
    assert g.values[buf.value] is not None and g.values[buf.value].alias_of is not None  # in place
    assert run.check.numerics_ok, run.check.describe()


def test_adam_step_is_captured_and_checked_as_tensorflow_computes_it() -> None:
    """TF's own Adam (one ResourceApplyAdam per parameter, tagged OPT, its gradient input the
    parameter's GRAD output); the first step's parameters equal TF's Adam formula applied to
    TF eager's gradients, and a later step moves them again (the moments are initialised)."""
    import numpy as np

    from schedlab.exec.tf_run import run_tensorflow
    from schedlab.tf.step import expected_update

    run = run_tensorflow(tiny_models.mlp(), IN_PROCESS, steps=2, warmup=0, optimizer="adam")
    assert run.check.numerics_ok, run.check.describe()
    g = run.graph
    updates = [op for op in g.ops if op.target == "tf.ResourceApplyAdam"]
    assert len(updates) == 4 and all(op.kind is OpKind.OPT for op in updates)
    assert g.meta["optimizer"] == "adam"
    for o in (o for o in g.outputs if o.role is OutputRole.GRAD):
        assert any(o.value == op.inputs[-1] for op in updates), o.name
    # the reference rule: about lr * sign(grad) on a first step, not SGD's lr * grad
    p, grad = np.ones(3, np.float32), np.array([1e-3, -2.0, 0.0], np.float32)
    step = p - expected_update("adam", 1e-3, p, grad)
    assert step[:2] == pytest.approx([1e-3, -1e-3], rel=1e-3) and step[2] == 0.0
