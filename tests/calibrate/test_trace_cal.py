"""Trace-driven calibration: ops seen in a real step cost what they cost there."""

from __future__ import annotations

import pytest

from schedlab.calibrate import signature
from schedlab.calibrate.trace_cal import trace_slots
from schedlab.errors import SchedlabError
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, make_graph, make_profile

US = 1000  # ns


def event(op: int, start_us: float, dur_us: float, threads: int = 1, worker: int = 0, step: int = 1) -> TraceEvent:
    name = ("mm", "t", "relu")[op]
    return TraceEvent(op, name, "F", "cpu0", worker, threads, int(start_us * US), int((start_us + dur_us) * US), step)


def one_slot_trace(steps: int = 3) -> Trace:
    """Back-to-back events, as the executor's straight-line step records them."""
    events = []
    for step in range(steps):
        t = 0.0
        for _ in range(10):  # ten repetitions of the 3-op graph per step
            for op, dur in ((0, 53.0), (1, 2.1), (2, 13.0)):
                dur = dur * 10 if step == 0 and op == 0 else dur  # one stalled step (10x): robust_mean drops it
                events.append(event(op, t, dur, threads=2, step=step))
                t += dur
    return Trace(events=tuple(events), meta={"source": "exec", "plan": {"slots": 1}})


def test_with_trace_adds_signatures_at_the_recorded_threads() -> None:
    graph = make_graph()
    p = make_profile().with_trace(one_slot_trace(), graph)
    mm, view, relu = graph.ops
    # one slot: events hold the whole dispatch, so the floor is op_us; the stalled step is
    # not the median one, so the step factor is 1 (to the events' nanosecond rounding)
    assert p.meta["traces"][0]["step_factor"] == pytest.approx(1.0, abs=1e-4)
    assert p.signatures[signature(mm)] == {2: pytest.approx(53.0 - DISPATCH.op_us, rel=1e-4)}
    assert p.kernel_us(mm, 2) == pytest.approx(50.0, rel=1e-4)
    assert p.kernel_us(relu, 2) == pytest.approx(10.0, rel=1e-4)
    assert signature(view) not in p.signatures and p.kernel_us(view, 2) == 0.0
    record = p.meta["traces"][0]
    assert record["graph_hash"] == graph.hash and record["slots"] == 1
    assert record["events_used"] == 60  # 2 kernels x 10 repetitions x 3 steps
    assert p.dispatch == DISPATCH


def test_trace_entries_replace_microbenchmark_ones_and_keep_other_threads() -> None:
    graph = make_graph()
    mm = graph.ops[0]
    p = make_profile(signatures={signature(mm): {1: 90.0, 2: 70.0}}).with_trace(one_slot_trace(), graph)
    assert p.signatures[signature(mm)] == {1: 90.0, 2: pytest.approx(50.0, rel=1e-4)}


def test_corun_trace_uses_the_corun_floor_and_leaves_out_overlapping_events() -> None:
    events = (
        event(0, 0.0, 100.0, worker=0),
        event(2, 50.0, 100.0, worker=1),  # co-runs with the mm
        event(2, 200.0, 11.6, worker=0),
    )
    trace = Trace(events=events, meta={"source": "exec", "plan": {"slots": 2}})
    assert trace_slots(trace) == 2
    graph = make_graph()
    p = make_profile().with_trace(trace, graph)
    assert signature(graph.ops[0]) not in p.signatures
    assert p.signatures[signature(graph.ops[2])] == {1: pytest.approx(11.6 - DISPATCH.corun_event_floor_us)}
    assert p.meta["traces"][0]["events_overlapping"] == 2


