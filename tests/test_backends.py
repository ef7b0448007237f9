"""The executor and the simulator are two implementations of one interface (DESIGN.md, invariant 1)."""

from __future__ import annotations

from schedlab.backend import Backend
from schedlab.exec import ExecBackend
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from schedlab.sim import SimBackend
from schedlab.sim.testing import random_cost
from tests.conftest import captured_workload


def test_exec_and_sim_take_the_same_call_and_give_the_same_trace_schema() -> None:
    _, cap = captured_workload("mlp")
    graph = cap.graph  # type: ignore[attr-defined]
    machine = detect_host()
    resolved = resolve(graph, Plan(slots=2, threads=1, order="w-last"), machine)
    cost = random_cost(0)
    backends: list[Backend] = [
        ExecBackend(cap.input_values, warmup=0),  # type: ignore[attr-defined]
        SimBackend(lambda r: cost),
    ]
    runs = {}
    for b in backends:
        assert isinstance(b, Backend)
        runs[b.source] = b.run(graph, resolved, machine, steps=2)
    ex, sm = runs["exec"], runs["sim"]
    assert ex.trace.source == "exec" and sm.trace.source == "sim"
    assert len(ex.step_times_s) == 2 and len(sm.step_times_s) == 2
    assert all(t > 0 for t in (*ex.step_times_s, *sm.step_times_s))
    # Every op of the graph appears once per step in both, on the plan's device and threads.
    assert sorted(e.op for e in ex.trace.step_events(0)) == list(range(len(graph.ops)))
    assert sorted(e.op for e in sm.trace.step_events(0)) == list(range(len(graph.ops)))
    for tr in (ex.trace, sm.trace):
        for e in tr.step_events(0):
            assert e.device == resolved.device[e.op] and e.threads == resolved.threads[e.op]
        assert tr.meta["plan_hash"] == resolved.plan.hash and tr.meta["graph_hash"] == graph.hash
    assert set(ex.trace.to_json()) == set(sm.trace.to_json())
