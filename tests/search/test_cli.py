"""`schedlab search` and `schedlab validate`: the run directory and the JSON contracts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.trace import Trace

RUN_KEYS = {
    "schema", "version", "model", "size", "optimizer", "seed", "space", "strategy", "study", "storage", "trials",
    "profile", "machine", "created_unix_s",
}
BEST_KEYS = {"trial", "strategy", "plan", "predicted_step_time_s", "predicted_peak_memory_bytes"}
NUMERIC_KEYS = {"numeric_ok", "worst_tensor", "worst_ratio", "worst_abs_diff", "atol", "rtol"}
CANDIDATE_KEYS = {
    "trial", "strategy", "plan", "predicted_step_time_s", "measured_step_time_s", "measured_step_times_s", "spread_s",
    "max_rel_diff", "speedup", *NUMERIC_KEYS,
}
BASELINE_KEYS = {
    "plan", "predicted_step_time_s", "measured_step_time_s", "measured_step_times_s", "spread_s", "max_rel_diff",
    *NUMERIC_KEYS,
}


def _run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, profile_path: Path) -> Path:
    """A tiny search: Optuna, then both seed strategies into the same run directory."""
    d = tmp_path_factory.mktemp("run") / "mlp"
    common = ["mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress"]
    assert main(["search", *common, "--trials", "8", "--json"]) == 0
    for strategy in ("paper-concurrency", "ooo"):
        assert main(["search", *common, "--strategy", strategy]) == 0
    return d


def test_search_writes_the_run_directory(run_dir: Path) -> None:
    run = json.loads((run_dir / "run.json").read_text())
    assert set(run) >= RUN_KEYS and run["schema"] == "schedlab.run" and run["model"] == "mlp"
    assert run["storage"] == f"sqlite:///{(run_dir / 'study.db').resolve()}"
    assert (run_dir / "graph.json").exists()
    search = json.loads((run_dir / "search.json").read_text())
    for key in ("best", "baselines", "strategies", "trials_per_s", "n_trials", "wall_s"):
        assert key in search
    assert set(search["baselines"]) == {"pytorch-default", "tensorflow-recommended"}
    assert set(search["strategies"]) == {"optuna", "paper-concurrency", "ooo"}
    assert search["strategies"]["optuna"]["trials"] == 8
    assert 1 <= len(search["best"]) <= 10 and all(set(b) >= BEST_KEYS for b in search["best"])
    times = [b["predicted_step_time_s"] for b in search["best"]]
    assert times == sorted(times)
    with sqlite3.connect(run_dir / "study.db") as db:
        keys = {k for (k,) in db.execute("SELECT DISTINCT key FROM trial_user_attributes")}
    assert {"plan", "strategy", "peak_memory_bytes"} <= keys


def test_search_json_contract(capsys, run_dir: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = _run(
        capsys, "search", "mlp", "--size", "tiny", "--trials", "10", "--run-dir", str(run_dir),
        "--profile", str(profile_path), "--no-progress", "--json",
    )
    assert rc == 0
    d = json.loads(out)
    assert d["new_trials"] == 2 and d["strategies"]["optuna"]["trials"] == 10  # resumed: only the remainder
    assert d["run_dir"] == str(run_dir) and {"best", "baselines", "strategies", "trials_per_s"} <= set(d)


def test_validate_json_contract(capsys, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = _run(capsys, "validate", str(run_dir), "--top", "2", "--repeats", "2", "--steps", "1", "--no-progress", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d == {**json.loads((run_dir / "results.json").read_text()), "paths": d["paths"]}
    assert d["schema"] == "schedlab.results" and d["repeats"] == 2 and d["steps_per_repeat"] == 1
    assert set(d["baselines"]) == {"pytorch-default", "tensorflow-recommended"}
    for b in d["baselines"].values():
        assert set(b) >= BASELINE_KEYS and b["measured_step_time_s"] > 0 and len(b["measured_step_times_s"]) == 2
    searched = [c for c in d["candidates"] if c["baseline"] is None]
    assert len(searched) == 2 and all(set(c) >= CANDIDATE_KEYS for c in d["candidates"])
    assert all(c["max_rel_diff"] <= 1e-5 for c in d["candidates"])
    assert all(c["numeric_ok"] and c["worst_ratio"] <= 1 and c["atol"] == 1e-5 for c in d["candidates"])
    measured = [c["measured_step_time_s"] for c in d["candidates"]]
    assert d["best"] == measured.index(min(measured))  # the fastest measured, baselines included
    assert d["searched_plan_won"] == (d["candidates"][d["best"]]["baseline"] is None)
    for c in searched:
        assert set(c["speedup"]) == set(d["baselines"])
    for name in ("best.exec.json", "best.sim.json", "baseline.exec.json"):
        assert Trace.load(run_dir / "traces" / name).events
    assert Trace.load(run_dir / "traces" / "best.sim.json").source == "sim"
    import optuna

    study = optuna.load_study(storage=f"sqlite:///{run_dir / 'study.db'}", study_name="mlp-tiny-sgd")
    assert study.user_attrs["validation"]["best"] == d["best"]


def test_search_without_a_profile_says_how_to_make_one(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "search", "mlp", "--size", "tiny", "--run-dir", str(tmp_path / "r"), "--profile", str(tmp_path / "none.json"))
    assert rc == 2 and "schedlab calibrate --quick" in err and len(err.strip().splitlines()) == 1


def test_search_refuses_another_model_in_a_run_directory(capsys, run_dir: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "search", "cnn", "--size", "tiny", "--run-dir", str(run_dir), "--profile", str(profile_path))
    assert rc == 2 and "use another --run-dir" in err


def test_validate_needs_a_run_directory(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "validate", str(tmp_path))
    assert rc == 2 and "not a run directory" in err and "Traceback" not in err


def test_seed_strategy_resumes_without_repeating_its_plans(capsys, run_dir: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = _run(
        capsys, "search", "mlp", "--size", "tiny", "--strategy", "ooo", "--run-dir", str(run_dir),
        "--profile", str(profile_path), "--no-progress", "--json",
    )
    assert rc == 0 and json.loads(out)["new_trials"] == 0


def test_memory_objective_lists_the_pareto_front(capsys, tmp_path: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = _run(
        capsys, "search", "mlp", "--size", "tiny", "--trials", "12", "--memory", "--run-dir", str(tmp_path / "m"),
        "--profile", str(profile_path), "--no-progress", "--json",
    )
    assert rc == 0
    d = json.loads(out)
    assert d["objectives"] == ["time", "memory"] and d["pareto"]
    assert all(p["predicted_peak_memory_bytes"] > 0 for p in d["pareto"])
    rc, _, err = _run(capsys, "search", "mlp", "--size", "tiny", "--run-dir", str(tmp_path / "m"), "--profile", str(profile_path))
    assert rc == 2 and "use another --run-dir" in err  # the run directory was searched with two objectives


def test_validation_picks_one_plan_per_concurrency_setting_first() -> None:
    from schedlab.search.validate import pick

    def row(slots: int, threads: int, order: str) -> dict[str, object]:
        return {"plan": {"slots": slots, "threads": threads, "class_threads": {}, "op_threads": {}, "order": order}}

    rows = [row(2, 1, "topo"), row(2, 1, "w-last"), row(1, 2, "topo"), row(2, 2, "topo")]
    assert pick(rows, 3) == [rows[0], rows[2], rows[3]]
    assert pick(rows, 4) == rows and pick(rows, 0) == []
    # a placement is a setting of its own: the same threads with layers on another device count apart
    placed = {"plan": {**rows[0]["plan"], "placement": {"default": None, "layers": {"head": "cpu1"}, "ops": {}}}}  # type: ignore[dict-item]
    rows = [rows[0], rows[1], placed, rows[2]]
    assert pick(rows, 3) == [rows[0], placed, rows[3]]  # before the order variant rows[1]
