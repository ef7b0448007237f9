"""Fidelity on several ranks (`calibrate.rank_fidelity`, `schedlab fidelity --devices N`):
the spread as data, the per-kind summaries, and a short real run on 2 ranks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from schedlab.backend import BackendRun
from schedlab.calibrate.comm_host import host_costs_of
from schedlab.calibrate.fidelity import PROFILE_ONLY, TRACE_CALIBRATED, FidelityRow, Measurement
from schedlab.calibrate.rank_fidelity import (
    DATA_PARALLEL,
    HYBRID,
    PIPELINE,
    PLACED,
    RANK_PLAN_SPREAD,
    REVERSE_FIRST_K,
    RankFidelity,
    RankPlanSpec,
    layers_cut_at,
    pooled_rounds,
    rank_cases,
    rank_plan_spread,
    rank_summary,
    step_shapes,
)
from schedlab.calibrate.trace_cal import joined_traces
from schedlab.cli import main
from schedlab.errors import SchedlabError
from schedlab.machine import detect_host, host_ranks
from schedlab.microbatch import PipelineStep
from schedlab.plan import DEFAULT_STEADY_STEPS
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import make_profile
from tests.calibrate.test_comm_host import _points
from tests.calibrate.test_links import synthetic_fits
from tests.conftest import captured_workload


def test_the_spread_has_every_kind_and_fits_its_devices() -> None:
    kinds = {s.kind for s in RANK_PLAN_SPREAD}
    assert kinds == {PLACED, DATA_PARALLEL, REVERSE_FIRST_K, PIPELINE, HYBRID}
    assert len({s.name for s in RANK_PLAN_SPREAD}) == len(RANK_PLAN_SPREAD)
    assert all(s.steps == DEFAULT_STEADY_STEPS for s in RANK_PLAN_SPREAD if s.kind == REVERSE_FIRST_K)
    two = rank_plan_spread(2)
    assert [s.name for s in two] == [s.name for s in RANK_PLAN_SPREAD if s.kind != HYBRID]  # replicas of pipelines: 4+
    four = {s.name for s in rank_plan_spread(4)}
    assert "layers" in four and "dp-b25" in four and "layers-30" not in four  # a cut in two needs 2 per replica
    assert "pipe-r2-1f1b-m2" in four and "pipe-r2-1f1b-m2" not in {s.name for s in rank_plan_spread(3)}
    assert [s.name for s in rank_plan_spread(2, names=["dp-b1", "layers"])] == ["layers", "dp-b1"]
    with pytest.raises(SchedlabError, match="unknown plans"):
        rank_plan_spread(2, names=["nope"])
    with pytest.raises(SchedlabError, match="at least 2 devices"):
        rank_plan_spread(1)


def test_specs_build_plans() -> None:
    _, c = captured_workload("mlp")
    devices = ["cpu0", "cpu1"]
    dp = RankPlanSpec(DATA_PARALLEL, "dp", replicas=0, bucket_mb=4.0, order="w-last").plan(c.graph, devices, None)
    assert (dp.replicas, dp.bucket_mb, dp.order, dp.threads, dp.name) == (2, 4.0, "w-last", 1, "dp")
    placed = RankPlanSpec(PLACED, "l", placement="layers").plan(c.graph, devices, None)
    assert placed.replicas == 1 and set(placed.layer_devices.values()) == {"cpu0", "cpu1"}
    with pytest.raises(SchedlabError, match="unknown placement"):
        RankPlanSpec(PLACED, "x", placement="rows").plan(c.graph, devices, None)


def test_a_pipeline_spec_runs_its_schedule_over_a_replicas_devices() -> None:
    spec = RankPlanSpec(PIPELINE, "p", schedule="gpipe", micro_batches=4)
    assert spec.fits(2) and spec.fits(4) and not RankPlanSpec(PIPELINE, "p", schedule="1f1b", replicas=2).fits(2)
    _, c = captured_workload("mlp")
    plan = spec.plan(c.graph, ["cpu0", "cpu1"], None)
    assert (plan.micro_batches, plan.n_stages, plan.schedule, plan.pipeline_devices) == (4, 2, "gpipe", ("cpu0", "cpu1"))
    assert plan.split_batch_stats  # a micro-batch's batch norm sees its part only: accepted, it changes no time
    shapes = step_shapes([spec, RankPlanSpec(DATA_PARALLEL, "d", replicas=0), RankPlanSpec(PLACED, "l")], 2)
    assert shapes == [(1, 1), (1, 4), (2, 1)]  # the full step, one micro-batch's, one replica's: each calibrated once
    hybrid = RankPlanSpec(HYBRID, "h", schedule="1f1b", micro_batches=2, replicas=2)
    plan = hybrid.plan(c.graph, ["cpu0", "cpu1", "cpu2", "cpu3"], None)
    assert (plan.replicas, plan.micro_batches, plan.pipeline_devices) == (2, 2, ("cpu0", "cpu1"))


def test_pipeline_cases_take_the_micro_batch_step() -> None:
    from schedlab.cli.common import plan_step_of

    asked: list[tuple[int, int]] = []

    def step_of(replicas: int, micro_batches: int):  # type: ignore[no-untyped-def]
        asked.append((replicas, micro_batches))
        return plan_step_of("mlp", "tiny", "sgd", 0, replicas=replicas, cache=True, micro_batches=micro_batches)

    specs = rank_plan_spread(2, names=["pipe-1f1b-m2"])
    (case,) = rank_cases("mlp", step_of, specs, host_ranks(2), None)
    assert asked == [(1, 2)]
    run = case.resolved.run_graph(case.graph)
    assert set(case.resolved.device) == {"cpu0", "cpu1"} and any(o.kind.name == "COMM" for o in run.ops)
    assert isinstance(step_of(1, 2), PipelineStep) and len(case.inputs) >= len(case.graph.inputs)


def test_a_cut_puts_the_first_share_of_the_cost_on_the_first_device() -> None:
    _, c = captured_workload("mlp")  # layers body.0, body.2, head in forward order
    layer_us = {"body.0": 1.0, "body.2": 1.0, "head": 8.0}
    n_ops = {lay: sum(1 for op in c.graph.ops if op.layer == lay) for lay in layer_us}

    def cost(op, threads):  # type: ignore[no-untyped-def]  # each layer's ops add up to layer_us
        return layer_us[op.layer] / n_ops[op.layer] if op.layer in layer_us else 0.0

    assert layers_cut_at(c.graph, ["a", "b"], 0.08, cost) == {"body.0": "a", "body.2": "b", "head": "b"}
    assert layers_cut_at(c.graph, ["a", "b"], 0.15, cost) == {"body.0": "a", "body.2": "a", "head": "b"}
    assert layers_cut_at(c.graph, ["a", "b"], 0.99, cost) == {"body.0": "a", "body.2": "a", "head": "b"}  # b keeps one
    with pytest.raises(SchedlabError, match="between 0 and 1"):
        layers_cut_at(c.graph, ["a", "b"], 1.0, cost)


def _row(workload: str, plan: str, kind: str, measured: float, predicted: float, method: str) -> FidelityRow:
    return FidelityRow(workload, plan, measured, (measured, measured), predicted, 1e-3, 1e-3, 10, False, method,
                       0.0, kind)


def test_summary_per_workload_and_kind() -> None:
    rows = [
        _row("m", "a", PLACED, 1.0, 1.1, TRACE_CALIBRATED),
        _row("m", "b", PLACED, 2.0, 1.8, TRACE_CALIBRATED),
        _row("m", "c", DATA_PARALLEL, 3.0, 3.0, TRACE_CALIBRATED),
        _row("m", "d", DATA_PARALLEL, 4.0, 2.0, TRACE_CALIBRATED),
    ]
    s = rank_summary([RankFidelity("m", {TRACE_CALIBRATED: rows})], [TRACE_CALIBRATED])
    (m,) = s["models"]
    t = m["trace_calibrated"]
    assert t["mape"] == pytest.approx((0.1 + 0.1 + 0.0 + 0.5) / 4)
    assert t["kinds"][PLACED]["mape"] == pytest.approx(0.1) and t["kinds"][PLACED]["kendall_tau"] == pytest.approx(1.0)
    assert t["kinds"][DATA_PARALLEL]["worst_error"] == pytest.approx(-0.5)
    assert t["kendall_tau"] == pytest.approx(4 / 6)  # of 6 pairs, only (c, d) is predicted the wrong way round
    assert REVERSE_FIRST_K not in t["kinds"]
    o = s["overall"]["trace_calibrated"]
    assert o["n_plans"] == 4 and o["kinds"][DATA_PARALLEL]["n_plans"] == 2
    assert [p["plan_kind"] for p in s["plans"]] == [PLACED, PLACED, DATA_PARALLEL, DATA_PARALLEL]
    assert all(p["scored"] for p in s["plans"])


@pytest.fixture
def links_profile(tmp_path: Path) -> Path:
    fits = dataclasses.replace(synthetic_fits(), host_costs=host_costs_of(_points()))
    profile = dataclasses.replace(make_profile(machine=detect_host().fingerprint), links=fits)
    return profile.save(tmp_path / "profile.json")


def test_two_rank_fidelity_command(capsys, tmp_path: Path, links_profile: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ranks.json"
    argv = ["fidelity", "mlp", "--size", "tiny", "--devices", "2", "--plans", "layers,dp-b25,pipe-1f1b-m2", "--steps", "2",
            "--no-trace-calibration", "--profile", str(links_profile), "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d == json.loads(out.read_text())
    assert (d["set"], d["devices"], d["link_model"], d["host_costs"]) == ("built-in", 2, "fit", True)
    assert d["methods"] == [PROFILE_ONLY] and d["trace_calibration"] is False
    assert [(p["plan"], p["plan_kind"], p["method"]) for p in d["plans"]] == [
        ("layers", PLACED, PROFILE_ONLY), ("dp-b25", DATA_PARALLEL, PROFILE_ONLY),
        ("pipe-1f1b-m2", PIPELINE, PROFILE_ONLY)]
    assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 for p in d["plans"])
    assert d["plans"][0]["ops"] > len(captured_workload("mlp")[1].graph.ops)  # the expanded graph's ops
    (w,) = d["workloads"]
    assert w["workload"] == "mlp" and set(w["kinds"]) == {PLACED, DATA_PARALLEL, PIPELINE}
    assert d["mape"] == pytest.approx(sum(abs(p["error"]) for p in d["plans"]) / 3)
    assert set(d["overall"]["profile_only"]["kinds"]) == {PLACED, DATA_PARALLEL, PIPELINE}
    assert d["plan_specs"][2]["schedule"] == "1f1b" and d["plan_specs"][2]["micro_batches"] == 2


def test_rounds_pool_every_step_and_keep_the_typical_rounds_trace() -> None:
    def taken(times: tuple[float, ...], tag: str, foreign: float | None) -> Measurement:
        return Measurement(BackendRun(times, Trace((), {"tag": tag})), foreign)

    one = taken((1.0, 2.0), "a", 0.1)
    assert pooled_rounds([one]) is one
    pooled = pooled_rounds([taken((1.0, 1.1, 1.2), "fast", 0.0), taken((2.0, 2.2, 2.4), "slow", 0.3),
                            taken((1.3, 1.4, 1.5), "typical", None)])
    assert pooled.run.step_times_s == (1.0, 1.1, 1.2, 2.0, 2.2, 2.4, 1.3, 1.4, 1.5)
    assert pooled.run.step_time_s == pytest.approx(1.4)  # one slow round moves the plan's time little
    assert pooled.round_medians_s == (1.1, 2.2, 1.4)
    assert pooled.run.trace.meta["tag"] == "typical" and pooled.foreign_cpu_frac == 0.3
    assert [t.meta["tag"] for t in pooled.round_traces] == ["fast", "slow", "typical"]


def test_calibration_runs_join_as_one_trace_with_their_steps_in_turn() -> None:
    def run(steps: int, dur_ns: int) -> Trace:
        return Trace(tuple(TraceEvent(0, "mm", "F", "cpu0", 0, 1, 0, dur_ns, k) for k in range(steps)), {"a": 1})

    first = run(2, 10)
    assert joined_traces([first]) is first
    joined = joined_traces([first, run(3, 30)])
    assert [(e.step, e.dur_ns) for e in joined.events] == [(0, 10), (1, 10), (2, 30), (3, 30), (4, 30)]
    assert joined.meta == {"a": 1, "joined_runs": 2}


@pytest.mark.slow
def test_two_rank_fidelity_in_rounds(capsys, tmp_path: Path, links_profile: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ranks.json"
    argv = ["fidelity", "mlp", "--size", "tiny", "--devices", "2", "--plans", "dp-b25", "--steps", "2", "--rounds", "2",
            "--profile", str(links_profile), "--out", str(out), "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rounds"] == 2 and d["methods"] == [TRACE_CALIBRATED]  # calibrated in each round
    (row,) = d["plans"]
    assert len(row["round_medians_s"]) == 2 and all(t > 0 for t in row["round_medians_s"])
    assert min(row["round_medians_s"]) <= row["measured_s"] <= max(row["round_medians_s"])


def test_a_two_rank_run_cut_short_resumes_with_the_models_it_finished(
    capsys, tmp_path: Path, links_profile: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    from schedlab.calibrate import rank_fidelity as rf

    out = tmp_path / "ranks.json"
    argv = ["fidelity", "mlp", "cnn", "--size", "tiny", "--devices", "2", "--plans", "dp-b25", "--steps", "1",
            "--no-trace-calibration", "--profile", str(links_profile), "--out", str(out)]
    real, ran = rf.rank_fidelity, []

    def measured(workload: str, *a: object, **kw: object) -> object:
        ran.append(workload)
        if workload == "cnn" and len(ran) == 2:  # the first run is cut short on its second model
            raise KeyboardInterrupt
        return real(workload, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rf, "rank_fidelity", measured)
    assert main(argv) == 130
    cut = json.loads(out.read_text())
    assert cut["complete"] is False and cut["pending"] == ["cnn"] and [p["workload"] for p in cut["plans"]] == ["mlp"]
    assert main([*argv, "--resume"]) == 0 and ran == ["mlp", "cnn", "cnn"]
    done = json.loads(out.read_text())
    assert done["complete"] is True and [w["workload"] for w in done["workloads"]] == ["mlp", "cnn"]
    assert done["plans"][0] == cut["plans"][0]
    capsys.readouterr()
    assert main([*argv[:8], "layers", *argv[9:], "--resume"]) == 2  # other plans than the file's
    assert "measured with plan_specs" in capsys.readouterr().err


def test_two_rank_fidelity_command_errors(capsys, links_profile: Path) -> None:  # type: ignore[no-untyped-def]
    for extra, msg in ((["--devices", "1"], "--devices must be >= 2"), (["--plans", "layers"], "give --devices"),
                       (["--devices", "2", "--rounds", "0"], "--rounds must be >= 1")):
        rc = main(["fidelity", "mlp", "--size", "tiny", "--profile", str(links_profile), *extra])
        assert rc != 0 and msg in capsys.readouterr().err


def test_plans_a_models_batch_cannot_split_are_left_out_and_said(capsys, tmp_path: Path, links_profile: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ranks.json"
    argv = ["fidelity", "transformer", "--size", "tiny", "--devices", "2", "--plans", "layers,pipe-1f1b-m4",
            "--steps", "1", "--no-trace-calibration", "--profile", str(links_profile), "--out", str(out), "--json"]
    assert main(argv) == 0  # its batch of 2 has no 4 micro-batches
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert [p["plan"] for p in d["plans"]] == ["layers"] and d["skipped_plans"] == {"transformer": ["pipe-1f1b-m4"]}
    assert "left out pipe-1f1b-m4" in captured.err
    rc = main([*argv[:6], "--plans", "pipe-1f1b-m4", *argv[8:]])
    assert rc != 0 and "no plan of the spread fits" in capsys.readouterr().err
