"""A critical-path order ranks ops by the calibrated cost model when the caller has one."""

from __future__ import annotations

import json
from pathlib import Path

from schedlab.graph import Graph, Op
from schedlab.plan import Plan, resolve
from schedlab.sim.cost import op_cost_us
from schedlab.sim.testing import GraphBuilder, TableCost, cpu_machine

CRITICAL_PATH = Plan(slots=1, threads=1, order="critical-path")


def two_branches() -> Graph:
    """x -> (big: one heavy matmul by FLOPs) and (small: a light op); both feed `join`."""
    b = GraphBuilder("branches")
    x = b.input("x")
    big = b.op("big", [x], flops=1e9)
    small = b.op("small", [x], target="aten.relu.default", flops=1e3)
    b.op("join", [big, small], target="aten.add.Tensor")
    return b.build()


def first_of(graph: Graph, sequence: tuple[int, ...], names: set[str]) -> str:
    return next(graph.ops[i].name for i in sequence if graph.ops[i].name in names)


def test_without_a_profile_the_roofline_ranks_the_heavy_matmul_first() -> None:
    g = two_branches()
    resolved = resolve(g, CRITICAL_PATH, cpu_machine(2))
    assert first_of(g, resolved.sequence, {"big", "small"}) == "big"


def test_a_profile_that_makes_an_op_very_expensive_changes_the_order() -> None:
    g = two_branches()
    # Calibrated: the "light" op is in fact slow here (say, a strided kernel); the matmul is fast.
    cost = TableCost(kernel={"big": 5.0, "small": 5_000.0, "join": 1.0})
    resolved = resolve(g, CRITICAL_PATH, cpu_machine(2), op_cost_us=op_cost_us(cost))
    assert first_of(g, resolved.sequence, {"big", "small"}) == "small"
    # Orders other than critical-path do not depend on weights.
    for order in ("topo", "w-last", "random:3"):
        plan = Plan(slots=1, threads=1, order=order)
        assert resolve(g, plan, cpu_machine(2), op_cost_us=op_cost_us(cost)).priority == resolve(
            g, plan, cpu_machine(2)
        ).priority


def test_weights_are_asked_with_the_threads_the_plan_gives_each_op() -> None:
    g = two_branches()
    asked: dict[str, int] = {}

    def cost_us(op: Op, threads: int) -> float:
        asked[op.name] = threads
        return 1.0

    plan = Plan(slots=1, threads=1, class_threads={"relu": 2}, order="critical-path")
    resolve(g, plan, cpu_machine(2), op_cost_us=cost_us)
    assert asked == {"big": 1, "small": 2, "join": 1}


def test_search_evaluator_and_validate_resolve_with_the_same_weights() -> None:
    """The simulator (search's Evaluator) and the executor (validate) must run one order."""
    from schedlab.search.objective import Evaluator

    g = two_branches()
    cost = TableCost(kernel={"big": 5.0, "small": 5_000.0, "join": 1.0})
    ev = Evaluator(g, cpu_machine(2), cost)
    mine = ev.resolve(CRITICAL_PATH)
    assert mine == resolve(g, CRITICAL_PATH, cpu_machine(2), op_cost_us=op_cost_us(cost))
    assert mine.priority != resolve(g, CRITICAL_PATH, cpu_machine(2)).priority
    assert ev.resolve(CRITICAL_PATH) == mine  # the second time from the memo of op weights


def test_simulate_ranks_critical_path_by_the_profile(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`schedlab simulate --plan P --profile F`: a profile that makes one weight-gradient
    matmul very slow moves it ahead of the input-gradient work it used to follow."""
    from schedlab.calibrate.signature import signature
    from schedlab.cli import main
    from schedlab.graph import OpKind
    from schedlab.machine import detect_host
    from schedlab.trace import Trace
    from tests.calibrate.factories import make_profile
    from tests.conftest import captured_workload

    _, captured = captured_workload("mlp")
    g = captured.graph
    slow = next(op for op in g.ops if op.kind is OpKind.W and op.op_class == "mm")
    plan = Plan(slots=1, threads=1, order="critical-path").save(tmp_path / "cp.json")
    orders = {}
    for name, rows in (("plain", None), ("slow-w", {signature(slow): {1: 1e6, 2: 1e6}})):
        profile = make_profile(machine=detect_host().fingerprint, signatures=rows).save(tmp_path / f"{name}.json")
        out = tmp_path / f"{name}.sim.json"
        argv = ["simulate", "mlp", "--size", "tiny", "--plan", str(plan), "--profile", str(profile), "--out", str(out)]
        assert main([*argv, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["trace"] == str(out)
        events = sorted(Trace.load(out).events, key=lambda e: e.start_ns)
        orders[name] = [e.op for e in events]
    assert orders["plain"] != orders["slow-w"]
    assert orders["slow-w"].index(slow.id) < orders["plain"].index(slow.id)
