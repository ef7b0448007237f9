"""Fidelity: the built-in protocol and the held-out one (two kinds of prediction, one set of runs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from schedlab.backend import BackendRun
from schedlab.calibrate.fidelity import (
    CALIBRATION_PLAN,
    PROFILE_ONLY,
    TRACE_CALIBRATED,
    FidelityRow,
    HeldOutResult,
    Measurement,
    calibration_trace,
    error_summary,
    halves_mape,
    held_out_fidelity,
    measure_and_predict,
    one_round_mape,
    overall_summary,
    plan_shape,
    plan_spread,
    pooled_rounds,
    resolve_all,
    resolved_tau,
    round_spread,
    round_to_round_mape,
    shape_errors,
    sim_cost,
    sim_cost_overall,
)
from schedlab.cli import main
from schedlab.cli.fidelity_cmd import chosen_models, print_held_out
from schedlab.errors import SchedlabError
from schedlab.exec import ExecBackend
from schedlab.machine import detect_host
from schedlab.trace import Trace, TraceEvent
from schedlab.workloads import BUILTIN_WORKLOADS
from schedlab.workloads.heldout import HELDOUT_WORKLOADS
from tests.calibrate.factories import make_profile
from tests.conftest import captured_workload

MODEL = "heldout:mixer"  # the smallest held-out step at size tiny


@pytest.fixture
def exec_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The plans the executor ran, in order."""
    calls: list[str] = []
    real = ExecBackend.run

    def counting(self: ExecBackend, graph: Any, resolved: Any, machine: Any, *, steps: int = 1) -> Any:
        calls.append(resolved.plan.name)
        return real(self, graph, resolved, machine, steps=steps)

    monkeypatch.setattr(ExecBackend, "run", counting)
    return calls


@pytest.fixture(scope="module")
def held_out() -> HeldOutResult:
    _, c = captured_workload(MODEL)
    machine = detect_host()
    return held_out_fidelity(
        MODEL, c.graph, c.input_values, plan_spread(machine.default_device.cores), make_profile(), machine,  # type: ignore[attr-defined]
        steps=1, warmup=0,
    )


def test_held_out_predicts_twice_from_one_set_of_measurements(held_out: HeldOutResult) -> None:
    n = len(plan_spread(detect_host().default_device.cores))
    alone, learnt = held_out.profile_only, held_out.trace_calibrated
    assert len(alone) == len(learnt) == n
    assert [r.plan for r in alone] == [r.plan for r in learnt]
    assert [r.measured_s for r in alone] == [r.measured_s for r in learnt]  # the same runs
    assert {r.method for r in alone} == {PROFILE_ONLY} and {r.method for r in learnt} == {TRACE_CALIBRATED}
    # the trace changed the model: at least the calibration plan is predicted differently
    assert [r.predicted_s for r in alone] != [r.predicted_s for r in learnt]


def test_the_calibration_plan_is_left_out_of_the_trace_calibrated_error(held_out: HeldOutResult) -> None:
    cal = [r for r in held_out.trace_calibrated if r.in_calibration]
    assert [r.plan for r in cal] == [CALIBRATION_PLAN.name]
    assert not any(r.in_calibration for r in held_out.profile_only)  # nothing of the model was learnt
    assert len(held_out.scored(PROFILE_ONLY)) == len(held_out.profile_only)
    scored = held_out.scored(TRACE_CALIBRATED)
    assert len(scored) == len(held_out.trace_calibrated) - 1 and cal[0] not in scored
    other = held_out.other_shapes()
    assert other and all(not r.plan.startswith("s1-t1-") for r in other)
    assert len(other) == sum(1 for r in held_out.trace_calibrated if not r.plan.startswith("s1-t1-"))


def test_held_out_runs_each_plan_once_and_needs_the_calibration_plan(exec_calls: list[str]) -> None:
    _, c = captured_workload(MODEL)
    machine = detect_host()
    plans = [p for p in plan_spread(machine.default_device.cores) if p.order == "topo"]
    from schedlab.calibrate.signature import signature

    kernels = [op for op in c.graph.ops if not op.is_view]  # type: ignore[attr-defined]
    known = {signature(kernels[0]): {1: 5.0}}  # the profile measured exactly one of the model's ops
    res = held_out_fidelity(MODEL, c.graph, c.input_values, plans, make_profile(signatures=known), machine, steps=1, warmup=0)  # type: ignore[attr-defined]
    assert exec_calls == [p.name for p in plans]  # no separate calibration runs
    assert len(res.scored(TRACE_CALIBRATED)) == len(plans) - 1
    same = sum(1 for op in kernels if signature(op) in known)
    assert res.profile_seen_ops_frac == pytest.approx(same / len(kernels)) and 0 < res.profile_seen_ops_frac < 1
    with pytest.raises(SchedlabError, match="calibration plan"):
        held_out_fidelity(MODEL, c.graph, c.input_values, plans[1:], make_profile(), machine, steps=1)  # type: ignore[attr-defined]


