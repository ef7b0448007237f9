"""Hand-computed step times and traces of the executor model (times in µs)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import Op, OpKind
from schedlab.plan import Plan, resolve
from schedlab.sim import SimResult, Simulator, simulate
from schedlab.sim.testing import (
    GraphBuilder,
    TableCost,
    chain,
    cpu_machine,
    fork_join,
    independent,
    random_cost,
    random_dag,
)
from schedlab.trace import Trace
from tests.sim.conftest import spans


def run(graph_builder_or_graph, plan: Plan, cores: int, cost: TableCost, engine: str = "auto") -> SimResult:  # type: ignore[no-untyped-def]
    g = graph_builder_or_graph.build() if isinstance(graph_builder_or_graph, GraphBuilder) else graph_builder_or_graph
    m = cpu_machine(cores)
    return simulate(g, resolve(g, plan, m), m, cost, engine=engine)


ENGINES = ("fast", "simpy", "compiled")


@pytest.mark.parametrize("engine", ENGINES)
def test_chain_is_the_sum_of_dispatch_and_kernel(engine: str) -> None:
    cost = TableCost(kernel={"op0": 100.0, "op1": 200.0, "op2": 300.0}, dispatch=10.0)
    res = run(chain(3), Plan(slots=1, threads=1), 2, cost, engine)
    assert res.step_time_s == pytest.approx(630e-6)
    assert spans(res.trace) == [("op0", 0, 110, 0), ("op1", 110, 320, 0), ("op2", 320, 630, 0)]
    ev = res.trace.events if res.trace else ()
    assert [(e.op, e.kind, e.device, e.threads, e.step) for e in ev] == [(i, "F", "cpu0", 1, 0) for i in range(3)]
    assert res.engine == engine


@pytest.mark.parametrize("engine", ENGINES)
def test_fork_join_with_two_slots(engine: str) -> None:
    # src 0-110 on w0; w0 takes b0 at 110 (lock 110-120); w1, woken, gets the lock at 120;
    # b0 ends 320 (w0 finds nothing ready); b1 ends 430, w1 takes join: 430-490.
    cost = TableCost(kernel={"src": 100.0, "b0": 200.0, "b1": 300.0, "join": 50.0}, dispatch=10.0)
    res = run(fork_join(2), Plan(slots=2, threads=1), 2, cost, engine)
    assert spans(res.trace) == [
        ("src", 0, 110, 0),
        ("b0", 110, 320, 0),
        ("b1", 120, 430, 1),
        ("join", 430, 490, 1),
    ]
    assert res.step_time_s == pytest.approx(490e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_single_thread_ops_corun_on_two_cores(engine: str) -> None:
    cost = TableCost(kernel={"a": 100.0, "b": 150.0})
    corun = run(independent("a", "b"), Plan(slots=2, threads=1), 2, cost, engine)
    assert spans(corun.trace) == [("a", 0, 100, 0), ("b", 0, 150, 1)]
    assert corun.step_time_s == pytest.approx(150e-6)  # max, not sum
    serial = run(independent("a", "b"), Plan(slots=1, threads=1), 2, cost, engine)
    assert serial.step_time_s == pytest.approx(250e-6)
    assert corun.busy_core_s["cpu0"] == pytest.approx(250e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_oversubscribed_kernels_are_stretched(engine: str) -> None:
    cost = TableCost(kernel={"a": 100.0, "b": 100.0})
    # Together from t=0: 4 threads on 2 cores, each at half speed: both end at 200.
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, cost, engine)
    assert spans(res.trace) == [("a", 0, 200, 0), ("b", 0, 200, 1)]
    # With dispatch 10: a runs alone 10-20 (10 done), then both at half speed: a ends at
    # 20 + 90 / 0.5 = 200 with b 90 done; b finishes its last 10 alone: 210.
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, TableCost(kernel=cost.kernel, dispatch=10.0), engine)
    assert spans(res.trace) == [("a", 0, 200, 0), ("b", 10, 210, 1)]
    assert res.step_time_s == pytest.approx(210e-6)
    assert res.busy_core_s["cpu0"] == pytest.approx(2 * 200e-6)  # both cores busy 10-210


@dataclass
class AtenCost(TableCost):
    """A hand-made cost of ATen's runtime: a kernel no faster at more threads ran inline."""

    inlines_small_calls: ClassVar[bool] = True


def inline_a_team_b(op: Op, threads: int) -> float:
    return 50.0 if op.name == "b" and threads > 1 else 100.0  # a: no faster at 2 threads


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kernel_no_faster_at_two_threads_holds_one_core_under_aten(engine: str) -> None:
    # a ran inline (one core), b runs its team of two: 3 cores wanted of 2, each at 2/3 speed;
    # b's 50 us end at 75 with 50 of a's done, a's other 50 alone: 125.
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, AtenCost(kernel=inline_a_team_b), engine)
    assert spans(res.trace) == [("a", 0, 125, 0), ("b", 0, 75, 1)]
    # Without the flag a holds its team too: 4 of 2 cores, half speed; b ends at 100, a at 150.
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, TableCost(kernel=inline_a_team_b), engine)
    assert spans(res.trace) == [("a", 0, 150, 0), ("b", 0, 100, 1)]
    # Two inline kernels take a core each: together, not stretched.
    res = run(independent("a", "a2"), Plan(slots=2, threads=2), 2, AtenCost(kernel={"a": 100.0, "a2": 100.0}), engine)
    assert spans(res.trace) == [("a", 0, 100, 0), ("a2", 0, 100, 1)]


