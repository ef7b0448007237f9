"""Live bytes and peaks, computed by hand on a small graph with a view."""

from __future__ import annotations

import pytest

from schedlab.graph import OutputRole, alias_roots
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import GraphBuilder, TableCost, cpu_machine, random_cost, random_dag

ENGINES = ("fast", "simpy", "compiled")


def small(a_is_output: bool = False) -> GraphBuilder:
    """x(1000) -> a(100) -> v = view(a) -> b(200) -> c(50) -> d(10, reads c and x) = loss."""
    g = GraphBuilder("mem")
    x = g.input("x", 1000)
    a = g.op("a", [x], nbytes=100)
    v = g.op("v", [a], nbytes=100, view=True)
    b = g.op("b", [v], nbytes=200)
    c = g.op("c", [b], nbytes=50)
    g.output(g.op("d", [c, x], nbytes=10))
    if a_is_output:
        g.output(a, "a", OutputRole.GRAD)
    return g


@pytest.mark.parametrize("engine", ENGINES)
def test_peak_by_hand(engine: str) -> None:
    # live over the step (input x always): a 1100, v +0 (a view), b 1300 (a still read
    # through v), c: a freed after b -> 1000 + 200 + 50 = 1250, d: b freed -> 1060.
    # Peak 1300. A view allocating would give 1400; a never freed would give 1350.
    g = small().build()
    m = cpu_machine(2)
    res = simulate(g, resolve(g, Plan(slots=1, threads=1), m), m, TableCost(dispatch=1.0), engine=engine)
    assert res.peak_memory_bytes == {"cpu0": 1300}
    assert res.oom_devices == ()


@pytest.mark.parametrize("engine", ENGINES)
def test_graph_outputs_stay_live(engine: str) -> None:
    g = small(a_is_output=True).build()
    m = cpu_machine(2)
    res = simulate(g, resolve(g, Plan(slots=1, threads=1), m), m, TableCost(dispatch=1.0), engine=engine)
    assert res.peak_memory_bytes == {"cpu0": 1350}  # at c: x + a + b + c


def test_inputs_count_even_when_unused() -> None:
    b = GraphBuilder("inputs")
    x = b.input("x", 10)
    b.input("unused", 5000)
    b.output(b.op("a", [x], nbytes=7))
    g = b.build()
    m = cpu_machine(1)
    assert simulate(g, resolve(g, Plan(), m), m, TableCost()).peak_memory_bytes == {"cpu0": 5017}


def test_unread_value_is_freed_when_its_op_ends() -> None:
    b = GraphBuilder("dead")
    x = b.input("x", 10)
    b.op("dead", [x], nbytes=500)  # read by nobody, no output: freed at its end
    y = b.op("y", [x], nbytes=20)
    b.output(b.op("z", [y], nbytes=30))
    g = b.build()
    m = cpu_machine(1)
    res = simulate(g, resolve(g, Plan(slots=1, threads=1), m), m, TableCost(dispatch=1.0))
    assert res.peak_memory_bytes == {"cpu0": 510}  # later: 10 + 20 + 30 = 60


def test_allocations_come_before_frees_within_an_instant() -> None:
    # Zero dispatch: b's output is allocated at the instant a's input is released.
    b = GraphBuilder("instant")
    x = b.input("x", 0)
    a = b.op("a", [x], nbytes=100)
    b.output(b.op("b", [a], nbytes=100))
    g = b.build()
    m = cpu_machine(1)
    for engine in ENGINES:
        res = simulate(g, resolve(g, Plan(slots=1), m), m, TableCost(), engine=engine)
        assert res.peak_memory_bytes == {"cpu0": 200}


@pytest.mark.parametrize("engine", ENGINES)
def test_oom_is_flagged_not_raised(engine: str) -> None:
    g = small().build()
    for capacity, oom in ((1299, ("cpu0",)), (1300, ())):
        m = cpu_machine(2, memory_bytes=capacity)
        res = simulate(g, resolve(g, Plan(slots=1, threads=1), m), m, TableCost(dispatch=1.0), engine=engine)
        assert res.oom_devices == oom
        assert res.ok is (not oom)
        assert res.step_time_s > 0


def test_alias_roots_follow_chains() -> None:
    b = GraphBuilder("alias")
    x = b.input("x", 8)
    v1 = b.op("v1", [x], view=True)
    v2 = b.op("v2", [v1], view=True)
    y = b.op("y", [v2])
    assert alias_roots(b.build()) == [x, x, x, y]


def test_peak_never_below_inputs_and_bounded_by_all_bytes() -> None:
    g = random_dag(120, seed=9, view_share=0.2)
    m = cpu_machine(4)
    res = simulate(g, resolve(g, Plan(slots=3, threads=1), m), m, random_cost(9))
    inputs = sum(meta.nbytes for i in g.inputs if (meta := g.values[i.value]) is not None)
    everything = sum(meta.nbytes for meta in g.values if meta is not None and meta.alias_of is None)
    assert inputs <= res.peak_memory_bytes["cpu0"] <= everything
