"""`--space schedule` (`search.schedule_space`): pipeline plans searched over schedule
family, micro-batches and stage cuts, simulated on each micro-batch count's graph, and
validated on real ranks."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import optuna
import pytest

from schedlab.cli import main
from schedlab.cli.common import plan_step_of
from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import detect_host, host_ranks
from schedlab.plan import resolve
from schedlab.search.schedule_space import (
    FAMILIES,
    MicroBatchEvaluator,
    ScheduleSpace,
    batch_size,
    micro_batch_choices,
)
from schedlab.workloads import load_workload
from tests.search.conftest import fake_profile

TWO = host_ranks(2)


def graph_of(micro_batches: int, replicas: int = 1, model: str = "mlp") -> Graph:
    return plan_step_of(model, "tiny", "sgd", 0, replicas=replicas, cache=True, micro_batches=micro_batches).graph


def test_micro_batch_counts_split_the_batch_evenly() -> None:
    assert micro_batch_choices(32) == (1, 2, 4, 8, 16)
    assert micro_batch_choices(12, limit=6) == (1, 2, 3, 4, 6)
    assert micro_batch_choices(1) == (1,)
    full = graph_of(1)
    assert batch_size(full) == load_workload("mlp", "tiny", seed=0).inputs[0].shape[0]  # read from its user input


def test_every_point_of_the_space_is_a_pipeline_plan_that_resolves() -> None:
    full = graph_of(1)
    space = ScheduleSpace(full, TWO, fake_profile())  # type: ignore[arg-type]
    assert space.families and set(space.families) <= set(FAMILIES)
    assert all(space.stages[f] <= 3 for f in space.families)  # mlp/tiny has 3 layers: zbv's 4 stages do not fit
    assert "zbv" not in space.families and "1f1b" in space.families
    m = max(space.micro_batches)
    graph = graph_of(m)
    assert "tessel" in space.families
    for family in space.families:
        for cuts in ("equal", "balanced"):
            plan = space.plan(family, m, cuts)
            named = family if family != "tessel" else plan.schedule  # Tessel's: the searched actions
            assert (plan.schedule, plan.micro_batches, plan.pipeline_devices) == (named, m, ("cpu0", "cpu1"))
            resolved = resolve(graph, plan, TWO)
            assert set(resolved.device) == {"cpu0", "cpu1"}
    with pytest.raises(SchedlabError, match="unknown stage cuts"):
        space.plan("1f1b", m, "random")


def test_interleaved_schedules_of_more_virtual_stages_are_searched_where_layers_allow() -> None:
    graph = graph_of(1, model="transformer")
    space = ScheduleSpace(graph, TWO, fake_profile())  # type: ignore[arg-type]
    assert {"interleaved:3", "interleaved:4"} <= set(space.families)
    m = max(space.micro_batches)
    for v in (3, 4):
        plan = space.plan(f"interleaved:{v}", m, "balanced")
        assert plan.n_stages == 2 * v and plan.stage_map == "loop"  # V stages on each of the 2 devices
        assert set(resolve(graph_of(m, model="transformer"), plan, TWO).device) == {"cpu0", "cpu1"}
    small = ScheduleSpace(graph_of(1), TWO, fake_profile())  # type: ignore[arg-type]
    assert not {"interleaved:2", "interleaved:3", "interleaved:4"} & set(small.families)  # mlp/tiny: 3 layers


def test_optuna_samples_the_three_choices() -> None:
    space = ScheduleSpace(graph_of(1), TWO, fake_profile())  # type: ignore[arg-type]
    trial = optuna.trial.FixedTrial({"schedule": "gpipe", "micro_batches": 2, "stage_cuts": "balanced"})
    plan = space.suggest(trial)
    assert (plan.schedule, plan.micro_batches, plan.n_stages) == ("gpipe", 2, 2)
    assert isinstance(plan.stages, tuple)  # balanced: the first layer of the second stage


def test_tessel_is_searched_once_per_micro_batches_and_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    import schedlab.search.schedule_space as mod

    calls: list[tuple[int, object]] = []
    real = mod.with_tessel_schedule

    def counted(plan, devices, graph, m, stages, cost, **kw):  # type: ignore[no-untyped-def]
        calls.append((m, stages))
        return real(plan, devices, graph, m, stages, cost, **kw)

    monkeypatch.setattr(mod, "with_tessel_schedule", counted)
    space = ScheduleSpace(graph_of(1), TWO, fake_profile())  # type: ignore[arg-type]
    trial = optuna.trial.FixedTrial({"schedule": "tessel", "micro_batches": 4, "stage_cuts": "balanced"})
    first, again = space.suggest(trial), space.suggest(trial)
    assert first == again and len(calls) == 1
    assert isinstance(first.schedule, tuple) and first.micro_batches == 4
    space.plan("tessel", 2, "balanced")
    assert len(calls) == 2


def test_a_batch_norm_model_is_searched_at_one_micro_batch() -> None:
    bn = plan_step_of("heldout:conv1d-two-branch", "tiny", "sgd", 0, replicas=1, cache=True).graph
    space = ScheduleSpace(bn, TWO, fake_profile())  # type: ignore[arg-type]
    assert space.micro_batches == (1,)
    plan = space.plan("1f1b", 1, "balanced")
    assert set(resolve(bn, plan, TWO).device) == {"cpu0", "cpu1"}


def test_one_device_has_no_pipeline() -> None:
    with pytest.raises(SchedlabError, match="several devices"):
        ScheduleSpace(graph_of(1), detect_host(), fake_profile())  # type: ignore[arg-type]


def test_each_micro_batch_count_is_simulated_on_its_own_graph() -> None:
    asked: list[int] = []

    def graphs(m: int, replicas: int) -> Graph:
        asked.append(m)
        return graph_of(m, replicas)

    space = ScheduleSpace(graph_of(1), TWO, fake_profile())  # type: ignore[arg-type]
    ev = MicroBatchEvaluator(graphs, TWO, fake_profile())  # type: ignore[arg-type]
    two, four = ev.evaluate(space.plan("1f1b", 2, "equal")), ev.evaluate(space.plan("1f1b", 4, "equal"))
    ev.evaluate(space.plan("gpipe", 2, "equal"))
    assert asked == [2, 4]  # one graph per count, asked once
    assert two.ok and four.ok, (two.error, four.error)
    assert two.step_time_s != four.step_time_s  # other graphs, other steps
    again = ev.evaluate(dataclasses.replace(space.plan("1f1b", 2, "equal"), name="later"))
    assert again.step_time_s == two.step_time_s and again.plan.name == "later"  # simulated once, named anew
    assert again.sim_wall_s == two.sim_wall_s


def test_on_four_devices_pipelines_with_replicas_are_searched_each_on_its_own_graph(tmp_path: Path) -> None:
    from schedlab.search.micro_graphs import MicroGraphs

    four = host_ranks(4)

    def step_graph(m: int, replicas: int = 1) -> Graph:
        return plan_step_of("transformer", "tiny", "sgd", 0, replicas=replicas, cache=True, micro_batches=m).graph

    full = step_graph(1)
    space = ScheduleSpace(full, four, fake_profile())  # type: ignore[arg-type]
    assert space.replicas == (1, 2) and (2, 1) in space.shapes  # 2 replicas x 2 stages; the batch splits in 2 only
    assert all(r * m <= 2 for r, m in space.shapes)
    trial = optuna.trial.FixedTrial({"schedule": "1f1b", "replicas": 2, "micro_batches_r2": 1, "stage_cuts": "equal"})
    plan = space.suggest(trial)
    assert (plan.replicas, plan.micro_batches, plan.pipeline_devices, plan.n_stages) == (2, 1, ("cpu0", "cpu1"), 2)
    graphs = MicroGraphs(tmp_path, full, lambda m, r: step_graph(m, r))
    graphs.fill(space.shapes)
    assert (tmp_path / "graphs" / "r2-m1.json").exists() and (tmp_path / "graphs" / "m2.json").exists()
    ev = MicroBatchEvaluator(graphs, four, fake_profile())  # type: ignore[arg-type]
    hybrid, single = ev.evaluate(plan), ev.evaluate(space.plan("1f1b", 1, "equal"))
    assert hybrid.ok and single.ok, (hybrid.error, single.error)
    assert set(resolve(graphs(1, 2), plan, four).device) == {"cpu0", "cpu1", "cpu2", "cpu3"}
    assert hybrid.step_time_s != single.step_time_s  # half the batch per pipeline, and the all-reduces
    for family in space.families:  # every family fits each replica's devices
        assert resolve(graphs(1, 2), space.plan(family, 1, "balanced", replicas=2), four).plan.replicas == 2
    with pytest.raises(SchedlabError, match="3 replicas are not in the space"):
        space.plan("1f1b", 1, "equal", replicas=3)


@pytest.mark.slow
def test_search_and_validate_a_schedule_space_on_two_ranks(capsys, tmp_path: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "sched"
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--space", "schedule", "--devices", "2", "--trials", "6", "--json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["space"] == "schedule" and s["new_trials"] == 6
    assert all(isinstance(b["plan"]["schedule"], list) or b["plan"]["schedule"] in FAMILIES for b in s["best"])
    assert all(b["plan"]["micro_batches"] >= 1 for b in s["best"])
    rc = main(["validate", str(d), "--top", "2", "--repeats", "1", "--steps", "1", "--no-progress", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0
    searched = [c for c in r["candidates"] if c["baseline"] is None]
    assert 1 <= len(searched) <= 2
    for c in r["candidates"]:
        assert c["error"] is None and c["numeric_ok"], c  # each pipeline checked against eager PyTorch
        assert c["measured_step_time_s"] > 0 and c["predicted_step_time_s"] > 0
    assert all(c["ranks"] == 2 for c in searched)
    assert r["space"] == "schedule" and set(r["paths"]) == {"results", "best_exec", "best_sim", "baseline_exec"}


def test_workers_simulate_pipeline_plans_on_the_run_directorys_micro_batch_graphs(
        capsys, tmp_path: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "sched"
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--space", "schedule", "--devices", "2", "--trials", "8", "--workers", "2",
            "--json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["workers"] == 2 and s["n_trials"] == 8
    space = ScheduleSpace(graph_of(1), TWO, fake_profile())  # type: ignore[arg-type]
    for m in space.micro_batches[1:]:  # written before the workers started, as the search captured them
        assert Graph.load(d / "graphs" / f"m{m}.json").hash == graph_of(m).hash
    study = optuna.load_study(storage=f"sqlite:///{d / 'study.db'}", study_name="mlp-tiny-sgd")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    me = f":{os.getpid()}"
    assert done and not any(t.user_attrs["worker"].endswith(me) for t in done)  # worker processes ran them
    assert any(t.params["micro_batches"] > 1 for t in done)


@pytest.mark.parametrize(("extra", "message"), [
    (("--devices", "1"), "several devices"),
    (("--devices", "2", "--strategy", "m-etf"), "searched by optuna"),
])
def test_bad_schedule_searches_get_one_clear_error(capsys, tmp_path: Path, profile_path: Path, extra: tuple[str, ...],  # type: ignore[no-untyped-def]
                                                    message: str) -> None:
    rc = main(["search", "mlp", "--size", "tiny", "--run-dir", str(tmp_path / "r"), "--profile", str(profile_path),
               "--no-progress", "--no-trace-calibration", "--space", "schedule", "--trials", "2", *extra])
    assert rc != 0 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before anything was written
