"""Seed strategies: valid plans; paper-concurrency takes the model's best threads; ooo defers W ops."""

from __future__ import annotations

import pytest

from schedlab.graph import Op, OpKind
from schedlab.plan import resolve
from schedlab.search.strategies import (
    STRATEGIES,
    best_threads,
    compress_threads,
    ooo,
    paper_concurrency,
    strategy_plans,
)
from schedlab.sim.testing import TableCost, cpu_machine
from tests.conftest import captured_workload


def _kernel(op: Op, threads: int) -> float:
    """Big ops scale to 3 threads then get slower; small ops are fastest on one thread."""
    if op.flops > 1e5:
        return 100.0 / min(threads, 3) + 5.0 * max(0, threads - 3)
    return 5.0 + 2.0 * (threads - 1)


COST = TableCost(kernel=_kernel, dispatch=2.0)


def _graph():  # type: ignore[no-untyped-def]
    return captured_workload("transformer")[1].graph  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("cores", [1, 2, 8])
def test_strategy_plans_resolve(name: str, cores: int) -> None:
    graph = _graph()
    machine = cpu_machine(cores)
    plans = strategy_plans(name, graph, machine, COST)
    assert 1 <= len(plans) <= 20
    assert len({p.hash for p in plans}) == len(plans)
    for plan in plans:
        resolve(graph, plan, machine)
        assert plan.name.startswith(name)


def test_paper_concurrency_gives_each_op_the_models_best_threads() -> None:
    graph = _graph()
    machine = cpu_machine(8)
    best = best_threads(graph, COST, 8)
    assert {best[op.id] for op in graph.ops if op.flops > 1e5 and not op.is_view} == {3}
    assert {best[op.id] for op in graph.ops if op.flops <= 1e5} == {1}
    plans = paper_concurrency(graph, machine, COST)
    one_slot = next(p for p in plans if p.slots == 1)
    assert list(resolve(graph, one_slot, machine).threads) == best
    packed4 = next(p for p in plans if p.slots == 4 and p.name.endswith("packed"))
    assert max(resolve(graph, packed4, machine).threads) == 2  # 8 cores / 4 slots


def test_compress_threads_round_trips() -> None:
    graph = _graph()
    per_op = [1 + (op.id % 3 if op.op_class == "mm" else 0) for op in graph.ops]
    default, class_threads, op_threads = compress_threads(graph, per_op)
    got = [op_threads.get(op.id, class_threads.get(op.op_class, default)) for op in graph.ops]
    assert got == per_op


def test_ooo_defers_weight_gradient_ops() -> None:
    graph = _graph()
    machine = cpu_machine(4)
    w_ops = [op.id for op in graph.ops if op.kind is OpKind.W]
    assert w_ops
    plans = ooo(graph, machine, COST)
    assert any(p.slots == 2 for p in plans)
    for plan in plans:
        seq = resolve(graph, plan, machine).sequence
        pos = {op: i for i, op in enumerate(seq)}
        assert sum(pos[i] for i in w_ops) > sum(w_ops), plan.name  # later than in program order
    all_last = next(p for p in plans if p.slots == 2 and p.name.endswith("all W last"))
    seq = resolve(graph, all_last, machine).sequence
    first_w = min(seq.index(i) for i in w_ops)
    # once the first W op runs, only W ops and what waits on them (optimizer updates) remain
    assert all(graph.ops[o].kind in (OpKind.W, OpKind.OPT) for o in seq[first_w:])
    split = [p for p in plans if p.slots == 2 and p.op_threads]
    assert split and all(set(p.op_threads) == set(w_ops) for p in split)


def test_a_searched_plan_identical_to_a_baseline_does_not_win() -> None:
    from schedlab.plan import Plan
    from schedlab.search.validate import Contender, Measurement, results_of

    same, other = Plan(threads=2), Plan(threads=1)
    searched = Contender(plan=same, predicted_step_time_s=1.0, trial=7, strategy="optuna")
    slower = Contender(plan=other, predicted_step_time_s=1.0, trial=8, strategy="optuna")
    baseline = Contender(plan=same, predicted_step_time_s=1.0, baseline="tensorflow-recommended")
    measured = {
        same.hash: Measurement(plan=same, step_times_s=[0.2, 0.2], max_rel_diff=0.0, numeric_ok=True),
        other.hash: Measurement(plan=other, step_times_s=[0.3], max_rel_diff=0.0, numeric_ok=True),
    }
    candidates, _, best = results_of([searched, slower, baseline], measured)
    assert best is not None and candidates[best]["baseline"] == "tensorflow-recommended"


def test_a_win_inside_the_baselines_spread_is_not_beyond_noise() -> None:
    from schedlab.search.validate import _beyond_noise

    best = [{"baseline": None, "spread_s": [0.28, 0.29]}]
    assert _beyond_noise(best, 0, {"spread_s": [0.285, 0.293]}) is False
    assert _beyond_noise(best, 0, {"spread_s": [0.30, 0.31]}) is True
    assert _beyond_noise([{"baseline": "pytorch-default", "spread_s": [0.2, 0.3]}], 0, {"spread_s": [0.3, 0.4]}) is None
