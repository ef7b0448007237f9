"""The CostTable (sim.cost_table) changes no answer: a cold simulate() with it, with a cost
model's keys and without either gives the same step."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import numpy as np
import pytest

from schedlab.calibrate.context import ContextCosts
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.signature import signature
from schedlab.graph import Graph, Op
from schedlab.machine import Machine
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.sim import SimResult, Simulator, simulate
from schedlab.sim.cost_table import CostTable, KeyedCostModel, content_groups, content_keys, cost_groups
from schedlab.sim.fast import run_fast
from schedlab.sim.prepare import prepare
from schedlab.sim.testing import cpu_machine, random_cost, random_dag, random_plan
from tests.calibrate.factories import make_profile
from tests.conftest import captured_workload
from tests.sim.keyed_profile import unkeyed

MODELS = ("mlp", "cnn", "transformer", "nmt")
PLANS = ((1, 1), (1, 2), (2, 1), (2, 2))


def tiny_graph(model: str) -> Graph:
    _, c = captured_workload(model)
    return c.graph  # type: ignore[attr-defined, no-any-return]


def profile_for(graph: Graph) -> Profile:
    """A hand-made Profile whose signature table holds every third op of `graph` (the others
    fall to the class model or the fallback), bound to `graph` with first uses."""
    table = {signature(op): {1: 10.0 + i % 7, 2: 6.0 + i % 5} for i, op in enumerate(graph.ops) if i % 3 == 0}
    return dataclasses.replace(make_profile(signatures=table), context=ContextCosts({}, 0.0, {"mm": 30.0}, 7.0))


def reference(graph: Graph, resolved: ResolvedPlan, machine: Machine, cost: Profile) -> tuple[float, int, float]:
    """Step, peak bytes and busy core-µs with every cost asked op by op (`prepare` alone)."""
    prep = prepare(graph, resolved, machine, cost)
    tl, mem, busy = run_fast(prep)
    return max(tl.end_us) / 1e6, mem.peak[0], busy[0] / 1e6


def figures(res: SimResult) -> tuple[float, int, float]:
    return res.step_time_s, res.peak_memory_bytes["cpu0"], res.busy_core_s["cpu0"]


@pytest.mark.parametrize("model", MODELS)
def test_content_keys_are_finer_than_signatures_and_repeat(model: str) -> None:
    g = tiny_graph(model)
    keys = content_keys(g)
    assert len(keys) == len(g.ops)
    sig_of: dict[Hashable, str] = {}
    for k, op in zip(keys, g.ops, strict=True):
        assert sig_of.setdefault(k, signature(op)) == signature(op)  # equal keys: equal signatures
    assert len(set(keys)) < len(keys)  # a step repeats ops: something to share
    assert content_keys(g) is keys  # kept on the graph


def test_content_keys_tell_apart_what_json_tells_apart() -> None:
    g = tiny_graph("mlp")
    op = next(o for o in g.ops if not o.is_view)

    def key_of(**change: object) -> Hashable:
        other = dataclasses.replace(g, ops=(dataclasses.replace(op, **change),))  # type: ignore[arg-type]
        return content_keys(other)[0]

    base = key_of()
    assert key_of(args=(*op.args, 1)) != key_of(args=(*op.args, 1.0)) != key_of(args=(*op.args, True))
    assert key_of(args=(*op.args, "T")) != key_of(args=(*op.args, {"v": 3}))  # a string is no tensor
    assert key_of(args=(*op.args, -0.0)) != key_of(args=(*op.args, 0.0))
    assert key_of(args=(*op.args, [1, 2])) == key_of(args=(*op.args, (1, 2)))  # as JSON has them
    assert key_of(kwargs={"dim": 1, "keepdim": True}) == key_of(kwargs={"keepdim": True, "dim": 1})
    assert key_of(kwargs={"dim": 1}) != key_of(kwargs={"dim": [1]})
    assert key_of(args=tuple({"v": 99} if isinstance(a, dict) and "v" in a else a for a in op.args)) == base
    assert key_of(flops=op.flops + 1) != base and key_of(is_view=not op.is_view) != base


class CountingKeyed:
    """A cost model keyed by op target only, counting what it is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []  # (what, op id, threads or busy cores)

    def cost_keys(self, graph: Graph) -> Sequence[Hashable] | np.ndarray:
        return [op.target for op in graph.ops]

    def kernel_us(self, op: Op, threads: int) -> float:
        self.asked.append(("kernel", op.id, threads))
        return 0.0 if op.is_view else 100.0 / threads + len(op.target)

    def dispatch_us(self, op: Op) -> float:
        self.asked.append(("dispatch", op.id, 0))
        return 2.0 + len(op.target) % 3

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        self.asked.append(("slowdown", op.id, busy_cores))
        return 1.0 + 0.1 * busy_cores