def test_the_search_path_holds_the_same_cores_as_the_traced_one() -> None:
    g = independent("a", "b")
    m = cpu_machine(2)
    resolved = resolve(g, Plan(slots=2, threads=2), m)
    sim = Simulator(g, m, AtenCost(kernel=inline_a_team_b))
    assert sim.run(resolved, record=False).step_time_s == pytest.approx(125e-6)
    assert sim.run(resolved, record=False).engine == "compiled"


@pytest.mark.parametrize("engine", ENGINES)
def test_corun_slowdown_divides_the_rate(engine: str) -> None:
    cost = TableCost(kernel={"a": 100.0, "b": 300.0}, corun=lambda op, busy, total: 2.0 if busy else 1.0)
    res = run(independent("a", "b"), Plan(slots=2, threads=1), 2, cost, engine)
    # Both at half speed until a ends at 200 (b has done 100), then b alone: 200 + 200.
    assert spans(res.trace) == [("a", 0, 200, 0), ("b", 0, 400, 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_interpreter_lock_serialises_dispatch(engine: str) -> None:
    names = ("a", "b", "c")
    res = run(independent(*names), Plan(slots=3, threads=1), 4, TableCost(default_kernel_us=100.0, dispatch=10.0), engine)
    assert spans(res.trace) == [("a", 0, 110, 0), ("b", 10, 120, 1), ("c", 20, 130, 2)]
    # Dispatch-bound: three slots cannot beat the lock.
    res = run(independent(*names), Plan(slots=3, threads=1), 4, TableCost(default_kernel_us=10.0, dispatch=50.0), engine)
    assert spans(res.trace) == [("a", 0, 60, 0), ("b", 50, 110, 1), ("c", 100, 160, 2)]
    assert res.step_time_s == pytest.approx(160e-6)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order", ["topo", "critical-path", "w-last", "random:7"])
def test_one_slot_runs_the_list_schedule(engine: str, order: str) -> None:
    g = random_dag(60, seed=4)
    m = cpu_machine(4)
    resolved = resolve(g, Plan(slots=1, threads=2, order=order), m)
    res = simulate(g, resolved, m, random_cost(4), engine=engine)
    assert res.trace is not None
    ev = res.trace.events
    assert tuple(e.op for e in ev) == resolved.sequence
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(ev))  # back to back, one worker
    assert {e.worker for e in ev} == {0}


def test_priority_picks_among_ready_ops() -> None:
    # Three ready ops, one slot, an explicit order c, a, b.
    g = independent("a", "b", "c")
    m = cpu_machine(2)
    res = simulate(g, resolve(g, Plan(slots=1, threads=1, order=(2, 0, 1)), m), m, TableCost(default_kernel_us=5.0))
    assert [name for name, *_ in spans(res.trace)] == ["c", "a", "b"]


def test_trace_schema_and_meta() -> None:
    g = chain(4)
    m = cpu_machine(2, name="box")
    plan = Plan(slots=1, threads=2)
    res = simulate(g, resolve(g, plan, m), m, TableCost())
    assert res.trace is not None
    meta = res.trace.meta
    assert res.trace.source == "sim"
    assert (meta["graph_hash"], meta["plan_hash"], meta["machine"]["name"], meta["workload"]) == (g.hash, plan.hash, "box", "chain")
    assert Trace.from_json(res.trace.to_json()).events == res.trace.events
    assert res.trace.makespan_ns() == round(res.step_time_s * 1e9)
    assert res.sim_wall_s > 0
    assert simulate(g, resolve(g, plan, m), m, TableCost(), record=False).trace is None


def test_kinds_and_threads_come_from_the_graph_and_plan() -> None:
    b = GraphBuilder("k")
    x = b.input("x")
    y = b.op("fwd", [x], kind=OpKind.F)
    b.output(b.op("wgrad", [y], kind=OpKind.W, target="aten.add.Tensor"))
    g = b.build()
    m = cpu_machine(8)
    res = simulate(g, resolve(g, Plan(threads=4, class_threads={"add": 2}), m), m, TableCost())
    assert res.trace is not None
    assert [(e.kind, e.threads) for e in res.trace.events] == [("F", 4), ("W", 2)]


def test_engine_choice() -> None:
    g = chain(3)
    m = cpu_machine(2)
    r = resolve(g, Plan(), m)
    assert simulate(g, r, m, TableCost()).engine == "compiled"
    assert simulate(g, r, m, TableCost(), engine="simpy").engine == "simpy"
    with pytest.raises(SchedlabError, match="engine"):
        simulate(g, r, m, TableCost(), engine="warp")


def test_simulator_reuse_matches_simulate() -> None:
    g = random_dag(80, seed=2)
    m = cpu_machine(4)
    sim = Simulator(g, m, random_cost(2))
    for seed in range(4):
        r = resolve(g, Plan(slots=1 + seed % 3, threads=1 + seed, order=f"random:{seed}"), m)
        a, b = sim.run(r, record=True), simulate(g, r, m, random_cost(2))
        assert a.trace is not None and b.trace is not None
        assert (a.step_time_s, a.peak_memory_bytes, a.trace.events) == (b.step_time_s, b.peak_memory_bytes, b.trace.events)


def test_empty_graph() -> None:
    g = GraphBuilder("empty").build()
    m = cpu_machine(1)
    for engine in ENGINES:
        res = simulate(g, resolve(g, Plan(), m), m, TableCost(), engine=engine)
        assert res.step_time_s == 0.0 and res.trace is not None and res.trace.events == ()
