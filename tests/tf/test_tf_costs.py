"""TensorFlow's cost model from its own traces, and the fidelity protocol built on it."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("tensorflow")

from schedlab.calibrate.signature import signature
from schedlab.calibrate.tf_costs import TFCalibrationRun, TFCosts, tf_costs
from schedlab.calibrate.tf_fidelity import as_plan, is_tf_calibration, predict_tf, tf_plan_spread
from schedlab.calibrate.trace_cal import trace_figures
from schedlab.errors import SchedlabError
from schedlab.sim.testing import cpu_machine
from schedlab.tf.runtime import TFThreads
from tests.tf import IN_PROCESS, tiny_models


@pytest.fixture(scope="module")
def mlp_run():  # type: ignore[no-untyped-def]
    from schedlab.exec.tf_run import run_tensorflow

    return run_tensorflow(tiny_models.mlp(), IN_PROCESS, steps=6, warmup=1)


def _as_calibration(run: Any, inter_op: int = 1) -> TFCalibrationRun:
    """The in-process run (one inter-op thread, `IN_PROCESS`) as a calibration run."""
    return TFCalibrationRun(run.graph, run.trace, run.step_times_s, intra_op=1, inter_op=inter_op)


def test_every_timed_kernel_gets_its_trace_time(mlp_run) -> None:  # type: ignore[no-untyped-def]
    # One inter-op thread, yet TF may run a cheap node inline on the caller's thread beside
    # it (under CI's load 5 of 89 events overlapped once, 50 of 150 another time): those are
    # left out of the table, and an op gets its time from the steps where it ran alone. With
    # TF's default inter-op pool they overlapped in every step and 7 ops got no time at all.
    figs = trace_figures(mlp_run.trace, mlp_run.graph, floor_us=0.0)
    g = mlp_run.graph
    kernels = [op for op in g.ops if not op.is_view]
    assert figs.n_events_overlapping < 0.5 * (figs.n_events_used + figs.n_events_overlapping)
    assert len(figs.ops_without_clean_event) <= len(kernels) // 10
    costs = tf_costs([_as_calibration(mlp_run)], base=None)
    untimed = [g.ops[i] for i in figs.ops_without_clean_event]
    assert sum(costs.unseen(g).values()) <= len(untimed)
    factor = costs.meta["runs"][0]["step_factor"]
    assert 0.5 <= factor <= 2.0
    for op in kernels:
        if op.id in figs.ops_without_clean_event:
            continue
        timed = [e.dur_ns / 1e3 for e in mlp_run.trace.events if e.op == op.id]
        got = costs.kernel_us(op, 1)
        # one signature may cover several ops: its typical time lies within theirs, and the
        # model holds it scaled by what a median step spends beyond the per-op typical times
        same = [e.dur_ns / 1e3 for e in mlp_run.trace.events if signature(g.ops[e.op]) == signature(op)]
        typical = figs.signatures[signature(op)]
        assert timed and all(min(same) <= us <= max(same) for us in typical.values())
        assert costs.signatures[signature(op)] == pytest.approx({k: us * factor for k, us in typical.items()}, rel=1e-3)
        assert got > 0
    assert costs.node_us >= 0.0 and costs.session_us >= 0.0
    assert costs.to_json()["schema"] == "schedlab.tf_costs"


def test_the_calibrated_setting_is_predicted_from_its_own_trace(mlp_run) -> None:  # type: ignore[no-untyped-def]
    costs = tf_costs([_as_calibration(mlp_run)], base=None)
    machine = cpu_machine(1)
    pred = predict_tf(mlp_run.graph, TFThreads(1, 1), costs, machine)
    measured = mlp_run.step_time_s
    # played back: kernels, per-node gaps and the session's fixed cost add up to the step
    assert 0.5 * measured < pred.step_time_s < 2.0 * measured
    assert pred.sim_wall_s > 0 and pred.sim_cold_s > 0


def test_calibration_needs_a_one_inter_op_run(mlp_run) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match="at least one traced run"):
        tf_costs([], base=None)
    with pytest.raises(SchedlabError, match="one inter-op thread"):
        tf_costs([_as_calibration(mlp_run, inter_op=2)], base=None)


class _RecordingProfile:
    """Stands for the torch Profile: records the co-running it is asked about."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def corun_slowdown(self, op: Any, busy_cores: int, total_cores: int) -> float:
        self.asked.append((busy_cores, total_cores))
        return 1.5


