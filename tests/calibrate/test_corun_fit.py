"""The executor's waits per op: the co-run one and the one-slot team's, fitted on steps."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.calibrate.corun_fit import CorunRun, fit_corun_latency
from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import GraphBuilder, cpu_machine
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, MM_MODEL, fit, make_graph, make_profile


def with_waits(p: Profile, corun: dict[int, float], team: dict[int, float], team_share: bool = True) -> Profile:
    return dataclasses.replace(
        p, corun=dataclasses.replace(p.corun, latency_us=corun, team_latency_us=team, views_wait=True,
                                     team_share=team_share)
    )


def test_a_one_slot_op_pays_the_team_wait_in_proportion_to_its_parallel_share() -> None:
    """An op below its class's parallel regime never forks its team: it pays next to
    nothing of the wait, an op deep in the regime nearly all of it."""
    mm_model = dataclasses.replace(MM_MODEL, h_us=50.0)  # the parallel regime from 50 us of work
    base = dataclasses.replace(make_profile(), classes={"mm": fit(mm_model)})
    p = with_waits(base, {}, {2: 40.0})
    mm = make_graph().ops[0]
    small, large = (dataclasses.replace(mm, flops=f, bytes_moved=b) for f, b in ((1e3, 100), (1e10, 10**8)))
    for op in (mm, small, large):
        share = p._lookup(op).shares()[2]
        assert p.kernel_us(op, 2) == pytest.approx(base.kernel_us(op, 2) + 40.0 * share)
        assert p.team_wait_us(op, 1) == 0.0
    assert p.team_wait_us(small, 2) < 1.0 < 30.0 < p.team_wait_us(large, 2)
    assert Profile.from_json(p.to_json()).corun.team_share  # kept in the JSON
    old = p.to_json()
    del old["corun"]["team_share"]  # a profile from before: every op paid all of it
    assert Profile.from_json(old).kernel_us(small, 2) == pytest.approx(base.kernel_us(small, 2) + 40.0)


def test_a_one_slot_op_with_a_team_pays_the_team_wait_and_nothing_else_does() -> None:
    base = make_profile()
    p = with_waits(base, {1: 12.0, 2: 30.0}, {2: 4.0}, team_share=False)
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


def view_chain(n_views: int) -> Graph:
    """x -> n_views reshapes in a chain -> relu: nothing to run beside anything."""
    meta = TensorMeta((4, 8), "float32", 128)
    views = [
        Op(i, f"view{i}", "aten.view.default", OpKind.F, ({"v": i}, [4, 8]), {}, (i,), (i + 1,), 0.0, 0, is_view=True)
        for i in range(n_views)
    ]
    relu = Op(n_views, "relu", "aten.relu.default", OpKind.F, ({"v": n_views},), {}, (n_views,), (n_views + 1,), 32.0, 256)
    values = (meta, *(TensorMeta((4, 8), "float32", 128, alias_of=0) for _ in range(n_views)), meta)
    return Graph(name="views", inputs=(GraphInput(0, "x", InputRole.USER),),
                 outputs=(GraphOutput(n_views + 1, "loss", OutputRole.LOSS),), ops=(*views, relu), values=values)


def test_a_view_waits_for_a_worker_in_a_co_run_plan_and_for_nothing_in_one_slot() -> None:
    p = with_waits(make_profile(), {1: 12.0, 2: 30.0}, {2: 4.0})
    _, view, _ = make_graph().ops
    assert p.kernel_us(view, 1) == 0.0 and p.kernel_us(view, 2) == 0.0  # no kernel, no team
    two = p.for_slots(2)
    assert two.kernel_us(view, 1) == 12.0 and two.kernel_us(view, 2) == 30.0  # taken from the heap like any op
    assert two.serial_us(view) == 0.0 and two.wake_us(view, 2) == 0.0  # and nothing else
    # in a step: each of 6 chained views adds its wait, in a co-run plan only
    g, machine = view_chain(6), cpu_machine(2)

    def step_us(profile: Profile, slots: int) -> float:
        plan = resolve(g, Plan(slots=slots, threads=1), machine)
        return 1e6 * simulate(g, plan, machine, profile.for_graph(g).for_slots(slots), record=False).step_time_s

    none = with_waits(make_profile(), {}, {})
    assert step_us(p, 2) - step_us(none, 2) == pytest.approx(7 * 12.0, rel=1e-6)  # 6 views and the relu
    assert step_us(p, 1) == pytest.approx(step_us(none, 1), rel=1e-9)
    # a profile whose wait was fitted with its views paying nothing keeps that meaning
    d = p.to_json()
    assert Profile.from_json(d).for_slots(2).kernel_us(view, 2) == 30.0
    del d["corun"]["views_wait"]
    assert Profile.from_json(d).for_slots(2).kernel_us(view, 2) == 0.0
    assert step_us(Profile.from_json(d), 2) - step_us(none, 2) == pytest.approx(12.0, rel=1e-6)  # the relu alone
    # and the fit charges views: what it fitted is what the profile it returns charges
    fitted, _ = fit_corun_latency(make_profile(), [CorunRun("toy", g, 1, step_us(p, 2) * 1e-6)], machine)
    assert fitted.corun.views_wait and fitted.corun.latency_us == pytest.approx({1: 12.0}, abs=0.15)


def test_trace_calibration_takes_the_team_wait_off_a_one_slot_team_s_events() -> None:
    g = make_graph()
    p = with_waits(make_profile(), {2: 30.0}, {2: 4.0})
    mm = g.ops[0]
    events = tuple(  # each event: the executor's floor, a 50 us kernel, the team's 4 us
        TraceEvent(mm.id, mm.name, "F", "cpu0", 0, 2, 0, int(1e3 * (DISPATCH.op_us + 54.0)), step)
        for step in range(3)
    )
    traced = p.with_trace(Trace(events=events, meta={"source": "exec", "graph_hash": g.hash, "plan": {"slots": 1}}), g)
    # (the mm's parallel share is 1 - 2e-8: all of the team's wait)
    assert traced.kernel_us(mm, 2) == pytest.approx(54.0, abs=0.01)  # 50 in the table, the wait added back once
    assert traced.for_slots(2).kernel_us(mm, 2) == pytest.approx(50.0 + 30.0, abs=0.01)  # the co-run wait, not the team's


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
    # the two-slot wait is read off the median step: a fastest step half as long changes nothing
    halved = [dataclasses.replace(r, measured_s=r.measured_s / 2, median_s=r.measured_s) for r in runs[:2]]
    assert fit_corun_latency(base, halved, machine)[0].corun.latency_us == pytest.approx({1: 12.0, 2: 30.0}, abs=0.15)


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


def test_the_runs_carry_the_median_step_which_the_two_slot_fit_matches_and_the_fastest_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two-slot fit matches the median of the timed steps, the team's fit the ratio of
    the fastest; both are kept in the report, so that a fit on either can be tried offline
    on a saved profile."""
    import schedlab.exec as exec_pkg
    from schedlab.calibrate.corun_fit import measure_corun_runs
    from schedlab.exec import ExecResult

    g, machine = make_graph(), cpu_machine(2)
    # step times by (slots, threads), handed out in turn; the first one-slot one-thread call is the size check
    times = {(1, 1): [0.001], (2, 1): [0.009, 0.004, 0.006], (2, 2): [0.012, 0.010, 0.030]}
    team = {(1, 1): [0.002, 0.004, 0.003], (1, 2): [0.005, 0.008, 0.004]}  # one step per round, three rounds
    calls: list[tuple[int, int, int]] = []

    def fake_run_steps(graph: Graph, inputs: object, plan: Plan, machine: object, steps: int, warmup: int) -> ExecResult:
        key = (plan.slots, plan.threads or 1)
        calls.append((*key, steps))
        if times.get(key):
            taken, times[key] = times[key], []
        else:
            taken = [team[key].pop(0)]
        return ExecResult(step_times_s=tuple(taken), trace=Trace(events=()), outputs={})

    monkeypatch.setattr(exec_pkg, "run_steps", fake_run_steps)
    runs = measure_corun_runs([("toy", g, {})], (1, 2), machine, steps=3)
    assert [(r.slots, r.threads) for r in runs] == [(2, 1), (2, 2), (1, 2)]
    assert [r.measured_s for r in runs] == [0.004, 0.010, 0.004]  # the fastest of each
    assert [r.median_s for r in runs] == [0.006, 0.012, 0.005]
    assert runs[2].one_thread_s == 0.002 and runs[2].one_thread_median_s == 0.003
    assert calls == [(1, 1, 1), (2, 1, 3), (2, 2, 3), (1, 1, 1), (1, 2, 1), (1, 1, 1), (1, 2, 1), (1, 1, 1), (1, 2, 1)]
    _, report = fit_corun_latency(make_profile(), runs, machine)
    assert report[0]["measured_ms"] == 4.0 and report[0]["median_ms"] == 6.0
    assert report[0]["target_ms"] == 6.0 and report[1]["target_ms"] == 12.0  # two slots: the median
    assert report[2]["one_thread_measured_ms"] == 2.0 and report[2]["one_thread_median_ms"] == 3.0
    fastest_only = [dataclasses.replace(r, median_s=None) for r in runs[:2]]  # a row kept before medians
    assert [row["target_ms"] for row in fit_corun_latency(make_profile(), fastest_only, machine)[1]] == [4.0, 10.0]