def test_builtin_protocol_marks_its_calibration_shapes(exec_calls: list[str]) -> None:
    _, c = captured_workload("mlp")
    machine = detect_host()
    plans = plan_spread(machine.default_device.cores)[:4]  # one slot, one thread, every order
    rows = measure_and_predict("mlp", c.graph, c.input_values, plans, make_profile(), machine, steps=1, calibration_threads=(1,))  # type: ignore[attr-defined]
    assert exec_calls == [p.name for p in plans]
    assert [r.in_calibration for r in rows] == [p.order == "topo" for p in plans]
    assert {r.method for r in rows} == {TRACE_CALIBRATED}
    rows = measure_and_predict("mlp", c.graph, c.input_values, plans[:1], make_profile(), machine, steps=1)  # type: ignore[attr-defined]
    assert rows[0].method == PROFILE_ONLY and not rows[0].in_calibration


# ---- the command ------------------------------------------------------------------------------


def _ns(models: list[str], model_list: list[str], held_out: bool) -> argparse.Namespace:
    return argparse.Namespace(models=models, model_list=model_list, held_out=held_out)


def test_chosen_models() -> None:
    assert chosen_models(_ns([], [], False)) == list(BUILTIN_WORKLOADS)
    assert chosen_models(_ns([], [], True)) == list(HELDOUT_WORKLOADS)
    assert chosen_models(_ns(["cnn"], ["mlp,cnn", "nmt"], False)) == ["cnn", "mlp", "nmt"]
    assert chosen_models(_ns([], ["gru-tagger, heldout:mixer"], True)) == ["heldout:gru-tagger", "heldout:mixer"]
    with pytest.raises(SchedlabError, match="not a held-out model"):
        chosen_models(_ns([], ["mlp"], True))


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    return make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")