def test_tf_kernels_share_one_pool_and_never_oversubscribe(mlp_run) -> None:  # type: ignore[no-untyped-def]
    base = _RecordingProfile()
    costs = TFCosts(signatures={}, node_us=1.0, session_us=0.0, base=base)  # type: ignore[arg-type]
    op = next(op for op in mlp_run.graph.ops if not op.is_view)
    assert costs.corun_slowdown(op, 1, 2) == 1.5
    assert costs.corun_slowdown(op, 4, 2) == 1.5
    assert base.asked == [(1, 2), (1, 2)]  # the others busy on every core is contention, not oversubscription
    assert TFCosts(signatures={}, node_us=1.0, session_us=0.0).corun_slowdown(op, 4, 2) == 1.0


def test_the_spread_and_its_calibration_settings() -> None:
    spread = tf_plan_spread(2)
    assert spread == [TFThreads(1, 1), TFThreads(1, 2), TFThreads(2, 1), TFThreads(2, 2)]
    assert [is_tf_calibration(t) for t in spread] == [True, False, True, False]
    assert tf_plan_spread(1) == [TFThreads(1, 1)]
    plan = as_plan(TFThreads(0, 0), cores=8)
    assert (plan.slots, plan.threads) == (8, 8)  # TF's default: one thread per core in each pool


def test_the_cost_model_round_trips_and_a_corrupt_one_is_named(mlp_run) -> None:  # type: ignore[no-untyped-def]
    from schedlab.calibrate.tf_costs import tf_costs_from_json

    costs = tf_costs([_as_calibration(mlp_run)], base=None)
    back = tf_costs_from_json(costs.to_json(), base=None)
    assert (back.signatures, back.node_us, back.session_us) == (costs.signatures, costs.node_us, costs.session_us)
    with pytest.raises(SchedlabError, match="not a TensorFlow cost model"):
        tf_costs_from_json({"schema": "other"}, base=None)
    with pytest.raises(SchedlabError, match=r"corrupt tf_costs\.json"):
        tf_costs_from_json({**costs.to_json(), "node_us": "fast"}, base=None)


def test_rounds_measure_the_spread_round_robin_and_score_on_every_rounds_steps(mlp_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With rounds, every setting runs once per round in spread order; a setting's time is
    the median of all its rounds' steps, each round's median is kept, and calibration takes
    the round whose median is nearest that (its own step times, which its trace's steps are)."""
    import statistics

    from schedlab.calibrate import tf_fidelity
    from schedlab.exec.tf_job import TFResult

    plans = [TFThreads(1, 1), TFThreads(1, 2)]
    n = len(mlp_run.step_times_s)
    scale = {0: 1.0, 1: 3.0, 2: 1.1}  # round 1 is a slow spell
    asked: list[str] = []

    def fake_worker(req, timeout_s):  # type: ignore[no-untyped-def]
        k = len(asked) // len(plans)
        asked.append(tf_fidelity.plan_name(req.threads))
        times = tuple(t * scale[k] for t in mlp_run.step_times_s)
        return TFResult(mlp_run.graph, mlp_run.trace, times, {"numerics_ok": k != 1}, None)  # the slow round's check failed

    monkeypatch.setattr(tf_fidelity, "run_tf_worker", fake_worker)
    fid = tf_fidelity.tf_fidelity("mlp", "tiny", plans, None, cpu_machine(cores=2), rounds=3)
    assert asked == ["tf-intra1-inter1", "tf-intra1-inter2"] * 3
    every = [t * scale[k] for k in range(3) for t in mlp_run.step_times_s]
    for row in fid.rows:
        assert row.measured_s == pytest.approx(statistics.median(every))
        assert row.round_medians_s == pytest.approx(tuple(statistics.median(mlp_run.step_times_s) * scale[k]
                                                          for k in range(3)))
        assert row.measured_spread_s == (min(every), max(every))
    assert [r["steps"] for r in fid.costs.meta["runs"]] == [n]  # one round calibrates, not the pooled steps
    assert len(fid.results["tf-intra1-inter1"].step_times_s) == 3 * n
    assert fid.numerics_ok is False  # a failed check in any round, not only the typical one's
    with pytest.raises(SchedlabError, match="rounds must be at least 1"):
        tf_fidelity.tf_fidelity("mlp", "tiny", plans, None, cpu_machine(cores=2), rounds=0)
