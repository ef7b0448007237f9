"""Re-scoring saved held-out runs: every profile on the same measurements, and the runs' own spread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedlab.calibrate.fidelity import PROFILE_ONLY, TRACE_CALIBRATED, plan_spread, predict, resolve_all
from schedlab.calibrate.rank_fidelity import rank_cases, rank_plan_spread, ranks_machine
from schedlab.calibrate.rescore import load_runs, one_device_plans, rank_plans, rescore
from schedlab.cli import main
from schedlab.errors import SchedlabError
from schedlab.machine import detect_host
from schedlab.sim.testing import cpu_machine
from tests.calibrate.factories import make_profile
from tests.conftest import captured_workload

MODEL = "heldout:mixer"


def results_file(path: Path, scale: float, cores: int = 2, size: str = "tiny", **extra: Any) -> Path:
    """A held-out results file as `schedlab fidelity --held-out` writes it: each plan's
    measurement in a profile-only and a trace-calibrated row; plan i measured (i + 1) ms x scale."""
    plans = [p.name or p.describe() for p in plan_spread(cores)]
    rows = [
        {"workload": MODEL, "plan": name, "method": method, "measured_s": (i + 1) * 1e-3 * scale, "predicted_s": 1.0}
        for i, name in enumerate(plans)
        for method in (PROFILE_ONLY, TRACE_CALIBRATED)
    ]
    path.write_text(json.dumps({"set": "held-out", "size": size, "optimizer": "sgd", "cores": cores, "plans": rows,
                                "machine": {"cpu_model": "Test CPU"}, "versions": {"torch": "2.13.0"},
                                "steps_per_plan": 5, **extra}))
    return path


def graph_of(workload: str):  # type: ignore[no-untyped-def]
    return captured_workload(workload, "sgd", "tiny")[1].graph


def test_each_plan_is_predicted_against_the_median_of_the_runs(tmp_path: Path) -> None:
    runs = load_runs([results_file(tmp_path / "a.json", 1.0), results_file(tmp_path / "b.json", 2.0),
                      results_file(tmp_path / "c.json", 4.0)])
    machine, profile = cpu_machine(2), make_profile()
    out = rescore(runs, profile, machine, one_device_plans(graph_of, machine), 2)
    graph = graph_of(MODEL)
    expected = predict(graph, resolve_all(graph, plan_spread(2), machine), profile, machine)
    assert [p["predicted_s"] for p in out["plans"]] == [e.step_time_s for e in expected]
    first = out["plans"][0]
    assert first["measured_s"] == pytest.approx(2e-3) and first["measured_spread_s"] == pytest.approx((1e-3, 4e-3))
    assert first["error"] == pytest.approx(first["predicted_s"] / 2e-3 - 1)
    # each run against the median (2x the first run, 1x the second, 0.5x the third)
    assert out["overall"]["run_spread"] == pytest.approx([1.0, 0.0, 0.5])
    (model,) = out["models"]
    assert model["run_spread"] == pytest.approx([1.0, 0.0, 0.5]) and model["profile_only"]["n_plans"] == 16
    assert out["overall"]["profile_only"]["mape"] == pytest.approx(
        sum(abs(p["error"]) for p in out["plans"]) / len(out["plans"]))


def test_a_rescore_tells_plans_apart_on_every_round_of_every_file(tmp_path: Path) -> None:
    """Rounds kept by the files are pooled per plan (a file without them gives its median):
    two runs whose plans sit 1 ms apart tell all 120 pairs apart; rounds spread over
    +-60% of each plan's time leave the neighbours within each other's rounds."""
    def with_rounds(path: Path, spread: float) -> Path:
        d = json.loads(path.read_text())
        for r in d["plans"]:
            r["round_medians_s"] = [r["measured_s"] * (1 - spread), r["measured_s"] * (1 + spread)]
        path.write_text(json.dumps(d))
        return path

    plain = load_runs([results_file(tmp_path / "a.json", 1.0), results_file(tmp_path / "b.json", 1.0)])
    key = (MODEL, plan_spread(2)[3].name)
    assert plain.rounds_s[key] == pytest.approx((4e-3, 4e-3))
    wide = load_runs([with_rounds(results_file(tmp_path / "c.json", 1.0), 0.6), results_file(tmp_path / "d.json", 1.0)])
    assert wide.rounds_s[key] == pytest.approx((1.6e-3, 6.4e-3, 4e-3))
    machine, profile = cpu_machine(2), make_profile()
    told = [rescore(r, profile, machine, one_device_plans(graph_of, machine), 2)["models"][0]["profile_only"]
            for r in (plain, wide)]
    assert told[0]["resolved_pairs"] == told[0]["pairs"] == 120
    assert told[1]["resolved_pairs"] < 120


def test_bad_results_files_get_one_clear_error(tmp_path: Path) -> None:
    good = results_file(tmp_path / "good.json", 1.0)
    with pytest.raises(SchedlabError, match="no results file"):
        load_runs([tmp_path / "missing.json"])
    (tmp_path / "corrupt.json").write_text("{ not json")
    with pytest.raises(SchedlabError, match="not a readable JSON"):
        load_runs([tmp_path / "corrupt.json"])
    with pytest.raises(SchedlabError, match="measured the tensorflow backend"):
        load_runs([results_file(tmp_path / "tf.json", 1.0, backend="tensorflow")])
    with pytest.raises(SchedlabError, match="or it is a re-scored one"):
        load_runs([results_file(tmp_path / "again.json", 1.0, rescored=True)])
    builtin = results_file(tmp_path / "builtin.json", 1.0)
    builtin.write_text(builtin.read_text().replace('"held-out"', '"built-in"'))
    assert load_runs([builtin]).set_name == "built-in"
    with pytest.raises(SchedlabError, match="different conditions"):
        load_runs([good, builtin])
    with pytest.raises(SchedlabError, match="different conditions"):
        load_runs([good, results_file(tmp_path / "ranks.json", 1.0, devices=2)])
    with pytest.raises(SchedlabError, match="different conditions"):
        load_runs([good, results_file(tmp_path / "default.json", 1.0, size="default")])
    with pytest.raises(SchedlabError, match="measured on 4 cores"):
        rescore(load_runs([results_file(tmp_path / "four.json", 1.0, cores=4)]), make_profile(), cpu_machine(2),
                one_device_plans(graph_of, cpu_machine(2)), 2)
    bad = json.loads(good.read_text())
    bad["plans"][0]["measured_s"] = 0
    (tmp_path / "zero.json").write_text(json.dumps(bad))
    with pytest.raises(SchedlabError, match="must be > 0"):
        load_runs([tmp_path / "zero.json"])


def test_cli_rescores_without_running_and_never_overwrites_its_inputs(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cores = detect_host().default_device.cores
    a, b = results_file(tmp_path / "a.json", 1.0, cores), results_file(tmp_path / "b.json", 3.0, cores)
    profile = make_profile().save(tmp_path / "profile.json")
    out = tmp_path / "rescored.json"
    rc = main(["fidelity", "--held-out", "--rescore", str(a), "--rescore", str(b), "--profile", str(profile),
               "--out", str(out), "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert rc == 0 and json.loads(out.read_text()) == printed
    assert printed["runs"] == [str(a), str(b)] and printed["overall"]["run_spread"] == pytest.approx([1.0, 1 / 3])
    assert printed["set"] == "held-out" and printed["rescored"] and printed["machine"] == {"cpu_model": "Test CPU"}
    assert sum(s["n_plans"] for s in printed["plan_shapes"]) == len(printed["plans"])  # every spread plan, by shape
    assert main(["fidelity", "--held-out", "--rescore", str(a), "--profile", str(profile),
                 "--out", str(tmp_path / "again.json")]) == 0
    assert "by plan shape" in capsys.readouterr().out
    assert main(["report", str(out), "--out", str(tmp_path / "report"), "--json"]) == 0  # drawn as a fidelity file
    assert json.loads(capsys.readouterr().out)["figures"][0]["name"] == "fidelity"
    from schedlab.reports.figures.fidelity import load_fidelity

    assert load_fidelity(out).runs == 2 and load_fidelity(a).runs == 1
    assert main(["fidelity", "--rescore", str(a), "--models", "mlp"]) == 2  # the files say which models
    assert "give no models" in capsys.readouterr().err
    assert main(["fidelity", "--rescore", str(a), "--devices", "2", "--profile", str(profile)]) == 2
    assert "measured on 1 rank(s)" in capsys.readouterr().err
    before = a.read_text()
    assert main(["fidelity", "--held-out", "--rescore", str(a), "--out", str(a), "--profile", str(profile)]) == 2
    assert a.read_text() == before


def test_one_device_runs_of_a_bigger_host_are_rescored_on_its_cores(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A lent 16-core machine's runs re-score here, with the profile calibrated there: the
    plans are that host's spread (slots up to 4, threads up to its cores)."""
    cores = detect_host().default_device.cores + 14
    a = results_file(tmp_path / "big.json", 1.0, cores)
    profile = make_profile().save(tmp_path / "profile.json")
    out = tmp_path / "rescored.json"
    assert main(["fidelity", "--rescore", str(a), "--profile", str(profile), "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cores"] == cores and printed["machine"] == {"cpu_model": "Test CPU"}
    assert {p["plan"] for p in printed["plans"]} == {p.name for p in plan_spread(cores)}
    assert any(p["plan"].startswith("s4-") for p in printed["plans"])


def test_multi_rank_runs_are_rescored_on_the_ranks_they_ran_on(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.cli.common import plan_step_of
    from schedlab.sim.cost import op_cost_us

    specs = [sp for sp in rank_plan_spread(2) if sp.name in ("layers", "dp-b25", "pipe-1f1b-m2")]
    rows = [{"workload": "mlp", "plan": sp.name, "method": TRACE_CALIBRATED, "measured_s": (i + 1) * 0.01,
             "predicted_s": 1.0, "plan_kind": sp.kind} for i, sp in enumerate(specs)]
    cores = detect_host().default_device.cores
    paths = []
    for k, scale in enumerate((1.0, 3.0)):
        scaled = [{**r, "measured_s": r["measured_s"] * scale} for r in rows]
        paths.append(tmp_path / f"ranks{k}.json")
        paths[-1].write_text(json.dumps({"set": "built-in", "size": "tiny", "optimizer": "sgd", "cores": cores,
                                         "devices": 2, "plans": scaled}))
    profile = make_profile()
    runs = load_runs(paths)
    assert (runs.devices, runs.set_name) == (2, "built-in")

    def step_of(workload: str):  # type: ignore[no-untyped-def]
        return lambda r, m: plan_step_of(workload, "tiny", "sgd", 0, replicas=r, cache=True, micro_batches=m)

    machine = ranks_machine(2, profile)
    out = rescore(runs, profile, machine, rank_plans(step_of, machine, profile), cores)
    cases = rank_cases("mlp", step_of("mlp"), specs, machine, op_cost_us(profile))
    expected = [predict(c.graph, [c.resolved], profile, machine)[0].step_time_s for c in cases]
    assert [p["predicted_s"] for p in out["plans"]] == expected
    assert [p["plan_kind"] for p in out["plans"]] == ["placed", "data-parallel", "pipeline"]
    assert [p["measured_s"] for p in out["plans"]] == pytest.approx([0.02, 0.04, 0.06])  # the median of 1x and 3x
    assert out["devices"] == 2 and out["overall"]["run_spread"] == pytest.approx([1.0, 1 / 3])
    saved = profile.save(tmp_path / "profile.json")
    rescored = tmp_path / "rescored.json"
    assert main(["fidelity", "--rescore", str(paths[0]), "--rescore", str(paths[1]), "--profile", str(saved),
                 "--out", str(rescored)]) == 0
    printed = capsys.readouterr().out
    assert "built-in fidelity re-scored" in printed and "2 ranks" in printed
    assert [p["predicted_s"] for p in json.loads(rescored.read_text())["plans"]] == expected
    assert main(["fidelity", "--held-out", "--rescore", str(paths[0]), "--profile", str(saved)]) == 2
    assert "measured the built-in models" in capsys.readouterr().err


def _with_trace(path: Path, trace_text: str) -> Path:
    """A results file naming a calibration trace of MODEL, whose file holds `trace_text`."""
    from schedlab.calibrate import cal_traces

    (path.parent / "t").mkdir(exist_ok=True)
    (path.parent / "t" / "m.json").write_text(trace_text)
    return results_file(path, 1.0, models=[{"workload": MODEL, cal_traces.KEY: "t/m.json"}])


def test_a_saved_calibration_trace_is_rescored_trace_calibrated_and_a_stale_one_is_left_out(tmp_path: Path) -> None:
    from schedlab.calibrate.fidelity import CALIBRATION_PLAN
    from schedlab.exec import run_steps

    _, c = captured_workload(MODEL, "sgd", "tiny")
    machine, profile = cpu_machine(2), make_profile()
    trace = run_steps(c.graph, c.input_values, CALIBRATION_PLAN, machine, steps=2, warmup=0).trace
    out = rescore(load_runs([_with_trace(tmp_path / "a.json", json.dumps(trace.to_json()))]), profile, machine,
                  one_device_plans(graph_of, machine), 2)
    learnt = [p for p in out["plans"] if p["method"] == TRACE_CALIBRATED]
    expected = predict(c.graph, resolve_all(c.graph, plan_spread(2), machine), profile.with_trace(trace, c.graph), machine)
    assert [p["predicted_s"] for p in learnt] == [e.step_time_s for e in expected]
    assert [p["plan"] for p in learnt if p["in_calibration"]] == [CALIBRATION_PLAN.name]
    assert [p["plan"] for p in out["plans"] if not p["scored"]] == [CALIBRATION_PLAN.name]  # as the report counts
    (model,) = out["models"]
    assert model["trace_calibrated"]["n_plans"] == len(learnt) - 1 == out["overall"]["trace_calibrated"]["n_plans"]
    assert out["trace_calibration_skipped"] == {}

    same = trace.to_json()
    same["meta"]["graph_hash"] = "0" * 16  # another capture of the same schedule (`Graph.schedule_hash`): learnt from
    out = rescore(load_runs([_with_trace(tmp_path / "s.json", json.dumps(same))]), profile, machine,
                  one_device_plans(graph_of, machine), 2)
    assert [p["predicted_s"] for p in out["plans"] if p["method"] == TRACE_CALIBRATED] == [e.step_time_s for e in expected]
    stale = trace.to_json()
    stale["meta"]["graph_hash"], stale["meta"]["schedule_hash"] = "0" * 16, "1" * 16  # recorded before the capture changed
    out = rescore(load_runs([_with_trace(tmp_path / "b.json", json.dumps(stale))]), profile, machine,
                  one_device_plans(graph_of, machine), 2)
    assert "trace_calibrated" not in out["overall"] and "trace_calibrated" not in out["models"][0]
    assert "today's capture" in out["trace_calibration_skipped"][MODEL]
    with pytest.raises(SchedlabError, match=r"c.json: its calibration trace t/m.json"):
        rescore(load_runs([_with_trace(tmp_path / "c.json", "{ corrupt")]), profile, machine,
                one_device_plans(graph_of, machine), 2)