def test_a_trace_whose_every_step_pays_a_slow_kernel_reads_it_in_the_mean() -> None:
    """Every step has one slow mm (a different repetition each time, under the stall cut):
    the mean of the mm's events holds it, so the table sums to a typical step's kernels and
    the step factor is 1 (the median read the fast mm and needed a factor of 1.08)."""
    events = []
    for step in range(3):
        t = 0.0
        for rep in range(10):
            for op, dur in ((0, 53.0), (2, 13.0)):
                dur = dur * 2 if op == 0 and rep == step else dur
                events.append(event(op, t, dur, step=step))
                t += dur
    graph = make_graph()
    p = make_profile().with_trace(Trace(events=tuple(events), meta={"source": "exec", "plan": {"slots": 1}}), graph)
    assert p.meta["traces"][0]["step_factor"] == pytest.approx(1.0, abs=1e-4)
    assert p.kernel_us(graph.ops[0], 1) == pytest.approx(53.0 * 1.1 - DISPATCH.op_us, rel=1e-4)
    assert p.kernel_us(graph.ops[2], 1) == pytest.approx(13.0 - DISPATCH.op_us, rel=1e-4)


def test_a_trace_whose_steps_disagree_with_its_table_scales_its_kernels() -> None:
    """The step factor still scales the table where a typical step's kernels and the
    table's sum part: a stall the cut drops in every step (3 of 3 steps hold one)
    is not the typical event, and the median step holds it."""
    events = []
    for step in range(3):
        t = 0.0
        for rep in range(10):
            for op, dur in ((0, 53.0), (2, 13.0)):
                dur = dur * 10 if op == 0 and rep == step else dur
                events.append(event(op, t, dur, step=step))
                t += dur
    graph = make_graph()
    p = make_profile().with_trace(Trace(events=tuple(events), meta={"source": "exec", "plan": {"slots": 1}}), graph)
    typical = 10 * (53.0 - DISPATCH.op_us) + 10 * (13.0 - DISPATCH.op_us)
    factor = (typical + 9 * 53.0) / typical
    assert p.meta["traces"][0]["step_factor"] == pytest.approx(factor, rel=1e-4)
    assert p.kernel_us(graph.ops[0], 1) == pytest.approx((53.0 - DISPATCH.op_us) * factor, rel=1e-4)


def test_slots_default_to_one() -> None:
    assert trace_slots(Trace(events=(), meta={"source": "exec"})) == 1
    assert trace_slots(Trace(events=(), meta={"source": "exec", "plan": {"slots": "x"}})) == 1


def test_simulated_trace_is_refused() -> None:
    with pytest.raises(SchedlabError, match="needs an executor trace"):
        make_profile().with_trace(Trace(events=(), meta={"source": "sim"}), make_graph())


def test_trace_of_another_graph_is_refused() -> None:
    trace = Trace(events=(), meta={"source": "exec", "graph_hash": "0123456789abcdef"})
    with pytest.raises(SchedlabError, match="recorded for graph 0123456789abcdef"):
        make_profile().with_trace(trace, make_graph())
    bad_op = Trace(events=(event(0, 0, 1), TraceEvent(9, "x", "F", "cpu0", 0, 1, 0, 5, 1)), meta={"source": "exec"})
    with pytest.raises(SchedlabError, match="names op 9, but graph 'toy' has 3 ops"):
        make_profile().with_trace(bad_op, make_graph())


def test_robust_mean_ignores_stalls() -> None:
    from schedlab.calibrate.trace_cal import robust_mean

    us = 1000.0  # durations are in ns
    assert robust_mean([50 * us, 500 * us, 600 * us]) == 50 * us  # two of three steps stalled
    assert robust_mean([10 * us] * 9 + [200 * us] * 3) == 10 * us
    assert robust_mean([100 * us, 120 * us, 140 * us]) == 120 * us
    # skewed below the stall line: the mean, which sums to the step as the ops do (a median read 100)
    assert robust_mean([100 * us, 100 * us, 100 * us, 180 * us, 220 * us]) == 140 * us
    # below zero (an event shorter than the context taken off it): no stall rule drops them all
    assert robust_mean([-30 * us, -20 * us, 500 * us]) == -25 * us


