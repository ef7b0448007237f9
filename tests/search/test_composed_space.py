"""``--space all`` on several devices (`search.composed_space`): placements and pipelines in
one study, each with every device's concurrency."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from schedlab.cli import main
from schedlab.cli.common import plan_step_of
from schedlab.graph import Graph
from schedlab.machine import host_ranks, load_machine
from schedlab.plan import Plan, place, resolve
from schedlab.search.composed_space import PIPELINE, PLACEMENT, ComposedSpace
from schedlab.search.placement.problem import build_problem
from schedlab.search.placement.space import PlacementSpace, max_slots
from schedlab.search.schedule_space import MicroBatchEvaluator
from schedlab.search.space import make_space
from tests.search.conftest import fake_profile


def graph_of(micro_batches: int, replicas: int = 1, model: str = "mlp") -> Graph:
    return plan_step_of(model, "tiny", "sgd", 0, replicas=replicas, cache=True, micro_batches=micro_batches).graph


def test_trials_pick_placements_and_pipelines_each_with_its_devices_concurrency() -> None:
    machine = load_machine("cpu-2gpu", None)
    space = make_space("all", graph_of(1), machine, fake_profile())  # type: ignore[arg-type]
    assert isinstance(space, ComposedSpace) and space.choices == (PLACEMENT, PIPELINE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    ev = MicroBatchEvaluator(graph_of, machine, fake_profile())  # type: ignore[arg-type]
    kinds = set()
    for _ in range(24):
        trial = study.ask()
        plan = space.suggest(trial)
        kind = trial.params["parallelism"]
        kinds.add(kind)
        graph = graph_of(plan.micro_batches)
        if kind == PIPELINE:
            assert plan.schedule is not None and plan.pipeline_devices == tuple(d.id for d in machine.devices)
            assert not any(k.startswith("device.") for k in trial.params)
            used = set(plan.pipeline_devices)
        else:
            assert plan.schedule is None and plan.micro_batches == 1
            used = set(place(graph, plan, machine))
        assert set(plan.device_slots) <= used and set(plan.device_slots) == {
            k.removeprefix("slots.") for k in trial.params if k.startswith("slots.")} & used
        assert all(1 <= k <= max_slots(machine.device(d)) for d, k in plan.device_slots.items())
        resolved = resolve(graph, plan, machine)
        assert set(resolved.device) <= used
        e = ev.evaluate(plan)
        assert e.ok, e.error
        study.tell(trial, e.step_time_s)
    assert kinds == {PLACEMENT, PIPELINE}


def test_a_pipelines_slots_and_threads_reach_its_resolved_plan() -> None:
    machine = host_ranks(2)
    space = make_space("all", graph_of(1), machine, fake_profile())  # type: ignore[arg-type]
    params = {"parallelism": PIPELINE, "schedule": "1f1b", "micro_batches": 2, "stage_cuts": "equal"}
    params |= {f"slots.{d.id}": 1 for d in machine.devices}
    plan = space.suggest(optuna.trial.FixedTrial(params))
    assert plan.device_slots == {"cpu0": 1, "cpu1": 1} and plan.micro_batches == 2
    assert resolve(graph_of(2), plan, machine).device_slots == {"cpu0": 1, "cpu1": 1}


def test_a_model_too_small_to_pipeline_is_searched_over_placements_only() -> None:
    machine = load_machine("cpu-2gpu", None)
    graph = graph_of(1)
    placed = PlacementSpace("all", build_problem(graph, machine, fake_profile()), fake_profile())  # type: ignore[arg-type]
    space = ComposedSpace(placed, None, machine)
    assert space.choices == (PLACEMENT,) and space.micro_batches == (1,)
    plan = space.suggest(optuna.create_study().ask())
    assert isinstance(plan, Plan) and plan.schedule is None
    with pytest.raises(Exception, match="'all'"):
        ComposedSpace(PlacementSpace("placement", placed.problem, fake_profile()), None, machine)  # type: ignore[arg-type]


def test_search_all_on_two_ranks_then_validate_both_kinds(capsys, tmp_path: Path, profile_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "all"
    argv = ["search", "mlp", "--size", "tiny", "--run-dir", str(d), "--profile", str(profile_path), "--no-progress",
            "--no-trace-calibration", "--devices", "2", "--trials", "16", "--json"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["space"] == "all" and s["n_trials"] == 16
    study = optuna.load_study(storage=f"sqlite:///{d / 'study.db'}", study_name="mlp-tiny-sgd")
    kinds = {t.params["parallelism"] for t in study.trials if t.state.name == "COMPLETE"}
    assert kinds == {PLACEMENT, PIPELINE}
    assert any((d / "graphs").glob("m*.json"))  # pipeline trials of M > 1 kept their graphs
    rc = main(["validate", str(d), "--top", "2", "--repeats", "1", "--steps", "1", "--no-progress", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0
    searched = [c for c in r["candidates"] if c["baseline"] is None]
    assert 1 <= len(searched) <= 2 and all(c["ranks"] in (1, 2) for c in searched), [c["ranks"] for c in searched]
    for c in r["candidates"]:
        assert c["error"] is None and c["numeric_ok"], c


def test_calibration_times_micro_batch_steps_only_where_the_space_pipelines() -> None:
    from schedlab.errors import SchedlabError
    from schedlab.search.schedule_space import searched_shapes

    graph, cost = graph_of(1), fake_profile()
    assert searched_shapes("all", graph, host_ranks(2), cost)[1:]  # mlp/tiny splits its batch
    assert searched_shapes("all", graph, host_ranks(1), cost) == ()  # one device: no pipeline
    assert searched_shapes("placement", graph, host_ranks(2), cost) == ()
    four = load_machine("dgx-8gpu", 4)  # mlp/tiny's 3 layers cannot fill a stage on each of 4 devices
    assert searched_shapes("all", graph, four, cost) == ()  # so `all` only places it
    assert make_space("all", graph, four, cost).choices == (PLACEMENT,)  # type: ignore[arg-type, attr-defined]
    with pytest.raises(SchedlabError, match="too few"):
        searched_shapes("schedule", graph, four, cost)  # type: ignore[arg-type]
