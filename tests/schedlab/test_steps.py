"""Steady state: S steps back to back as one unrolled graph, and the reverse-first-k order."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.capture import capture
from schedlab.data_parallel import plan_step
from schedlab.distribute import ALL_REDUCE, RECV, SEND
from schedlab.errors import SchedlabError
from schedlab.exec import Executor, check_step
from schedlab.graph import InputRole, OpKind, OutputRole
from schedlab.machine import Device, Link, Machine, host_ranks
from schedlab.order import priorities, weight_layers
from schedlab.plan import DEFAULT_STEADY_STEPS, Plan, PlanError, list_schedule, resolve, steady_steps
from schedlab.sim import simulate
from schedlab.sim.testing import TableCost
from schedlab.steps import as_step_outputs, step_of, unroll
from tests.conftest import captured_workload

HOST = Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),))
HOST2 = host_ranks(2, HOST)


def test_unroll_feeds_each_step_the_updates_of_the_one_before() -> None:
    _, c = captured_workload("mlp")
    g = c.graph  # type: ignore[attr-defined]
    u = unroll(g, 3)
    n, V = len(g.ops), len(g.values)
    assert len(u.ops) == 3 * n and u.meta["step_ops"] == n and u.meta["unrolled_from"] == g.hash
    assert [step_of(u, i) for i in (0, n - 1, n, 3 * n - 1)] == [0, 0, 1, 2]
    param = next(i for i in g.inputs if i.role is InputRole.PARAM)
    updated = g.output(OutputRole.PARAM, param.name).value
    readers0 = [op.id for op in g.ops if param.value in op.inputs]
    # step 1's copies of those readers read step 0's update, step 2's read step 1's
    assert all(updated in u.ops[n + r].inputs for r in readers0)
    assert all(updated + V in u.ops[2 * n + r].inputs for r in readers0)
    user = next(i for i in g.inputs if i.role is InputRole.USER)
    user_readers = [op.id for op in g.ops if user.value in op.inputs]
    assert all(user.value in u.ops[2 * n + r].inputs for r in user_readers)  # the same batch every step
    assert u.output(OutputRole.PARAM, param.name).value == updated + 2 * V  # the outputs are the last step's
    assert unroll(g, 1) is g


def test_unrolled_comm_ops_stay_unique_per_step() -> None:
    w, _ = captured_workload("mlp")
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    r = resolve(step.graph, Plan(threads=1, device="cpu0", layer_devices={"head": "cpu1"}), HOST2, steps=3)
    g = r.run_graph(step.graph)
    tags = [op.kwargs["tag"] for op in g.ops if op.target == SEND]
    assert tags and len(tags) == len(set(tags)) == 3 * len(tags) // 3
    assert sorted(tags) == sorted(op.kwargs["tag"] for op in g.ops if op.target == RECV)
    dp = resolve(step.graph, Plan(threads=1, replicas=2, bucket_mb=0.01), HOST2, steps=2)
    G = dp.run_graph(step.graph)
    per_rank: dict[str, list[int]] = {}
    for op in G.ops:
        if op.target == ALL_REDUCE:
            per_rank.setdefault(dp.device[op.id], []).append(op.kwargs["bucket"])
    buckets = list(per_rank.values())
    assert buckets[0] == buckets[1] and len(set(buckets[0])) == len(buckets[0])  # one global issue order
    seq_buckets = [G.ops[o].kwargs["bucket"] for o in dp.sequence if G.ops[o].target == ALL_REDUCE and dp.device[o] == "cpu0"]
    assert seq_buckets == sorted(seq_buckets)


def test_steps_bounds_are_checked() -> None:
    _, c = captured_workload("mlp")
    for bad in (0, 1000):
        with pytest.raises(SchedlabError, match="steps must be between"):
            resolve(c.graph, Plan(), HOST, steps=bad)  # type: ignore[attr-defined]
    with pytest.raises(SchedlabError, match="already unrolled"):
        unroll(unroll(c.graph, 2), 2)  # type: ignore[attr-defined]
    assert steady_steps(Plan(order="reverse-first-k:1"), None) == DEFAULT_STEADY_STEPS
    assert steady_steps(Plan(), None) == 1 and steady_steps(Plan(), 3) == 3


def test_reverse_first_k_defers_the_first_layers_weight_gradients_in_ascending_order() -> None:
    _, c = captured_workload("mlp")
    g = c.graph  # type: ignore[attr-defined]
    layers = weight_layers(g)
    assert len(layers) >= 3
    seq = list_schedule(g, priorities(g, "reverse-first-k:2"))
    pos = {o: k for k, o in enumerate(seq)}
    grads = {o.name: g.producer[o.value] for o in g.outputs if o.role is OutputRole.GRAD}
    first, second = (grads[f"{layer}.weight"] for layer in layers[:2])
    last = grads[f"{layers[2]}.weight"]
    # layer 0's weight gradient is ready before layer 1's, and both after the other layers'
    assert pos[last] < pos[first] < pos[second]
    w_of = {layer: [op.id for op in g.ops if op.kind is OpKind.W and op.layer == layer] for layer in layers}
    topo = list_schedule(g, priorities(g, "topo"))
    assert min(topo.index(o) for o in w_of[layers[1]]) < min(topo.index(o) for o in w_of[layers[0]])
    for bad in ("reverse-first-k:0", "reverse-first-k:x"):
        with pytest.raises(PlanError, match="reverse-first-k"):
            resolve(g, Plan(order=bad), HOST)


@pytest.mark.parametrize("slots", [1, 2])
def test_an_unrolled_run_matches_as_many_eager_steps(slots: int) -> None:
    w, c = captured_workload("mlp")
    g = c.graph  # type: ignore[attr-defined]
    r = resolve(g, Plan(slots=slots, threads=1, order="reverse-first-k:2"), HOST, steps=3)
    G = r.run_graph(g)
    ex = Executor(G, r)
    outputs = as_step_outputs(g, G, ex.step(c.input_values)[0])  # type: ignore[attr-defined]
    check = check_step(w.module, g, c.input_values, lambda iv: outputs, steps=3)  # type: ignore[attr-defined]
    assert check.ok(), check.describe()
    # the guard tells three steps from one
    assert not check_step(w.module, g, c.input_values, lambda iv: outputs, steps=1).ok()  # type: ignore[attr-defined]


def _slow_links(latency_s: float) -> Machine:
    return dataclasses.replace(HOST2, links=tuple(
        Link(a.id, b.id, 1e9, latency_s, "loopback") for a in HOST2.devices for b in HOST2.devices if a.id != b.id
    ))


def test_steady_state_overlaps_a_steps_gradient_reduction_with_the_next_forward() -> None:
    """With slow all-reduces, the steady-state sequence starts step 1's forward before step
    0's last update, and the simulator predicts a shorter step than one at a time."""
    w, _ = captured_workload("mlp")
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    machine = _slow_links(2e-3)
    plan = Plan(threads=1, replicas=2, bucket_mb=0.001, order="reverse-first-k:2")
    one = resolve(step.graph, plan, machine)
    ss = resolve(step.graph, plan, machine, steps=3)
    G = ss.run_graph(step.graph)
    m = G.meta["step_ops"]
    rank0 = [o for o in ss.sequence if ss.device[o] == "cpu0"]
    last_opt0 = max(k for k, o in enumerate(rank0) if o < m and G.ops[o].kind is OpKind.OPT)
    first_fwd1 = min(k for k, o in enumerate(rank0) if m <= o < 2 * m and G.ops[o].kind is OpKind.F)
    assert first_fwd1 < last_opt0
    cost = TableCost(default_kernel_us=50.0, dispatch=5.0)
    t_one = simulate(step.graph, one, machine, cost).step_time_s
    t_ss = simulate(step.graph, ss, machine, cost).step_time_s
    assert t_ss < t_one


def test_the_exec_backend_runs_a_steady_state_plan_as_its_unrolled_graph() -> None:
    from schedlab.exec.backend import ExecBackend

    _, c = captured_workload("mlp")
    g = c.graph  # type: ignore[attr-defined]
    r = resolve(g, Plan(threads=1), HOST, steps=2)
    run = ExecBackend(c.input_values, warmup=0).run(g, r, HOST, steps=1)  # type: ignore[attr-defined]
    assert len(run.step_times_s) == 1 and run.trace.meta["steps_per_run"] == 2
    assert len(run.trace.events) == 2 * len(g.ops)
