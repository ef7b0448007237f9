"""A whole (tiny) calibration end to end, and the `calibrate` command."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

import schedlab.calibrate.run as run_mod
from schedlab.calibrate import DEFAULT_PROFILE_PATH, CalibrationConfig, Profile, run_calibration, signature
from schedlab.calibrate.sweep import SweepConfig, sweep_cases, sweep_specs
from schedlab.calibrate.timing import RetryBudget, TimingConfig
from schedlab.calibrate.wake import POOLED, WakePoint, fit_wake
from schedlab.capture import capture
from schedlab.cli import calibrate_cmd
from schedlab.errors import SchedlabError
from schedlab.workloads import load_workload

TINY = CalibrationConfig(
    quick=True,
    workloads=("mlp",),
    optimizers=("sgd",),
    coverage=(),
    replay_rounds=1,
    corun_steps=1,
    sweep=SweepConfig(per_class=2, max_flops=2e6, max_elems=1 << 12),
    threads=(1,),
    timing=TimingConfig(budget_s=0.0005, min_reps=1, max_reps=3, rounds=1),
    dispatch_ops=200,
    corun_s=0.01,
    corun_rounds=1,
    thread_wake=False,
    team_stall=False,
    in_turn_rounds=2,
)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, Path]:
    out = tmp_path_factory.mktemp("cal") / "profile.json"
    return run_calibration(quick=True, out=out, progress=False, config=TINY), out


def test_tiny_calibration_writes_a_loadable_profile(tiny_profile: tuple[Profile, Path]) -> None:
    profile, out = tiny_profile
    loaded = Profile.load(out)  # same machine: no warning expected
    assert loaded.to_json() == profile.to_json()
    assert {"addmm", "mm", "relu"} <= set(profile.classes)
    assert profile.meta["threads"] == [1] and profile.meta["failures"] == []
    assert profile.dispatch.op_us > 0 and profile.dispatch.view_us > 0
    assert profile.dispatch.call_floor_us <= profile.dispatch.op_us  # a floor above the event is a disturbed one
    assert profile.views.signatures and "t" in profile.views.classes  # mlp's transposes were measured
    assert profile.roofline is not None and profile.roofline.gflops[1] > 0 and profile.roofline.gbps[1] > 0
    assert profile.context.warm_us and profile.context.first_use_us  # from the executor's step of mlp
    assert set(profile.corun.latency_us) == {1}  # fitted at the one thread count benchmarked
    assert {r["source"] for r in profile.meta["corun_fit"]} == {"mlp/tiny/sgd"}
    assert profile.wake == {} and profile.meta["n_wake_points"] == 0  # one thread: no helper to wake


def test_a_calibration_at_two_threads_fits_what_waking_helpers_costs(tmp_path: Path) -> None:
    cfg = replace(TINY, threads=(1, 2), wake_reps=1, corun_steps=0)
    profile = run_calibration(quick=True, out=tmp_path / "p.json", progress=False, config=cfg)
    assert profile.meta["n_wake_points"] > 0
    pooled = profile.wake[POOLED]
    assert pooled.threads == 2 and pooled.n_points == profile.meta["n_wake_points"]
    assert Profile.load(tmp_path / "p.json").wake == profile.wake
    kept = profile.meta["wake_points"]  # every case as timed, so that a fit can be tried again offline
    assert len(kept) == profile.meta["n_wake_points"] and all(p[3] == 2 and p[4] >= 0.0 for p in kept)
    again = fit_wake([WakePoint(*p) for p in kept], lambda c: profile.classes[c].model if c in profile.classes else None)
    assert again[POOLED].n_points == pooled.n_points


@pytest.mark.slow
def test_a_calibration_with_megabyte_ops_fits_what_a_step_pays_for_data_not_in_the_caches(tmp_path: Path) -> None:
    """The stream coverage model's ops move megabytes: they are timed cold, and their step
    gives the in-step share (calibrate.cold); without cold timing the profile has none."""
    cfg = replace(run_mod.with_cold(TINY), workloads=(), coverage=(), corun_steps=0, replay_rounds=2)
    assert [j[0] for j in run_mod._capture_jobs(cfg)] == ["coverage:stream/small/sgd"]  # the cold probe
    profile = run_calibration(quick=True, out=tmp_path / "p.json", progress=False, config=cfg)
    cold = profile.cold
    assert cold is not None and cold.n_points > 0 and cold.n_share_ops > 0
    assert {"relu", "native_layer_norm"} <= set(cold.slope_us_per_mib)
    assert cold.pooled_us_per_mib[1] > 0.0  # from memory, megabytes cost more than from the caches
    assert 0.0 <= cold.share <= 1.0
    loaded = Profile.load(tmp_path / "p.json").cold
    assert loaded is not None and loaded.to_json() == cold.to_json()
    off = replace(cfg, cold_per_class=0)
    assert run_mod._capture_jobs(off) == []  # no cold costs: no probe either
    assert run_calibration(quick=True, out=tmp_path / "q.json", progress=False, config=replace(off, workloads=("mlp",))).cold is None


def test_the_wake_is_timed_at_the_most_threads_and_every_nth_case_at_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_wake(fn: object, args: object, kwargs: object, threads: int, cores: int, reps: int) -> float:
        calls.append(threads)
        return 10.0 * threads

    def fake_point(fn: object, args: object, kwargs: object, threads: tuple[int, ...], *rest: object) -> object:
        return {k: 100.0 / k for k in threads}, set()

    monkeypatch.setattr(run_mod, "time_wake", fake_wake)
    monkeypatch.setattr(run_mod, "time_point", fake_point)
    cases = list(sweep_cases(sweep_specs(SweepConfig(per_class=3, max_flops=2e6, max_elems=1 << 12)), set()))
    ops = sum(1 for c in cases if not c.is_view)
    acc = run_mod._Bench(retry=RetryBudget(1.0))
    run_mod._bench(iter(cases), (1, 2, 4), replace(TINY, wake_scale_every=3), lambda: None, acc, cores=4)
    assert calls.count(4) == ops and 0 < calls.count(2) <= ops // 3 + 1 and 1 not in calls
    assert {p.threads for p in acc.wake} == {2, 4} and len(acc.wake) == len(calls)
    calls.clear()
    run_mod._bench(iter(cases), (1, 2, 4), replace(TINY, wake_scale_every=0), lambda: None, run_mod._Bench(RetryBudget(1.0)), 4)
    assert set(calls) == {4}  # 0: the most threads only


def test_every_op_of_the_workload_gets_a_finite_cost(tiny_profile: tuple[Profile, Path]) -> None:
    profile, _ = tiny_profile
    graph = capture(load_workload("mlp", "tiny"), "adam").graph  # adam ops were never measured
    for op in graph.ops:
        for threads in (1, 2, 16):
            k = profile.kernel_us(op, threads)
            assert math.isfinite(k) and k >= 0.0
            if op.is_view:
                assert k == 0.0


def test_calibrate_command_prints_a_json_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_mod, "quick_config", lambda: TINY)
    parser = argparse.ArgumentParser(prog="schedlab")
    calibrate_cmd.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "p.json"
    args = parser.parse_args(["calibrate", "--quick", "--out", str(out), "--json", "--no-progress"])
    assert args.handler(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["path"] == str(out) and out.exists()
    assert summary["quick"] is True
    assert "mm" in summary["classes"] and "heldout_mape" in summary["classes"]["mm"]
    assert summary["dispatch_us"]["op_us"] > 0
    assert summary["wall_s"] >= 0
    assert summary["cold"] is None  # not asked for
    assert 0 <= summary["points_under_floor"] <= summary["points"] == Profile.load(out).meta["n_points"] > 0
    assert 1 <= len(summary["corun_foreign_readings"]) <= 3  # the co-run figures, read until quiet


def test_a_calibration_with_many_timings_under_the_call_floor_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    dispatch = {"op_us": 3.4, "call_floor_us": 1.5}
    calibrate_cmd._under_floor_note({"points_under_floor": 536, "points": 2242, "dispatch_us": dispatch})
    err = capsys.readouterr().err
    assert "536 of 2242 op timings ran under the call floor" in err and "read 1.90 us above" in err
    calibrate_cmd._under_floor_note({"points_under_floor": 50, "points": 2240, "dispatch_us": dispatch})
    assert capsys.readouterr().err == ""


def test_a_calibration_that_read_the_corun_figures_again_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    calibrate_cmd._corun_readings_note([0.0])
    assert capsys.readouterr().err == ""
    calibrate_cmd._corun_readings_note([0.092, 0.004])
    err = capsys.readouterr().err
    assert err.startswith("note: the co-run figures were read 2 times") and "9.2%, 0.4%" in err
    calibrate_cmd._corun_readings_note([0.2, None, 0.11])
    err = capsys.readouterr().err
    assert err.startswith("warning:") and "20.0%, ?, 11.0%" in err and "calibrate again" in err


def test_calibrate_measures_cold_costs_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[CalibrationConfig | None] = []

    def fake_run(quick: bool, out: Path, progress: bool, config: CalibrationConfig | None) -> Profile:
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(run_mod, "run_calibration", fake_run)
    parser = argparse.ArgumentParser(prog="schedlab")
    calibrate_cmd.register(parser.add_subparsers(dest="command"))
    assert run_mod.quick_config().cold_per_class == 4 and run_mod.full_config().cold_per_class == 8
    for argv, per_class in ((["--quick", "--no-cold"], 0), (["--no-cold", "--threads", "1"], 0),
                            (["--quick", "--cold"], None), (["--threads", "1"], 8)):
        args = parser.parse_args(["calibrate", *argv, "--out", "/tmp/schedlab-test-never-written.json"])
        with pytest.raises(SystemExit):
            args.handler(args)
        config = seen[-1]
        assert (config.cold_per_class if config is not None else None) == per_class  # None: the preset's
    assert seen[-1] is not None and seen[-1].threads == (1,) and seen[-1].quick is False
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--cold", "--no-cold"])
    for flag in ("--cold", "--no-cold"):
        for other in ("--links", "--cuda"):
            args = parser.parse_args(["calibrate", flag, other])
            with pytest.raises(SchedlabError, match=f"{flag} goes with the CPU calibration"):
                args.handler(args)
    assert run_mod.without_cold(run_mod.quick_config()).cold_per_class == 0


def test_calibrate_command_defaults_to_the_profile_simulate_reads() -> None:
    parser = argparse.ArgumentParser(prog="schedlab")
    calibrate_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate"])
    assert args.out == DEFAULT_PROFILE_PATH
    assert args.quick is False and args.json is False


def test_with_trace_of_a_real_executor_step(tiny_profile: tuple[Profile, Path]) -> None:
    from schedlab.exec import run_steps
    from schedlab.plan import Plan

    profile, _ = tiny_profile
    c = capture(load_workload("mlp", "tiny"), "sgd")
    result = run_steps(c.graph, c.input_values, Plan(slots=1, threads=1), steps=3, warmup=1)
    traced = profile.with_trace(result.trace, c.graph)
    assert traced.meta["traces"][0]["slots"] == 1
    assert traced.meta["traces"][0]["events_used"] > 0
    from schedlab.calibrate.context import first_uses
    from schedlab.calibrate.trace_cal import robust_mean

    first = first_uses(c.graph)
    bound = traced.for_graph(c.graph)
    # Each kernel is its typical event scaled by the trace's step factor (what a median step
    # spends in its kernels over their typical times' sum), recorded with the trace.
    factor = traced.meta["traces"][0]["step_factor"]
    assert 0.5 <= factor <= 2.0
    checked = 0
    for op in c.graph.ops:
        if op.is_view or sum(signature(o) == signature(op) for o in c.graph.ops) != 1:
            continue
        durs_ns = [float(e.dur_ns) for e in result.trace.events if e.op == op.id]  # robust_mean takes ns
        if op.id in first:
            # The table keeps the kernel without the first-use extra; bound to its graph,
            # the Profile adds it back.
            extra = profile.context.first_use(op.op_class)
            assert traced.kernel_us(op, 1) == pytest.approx(
                max(0.0, robust_mean([d - extra * 1e3 for d in durs_ns]) / 1e3 - profile.dispatch.op_us) * factor,
                abs=1e-3, rel=1e-3)
            assert bound.kernel_us(op, 1) == pytest.approx(max(0.0, traced.kernel_us(op, 1) + extra))
        else:
            expected = max(0.0, robust_mean(durs_ns) / 1e3 - profile.dispatch.op_us) * factor
            assert traced.kernel_us(op, 1) == pytest.approx(expected, abs=1e-3, rel=1e-3)
            assert bound.kernel_us(op, 1) == traced.kernel_us(op, 1)
        checked += 1
    assert checked >= 3


def test_the_cold_probe_is_replayed_past_its_first_steps_fresh_pages() -> None:
    """The probe's 8-12 MiB outputs took 1,300-1,760 us in the first timed steps after one
    untimed step and 74-215 us after: the share it is fitted on skips them."""
    from schedlab.calibrate.coverage import COLD_PROBE

    assert run_mod.replay_steps(f"coverage:{COLD_PROBE}/square/sgd", 3) == (run_mod.COLD_PROBE_STEPS, run_mod.COLD_PROBE_WARMUP)
    assert run_mod.replay_steps(f"coverage:{COLD_PROBE}/square/sgd", 20) == (20, run_mod.COLD_PROBE_WARMUP)
    assert run_mod.replay_steps("coverage:convs/square/sgd", 3) == (3, 1) == run_mod.replay_steps("mlp/tiny/sgd", 3)
    assert run_mod.COLD_PROBE_WARMUP > 1 and run_mod.COLD_PROBE_STEPS > 3
