"""Data-parallel plans on real ranks: the replicated step, its gradients averaged by the
ranks' all-reduces, matches eager PyTorch on the full batch."""

from __future__ import annotations

import pytest

from schedlab.capture import capture
from schedlab.data_parallel import plan_step
from schedlab.exec.check import check_step
from schedlab.exec.launch import run_ranks
from schedlab.layer_split import layer_split
from schedlab.machine import Device, Machine, host_ranks
from schedlab.plan import Plan, resolve
from schedlab.steps import as_step_outputs
from tests.conftest import captured_workload
from tests.exec.test_dist import four_core_ranks

HOST2 = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),)))


def run_dp(model: str, bucket_mb: float, slots: int = 1) -> tuple[object, object]:
    w, _ = captured_workload(model)
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    machine = HOST2 if slots == 1 else four_core_ranks(2)  # co-run slots need cores to resolve
    r = resolve(step.graph, Plan(threads=1, slots=slots, replicas=2, bucket_mb=bucket_mb), machine)
    run_graph = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, machine, step.inputs_for(run_graph), steps=2, warmup=1, timeout_s=60,
                    want_outputs=True, workload=model)
    outputs = step.as_full(run_graph, res.outputs or {})
    check = check_step(w.module, step.full.graph, step.full.input_values, lambda iv: outputs)  # type: ignore[attr-defined]
    return res, check


def test_data_parallel_on_two_ranks_matches_eager_on_the_full_batch() -> None:
    res, check = run_dp("transformer", bucket_mb=0.01)  # several buckets
    assert check.ok(), check.describe()  # type: ignore[attr-defined]
    assert res.ranks == 2  # type: ignore[attr-defined]
    kinds = {e.kind for e in res.trace.events}  # type: ignore[attr-defined]
    assert "COMM" in kinds


@pytest.mark.slow
@pytest.mark.parametrize(("model", "slots"), [("mlp", 1), ("nmt", 1), ("transformer", 2)])
def test_data_parallel_matches_eager_slow(model: str, slots: int) -> None:
    _, check = run_dp(model, bucket_mb=25.0, slots=slots)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]


USER = "tests.fixtures.user_model:make"


def test_a_user_model_placed_and_replicated_on_real_ranks() -> None:
    """A model nobody here wrote: its second layer on rank 1, then two replicas of it."""
    w, c = captured_workload(USER)
    g = c.graph  # type: ignore[attr-defined]
    r = resolve(g, Plan(threads=1, device="cpu0", layer_devices={"fc2": "cpu1"}), HOST2)
    res = run_ranks(g, r, HOST2, c.input_values, steps=1, warmup=0, timeout_s=60, want_outputs=True)  # type: ignore[attr-defined]
    check = check_step(w.module, g, c.input_values, lambda iv: res.outputs or {})  # type: ignore[attr-defined]
    assert check.ok(), check.describe()
    res, check = run_dp(USER, bucket_mb=25.0)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]


def run_steady(model: str, order: str, steps: int, placed: bool = False) -> tuple[object, object]:
    """A data-parallel plan (or, `placed`, the expert layer split) run `steps` steps back to
    back on two ranks, against as many eager steps."""
    w, c = captured_workload(model)
    if placed:
        g = c.graph  # type: ignore[attr-defined]
        plan = Plan(threads=1, device="cpu0", layer_devices=layer_split(g, ["cpu0", "cpu1"]), order=order)
        r = resolve(g, plan, HOST2, steps=steps)
        res = run_ranks(g, r, HOST2, c.input_values, steps=1, warmup=0, timeout_s=60, want_outputs=True)  # type: ignore[attr-defined]
        outputs = as_step_outputs(g, r.run_graph(g), res.outputs or {})
        return res, check_step(w.module, g, c.input_values, lambda iv: outputs, steps=steps)  # type: ignore[attr-defined]
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    r = resolve(step.graph, Plan(threads=1, replicas=2, bucket_mb=0.01, order=order), HOST2, steps=steps)
    run_graph = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, HOST2, step.inputs_for(run_graph), steps=1, warmup=0, timeout_s=60,
                    want_outputs=True, workload=model)
    outputs = step.as_full(run_graph, res.outputs or {})
    check = check_step(w.module, step.full.graph, step.full.input_values, lambda iv: outputs, steps=steps)  # type: ignore[attr-defined]
    return res, check


def test_reverse_first_k_in_steady_state_on_two_ranks_matches_eager() -> None:
    res, check = run_steady("mlp", "reverse-first-k:2", steps=3)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]
    assert res.trace.meta["steps_per_run"] == 3  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "placed"), [("cnn", True), ("transformer", False), ("nmt", False), ("nmt", True), (USER, False)])
def test_reverse_first_k_in_steady_state_matches_eager_slow(model: str, placed: bool) -> None:
    _, check = run_steady(model, "reverse-first-k:3", steps=2, placed=placed)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]
