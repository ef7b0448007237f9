"""Search spaces: every sampled plan resolves; parametrised orders are valid and reach the named ones."""

from __future__ import annotations

import optuna
import pytest

from schedlab.graph import OpKind
from schedlab.order import priorities
from schedlab.plan import Plan, list_schedule, resolve
from schedlab.search.space import ONE_DEVICE_SPACES, OrderParams, SearchSpace, heaviest_classes, parametric_order
from schedlab.sim.testing import cpu_machine, random_cost
from tests.conftest import captured_workload


def _graph(name: str = "transformer"):  # type: ignore[no-untyped-def]
    return captured_workload(name)[1].graph  # type: ignore[attr-defined]


@pytest.mark.parametrize("space_name", ONE_DEVICE_SPACES)
@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_sampled_plans_resolve(space_name: str, workload: str) -> None:
    graph = _graph(workload)
    machine = cpu_machine(4)
    space = SearchSpace(space_name, graph, machine, random_cost(0))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_orders = set()
    for _ in range(25):
        trial = study.ask()
        plan = space.suggest(trial)
        r = resolve(graph, plan, machine)  # raises if the plan is invalid
        assert 1 <= r.slots <= 4 and all(1 <= k <= 4 for k in r.threads)
        assert Plan.from_json(plan.to_json()).hash == plan.hash
        assert space.plan(trial.params).hash == plan.hash  # params alone rebuild the plan
        seen_orders.add(plan.order if isinstance(plan.order, str) else "explicit")
        study.tell(trial, 1.0)
    if space_name == "concurrency":
        assert seen_orders == {"critical-path"}
    else:
        assert "explicit" in seen_orders and len(seen_orders) >= 3


def test_concurrency_params_cover_the_heaviest_classes() -> None:
    graph = _graph()
    cost = random_cost(0)
    space = SearchSpace("concurrency", graph, cpu_machine(4), cost, heavy_classes=3)
    assert space.classes == heaviest_classes(graph, cost, 3) and len(space.classes) == 3
    params = {"slots": 2, "threads": 1, **{f"threads.{c}": 3 for c in space.classes}}
    plan = space.plan(params)
    assert plan.slots == 2 and plan.threads == 1 and plan.class_threads == dict.fromkeys(space.classes, 3)


def test_parametric_order_spans_program_order_critical_path_and_w_last() -> None:
    graph = _graph()
    space = SearchSpace("order", graph, cpu_machine(4), random_cost(0))
    n = len(graph.ops)
    assert parametric_order(graph, OrderParams(), space.up_us) == tuple(range(n))
    w_last = list_schedule(graph, priorities(graph, "w-last"))
    assert parametric_order(graph, OrderParams(w_defer_frac=1.0, w_defer_dist=1.0), space.up_us) == w_last
    cp = parametric_order(graph, OrderParams(cp_weight=1.0), space.up_us)
    assert cp != tuple(range(n)) and sorted(cp) == list(range(n))


def test_partial_deferral_moves_only_the_first_w_ops() -> None:
    graph = _graph()
    space = SearchSpace("order", graph, cpu_machine(4), random_cost(0))
    seq = parametric_order(graph, OrderParams(w_defer_frac=0.5, w_defer_dist=1.0), space.up_us)
    pos = {op: i for i, op in enumerate(seq)}
    w_ops = [op.id for op in graph.ops if op.kind is OpKind.W]
    half = (len(w_ops) + 1) // 2
    deferred, kept = w_ops[:half], w_ops[half:]
    # deferred W ops move later than in program order; the others keep their place relative to their neighbours
    assert sum(pos[i] - i for i in deferred) > 0
    assert sum(pos[i] - i for i in kept) <= sum(pos[i] - i for i in deferred)


def test_unknown_space_is_one_clear_error() -> None:
    from schedlab.errors import SchedlabError

    with pytest.raises(SchedlabError, match="unknown search space"):
        SearchSpace("bogus", _graph("mlp"), cpu_machine(2), random_cost(0))
