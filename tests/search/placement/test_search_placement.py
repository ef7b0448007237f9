"""`schedlab search --space placement`: every strategy into one run directory, the JSON
contract, resumption after SIGKILL, and the errors a user meets."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.graph import Graph
from schedlab.layer_split import layers_in_order
from schedlab.machine import Machine
from schedlab.plan import Plan, place, resolve
from schedlab.trace import Trace
from tests.search.test_processes import _trials

PLACEMENT = ("--space", "placement", "--machine", "dgx-8gpu", "--devices", "4")


def _common(run_dir: Path, profile: Path) -> list[str]:
    return ["mlp", "--size", "tiny", "--run-dir", str(run_dir), "--profile", str(profile), "--no-progress",
            "--no-trace-calibration", *PLACEMENT]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, profile_path: Path) -> Path:
    d = tmp_path_factory.mktemp("placement") / "mlp"
    for strategy in ("layers", "m-topo", "m-etf", "m-sct"):
        assert main(["search", *_common(d, profile_path), "--strategy", strategy]) == 0
    assert main(["search", *_common(d, profile_path), "--strategy", "rl", "--rl-iterations", "6", "--rl-samples", "4"]) == 0
    assert main(["search", *_common(d, profile_path), "--trials", "12"]) == 0
    return d


def test_every_strategy_lands_in_one_run_directory(run_dir: Path) -> None:
    search = json.loads((run_dir / "search.json").read_text())
    assert set(search["strategies"]) == {"layers", "m-topo", "m-etf", "m-sct", "rl", "optuna"}
    assert search["strategies"]["optuna"]["trials"] == 12
    assert all(s["wall_s"] is not None and s["wall_s"] >= 0 for s in search["strategies"].values())
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["space"], run["machine_spec"], run["devices"]) == ("placement", "dgx-8gpu", 4)
    machine = Machine.from_json(run["machine"])
    assert [d.id for d in machine.devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    graph = Graph.load(run_dir / "graph.json")
    for row in search["best"]:
        plan = Plan.from_json(row["plan"])
        assert set(place(graph, plan, machine)) <= {"gpu0", "gpu1", "gpu2", "gpu3"}
        resolve(graph, plan, machine)  # every recorded plan is valid on the searched machine
    times = [b["predicted_step_time_s"] for b in search["best"]]
    assert times == sorted(times) and all(t > 0 for t in times)


def test_expert_split_uses_every_gpu_and_rl_keeps_its_curve(run_dir: Path) -> None:
    import optuna

    study = optuna.load_study(storage=f"sqlite:///{run_dir / 'study.db'}", study_name="mlp-tiny-sgd")
    by_strategy = {t.user_attrs["strategy"]: t for t in study.trials if t.user_attrs.get("strategy") in ("layers", "rl")}
    graph = Graph.load(run_dir / "graph.json")
    machine = Machine.from_json(json.loads((run_dir / "run.json").read_text())["machine"])
    layers = Plan.from_json(by_strategy["layers"].user_attrs["plan"])
    n_layers = len(layers_in_order(graph))  # 3 in mlp tiny: one layer per GPU, the fourth idle
    assert len(set(place(graph, layers, machine))) == min(4, n_layers)
    curve = json.loads((run_dir / "rl" / "curve.json").read_text())
    assert curve["schema"] == "schedlab.rl_curve" and curve["reward"] == "simulated"
    assert [c["iteration"] for c in curve["curve"]] == list(range(1, 7))  # iterations 1..6
    assert curve["best_step_time_s"] == pytest.approx(by_strategy["rl"].values[0], rel=1e-9)
    best = [c["best_step_time_s"] for c in curve["curve"]]
    assert best == sorted(best, reverse=True)  # best so far never gets worse


def test_search_json_has_the_contract_keys(capsys, run_dir: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc = main(["search", *_common(run_dir, profile_path), "--strategy", "m-etf", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert d["new_trials"] == 0  # resumed: the heuristic's plan is already in the study
    assert {"best", "wall_s"} <= set(d) and all({"plan", "predicted_step_time_s"} <= set(b) for b in d["best"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--space", "placement"), "--space placement needs several devices"),
        (("--strategy", "m-etf", "--space", "concurrency", "--devices", "2"), "use --space placement"),
        (("--strategy", "ooo", "--space", "placement", "--machine", "dgx-8gpu", "--devices", "2"), "searches one device"),
        (("--space", "placement", "--machine", "dgx-8gpu", "--devices", "12"), "has 9 devices"),
        (("--strategy", "rl", "--reward", "measured", "--space", "placement", "--machine", "dgx-8gpu", "--devices", "2"),
         "--reward measured runs placements on this host"),
    ],
)
def test_bad_requests_get_one_clear_error(capsys, tmp_path: Path, profile_path: Path, extra: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    rc = main(["search", "mlp", "--size", "tiny", "--run-dir", str(tmp_path / "r"), "--profile", str(profile_path),
               "--no-progress", "--no-trace-calibration", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err


def test_a_run_directory_keeps_its_machine(capsys, run_dir: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(run_dir), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--space", "placement", "--machine", "dgx-8gpu", "--devices", "2"]
    rc = main(argv)
    assert rc == 2 and "use another --run-dir" in capsys.readouterr().err


def _search(run_dir: Path, profile: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "schedlab", "search", *_common(run_dir, profile), *extra]


def test_placement_search_killed_with_sigkill_resumes_without_losing_trials(tmp_path: Path, profile_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "run" / "study.db"
    cmd = _search(run_dir, profile_path, "--trials", "60")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(_trials(db)) < 10:
        time.sleep(0.02)
    assert proc.poll() is None, f"search ended before it could be killed: {proc.stderr.read().decode()[-500:]}"  # type: ignore[union-attr]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _trials(db)
    assert 10 <= len(before) < 60
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    after = _trials(db)
    assert len(after) == 60 and all(after.get(n) == v for n, v in before.items())
    assert all("device." in params for _, params in after.values())  # placement parameters, one per group


@pytest.mark.slow
def test_rl_search_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path: Path, profile_path: Path) -> None:
    rl = ("--strategy", "rl", "--rl-iterations", "24", "--rl-samples", "4")
    whole = tmp_path / "whole"
    assert subprocess.run(_search(whole, profile_path, *rl), cwd=tmp_path, capture_output=True, timeout=300).returncode == 0
    run_dir = tmp_path / "killed"
    cmd = _search(run_dir, profile_path, *rl)
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoint = run_dir / "rl" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not checkpoint.exists():
        time.sleep(0.01)
    time.sleep(0.05)
    assert proc.poll() is None, "training ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "rl" / "curve.json").exists()  # killed mid-training
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    a = json.loads((whole / "rl" / "curve.json").read_text())
    b = json.loads((run_dir / "rl" / "curve.json").read_text())
    strip = [{k: v for k, v in c.items() if k != "wall_s"} for c in a["curve"]]
    assert [{k: v for k, v in c.items() if k != "wall_s"} for c in b["curve"]] == strip
    assert a["best_step_time_s"] == b["best_step_time_s"]


@pytest.fixture(scope="module")
def rank_run(tmp_path_factory: pytest.TempPathFactory, profile_path: Path) -> Path:
    """A placement search on this host's 2 local ranks: the expert split and m-ETF."""
    d = tmp_path_factory.mktemp("ranks") / "mlp"
    common = ["mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
              "--no-trace-calibration", "--space", "placement", "--devices", "2"]
    for strategy in ("layers", "m-etf"):
        assert main(["search", *common, "--strategy", strategy]) == 0
    return d


