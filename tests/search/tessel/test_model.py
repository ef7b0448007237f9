"""Tessel's search on a model (`search.tessel.model`): a model's stages as the V shape
with their own F, I and W times, searched and written into a pipeline plan."""

from __future__ import annotations

import pytest

from schedlab.cli.common import plan_step_of
from schedlab.graph import Graph, Op, OpKind
from schedlab.machine import host_ranks
from schedlab.pipeline import check_schedule
from schedlab.pipeline.generators import generate
from schedlab.pipeline.schedule import orders_from_rows
from schedlab.plan import Plan, PlanError, resolve
from schedlab.search.tessel.model import StageTimes, model_shape, stage_times_us, with_tessel_schedule

TWO = host_ranks(2)


def graph_of(micro_batches: int = 1, model: str = "mlp") -> Graph:
    return plan_step_of(model, "tiny", "sgd", 0, replicas=1, cache=True, micro_batches=micro_batches).graph


def one_us(op: Op, threads: int) -> float:
    assert threads == 1  # stages are weighed at one thread
    return 1.0


def test_stage_times_sum_each_part_of_the_step_but_the_update() -> None:
    g = graph_of()
    times = stage_times_us(g, 2, one_us)
    assert len(times) == 2 and all(t.f_us > 0 and t.i_us + t.w_us > 0 for t in times)
    not_update = sum(1 for op in g.ops if op.kind is not OpKind.OPT)
    assert sum(t.f_us + t.i_us + t.w_us for t in times) == not_update  # every op once, the update left out
    assert sum(t.f_us for t in times) == sum(1 for op in g.ops if op.kind is OpKind.F)


def test_the_shape_is_a_chain_scaled_to_the_busiest_device() -> None:
    shape = model_shape([StageTimes(100.0, 50.0, 50.0), StageTimes(300.0, 60.0, 40.0)])
    assert [st.devices for st in shape.stages] == [(0,), (1,)]
    assert [st.next for st in shape.stages] == [(1,), ()]
    assert shape.stages[1].f_time + shape.stages[1].b_time == pytest.approx(1.0)
    assert shape.stages[0].f_time == pytest.approx(0.25) and shape.stages[0].b_time == pytest.approx(0.25)


def test_a_tessel_plan_holds_its_actions_and_resolves_on_two_ranks() -> None:
    m = 4
    graph = graph_of(m)
    plan, result = with_tessel_schedule(Plan(), ("cpu0", "cpu1"), graph_of(), m, None, one_us)
    assert result.repetend_time == pytest.approx(result.lower_bound)  # a chain has a zero-bubble repetend
    assert isinstance(plan.schedule, tuple) and plan.stage_map == "loop" and plan.micro_batches == m
    orders, _ = orders_from_rows(plan.schedule)
    assert [len(o) for o in orders] == [2 * m, 2 * m]  # each device: F and B of every micro-batch
    assert set(resolve(graph, plan, TWO).device) == {"cpu0", "cpu1"}
    # On the V shape, Tessel's F/B blocks give 1F1B's makespan: the bubble is only in warm-up and cool-down.
    one_f_one_b = check_schedule(generate("1f1b", result.schedule.shape, m)).makespan
    assert check_schedule(result.schedule).makespan == pytest.approx(one_f_one_b)
    again = Plan.from_json(plan.to_json())
    assert again.hash == plan.hash  # plain data: the schedule travels in the plan file


def test_a_stage_count_other_than_the_devices_is_refused() -> None:
    with pytest.raises(PlanError, match="one stage per device: 2 stages, not 3"):
        with_tessel_schedule(Plan(), ("cpu0", "cpu1"), graph_of(), 2, 3, one_us)
