"""`schedlab validate MODEL --plan ...`: plan files, multi-rank ones included, checked against
eager, measured, predicted and compared with the single-process baselines; bad input is one
clear error; the RUN_DIR form keeps its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.machine import detect_host
from schedlab.plan import Plan

BASELINES = {"pytorch-default", "tensorflow-recommended"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def plan_files(tmp_path: Path) -> tuple[Path, Path]:
    one = Plan(slots=1, threads=1, name="one-thread").save(tmp_path / "one.json")
    dp = Plan(replicas=2, threads=1, name="dp2").save(tmp_path / "dp2.json")
    return one, dp


def test_a_single_process_and_a_two_rank_plan(capsys, tmp_path: Path, plan_files: tuple[Path, Path],  # type: ignore[no-untyped-def]
                                              profile_path: Path) -> None:
    # Three launches of two ranks (the check, two rounds) and the baselines: ~11 s on a 2-core VM.
    one, dp = plan_files
    out = tmp_path / "validation.json"
    rc, stdout, _ = _run(
        capsys, "validate", "mlp", "--size", "tiny", "--plan", str(one), "--plan", str(dp), "--repeats", "2",
        "--steps", "1", "--profile", str(profile_path), "--out", str(out), "--no-progress", "--json",
    )
    assert rc == 0
    d = json.loads(stdout)
    assert d == {**json.loads(out.read_text()), "paths": {"results": str(out)}}
    assert d["schema"] == "schedlab.plan_validation" and d["model"] == "mlp" and d["repeats"] == 2
    assert (d["warmup"], d["warmup_ranks"]) == (1, 4)  # no --warmup: more untimed steps on ranks
    assert [p["name"] for p in d["plans"]] == [str(one), str(dp)]
    assert [p["ranks"] for p in d["plans"]] == [1, 2]
    assert set(d["baselines"]) == BASELINES and all(b["ranks"] == 1 for b in d["baselines"].values())
    for e in [*d["plans"], *d["baselines"].values()]:
        assert e["error"] is None and e["numeric_ok"] and e["worst_ratio"] <= 1
        assert len(e["measured_step_times_s"]) == 2 and e["measured_step_time_s"] > 0
        lo, hi = e["spread_s"]
        assert lo <= e["measured_step_time_s"] <= hi
        assert e["predicted_step_time_s"] > 0
        assert e["error_pct"] == pytest.approx((e["predicted_step_time_s"] / e["measured_step_time_s"] - 1) * 100)
        # the search's calibration steps, run again in each round, predict every plan once more
        assert e["recalibrated_predicted_step_time_s"] > 0
        assert e["recalibrated_error_pct"] == pytest.approx(
            (e["recalibrated_predicted_step_time_s"] / e["measured_step_time_s"] - 1) * 100)
    cores = detect_host().default_device.cores
    assert d["recalibration"] == {"rounds": 2, "steps_per_run": 2, "pinned_steps_per_run": 3,
                                  "threads": sorted({1, cores}), "one_thread_order": "topo", "pinned_shapes": []}
    for p in d["plans"]:
        assert set(p["speedup"]) == BASELINES
        for name, x in p["speedup"].items():
            assert x == pytest.approx(d["baselines"][name]["measured_step_time_s"] / p["measured_step_time_s"])
    dp_entry = d["plans"][1]
    assert dp_entry["devices"] == ["cpu0", "cpu1"] and dp_entry["sim_engine"] == "simpy"
    assert dp_entry["cost_sources"] == {"cpu0": "calibrated cpu profile", "cpu1": "calibrated cpu profile"}


def test_the_text_form_of_plan_files_without_a_profile(  # type: ignore[no-untyped-def]
    capsys, tmp_path: Path, plan_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from schedlab.calibrate import profile

    monkeypatch.setattr(profile, "DEFAULT_PROFILE_PATH", tmp_path / "none.json")
    one, _ = plan_files
    rc, stdout, _ = _run(capsys, "validate", "mlp", "--size", "tiny", "--plan", str(one), "--repeats", "1",
                         "--steps", "1", "--warmup", "0", "--no-progress")
    assert rc == 0
    lines = stdout.splitlines()
    assert lines[0].startswith("mlp/tiny: 1 plan file(s) and 2 baselines, 1 rounds x 1 steps")
    row = next(line for line in lines if line.strip().startswith(str(one)))
    assert " n/a " in row and "pytorch-default x" in row  # measured, not predicted
    assert any("note: no predictions: no profile at" in line for line in lines)


def test_no_recalibrate(capsys, tmp_path: Path, plan_files: tuple[Path, Path], profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    one, _ = plan_files
    rc, stdout, _ = _run(capsys, "validate", "mlp", "--size", "tiny", "--plan", str(one), "--repeats", "1",
                         "--steps", "1", "--profile", str(profile_path), "--no-recalibrate", "--no-progress", "--json")
    d = json.loads(stdout)
    assert rc == 0 and d["recalibration"] is None
    assert d["plans"][0]["predicted_step_time_s"] > 0 and d["plans"][0]["recalibrated_predicted_step_time_s"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nosuch", "--plan", "{one}"], "unknown workload 'nosuch'"),
        (["mlp", "--plan", "{tmp}/missing.json"], "plan file not found"),
        (["mlp", "--plan", "{three}"], "plan file {three}:"),  # 3 slots on a 2-core host's ranks
        (["mlp"], "'mlp' is not a run directory"),
        (["{tmp}", "--plan", "{one}"], "is a directory, not a MODEL"),
        (["{run}", "--plan", "{one}"], "is a run directory"),
        (["mlp", "--plan", "{one}", "--top", "2"], "--top picks a run directory's searched plans"),
        (["{run}", "--devices", "2"], "--devices go with --plan"),
    ],
)
def test_bad_input_is_one_clear_error(capsys, tmp_path: Path, plan_files: tuple[Path, Path], profile_path: Path,  # type: ignore[no-untyped-def]
                                      argv: list[str], message: str) -> None:
    one, _ = plan_files
    three = Plan(slots=3).save(tmp_path / "three.json")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    names = {"one": one, "three": three, "tmp": tmp_path, "run": run}
    args = [a.format(**names) for a in argv]
    profile = ["--profile", str(profile_path)] if "--plan" in args else []
    rc, _, err = _run(capsys, "validate", *args, "--size", "tiny", *profile, "--no-progress")
    assert rc == 2, err
    assert message.format(**names) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_plan_on_several_ranks_gets_more_untimed_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first steps of a multi-rank run are slow (`exec.launch.RANK_WARMUP`): unless the
    # user names --warmup, a rank plan's rounds start with more untimed steps than one process's.
    from types import SimpleNamespace

    from schedlab.backend import BackendRun
    from schedlab.exec.launch import PROCESS_WARMUP, RANK_WARMUP
    from schedlab.search import validate_plans as vp

    seen: list[tuple[str, int]] = []

    class Fake:
        def __init__(self, case, *_: object) -> None:  # type: ignore[no-untyped-def]
            self.case = case

        def check(self) -> object:
            return SimpleNamespace(max_rel_diff=0.0, ok=lambda: True, to_json=lambda: {})

        def time(self, steps: int, warmup: int) -> BackendRun:
            seen.append((self.case.name, warmup))
            return BackendRun((0.01,) * steps, None)  # type: ignore[arg-type]

    monkeypatch.setattr(vp, "_LocalRunner", Fake)
    monkeypatch.setattr(vp, "_RankRunner", Fake)
    cases = [SimpleNamespace(name=n, plan=Plan(), resolved=SimpleNamespace(multi_device=multi))
             for n, multi in (("one", False), ("ranks", True))]
    vp.measure_cases(cases, repeats=1, steps=1, warmup=None, timeout_s=1.0)  # type: ignore[arg-type]
    assert seen == [("one", PROCESS_WARMUP), ("ranks", RANK_WARMUP)] and RANK_WARMUP > PROCESS_WARMUP
    seen.clear()
    vp.measure_cases(cases, repeats=1, steps=1, warmup=2, timeout_s=1.0)  # type: ignore[arg-type]
    assert seen == [("one", 2), ("ranks", 2)]