def test_a_keyed_cost_model_is_asked_once_per_key() -> None:
    g = random_dag(200, 3, window=8, view_share=0.2)
    cost = CountingKeyed()
    assert isinstance(cost, KeyedCostModel)
    table = CostTable(g, cost, 4)
    targets = sorted({op.target for op in g.ops})
    threads = np.array([1 + op.id % 4 for op in g.ops], dtype=np.int64)
    kernel = table.kernel_us(threads)
    dispatch = table.dispatch_us()
    slow = table.slowdown(4, 2)
    per_op = [(cost.kernel_us(op, int(k)), cost.dispatch_us(op), cost.corun_slowdown(op, 1, 4))
              for op, k in zip(g.ops, threads, strict=True)]
    assert kernel.tolist() == [p[0] for p in per_op]
    assert dispatch.tolist() == [p[1] for p in per_op]
    assert slow[:, 1].tolist() == [p[2] for p in per_op]
    asked = cost.asked[: -3 * len(g.ops)]  # what the table asked, before the per-op reference
    assert sorted(g.ops[o].target for what, o, _ in asked if what == "dispatch") == targets
    assert sorted((g.ops[o].target, b) for what, o, b in asked if what == "slowdown") == [
        (t, b) for t in targets for b in (0, 1)]
    kernel_pairs = [(g.ops[o].target, k) for what, o, k in asked if what == "kernel"]
    assert sorted(kernel_pairs) == sorted({(op.target, 1 + op.id % 4) for op in g.ops})  # each pair once
    # Nothing is asked again for what the table holds.
    n_asked = len(cost.asked)
    table.kernel_us(threads)
    table.dispatch_us()
    table.slowdown(4, 2)
    assert len(cost.asked) == n_asked


def test_integer_keys_group_as_hashable_keys_do() -> None:
    g = random_dag(300, 5, window=8, view_share=0.2)
    by_target = CountingKeyed()
    codes = {t: i * 7 % 11 - 3 for i, t in enumerate(sorted({op.target for op in g.ops}))}  # distinct, negatives too

    class IntKeyed(CountingKeyed):
        def cost_keys(self, graph: Graph) -> np.ndarray:
            return np.array([codes[op.target] for op in graph.ops], dtype=np.int64)

    group, reps = cost_groups(g, by_target)
    int_group, int_reps = cost_groups(g, IntKeyed())
    assert int_group.tolist() == group.tolist() and int_reps.tolist() == reps.tolist()  # numbered by first appearance
    assert group[0] == 0 and reps.tolist() == sorted(reps.tolist())


def test_a_profile_keys_its_ops_by_content_number_and_first_use() -> None:
    g = tiny_graph("transformer")
    numbers = content_groups(g)
    assert content_groups(g) is numbers and not numbers.flags.writeable  # kept on the graph, read-only
    keys = content_keys(g)
    assert all((numbers[a] == numbers[b]) == (keys[a] == keys[b]) for a in range(0, len(keys), 7) for b in range(len(keys)))
    bound = profile_for(g).for_graph(g)
    first = bound.bound[1] if bound.bound else frozenset()
    assert first and bound.cost_keys(g).tolist() == [2 * int(n) + (id(op) in first) for n, op in zip(numbers, g.ops, strict=True)]
    assert profile_for(g).cost_keys(g).tolist() == (2 * numbers).tolist()  # bound to no graph: no first uses


def test_keys_must_cover_the_graph() -> None:
    from schedlab.errors import SchedlabError

    class Short(CountingKeyed):
        def cost_keys(self, graph: Graph) -> Sequence[Hashable]:
            return ["x"]

    with pytest.raises(SchedlabError, match="cost keys"):
        CostTable(random_dag(10, 1), Short(), 2)

    class FloatKeys(CountingKeyed):
        def cost_keys(self, graph: Graph) -> np.ndarray:
            return np.zeros(len(graph.ops))

    with pytest.raises(SchedlabError, match="integer array"):
        CostTable(random_dag(10, 1), FloatKeys(), 2)


@pytest.mark.parametrize("model", MODELS)
def test_cold_simulate_of_a_profile_keyed_or_not_equals_asking_each_op(model: str) -> None:
    g = tiny_graph(model)
    machine = cpu_machine(2)
    bound = profile_for(g).for_graph(g)
    for slots, threads in PLANS:
        resolved = resolve(g, Plan(slots=slots, threads=threads), machine)
        cost = bound.for_slots(slots)
        ref = reference(g, resolved, machine, cost)
        keys = cost.cost_keys(g)
        assert keys is not None and len(set(keys)) < len(g.ops)  # a Profile keys its ops, and ops share keys
        for c in (cost, unkeyed(cost)):
            quiet = simulate(g, resolved, machine, c, record=False)
            assert quiet.engine == "compiled"
            assert figures(quiet) == ref, (slots, threads, type(c).__name__)
            traced = simulate(g, resolved, machine, c, record=True, engine="fast")
            assert figures(traced) == ref


@pytest.mark.parametrize("seed", range(6))
def test_a_reused_simulator_keyed_or_not_gives_each_plan_the_same_step(seed: int) -> None:
    g = random_dag(150, seed, window=10, view_share=0.2)
    machine = cpu_machine(4)
    base = random_cost(seed)

    class Keyed:  # random costs depend on op names only, so names are sound keys
        def cost_keys(self, graph: Graph) -> Sequence[Hashable]:
            return [op.name for op in graph.ops]

        kernel_us = staticmethod(base.kernel_us)
        dispatch_us = staticmethod(base.dispatch_us)
        corun_slowdown = staticmethod(base.corun_slowdown)

    plain, keyed_sim = Simulator(g, machine, base), Simulator(g, machine, Keyed())
    for i in range(4):
        resolved = resolve(g, random_plan(g, 4, seed * 10 + i, max_slots=4), machine)
        a, b = plain.run(resolved, record=False), keyed_sim.run(resolved, record=False)
        assert (a.step_time_s, a.peak_memory_bytes, a.busy_core_s) == (b.step_time_s, b.peak_memory_bytes, b.busy_core_s)
        assert a.step_time_s == simulate(g, resolved, machine, base, record=True, engine="simpy").step_time_s