def test_held_out_command_json_and_table(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "f.json"
    argv = ["fidelity", "--held-out", "--models", "mixer", "--size", "tiny", "--steps", "1"]
    rc = main([*argv, "--profile", str(profile_file), "--out", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    stored = json.loads(out.read_text())
    assert printed["plans"] == stored["plans"] and stored["set"] == "held-out"
    n = len(plan_spread(detect_host().default_device.cores))
    assert stored["calibration_plan"] == CALIBRATION_PLAN.name and stored["plans_per_model"] == n
    (m,) = stored["models"]
    assert m["workload"] == MODEL and m["ops"] > 0
    assert m["profile_seen_ops"] == 0.0  # a hand-made profile with no signatures has seen none of its ops
    assert m["profile_only"]["n_plans"] == n and m["trace_calibrated"]["n_plans"] == n - 1
    for summary in (m["profile_only"], m["trace_calibrated"], m["trace_calibrated"]["other_shapes"]):
        assert set(summary) >= {"mape", "worst_error", "kendall_tau", "n_plans"}
        assert summary["mape"] >= 0 and abs(summary["worst_error"]) >= summary["mape"] - 1e-12
    assert stored["overall"]["trace_calibrated"]["n_plans"] == n - 1
    assert len(stored["plans"]) == 2 * n
    assert sum(p["in_calibration"] for p in stored["plans"]) == 1
    unscored = [p for p in stored["plans"] if not p["scored"]]
    assert [(p["plan"], p["method"]) for p in unscored] == [(CALIBRATION_PLAN.name, TRACE_CALIBRATED)]
    assert stored["size"] == "tiny" and stored["steps_per_plan"] == 1 and stored["versions"]["torch"]
    assert all(p["foreign_cpu_frac"] is None or 0.0 <= p["foreign_cpu_frac"] <= 1.0 for p in stored["plans"])
    assert all(p["steal_frac"] is None or 0.0 <= p["steal_frac"] <= 1.0 for p in stored["plans"])
    assert isinstance(stored["busy_plans"], list) and isinstance(stored["steal_plans"], list)
    scaling = stored["host_scaling"]
    assert scaling["calibration"] is None  # a hand-made profile: never probed
    (probe,) = scaling["models"]
    assert probe["workload"] == MODEL
    cores = detect_host().default_device.cores
    for p in (probe["before"], probe["after"]):
        if cores < 2:  # nothing to scale, no probe
            assert p is None
            continue
        assert p["threads"] == cores
        assert p["compute_speedup"] > 0 and p["memory_speedup"] > 0 and p["compute_1t_us"] > 0
    # the profile has no signatures: every kernel op is unseen, and the per-class table counts them all
    kernels = sum(c["n_ops"] for c in m["op_classes"])
    assert kernels > 0 and [c["op_class"] for c in stored["op_classes"]] != []
    assert sum(c["n_ops"] for c in stored["op_classes"]) == kernels
    assert all(c["measured_us"] >= 0 and c["predicted_us"] > 0 for c in stored["op_classes"])

    # per shape, each method over its scored rows: the calibration plan's trace-calibrated row is left out
    shapes = {(s["method"], s["shape"]): s for s in stored["plan_shapes"]}
    assert sum(s["n_plans"] for (method, _), s in shapes.items() if method == PROFILE_ONLY) == n
    assert shapes[(TRACE_CALIBRATED, "s1-t1")]["n_plans"] == shapes[(PROFILE_ONLY, "s1-t1")]["n_plans"] - 1

    # what simulating each plan cost against running it, over the profile-only rows (every plan once)
    alone = [p for p in stored["plans"] if p["method"] == PROFILE_ONLY]
    cold = {p["plan"]: p["measured_s"] / p["sim_cold_s"] for p in alone}
    cost = m["sim_cost"]
    assert cost["plans"] == n and cost["least_plan"] == min(cold, key=cold.__getitem__)
    assert cost["exec_over_sim_cold_min"] == pytest.approx(min(cold.values()))
    assert cost["exec_over_sim_cold_min"] <= cost["exec_over_sim_cold"]
    assert cost["exec_over_sim_min"] == pytest.approx(min(p["measured_s"] / p["sim_wall_s"] for p in alone))
    assert stored["sim_cost"]["least_model"] == MODEL
    assert stored["sim_cost"]["exec_over_sim_cold_min"] == cost["exec_over_sim_cold_min"]

    print_held_out(stored, "Test CPU", out)
    text = capsys.readouterr().out
    assert "simulating a step against running it" in text and f"({cost['least_plan']})" in text
    assert "by plan shape" in text and "s1-t1" in text
    assert "profile-only" in text and "trace-calibrated" in text and "mixer" in text
    assert "ops whose signature it never measured" in text and stored["op_classes"][0]["op_class"] in text
    assert text.count("*") >= 1 and f"other {n - 1} plans" in text and "others" in text and "seen ops" in text
    assert "one round per plan" in text and "--rounds 3" in text  # its noise unknown: the table says how to know it

    print_held_out({**stored, "busy_plans": [f"{MODEL}/p{i}" for i in range(7)], "steal_plans": []}, "Test CPU", out)
    text = capsys.readouterr().out
    assert f"warning: 7 of {n} plans measured while other processes used over 25%" in text
    assert f"{MODEL}/p4 and 2 more" in text and f"{MODEL}/p5" not in text
    assert "hypervisor took" not in text
    print_held_out({**stored, "steal_plans": [f"{MODEL}/p{i}" for i in range(2)]}, "Test CPU", out)
    text = capsys.readouterr().out
    assert f"warning: 2 of {n} plans measured while the hypervisor took over 10% of the CPU (column 'steal')" in text


def test_a_held_out_run_cut_short_keeps_its_models_and_resume_measures_only_the_rest(
    capsys, tmp_path: Path, profile_file: Path, exec_calls: list[str], monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    from schedlab.calibrate import fidelity

    out = tmp_path / "f.json"
    argv = ["fidelity", "--held-out", "--models", "mixer,conv1d-two-branch", "--size", "tiny", "--steps", "1",
            "--profile", str(profile_file), "--out", str(out)]
    real = fidelity.held_out_fidelity

    def dies_on_the_second(workload: str, *a: Any, **kw: Any) -> Any:
        if workload != MODEL:
            raise KeyboardInterrupt  # the run is cut short while measuring the second model
        return real(workload, *a, **kw)

    monkeypatch.setattr(fidelity, "held_out_fidelity", dies_on_the_second)
    assert main(argv) == 130  # interrupted (Ctrl-C)
    cut = json.loads(out.read_text())
    assert cut["complete"] is False and cut["pending"] == ["heldout:conv1d-two-branch"]
    assert [m["workload"] for m in cut["models"]] == [MODEL] and cut["overall"]["profile_only"]["n_plans"] > 0
    assert cut["models"][0]["calibration_trace"] == "f-traces/heldout_mixer.json"  # kept beside the results
    assert (tmp_path / "f-traces" / "heldout_mixer.json").is_file()
    monkeypatch.setattr(fidelity, "held_out_fidelity", real)
    exec_calls.clear()
    assert main([*argv, "--resume"]) == 0
    assert "resuming" in capsys.readouterr().err
    n = len(plan_spread(detect_host().default_device.cores))
    assert len(exec_calls) == n  # the second model's plans only, once each (steps 1, no warm-up rounds)
    done = json.loads(out.read_text())
    assert done["complete"] is True and done["pending"] == []
    assert [m["workload"] for m in done["models"]] == [MODEL, "heldout:conv1d-two-branch"]
    kept = [p for p in done["plans"] if p["workload"] == MODEL]
    assert kept == cut["plans"]  # the first model's measurements and predictions, as they were
    assert done["models"][0]["profile_only"] == cut["models"][0]["profile_only"]
    assert done["models"][0]["trace_calibrated"] == cut["models"][0]["trace_calibrated"]
    assert [m["workload"] for m in done["host_scaling"]["models"]] == [MODEL, "heldout:conv1d-two-branch"]
    assert [m["calibration_trace"] for m in done["models"]] == [
        "f-traces/heldout_mixer.json", "f-traces/heldout_conv1d-two-branch.json"]
    # re-scored with the same profile, the saved traces give back the run's own trace-calibrated predictions
    assert main(["fidelity", "--held-out", "--rescore", str(out), "--profile", str(profile_file),
                 "--out", str(tmp_path / "r.json")]) == 0
    again = json.loads((tmp_path / "r.json").read_text())
    run = {(p["workload"], p["plan"], p["method"]): p["predicted_s"] for p in done["plans"]}
    assert {(p["workload"], p["plan"], p["method"]): p["predicted_s"] for p in again["plans"]} == run
    assert again["overall"]["trace_calibrated"]["mape"] == pytest.approx(done["overall"]["trace_calibrated"]["mape"])
    assert [m["sim_cost"]["plans"] for m in again["models"]] == [n, n]  # simulated again here, each plan once
    assert again["sim_cost"]["least_model"] in {MODEL, "heldout:conv1d-two-branch"}
    printed = capsys.readouterr().out
    assert "trace-calibrated" in printed and "simulating a step against running it" in printed

    # another setting than the file's: one clear error, the file left as it was
    assert main([*argv[:-4], "--steps", "2", "--profile", str(profile_file), "--out", str(out), "--resume"]) == 2
    assert "measured with steps_per_plan 1, this run has 2" in capsys.readouterr().err
    assert json.loads(out.read_text()) == done


def test_the_dev_set_runs_the_held_out_protocol_and_rescores_on_its_own(  # type: ignore[no-untyped-def]
    capsys, tmp_path: Path, profile_file: Path
) -> None:
    out = tmp_path / "d.json"
    assert main(["fidelity", "--dev", "--models", "lstm", "--size", "tiny", "--steps", "1",
                 "--profile", str(profile_file), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("dev fidelity on ") and "trace-calibrated" in printed
    stored = json.loads(out.read_text())
    n = len(plan_spread(detect_host().default_device.cores))
    assert stored["set"] == "dev" and stored["calibration_plan"] == CALIBRATION_PLAN.name
    (m,) = stored["models"]
    assert m["workload"] == "dev:lstm" and m["trace_calibrated"]["n_plans"] == n - 1
    assert (tmp_path / m["calibration_trace"]).is_file()
    # re-scored as a dev run (its calibration trace too), never as the held-out set's
    rescored = tmp_path / "r.json"
    assert main(["fidelity", "--dev", "--rescore", str(out), "--profile", str(profile_file),
                 "--out", str(rescored)]) == 0
    again = json.loads(rescored.read_text())
    assert again["set"] == "dev" and again["overall"]["trace_calibrated"]["n_plans"] == n - 1
    assert again["overall"]["trace_calibrated"]["mape"] == pytest.approx(stored["overall"]["trace_calibrated"]["mape"])
    capsys.readouterr()
    assert main(["fidelity", "--held-out", "--rescore", str(out), "--profile", str(profile_file),
                 "--out", str(tmp_path / "h.json")]) == 2
    assert "--held-out: the results files measured the dev models" in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--models", "encoder-classifier"], "'encoder-classifier' is not a dev model; with --dev choose from gru, gru-big"),
        (["--held-out"], "give one"),
        (["--devices", "2"], "drop --backend, --cuda and --devices"),
        (["--no-trace-calibration"], "--dev reports profile-only and trace-calibrated errors both"),
    ],
)
def test_dev_command_errors(capsys, tmp_path: Path, profile_file: Path, extra: list[str], msg: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "d.json"
    rc = main(["fidelity", "--dev", "--size", "tiny", "--profile", str(profile_file), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err
    assert not out.exists()


def test_one_device_fidelity_in_rounds_scores_each_plan_on_every_rounds_steps(  # type: ignore[no-untyped-def]
    capsys, tmp_path: Path, profile_file: Path
) -> None:
    out = tmp_path / "f.json"
    argv = ["fidelity", "--held-out", "--models", "mixer", "--size", "tiny", "--steps", "2", "--rounds", "2",
            "--profile", str(profile_file), "--out", str(out), "--json"]
    assert main(argv) == 0
    stored = json.loads(out.read_text())
    assert stored["rounds"] == 2
    n = len(plan_spread(detect_host().default_device.cores))
    assert len(stored["plans"]) == 2 * n
    for row in stored["plans"]:
        lo, hi = min(row["round_medians_s"]), max(row["round_medians_s"])
        assert len(row["round_medians_s"]) == 2 and lo <= row["measured_s"] <= hi
    overall = stored["overall"]["profile_only"]
    assert overall["one_round_mape"] >= 0 and overall["round_to_round_mape"] >= 0
    # two rounds: each half is one round, so the halves are one round against the other
    assert overall["halves_mape"] == pytest.approx(overall["round_to_round_mape"])
    print_held_out(stored, "Test CPU", out)
    text = capsys.readouterr().out
    assert "against a single round's medians" in text and "one round per plan" not in text
    assert "the first half of the rounds' medians against the second half's" in text


def test_round_robin_measures_every_plan_once_a_round_in_plan_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedlab.calibrate import fidelity

    graph = captured_workload(MODEL, "sgd", "tiny")[1].graph
    machine = detect_host()
    plans = resolve_all(graph, plan_spread(1)[:3], machine)
    seen: list[str] = []

    class FakeBackend:
        def __init__(self, *_: Any, **__: Any) -> None:
            self.n = 0

        def run(self, _graph: Any, resolved: Any, _machine: Any, steps: int) -> Any:
            seen.append(resolved.plan.name)
            self.n += 1
            return BackendRun(step_times_s=(float(self.n),) * steps, trace=None)  # type: ignore[arg-type]

    monkeypatch.setattr("schedlab.exec.ExecBackend", FakeBackend)
    got = fidelity.measure(MODEL, graph, {}, plans, machine, steps=2, rounds=3)
    names = [p.plan.name for p in plans]
    assert seen == names * 3  # round-robin, not each plan three times in a row
    assert [m.round_medians_s for m in got] == [(1.0, 4.0, 7.0), (2.0, 5.0, 8.0), (3.0, 6.0, 9.0)]
    with pytest.raises(SchedlabError, match="rounds must be at least 1"):
        fidelity.measure(MODEL, graph, {}, plans, machine, rounds=0)


def test_plans_measured_on_a_busy_machine_are_flagged() -> None:
    from schedlab.calibrate.fidelity import BUSY_FRAC, STEAL_FRAC, FidelityRow, held_out_summary

    def row(plan: str, method: str, busy: float | None, cal: bool = False) -> FidelityRow:
        steal = 0.5 if plan == "s2-t2-topo" else 0.01  # the hypervisor's share, apart from other processes'
        return FidelityRow(MODEL, plan, 0.01, (0.01, 0.02), 0.012, 1e-4, 2e-4, 10, cal, method, busy, steal_frac=steal)

    busy = {"s1-t1-topo": 0.0, "s1-t2-topo": BUSY_FRAC + 0.3, "s2-t2-topo": None}
    res = HeldOutResult(
        MODEL,
        profile_only=[row(p, PROFILE_ONLY, b) for p, b in busy.items()],
        trace_calibrated=[row(p, TRACE_CALIBRATED, b, cal=p == "s1-t1-topo") for p, b in busy.items()],
        calibration_shape=(True, False, False),
    )
    d = held_out_summary([res])
    assert d["busy_plans"] == [f"{MODEL}/s1-t2-topo"] and d["busy_frac"] == BUSY_FRAC
    assert d["steal_plans"] == [f"{MODEL}/s2-t2-topo"] and d["steal_frac"] == STEAL_FRAC
    assert d["models"][0]["ops"] == 10
    assert d["models"][0]["trace_calibrated"]["n_plans"] == 2
    assert d["models"][0]["trace_calibrated"]["other_shapes"]["n_plans"] == 2
    assert [p["scored"] for p in d["plans"]] == [True, True, True, False, True, True]


@pytest.mark.parametrize(
    "extra, msg",
    [(["--models", "mlp"], "not a held-out model"), (["--no-trace-calibration"], "drop --no-trace-calibration")],
)
def test_held_out_command_errors(capsys, profile_file: Path, extra: list[str], msg: str) -> None:  # type: ignore[no-untyped-def]
    rc = main(["fidelity", "--held-out", "--size", "tiny", "--profile", str(profile_file), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err


def test_builtin_command_keeps_its_keys(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "f.json"
    rc = main(["fidelity", "--models", "mlp", "--size", "tiny", "--steps", "1", "--no-trace-calibration",
               "--profile", str(profile_file), "--out", str(out), "--json"])
    assert rc == 0
    d = json.loads(out.read_text())
    for key in ("machine", "versions", "size", "optimizer", "steps_per_plan", "trace_calibration", "mape",
                "mape_unseen_plans", "worst_error", "workloads", "plans", "wall_s"):
        assert key in d, key
    assert d["trace_calibration"] is False and {p["workload"] for p in d["plans"]} == {"mlp"}
    assert {p["method"] for p in d["plans"]} == {PROFILE_ONLY}
    assert json.loads(capsys.readouterr().out)["mape"] == d["mape"]
    (probe,) = d["host_scaling"]["models"]  # the host's two-core probe around the model's plans
    assert probe["workload"] == "mlp"
    if detect_host().default_device.cores >= 2:  # one core: nothing to scale, no probe
        assert probe["before"]["compute_speedup"] > 0 and probe["after"]["threads"] >= 2


def test_a_builtin_run_resumes_with_the_models_it_finished(
    capsys, tmp_path: Path, profile_file: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    from schedlab.calibrate import fidelity

    out = tmp_path / "f.json"
    argv = ["fidelity", "--models", "mlp,cnn", "--size", "tiny", "--steps", "1", "--no-trace-calibration",
            "--profile", str(profile_file), "--out", str(out)]
    real = fidelity.measure_and_predict
    ran: list[str] = []

    def dies_on_cnn(workload: str, *a: Any, **kw: Any) -> Any:
        ran.append(workload)
        if workload == "cnn":
            raise KeyboardInterrupt
        return real(workload, *a, **kw)

    monkeypatch.setattr(fidelity, "measure_and_predict", dies_on_cnn)
    assert main([*argv, "--resume"]) == 130  # nothing to resume yet: every model measured, until cut short
    assert "no results file at" in capsys.readouterr().err
    cut = json.loads(out.read_text())
    assert cut["complete"] is False and cut["pending"] == ["cnn"] and {p["workload"] for p in cut["plans"]} == {"mlp"}
    monkeypatch.setattr(fidelity, "measure_and_predict", lambda w, *a, **kw: (ran.append(w), real(w, *a, **kw))[1])
    ran.clear()
    assert main([*argv, "--resume"]) == 0 and ran == ["cnn"]
    done = json.loads(out.read_text())
    assert done["complete"] is True and [w["workload"] for w in done["workloads"]] == ["mlp", "cnn"]
    assert [p for p in done["plans"] if p["workload"] == "mlp"] == cut["plans"]
    capsys.readouterr()
    assert main([*[a for a in argv if a != "--no-trace-calibration"], "--resume"]) == 2  # calibrated on traces now
    assert "measured with trace_calibration False, this run has True" in capsys.readouterr().err


def test_a_scored_run_far_from_its_own_calibration_run_is_reported_as_drift() -> None:
    """Trace calibration replays its run's op times, so the same plan scored much slower or
    faster means the machine changed speed in between (mlp, 2026-11-24: 509 ms, then 326)."""
    from schedlab.calibrate.fidelity import FidelityRow
    from schedlab.cli.fidelity_cmd import DRIFT_WARN, calibration_drift

    def row(plan: str, measured_s: float) -> FidelityRow:
        return FidelityRow("mlp", plan, measured_s, (measured_s, measured_s), 0.5, 1e-3, 1e-3, 10, True)

    rows = [row("s1-t1-topo", 0.548), row("s1-t2-topo", 0.326), row("s2-t2-topo", 0.3)]
    drifts = calibration_drift("mlp", {1: 0.55, 2: 0.509, 16: 0.1}, rows)  # no s1-t16 plan in the spread
    assert [(d["plan"], d["threads"]) for d in drifts] == [("s1-t1-topo", 1), ("s1-t2-topo", 2)]
    assert abs(drifts[0]["drift"]) < DRIFT_WARN < abs(drifts[1]["drift"])
    assert drifts[1]["drift"] == pytest.approx(0.326 / 0.509 - 1)
    assert calibration_drift("mlp", {}, rows) == []  # --no-trace-calibration


def test_errors_by_plan_shape_show_a_bias_that_the_overall_mape_hides() -> None:
    """Every order of a shape predicted 20% fast is one bias, printed as such; plans outside
    the spread are left out of the shapes."""
    def row(plan: str, predicted_s: float, method: str = PROFILE_ONLY) -> FidelityRow:
        return FidelityRow(workload="m", plan=plan, measured_s=1.0, measured_spread_s=(1.0, 1.0), predicted_s=predicted_s,
                           sim_wall_s=0.0, sim_cold_s=0.0, ops=1, in_calibration=False, method=method)

    rows = [row("s2-t2-topo", 0.8), row("s2-t2-w-last", 0.8), row("s1-t1-topo", 1.1), row("s1-t1-random:0", 0.9),
            row("s1-t1-topo", 1.05, TRACE_CALIBRATED), row("dp-b25", 0.5)]
    assert plan_shape("s2-t2-random:0") == "s2-t2" and plan_shape("s12-t16-topo") == "s12-t16"
    assert plan_shape("dp-b25") is None and plan_shape("tf-intra1-inter2") is None
    got = [(s["method"], s["shape"], s["n_plans"], round(s["mean_error"], 6), round(s["mape"], 6))
           for s in shape_errors(rows)]
    assert got == [
        (PROFILE_ONLY, "s1-t1", 2, 0.0, 0.1),  # errors that cancel: no bias, 10% MAPE
        (PROFILE_ONLY, "s2-t2", 2, -0.2, 0.2),  # a bias: every plan predicted fast
        (TRACE_CALIBRATED, "s1-t1", 1, 0.05, 0.05),
    ]


def _ranked(plan: str, predicted_s: float, *rounds_s: float) -> FidelityRow:
    med = sorted(rounds_s)[len(rounds_s) // 2]
    return FidelityRow(workload="m", plan=plan, measured_s=med, measured_spread_s=(min(rounds_s), max(rounds_s)),
                       predicted_s=predicted_s, sim_wall_s=1e-3, sim_cold_s=1e-3, ops=1, in_calibration=False,
                       round_medians_s=tuple(rounds_s) if len(rounds_s) > 1 else ())


def test_tau_over_told_apart_pairs_leaves_out_plans_whose_rounds_interleave() -> None:
    """Two data-parallel bucket sizes within each other's rounds are a tie of the machine:
    plain tau scores the simulator on the noise, the told-apart tau leaves the pair out."""
    layers = _ranked("layers", 0.47, 0.47, 0.48)
    b25 = _ranked("dp-b25", 0.292, 0.290, 0.300)
    b1 = _ranked("dp-b1", 0.287, 0.296, 0.301)  # measured slower than b25, predicted faster; rounds overlap
    rows = [layers, b25, b1]
    tau_r, told, pairs = resolved_tau(rows)
    assert (told, pairs) == (2, 3) and tau_r == 1.0  # layers against each dp plan, both right
    summary = error_summary(rows)
    assert summary["kendall_tau"] < 0.5 < summary["kendall_tau_resolved"] == 1.0
    assert (summary["resolved_pairs"], summary["pairs"]) == (2, 3)
    # a reversed told-apart pair counts -1, a tied prediction 0
    assert resolved_tau([_ranked("a", 0.2, 0.10, 0.11), _ranked("b", 0.1, 0.20, 0.21)])[0] == -1.0
    assert resolved_tau([_ranked("a", 0.1, 0.10, 0.11), _ranked("b", 0.1, 0.20, 0.21)])[0] == 0.0
    # nothing told apart: undefined, not 0 or 1
    assert resolved_tau([b25, b1]) == (None, 0, 1)


def test_with_one_round_every_pair_of_distinct_medians_counts() -> None:
    rows = [_ranked("a", 1.0, 1.0), _ranked("b", 2.5, 2.0), _ranked("c", 2.0, 3.0), _ranked("d", 4.0, 3.0)]
    tau_r, told, pairs = resolved_tau(rows)
    assert (told, pairs) == (5, 6)  # c and d measured alike
    assert tau_r == (4 - 1) / 5  # b-c reversed


def test_the_rounds_spread_is_the_error_an_exact_prediction_scores_against_one_round() -> None:
    """Rounds of 90, 100 and 110 ms around a 100 ms median are 20/3% off it on average,
    whatever the prediction; a plan of one round says nothing of the noise."""
    rows = [_ranked("a", 0.5, 0.09, 0.10, 0.11), _ranked("b", 0.2, 0.20, 0.20, 0.20)]
    assert round_spread(rows) == pytest.approx((0.2 / 3 + 0.0) / 2)
    assert round_spread([_ranked("c", 0.1, 0.1)]) is None
    summary = error_summary(rows)
    assert summary["round_spread"] == pytest.approx(round_spread(rows))
    other = {**summary, "round_spread": 0.05}
    assert overall_summary([0.1], [summary, other, error_summary([])])["round_spread"] == pytest.approx(
        (round_spread(rows) + 0.05) / 2)


def test_the_one_round_mape_scores_the_same_predictions_against_each_round_alone() -> None:
    """A prediction of exactly the 100 ms median scores 0 against it and (11.1 + 0 + 9.1)/3 %
    against the rounds of 90, 100 and 110 ms one at a time; one of 110 ms scores 10% against
    the median and (22.2 + 10 + 0)/3 % against the rounds. Overall: weighted by each model's
    plans, and only where every model was measured in rounds."""
    exact, off = _ranked("a", 0.10, 0.09, 0.10, 0.11), _ranked("b", 0.11, 0.09, 0.10, 0.11)
    assert one_round_mape([exact]) == pytest.approx((0.10 / 0.09 - 1 + 0.0 + 1 - 0.10 / 0.11) / 3)
    assert one_round_mape([off]) == pytest.approx((0.11 / 0.09 - 1 + 0.1 + 0.0) / 3)
    assert one_round_mape([exact, off]) == pytest.approx((one_round_mape([exact]) + one_round_mape([off])) / 2)
    assert one_round_mape([exact, _ranked("c", 0.1, 0.1)]) is None  # a plan of one round: no such figure
    assert error_summary([exact, off])["one_round_mape"] == pytest.approx(one_round_mape([exact, off]))
    one, two = error_summary([exact]), error_summary([exact, off])
    assert overall_summary([0.0, 0.0, 0.1], [one, two])["one_round_mape"] == pytest.approx(
        (one_round_mape([exact]) + 2 * one_round_mape([exact, off])) / 3)
    assert overall_summary([0.0], [one, error_summary([_ranked("c", 0.1, 0.1)])])["one_round_mape"] is None


def test_round_to_round_mape_is_each_round_predicting_every_other_round() -> None:
    """Rounds of 90, 100 and 110 ms: each predicting the other two, six ratios; the
    prediction plays no part. Overall over every plan, as the one-round MAPE."""
    rounds = (0.09, 0.10, 0.11)
    expected = sum(abs(a / b - 1) for a in rounds for b in rounds if a != b) / 6
    rows = [_ranked("a", 0.5, *rounds), _ranked("b", 0.01, *rounds)]
    assert round_to_round_mape(rows) == pytest.approx(expected)
    assert round_to_round_mape([_ranked("c", 0.1, 0.1)]) is None
    summary = error_summary(rows)
    assert summary["round_to_round_mape"] == pytest.approx(expected)
    assert overall_summary([0.0] * 2, [summary])["round_to_round_mape"] == pytest.approx(expected)


def test_trace_calibration_learns_from_every_round_of_the_calibration_plan() -> None:
    """A round of 10 ns kernels and one of 30 ns: the trace learnt from holds both rounds'
    steps, numbered in turn, not only the round nearest the median."""
    def taken(dur_ns: int, tag: str) -> Measurement:
        events = tuple(TraceEvent(0, "mm", "F", "cpu0", 0, 1, 0, dur_ns, k) for k in range(2))
        return Measurement(BackendRun((dur_ns * 1e-9,) * 2, Trace(events, {"tag": tag})), None)

    pooled = pooled_rounds([taken(10, "a"), taken(30, "b")])
    joined = calibration_trace(pooled)
    assert sorted({e.step for e in joined.events}) == [0, 1, 2, 3] and joined.meta["joined_runs"] == 2
    assert sorted(e.dur_ns for e in joined.events) == [10, 10, 30, 30]
    assert calibration_trace(taken(10, "one")).meta["tag"] == "one"  # one round: its own trace


def test_the_simulators_cost_is_the_median_of_several_timed_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import types

    import schedlab.calibrate.fidelity as fidelity_mod
    import schedlab.sim as sim
    from schedlab.calibrate.fidelity import SIM_TIMINGS, predict

    _, c = captured_workload("mlp")
    machine = detect_host()
    resolved = resolve_all(c.graph, plan_spread(2)[:1], machine)  # type: ignore[attr-defined]
    # the first reused run fills the caches (not timed); then SIM_TIMINGS reused runs, their own
    # sim_wall_s, and as many cold calls, each timed whole around simulate() (its set-up included)
    walls = iter([9.9, 5.0, 1.0, 3.0])
    clock = iter([0.0, 40.0, 100.0, 120.0, 200.0, 230.0])
    cold = sim.simulate(c.graph, resolved[0], machine, make_profile(), record=False)  # type: ignore[attr-defined]
    run = sim.Simulator.run
    monkeypatch.setattr(sim.Simulator, "run", lambda *a, **kw: dataclasses.replace(run(*a, **kw), sim_wall_s=next(walls)))
    monkeypatch.setattr(sim, "simulate", lambda *a, **kw: dataclasses.replace(cold, sim_wall_s=1e-9))
    monkeypatch.setattr(fidelity_mod, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    (pred,) = predict(c.graph, resolved, make_profile(), machine)  # type: ignore[attr-defined]
    assert SIM_TIMINGS == 3 and (pred.sim_wall_s, pred.sim_cold_s) == (3.0, 30.0)
    assert next(walls, None) is None and next(clock, None) is None


def test_the_host_probe_table_says_how_much_slower_the_host_ran_than_at_calibration(capsys) -> None:  # type: ignore[no-untyped-def]
    from schedlab.cli.fidelity_cmd import print_host_scaling

    def probe(mm_us: float) -> dict[str, Any]:
        return {"threads": 2, "compute_speedup": 1.8, "memory_speedup": 1.4, "compute_1t_us": mm_us, "memory_1t_us": 900.0}

    models = [{"workload": "heldout:mixer", "before": probe(1500.0), "after": probe(2000.0)},
              {"workload": "heldout:lstm-lm", "before": probe(900.0), "after": {"threads": 2}}]  # a probe cut short
    print_host_scaling({"calibration": probe(1000.0), "models": models})
    out = capsys.readouterr().out
    assert "mixer" in out and "1.50x -> 2.00x" in out and "0.90x ->   -" in out
    assert "one-thread mm against calibration: 0.90-2.00x, median 1.50x" in out
    assert "one tiny call" not in out  # probes from before the tiny call was timed
    print_host_scaling({"calibration": None, "models": models})  # a profile from before the probe: speedups only
    out = capsys.readouterr().out
    assert "mixer" in out and "x ->" not in out and "against calibration" not in out

    def timed(mm_us: float, call_us: float) -> dict[str, Any]:
        return {**probe(mm_us), "call_us": call_us}

    models = [{"workload": "heldout:mixer", "before": timed(1000.0, 1.5), "after": timed(1010.0, 1.8)},
              {"workload": "heldout:lstm-lm", "before": timed(990.0, 1.2), "after": probe(1000.0)}]  # one from before
    print_host_scaling({"calibration": timed(1000.0, 1.2), "models": models})
    out = capsys.readouterr().out
    assert "1.00x -> 1.01x    1.25x -> 1.50x" in out and "0.99x -> 1.00x    1.00x ->   -" in out
    assert "one-thread mm against calibration: 0.99-1.01x" in out
    assert "one tiny call against calibration: 1.00-1.50x, median 1.25x" in out
    plans = [{"workload": "heldout:mixer", "predicted_s": 0.010, "measured_s": 0.0101, "method": "profile-only"}]
    print_host_scaling({"calibration": timed(1000.0, 1.2), "models": models}, plans)
    assert "profile-only MAPE 1.0% as predicted, 0.5% with each model's predictions times" in capsys.readouterr().out


def test_sim_cost_is_the_measured_step_over_the_simulation_median_and_least_over_plans() -> None:
    def row(plan: str, measured_s: float, sim_wall_s: float, sim_cold_s: float) -> FidelityRow:
        return FidelityRow(workload="m", plan=plan, measured_s=measured_s, measured_spread_s=(measured_s, measured_s),
                           predicted_s=measured_s, sim_wall_s=sim_wall_s, sim_cold_s=sim_cold_s, ops=1,
                           in_calibration=False)

    rows = [row("fast", 0.010, 1e-4, 1e-3), row("slow", 0.040, 1e-4, 1e-3), row("mid", 0.020, 4e-4, 4e-3)]
    cost = sim_cost(rows)  # reused 100, 400, 50; cold 10, 40, 5
    assert cost["plans"] == 3 and cost["least_plan"] == "mid"
    assert cost["exec_over_sim"] == pytest.approx(100.0) and cost["exec_over_sim_cold"] == pytest.approx(10.0)
    assert cost["exec_over_sim_min"] == pytest.approx(50.0) and cost["exec_over_sim_cold_min"] == pytest.approx(5.0)
    assert sim_cost([row("untimed", 0.01, 0.0, 0.0)])["exec_over_sim"] is None  # nothing simulated: no figure
    other = sim_cost([row("a", 0.010, 1e-4, 5e-4)])  # reused 100, cold 20
    least = sim_cost_overall([{"workload": "m", "sim_cost": cost}, {"workload": "n", "sim_cost": other},
                              {"workload": "old", "ops": 3}])  # a file from before: no sim_cost, left out
    assert least == {"exec_over_sim_min": pytest.approx(50.0), "exec_over_sim_cold_min": pytest.approx(5.0),
                     "least_model": "m"}
    assert sim_cost_overall([])["least_model"] is None


def test_halves_mape_is_the_first_half_of_the_rounds_against_the_second_both_ways() -> None:
    """Rounds of 90, 100 | 110, 120 ms: the halves' medians 95 and 115, each predicting the
    other; an odd middle round is left out; one round, no figure."""
    first, second = 0.095, 0.115
    expected = (abs(first / second - 1) + abs(second / first - 1)) / 2
    rows = [_ranked("a", 0.5, 0.09, 0.10, 0.11, 0.12), _ranked("b", 0.01, 0.09, 0.10, 0.11, 0.12)]
    assert halves_mape(rows) == pytest.approx(expected)
    odd = (abs(0.09 / 0.11 - 1) + abs(0.11 / 0.09 - 1)) / 2
    assert halves_mape([_ranked("c", 0.1, 0.09, 0.50, 0.11)]) == pytest.approx(odd)  # the middle round left out
    assert halves_mape([_ranked("c", 0.1, 0.1)]) is None
    assert halves_mape([*rows, _ranked("c", 0.1, 0.1)]) is None  # some plan of one round: no such figure
    summary = error_summary(rows)
    assert summary["halves_mape"] == pytest.approx(expected)
    assert overall_summary([0.0] * 2, [summary])["halves_mape"] == pytest.approx(expected)
    assert error_summary([])["halves_mape"] is None
