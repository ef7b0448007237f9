"""`schedlab plan` writes pipeline plans (a schedule by name or from torch's CSV), and
`simulate`, `trace` and `validate` take them like any other plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.cli.common import plan_ranks
from schedlab.machine import detect_host
from schedlab.pipeline.generators import default_shape, generate
from schedlab.pipeline.torch_io import write_csv
from schedlab.plan import Plan
from schedlab.trace import Trace
from tests.calibrate.factories import make_profile


def _run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    return make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")


def test_plan_then_simulate_and_trace_a_two_rank_pipeline(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    rc, _, err = _run(capsys, "plan", "mlp", "--size", "tiny", "--devices", "2", "--micro-batches", "4",
                      "--schedule", "gpipe", "--threads", "1", "-o", str(plan))
    assert rc == 0 and "pipeline: 4 micro-batch(es), 2 stage(s)" in err
    d = json.loads(plan.read_text())
    assert (d["version"], d["micro_batches"], d["stages"], d["stage_map"], d["schedule"], d["pipeline_devices"]) == (
        3, 4, 2, "loop", "gpipe", ["cpu0", "cpu1"])
    assert plan_ranks(Plan.load(plan)) == 2
    rc, out, _ = _run(capsys, "simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--plan", str(plan),
                      "--out", str(tmp_path / "s.sim.json"), "--json")
    sim = json.loads(out)
    assert rc == 0 and sim["ranks"] == 2 and sim["transfers"]["count"] > 0 and sim["predicted_step_time_s"] > 0
    assert {e.device for e in Trace.load(sim["trace"]).events} == {"cpu0", "cpu1"}
    rc, out, _ = _run(capsys, "trace", "mlp", "--size", "tiny", "--plan", str(plan), "--steps", "2", "--warmup", "0",
                      "--out", str(tmp_path / "t.json"), "--json")
    tr = json.loads(out)
    assert rc == 0 and tr["numerics_ok"] and tr["ranks"] == 2 and tr["ops"] == sim["ops"]


def test_a_pipeline_with_replicas_runs_its_rows_on_the_first_group_of_ranks(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    rc, _, err = _run(capsys, "plan", "mlp", "--size", "tiny", "--devices", "4", "--replicas", "2", "--stages", "2",
                      "--micro-batches", "2", "--threads", "1", "-o", str(plan))
    assert rc == 0 and "replicas=2" in err and "on 4 devices" in err, err
    d = json.loads(plan.read_text())
    assert (d["replicas"], d["micro_batches"], d["pipeline_devices"]) == (2, 2, ["cpu0", "cpu1"])
    assert plan_ranks(Plan.load(plan)) == 4
    rc, out, _ = _run(capsys, "simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--plan", str(plan),
                      "--out", str(tmp_path / "s.sim.json"), "--json")
    sim = json.loads(out)
    assert rc == 0 and sim["ranks"] == 4 and sim["predicted_step_time_s"] > 0
    assert {e.device for e in Trace.load(sim["trace"]).events} == {"cpu0", "cpu1", "cpu2", "cpu3"}
    rc, _, err = _run(capsys, "plan", "mlp", "--size", "tiny", "--devices", "4", "--replicas", "3", "--stages", "2",
                      "-o", str(tmp_path / "bad.json"))
    assert rc != 0 and "--replicas 3" in err and "Traceback" not in err and not (tmp_path / "bad.json").exists()


def test_a_tessel_plan_holds_the_searched_actions_and_runs_on_two_ranks(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    rc, _, err = _run(capsys, "plan", "mlp", "--size", "tiny", "--devices", "2", "--micro-batches", "2",
                      "--schedule", "tessel", "--stage-cuts", "balanced", "--threads", "1", "-o", str(plan))
    assert rc == 0 and "Tessel: repetend at 1.000x its lower bound" in err
    d = json.loads(plan.read_text())
    assert d["stage_map"] == "loop" and len(d["schedule"]) == 2 and isinstance(d["stages"], list)
    assert sorted(d["schedule"][0]) == ["0B0", "0B1", "0F0", "0F1"]
    rc, out, _ = _run(capsys, "trace", "mlp", "--size", "tiny", "--plan", str(plan), "--steps", "1", "--warmup", "0",
                      "--out", str(tmp_path / "t.json"), "--json")
    tr = json.loads(out)
    assert rc == 0 and tr["numerics_ok"] and tr["ranks"] == 2


def test_a_one_device_pipeline_traces_in_this_process(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    rc, _, _ = _run(capsys, "plan", "transformer", "--size", "tiny", "--micro-batches", "2", "--schedule", "looped-bfs",
                    "--threads", "1", "-o", str(plan))
    assert rc == 0 and json.loads(plan.read_text())["pipeline_devices"] == []
    rc, out, _ = _run(capsys, "trace", "transformer", "--size", "tiny", "--plan", str(plan), "--steps", "2",
                      "--out", str(tmp_path / "t.json"), "--json")
    tr = json.loads(out)
    assert rc == 0 and tr["numerics_ok"] and tr["ranks"] == 1
    names = {e.name for e in Trace.load(tr["trace"]).events}
    assert any(n.endswith("@m1") for n in names) and any(n.startswith("mean grad") for n in names)


def test_a_schedule_file_is_written_into_the_plan(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    csv = tmp_path / "s.csv"
    write_csv(generate("zb-h1", default_shape("zb-h1", 2), 4), csv)
    plan = tmp_path / "p.json"
    rc, _, _ = _run(capsys, "plan", "mlp", "--size", "tiny", "--devices", "2", "--schedule", str(csv), "-o", str(plan))
    d = json.loads(plan.read_text())
    assert rc == 0 and d["micro_batches"] == 4 and d["stages"] == 2
    assert d["schedule"] == [[str(a) for a in row] for row in generate("zb-h1", default_shape("zb-h1", 2), 4).orders]
    csv.unlink()  # the plan holds the schedule itself
    assert Plan.load(plan).schedule is not None


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["mlp", "--devices", "2", "--schedule", "nope"], "--schedule nope: unknown pipeline schedule"),
        (["mlp", "--devices", "2", "--stages", "3", "--micro-batches", "2"], "--stages 3: 3 stages do not split evenly"),
        (["transformer", "--devices", "2", "--micro-batches", "3"], "3 micro-batches must divide the batch"),
        (["mlp", "--devices", "2", "--micro-batches", "2", "--stage-map", "v"], "--stage-map v: schedule '1f1b' maps"),
        (["mlp", "--devices", "2", "--micro-batches", "2", "--order", "w-last"], "--order w-last: a pipeline plan"),
        (["mlp", "--micro-batches", "2", "--stage-cuts", "1,2"], "2 cut(s) make 3 stages, not --stages 1"),
        (["mlp", "--devices", "2", "--schedule", "missing.csv"], "no schedule file missing.csv"),
        (["mlp", "--devices", "2", "--schedule", "tessel", "--stages", "4"],
         "--schedule tessel: Tessel's search here runs one stage per device"),
    ],
)
def test_bad_pipeline_flags_name_the_flag(capsys, tmp_path: Path, argv: list[str], msg: str) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "plan", *argv, "--size", "tiny", "-o", str(tmp_path / "p.json"))
    assert rc != 0 and msg in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_bench_refuses_a_pipeline_plan_and_says_what_times_it(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = Plan(micro_batches=2, schedule="1f1b").save(tmp_path / "p.json")
    rc, _, err = _run(capsys, "bench", "mlp", "--size", "tiny", "--plan", str(path))
    assert rc != 0 and "pipeline plan" in err and "schedlab trace" in err


@pytest.mark.slow
def test_validate_checks_measures_and_predicts_pipeline_plans(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    one = Plan(threads=1, micro_batches=4, stages=2, schedule="looped-bfs", name="one").save(tmp_path / "one.json")
    two = Plan(threads=1, micro_batches=4, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "cpu1"),
               name="two").save(tmp_path / "two.json")
    rc, out, _ = _run(capsys, "validate", "mlp", "--size", "tiny", "--plan", str(one), "--plan", str(two),
                      "--repeats", "1", "--steps", "2", "--profile", str(profile_file), "--no-progress", "--json")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert [p["ranks"] for p in plans] == [1, 2]
    assert all(p["error"] is None and p["numeric_ok"] and p["predicted_step_time_s"] > 0 for p in plans)