def test_calibration_rounds_alternate_the_thread_counts_and_pool_their_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With rounds, 1 thread and all threads alternate; each count's runs are joined, so one
    slow round moves its median part way instead of deciding it."""
    import statistics
    from types import SimpleNamespace

    import schedlab.exec
    from schedlab.calibrate.trace_cal import calibrate_with_traces
    from schedlab.sim.testing import cpu_machine

    graph = make_graph()
    mm = graph.ops[0]
    asked: list[int] = []

    def fake_run_steps(g, inputs, plan, machine, steps, warmup, executor=None):  # type: ignore[no-untyped-def]
        slow = 1.5 if len(asked) == 1 else 1.0  # the first round's all-threads run hit a slow spell
        asked.append(plan.threads)
        events = []
        for step in range(steps):
            t = 0.0
            for op, dur in ((0, 53.0), (1, 2.1), (2, 13.0)):
                events.append(event(op, t, dur * slow, threads=plan.threads, step=step))
                t += dur * slow
        times = tuple(0.01 * slow * (1 + k / 100) for k in range(steps))
        trace = Trace(tuple(events), {"source": "exec", "plan": {"slots": 1}})
        return SimpleNamespace(trace=trace, step_times_s=times, step_time_s=statistics.median(times))

    monkeypatch.setattr(schedlab.exec, "run_steps", fake_run_steps)
    machine = cpu_machine(cores=2)
    once: dict[int, float] = {}
    one_round = calibrate_with_traces(make_profile(), graph, {}, machine, steps=3, step_times_s=once)
    assert asked == [1, 2]
    asked.clear()
    pooled: dict[int, float] = {}
    two = calibrate_with_traces(make_profile(), graph, {}, machine, steps=3, step_times_s=pooled, rounds=2)
    assert asked == [1, 2, 1, 2]
    slow_us, quiet_us = one_round.signatures[signature(mm)][2], two.signatures[signature(mm)][2]
    assert quiet_us < slow_us  # the slow round no longer decides the 2-thread time alone
    assert two.signatures[signature(mm)][1] == pytest.approx(one_round.signatures[signature(mm)][1])
    assert [t["events_used"] for t in two.meta["traces"]] == [12, 12]  # 2 kernels x 3 steps x 2 rounds, per count
    assert pooled[2] == pytest.approx(statistics.median([0.01 * s * (1 + k / 100) for s in (1.5, 1.0) for k in range(3)]))
    with pytest.raises(SchedlabError, match="rounds must be at least 1"):
        calibrate_with_traces(make_profile(), graph, {}, machine, steps=3, rounds=0)


def test_a_placement_search_calibrates_one_thread_in_its_plans_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A placement-only search on several devices scores critical-path plans of one thread
    per rank: its one-thread calibration steps run that order, ranked by the profile's op
    times; all threads, and every other search, in program order."""
    from types import SimpleNamespace

    import schedlab.exec
    from schedlab.calibrate.trace_cal import one_process_traces
    from schedlab.search.placement.space import PLACEMENT_ORDER, calibration_order
    from schedlab.sim.testing import cpu_machine

    assert calibration_order("placement", 2) == PLACEMENT_ORDER == "critical-path"
    assert [calibration_order(s, n) for s, n in (("placement", 1), ("concurrency", 2), ("all", 2))] == ["topo"] * 3
    ran: list[tuple[int | None, str, object]] = []

    def fake_run_steps(g, inputs, plan, machine, steps, warmup, executor=None):  # type: ignore[no-untyped-def]
        ran.append((plan.threads, plan.order, None if executor is None else executor.resolved.priority))
        return SimpleNamespace(trace=Trace((), {"source": "exec"}), step_times_s=(0.01,))

    class FakeExecutor:
        def __init__(self, graph, resolved) -> None:  # type: ignore[no-untyped-def]
            self.resolved = resolved

    monkeypatch.setattr(schedlab.exec, "run_steps", fake_run_steps)
    monkeypatch.setattr(schedlab.exec, "Executor", FakeExecutor)
    graph = make_graph()
    weights = {op.id: 10.0 * (1 + op.id) for op in graph.ops}
    traces = one_process_traces(graph, {}, cpu_machine(cores=2), 2, one_thread_order="critical-path",
                                weights=lambda op, threads: weights[op.id])
    assert sorted(traces) == [1, 2] and [(t, o) for t, o, _ in ran] == [(1, "critical-path"), (2, "topo")]
    assert ran[0][2] is not None and ran[1][2] is None  # the one-thread order ranked with the given op times