def test_validate_runs_each_strategy_winner_on_real_ranks(capsys, rank_run: Path) -> None:  # type: ignore[no-untyped-def]
    run = json.loads((rank_run / "run.json").read_text())
    assert [d["id"] for d in run["machine"]["devices"]] == ["cpu0", "cpu1"]
    search = json.loads((rank_run / "search.json").read_text())
    assert all(b["plan"]["placement"]["layers"] == {} for b in search["baselines"].values())  # one process
    rc = main(["validate", str(rank_run), "--repeats", "1", "--steps", "1", "--no-progress", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert d == {**json.loads((rank_run / "results.json").read_text()), "paths": d["paths"]}
    assert d["space"] == "placement" and set(d["baselines"]) == {"pytorch-default", "tensorflow-recommended"}
    searched = [c for c in d["candidates"] if c["baseline"] is None]
    assert {s for c in searched for s in c["strategies"]} == {"layers", "m-etf"}
    for c in d["candidates"]:
        assert c["error"] is None and c["numeric_ok"], c
        assert c["measured_step_time_s"] > 0 and c["predicted_step_time_s"] > 0
        assert c["error_pct"] == pytest.approx((c["predicted_step_time_s"] / c["measured_step_time_s"] - 1) * 100)
        assert c["recalibrated_predicted_step_time_s"] > 0  # the search's calibration, run again in the round
    assert d["recalibration"]["rounds"] == 1 and (d["warmup"], d["warmup_ranks"]) == (1, 4)
    assert d["recalibration"]["one_thread_order"] == "critical-path"  # as the searched plans run
    placed = [c for c in searched if len(c["devices"]) == 2]
    assert placed and all(c["ranks"] == 2 for c in placed)  # a plan over both ranks ran on two processes
    measured = [c["measured_step_time_s"] for c in d["candidates"]]
    assert d["best"] == measured.index(min(measured))
    # the best plan's measured and simulated traces and the faster baseline's, for the report's Gantt
    assert set(d["traces"]) == {"best_exec", "best_sim", "baseline_exec"}
    best = d["candidates"][d["best"]]
    exec_trace, sim_trace = (Trace.load(rank_run / "traces" / f"best.{k}.json") for k in ("exec", "sim"))
    assert (exec_trace.source, sim_trace.source) == ("exec", "sim")
    assert {e.device for e in exec_trace.events} == set(best["devices"]) == {e.device for e in sim_trace.events
                                                                           if e.kind != "OVERHEAD"}
    assert len({e.device for e in Trace.load(rank_run / "traces" / "baseline.exec.json").events}) == 1  # one process


def test_validate_refuses_a_placement_simulated_on_a_preset(capsys, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    rc = main(["validate", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot run on this host" in err and "Traceback" not in err


@pytest.mark.slow
def test_rl_with_a_measured_reward_trains_on_real_ranks(tmp_path: Path, profile_path: Path) -> None:
    d = tmp_path / "measured"
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--space", "placement", "--devices", "2", "--strategy", "rl", "--reward", "measured",
            "--rl-iterations", "2", "--rl-samples", "2"]
    assert main(argv) == 0
    curve = json.loads((d / "rl" / "curve.json").read_text())
    assert curve["reward"] == "measured" and len(curve["curve"]) == 2
    assert curve["best_step_time_s"] is not None and 0 < curve["best_step_time_s"] < 1.0  # a real tiny step, seconds


def test_a_simulated_placement_run_has_a_report_without_validation(capsys, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    assert not (run_dir / "results.json").exists()
    rc = main(["report", str(run_dir)])
    out = capsys.readouterr().out
    assert rc == 0, out
    for name in ("placement_strategies", "rl_curve", "placement_map"):
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 10_000
    assert "not validated" in (run_dir / "report" / "index.html").read_text()


def test_search_help_states_the_rl_defaults(capsys) -> None:  # type: ignore[no-untyped-def]
    from schedlab.search.placement.rl import RLConfig

    with pytest.raises(SystemExit):
        main(["search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    d = RLConfig()
    assert f"iterations (default {d.iterations})" in text and f"per iteration (default {d.samples})" in text


def test_space_all_on_several_devices_searches_placement_or_pipeline_concurrency_and_order(tmp_path: Path, profile_path: Path) -> None:
    import optuna

    d = tmp_path / "all"
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--space", "all", "--machine", "cpu-2gpu", "--trials", "15"]
    assert main(argv) == 0
    study = optuna.load_study(storage=f"sqlite:///{d / 'study.db'}", study_name="mlp-tiny-sgd")
    trials = [t for t in study.trials if t.user_attrs.get("strategy") == "optuna" and t.state.name == "COMPLETE"]
    assert len(trials) == 15
    names = set().union(*(t.params for t in trials))
    assert {"order", "slots.cpu0", "threads.cpu0", "slots.gpu0"} <= names and any(n.startswith("device.") for n in names)
    assert "threads.gpu0" not in names  # a GPU has no intra-op threads to choose
    graph, machine = Graph.load(d / "graph.json"), Machine.from_json(json.loads((d / "run.json").read_text())["machine"])
    from schedlab.search.placement.space import max_slots

    for t in trials:
        plan = Plan.from_json(t.user_attrs["plan"])
        if t.params["parallelism"] == "pipeline":  # placements and pipelines in one study
            used = set(plan.pipeline_devices)
            g = graph if plan.micro_batches == 1 else Graph.load(d / "graphs" / f"m{plan.micro_batches}.json")
        else:
            used, g = set(place(graph, plan, machine)), graph
        assert set(plan.device_slots) <= used  # settings only for the devices the plan uses
        assert all(1 <= k <= max_slots(machine.device(dev)) for dev, k in plan.device_slots.items())
        resolve(g, plan, machine)