def test_whether_a_call_runs_inline_does_not_turn_on_the_co_run_wait() -> None:
    """The simulator lets a call no faster at two threads than at one hold one core
    (`sim.cost.team_or_inline`). It compares the kernels alone (`Profile.team_basis_us`):
    compared with the co-run wait in, a one-thread wait above the two-thread one made every
    tiny op look faster at two threads, and a plan of two threads, which pays only the
    two-thread wait, came out slower as the one-thread wait grew."""
    b = GraphBuilder("branches")
    x = b.input("x", 64)
    relus = [b.op(f"relu{i}", [x], nbytes=64, target="aten.relu.default") for i in range(8)]
    b.output(b.op("join", relus, nbytes=64, target="aten.add.Tensor"))
    g, machine = b.build(), cpu_machine(2)
    plan = resolve(g, Plan(slots=2, threads=2), machine)
    low, high = (with_waits(make_profile(), {1: w1, 2: 10.0}, {}) for w1 in (5.0, 40.0))
    relu = g.ops[0]
    assert high.for_slots(2).team_basis_us(relu, 2) == low.team_basis_us(relu, 2) == make_profile().kernel_us(relu, 2)
    assert high.for_slots(2).kernel_us(relu, 1) > 1.05 * high.for_slots(2).kernel_us(relu, 2)  # the old trap
    for engine in ("simpy", "compiled"):
        steps = [simulate(g, plan, machine, p.for_graph(g).for_slots(2), record=False, engine=engine).step_time_s
                 for p in (low, high)]
        assert steps[0] == pytest.approx(steps[1], rel=1e-12), engine
