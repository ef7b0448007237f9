"""The executor's waits per op: the co-run one and the one-slot team's, fitted on steps."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.calibrate.corun_fit import CorunRun, fit_corun_latency
from schedlab.calibrate.profile import Profile
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import cpu_machine
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, make_graph, make_profile


def with_waits(p: Profile, corun: dict[int, float], team: dict[int, float]) -> Profile:
    return dataclasses.replace(p, corun=dataclasses.replace(p.corun, latency_us=corun, team_latency_us=team))


def test_a_one_slot_op_with_a_team_pays_the_team_wait_and_nothing_else_does() -> None:
    base = make_profile()
    p = with_waits(base, {1: 12.0, 2: 30.0}, {2: 4.0})
    mm, view, _ = make_graph().ops
    assert p.kernel_us(mm, 2) == pytest.approx(base.kernel_us(mm, 2) + 4.0)
    assert p.kernel_us(mm, 1) == base.kernel_us(mm, 1)  # one thread: no team
    assert p.kernel_us(mm, 8) == pytest.approx(base.kernel_us(mm, 8) + 4.0)  # the nearest fitted count
    assert p.kernel_us(view, 2) == 0.0
    # the co-run executor pays its own fitted wait, which holds the team's
    two = p.for_slots(2)
    assert two.kernel_us(mm, 2) == pytest.approx(base.for_slots(2).kernel_us(mm, 2) + 30.0)
    assert two.team_us(2) == 0.0
    # kept in the JSON; a profile from before has none
    d = p.to_json()
    assert Profile.from_json(d).corun.team_latency_us == {2: 4.0}
    del d["corun"]["team_latency_us"]
    assert Profile.from_json(d).kernel_us(mm, 2) == base.kernel_us(mm, 2)


def test_trace_calibration_takes_the_team_wait_off_a_one_slot_team_s_events() -> None:
    g = make_graph()
    p = with_waits(make_profile(), {2: 30.0}, {2: 4.0})
    mm = g.ops[0]
    events = tuple(  # each event: the executor's floor, a 50 us kernel, the team's 4 us
        TraceEvent(mm.id, mm.name, "F", "cpu0", 0, 2, 0, int(1e3 * (DISPATCH.op_us + 54.0)), step)
        for step in range(3)
    )
    traced = p.with_trace(Trace(events=events, meta={"source": "exec", "graph_hash": g.hash, "plan": {"slots": 1}}), g)
    assert traced.kernel_us(mm, 2) == pytest.approx(54.0)  # 50 in the table, the wait added back once
    assert traced.for_slots(2).kernel_us(mm, 2) == pytest.approx(50.0 + 30.0)  # not the team's: the co-run wait


def test_the_fit_recovers_both_waits_from_steps_made_with_them() -> None:
    g, machine = make_graph(), cpu_machine(2)
    base = make_profile()
    truth = with_waits(base, {1: 12.0, 2: 30.0}, {2: 3.5})

    def step_s(slots: int, threads: int) -> float:
        plan = resolve(g, Plan(slots=slots, threads=threads), machine)
        return simulate(g, plan, machine, truth.for_graph(g).for_slots(slots), record=False).step_time_s

    runs = [CorunRun("toy", g, 1, step_s(2, 1)), CorunRun("toy", g, 2, step_s(2, 2)),
            CorunRun("toy", g, 2, step_s(1, 2), slots=1)]
    fitted, report = fit_corun_latency(base, runs, machine)
    assert fitted.corun.latency_us == pytest.approx({1: 12.0, 2: 30.0}, abs=0.15)
    assert fitted.corun.team_latency_us == pytest.approx({2: 3.5}, abs=0.15)
    assert [(r["slots"], r["threads"]) for r in report] == [(2, 1), (2, 2), (1, 2)]
    assert all(r["predicted_ms"] == pytest.approx(r["measured_ms"], rel=0.01) for r in report)


def test_the_team_wait_is_fitted_to_the_ratio_of_the_two_steps_not_their_level() -> None:
    """Steps measured while the host ran 1.6x slower than when the kernels were timed: the
    level of each step is off, their ratio is not, and the wait comes out as made."""
    g, machine = make_graph(), cpu_machine(2)
    base = make_profile()
    truth = with_waits(base, {}, {2: 3.5})

    def step_s(threads: int) -> float:
        plan = resolve(g, Plan(slots=1, threads=threads), machine)
        return 1.6 * simulate(g, plan, machine, truth.for_graph(g), record=False).step_time_s

    beside = CorunRun("toy", g, 2, step_s(2), slots=1, one_thread_s=step_s(1))
    fitted, report = fit_corun_latency(base, [beside], machine)
    assert fitted.corun.team_latency_us == pytest.approx({2: 3.5}, abs=0.15)
    assert report[0]["target_ms"] == pytest.approx(report[0]["predicted_ms"], rel=0.01)
    alone = dataclasses.replace(beside, one_thread_s=None)  # the level alone: the host's 1.6x read as a wait
    assert fit_corun_latency(base, [alone], machine)[0].corun.team_latency_us[2] > 2 * 3.5
