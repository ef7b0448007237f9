"""A pipeline with data-parallel replicas: each replica runs the schedule on its own group
of devices, each stage's gradients are averaged over the devices that hold that stage,
the simulator prices the all-reduces, and bad plans get one clear error."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.capture import capture
from schedlab.data_parallel import PlanStep
from schedlab.distribute import ALL_REDUCE
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind, OutputRole
from schedlab.machine import Device, Machine, host_ranks
from schedlab.microbatch import PipelineStep, pipeline_step
from schedlab.pipeline.generators import parse_name
from schedlab.plan import Plan, PlanError, ResolvedPlan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import TableCost
from schedlab.workloads import load_workload

FOUR = host_ranks(4, Machine("four", (Device("cpu0", "cpu", 4, 8 * 2**30),)))
TWO = host_ranks(2, Machine("two", (Device("cpu0", "cpu", 2, 8 * 2**30),)))
_STEPS: dict[tuple[str, int, int], PlanStep] = {}


def step_of(model: str, micro_batches: int, replicas: int) -> PlanStep:
    """The step a plan of `replicas` and `micro_batches` captures (with one micro-batch, the data-parallel one)."""
    key = (model, micro_batches, replicas)
    if key not in _STEPS:
        step = pipeline_step(load_workload(model, "tiny"), micro_batches, lambda w: capture(w, "sgd"), replicas)
        assert isinstance(step, PipelineStep) == (micro_batches > 1)
        _STEPS[key] = step
    return _STEPS[key]


def hybrid_plan(schedule: str, micro_batches: int, stages: int, replicas: int = 2,
                devices: tuple[str, ...] = ("cpu0", "cpu1")) -> Plan:
    return Plan(threads=1, micro_batches=micro_batches, stages=stages, schedule=schedule, pipeline_devices=devices,
                stage_map=parse_name(schedule)[0].stage_map, replicas=replicas)


def actions_on(r: ResolvedPlan, run: Graph, dev: str) -> list[str]:
    tags = run.meta["pipeline_actions"]
    out: list[str] = []
    for i in (i for i in r.sequence if r.device[i] == dev):
        if tags[i] and (not out or out[-1] != tags[i]):
            out.append(tags[i])
    return out


def test_each_replica_runs_the_schedule_on_its_group_and_each_stage_is_averaged_over_its_copies() -> None:
    step = step_of("mlp", 2, 2)
    r = resolve(step.graph, hybrid_plan("1f1b", 2, 2), FOUR)
    run = r.run_graph(step.graph)
    assert set(r.device) == {"cpu0", "cpu1", "cpu2", "cpu3"}
    # replica 1 (cpu2, cpu3) runs exactly replica 0's rows (cpu0, cpu1)
    assert actions_on(r, run, "cpu2") == actions_on(r, run, "cpu0") != []
    assert actions_on(r, run, "cpu3") == actions_on(r, run, "cpu1") != []
    reduces = [op for op in run.ops if op.target == ALL_REDUCE]
    groups = {tuple(op.kwargs["group"]) for op in reduces}
    assert groups == {("cpu0", "cpu2"), ("cpu1", "cpu3")}  # one group per stage, never across stages
    for op in reduces:
        assert r.device[op.id] in op.kwargs["group"]
        assert {r.device[run.producer[v]] for v in op.inputs} == {r.device[op.id]}
    # every gradient the step returns, and every one the optimizer reads, is an average
    made_by = {v: run.ops[run.producer[v]].target for v in run.producer}
    grads = [o for o in run.outputs if o.role is OutputRole.GRAD]
    assert grads and all(made_by[o.value] == ALL_REDUCE for o in grads)
    pos = {i: k for k, i in enumerate(r.sequence)}
    for op in run.ops:
        if op.kind is OpKind.OPT:
            for v in op.inputs:
                if v in run.producer and made_by[v] == ALL_REDUCE:
                    assert pos[run.producer[v]] < pos[op.id]


def test_interleaved_stages_on_one_device_average_each_stage_as_soon_as_its_backward_ends() -> None:
    step = step_of("transformer", 1, 2)
    r = resolve(step.graph, hybrid_plan("interleaved:2", 1, 4), FOUR)
    run = r.run_graph(step.graph)
    stage_tags = run.meta["pipeline_actions"]
    for dev in ("cpu0", "cpu1", "cpu2", "cpu3"):
        mine = [i for i in r.sequence if r.device[i] == dev]
        buckets = [int(run.ops[i].kwargs["bucket"]) for i in mine if run.ops[i].target == ALL_REDUCE]
        assert len(buckets) >= 2 and buckets == sorted(buckets), (dev, buckets)  # every rank issues them in order
        # the later stage's all-reduce is issued before this device's last backward work:
        # it overlaps the earlier stage's backward instead of waiting for the whole step
        first_reduce = next(k for k, i in enumerate(mine) if run.ops[i].target == ALL_REDUCE)
        last_backward = max(k for k, i in enumerate(mine) if "B" in stage_tags[i])
        assert first_reduce < last_backward, dev


def test_the_simulator_prices_the_replicas_all_reduces_on_the_links() -> None:
    step = step_of("mlp", 2, 2)
    plan = hybrid_plan("1f1b", 2, 2)
    cost = TableCost(default_kernel_us=10.0, dispatch=5.0)
    one_graph = dataclasses.replace(step.graph, meta={k: v for k, v in step.graph.meta.items() if k != "replicas"})

    def on_links(machine: Machine, bw_bytes_per_s: float) -> Machine:
        return dataclasses.replace(machine, links=tuple(
            dataclasses.replace(link, bw_bytes_per_s=bw_bytes_per_s, latency_s=0.0) for link in machine.links))

    def extra_s(bw_bytes_per_s: float) -> float:
        four, two = on_links(FOUR, bw_bytes_per_s), on_links(TWO, bw_bytes_per_s)
        hybrid = simulate(step.graph, resolve(step.graph, plan, four), four, cost)
        single = simulate(one_graph, resolve(one_graph, dataclasses.replace(plan, replicas=1), two), two, cost)
        assert hybrid.collective_count == 2  # one per stage's bucket
        ends = {d: s.end_s for s in hybrid.ranks.values() for d in s.devices}
        assert ends["cpu0"] == pytest.approx(ends["cpu2"]) and ends["cpu1"] == pytest.approx(ends["cpu3"])
        return hybrid.step_time_s - single.step_time_s

    grad_bytes = sum(v.nbytes for v in (step.graph.values[o.value] for o in step.graph.outputs
                                         if o.role is OutputRole.GRAD) if v is not None)
    slow_bw = grad_bytes / 1e-3  # a stage's share of the gradients takes a good part of a millisecond
    assert extra_s(1e18) >= 0
    assert extra_s(slow_bw) > extra_s(1e18) + 2e-4


def test_every_replica_runs_with_the_first_replicas_per_device_slots_and_threads() -> None:
    step = step_of("mlp", 2, 2)
    eight = host_ranks(4, Machine("eight", (Device("cpu0", "cpu", 8, 8 * 2**30),)))  # 2 cores a rank
    plan = dataclasses.replace(hybrid_plan("1f1b", 2, 2), device_slots={"cpu1": 2}, device_threads={"cpu0": 2})
    r = resolve(step.graph, plan, eight)
    assert r.device_slots == {"cpu0": 1, "cpu1": 2, "cpu2": 1, "cpu3": 2}
    run = r.run_graph(step.graph)
    threads = {(r.device[op.id], r.threads[op.id]) for op in run.ops if op.kind is not OpKind.COMM}
    assert threads == {("cpu0", 2), ("cpu1", 1), ("cpu2", 2), ("cpu3", 1)}
    own = dataclasses.replace(plan, device_slots={"cpu1": 2, "cpu3": 1})  # a replica's own setting stands
    assert resolve(step.graph, own, eight).device_slots["cpu3"] == 1


@pytest.mark.parametrize(
    ("plan", "msg"),
    [
        (hybrid_plan("1f1b", 2, 2, replicas=3), "3 replicas do not divide the 4 devices"),
        (hybrid_plan("1f1b", 2, 2, devices=("cpu0", "cpu2")), "first replica's devices.*Not: cpu2"),
        (hybrid_plan("1f1b", 2, 2, replicas=4, devices=("cpu0",)), "captured for 2 replica"),
    ],
)
def test_bad_pipeline_plans_with_replicas_give_one_clear_error(plan: Plan, msg: str) -> None:
    with pytest.raises(PlanError, match=msg):
        resolve(step_of("mlp", 2, 2).graph, plan, FOUR)


def test_a_batch_the_replicas_micro_batches_do_not_divide_says_both_counts() -> None:
    with pytest.raises(SchedlabError, match="batch must divide by 2 x 3"):
        pipeline_step(load_workload("mlp", "tiny"), 3, lambda w: capture(w, "sgd"), replicas=2)
