"""A plan changes speed, never results: every policy and slot count matches eager PyTorch."""

from __future__ import annotations

import pytest

from schedlab.exec import Executor, NumericCheck, check_step
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload

ORDERS = ["topo", "critical-path", "w-last", "random:3"]
WORKLOADS = ["mlp", "cnn", "transformer", "nmt", "tests.fixtures.user_model:make", "tests.fixtures.conv_bn:make"]


def _check(name: str, optimizer: str, plan: Plan) -> NumericCheck:
    w, c = captured_workload(name, optimizer)
    ex = Executor(c.graph, resolve(c.graph, plan, detect_host()))
    return check_step(w.module, c.graph, c.input_values, lambda iv: ex.step(iv)[0])


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("slots", [1, 2])
def test_sgd_step_matches_eager(name: str, order: str, slots: int) -> None:
    check = _check(name, "sgd", Plan(slots=slots, threads=1 if slots == 2 else None, order=order))
    assert check.ok(), check.describe()


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("slots", [1, 2])
def test_adam_step_matches_eager(name: str, slots: int) -> None:
    check = _check(name, "adam", Plan(slots=slots, threads=1, order="w-last"))
    assert check.ok(), check.describe()


def test_multi_step_training_lowers_the_loss() -> None:
    from schedlab.exec import next_inputs, run_steps
    from schedlab.graph import OutputRole

    _, c = captured_workload("mlp", "adam")
    g = c.graph
    ex = Executor(g, resolve(g, Plan(), detect_host()))
    loss_v = g.output(OutputRole.LOSS).value
    inputs = dict(c.input_values)
    losses = []
    for _ in range(10):
        out, _rec = ex.step(inputs)
        losses.append(float(out[loss_v]))
        inputs = next_inputs(g, inputs, out)
    assert losses[-1] < losses[0]  # updates feed the next step: training makes progress
    res = run_steps(g, c.input_values, Plan(), steps=3, warmup=0)
    assert {e.step for e in res.trace.events} == {0, 1, 2}
