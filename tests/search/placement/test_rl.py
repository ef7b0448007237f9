"""RL placement (search.placement.rl): features, learning on synthetic step times with a
known answer, the simulator as the reward, memory and infeasibility penalties, seeding,
and resuming from a checkpoint with nothing lost."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from schedlab.capture import capture
from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import load_machine
from schedlab.search.placement.problem import PlacementProblem, build_problem
from schedlab.search.placement.rl import RLConfig, RLResult, features, train_placer
from schedlab.sim.testing import random_cost
from schedlab.workloads.loader import load_workload


@pytest.fixture(scope="module")
def transformer() -> Graph:
    return capture(load_workload("transformer", size="tiny")).graph


@pytest.fixture(scope="module")
def mlp() -> Graph:
    return capture(load_workload("mlp", size="tiny")).graph


def _problem(graph: Graph, devices: int, split_fbw: bool = False) -> PlacementProblem:
    return build_problem(graph, load_machine("dgx-8gpu", devices), random_cost(0), split_fbw=split_fbw)


def _curve(result: RLResult) -> list[dict[str, Any]]:
    """The curve without wall_s, the one field that varies between identical runs."""
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in result.curve]


def _cuts(gd: list[int]) -> int:
    """Neighbouring atoms on different devices."""
    return sum(a != b for a, b in itertools.pairwise(gd))


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_features_are_normalised_per_atom(transformer: Graph) -> None:
    problem = _problem(transformer, 4, split_fbw=True)
    f = features(problem)
    assert f.dtype == torch.float32 and f.shape[0] == problem.n_groups
    assert bool(torch.isfinite(f).all()) and float(f.min()) >= 0.0 and float(f.max()) <= 1.0 + 1e-6
    mix = f[:, :9]  # share of each atom's time in the top 8 op classes and "other"
    assert torch.allclose(mix.sum(dim=1), torch.ones(problem.n_groups), atol=1e-5)
    kinds = f[:, 9:13]  # F/B/W/OPT shares; with split_fbw every atom is of one kind
    assert sorted(set(kinds.sum(dim=1).round(decimals=5).tolist())) == [1.0]
    assert len({tuple(r) for r in f.tolist()}) == problem.n_groups  # every atom tells itself apart


def test_learns_a_known_optimum(transformer: Graph) -> None:
    """Step time = 1 + atoms off their target device, the first half of the layers on one
    device and the second on the other: the policy itself improves and finds the optimum."""
    problem = _problem(transformer, 2)
    n = problem.n_groups
    target = [a * 2 // n for a in range(n)]

    def step_time_s(gd: list[int]) -> float:
        return 1.0 + sum(d != t for d, t in zip(gd, target))

    result = train_placer(problem, step_time_s, RLConfig(iterations=40, samples=16, lr=0.01, entropy=0.05, seed=0))
    assert len(result.curve) == 40 and [r["iteration"] for r in result.curve] == list(range(1, 41))
    assert result.step_time_s == step_time_s(result.group_device)
    assert result.group_device == target and result.step_time_s == 1.0
    first, last = result.curve[:5], result.curve[-5:]
    assert _mean(last, "mean_step_time_s") < 0.6 * _mean(first, "mean_step_time_s")  # the policy, not luck
    assert result.curve[-1]["entropy"] < result.curve[0]["entropy"]
    assert result.evaluations <= 40 * 16


def test_communication_heavy_puts_everything_on_one_device(transformer: Graph) -> None:
    problem = _problem(transformer, 4, split_fbw=True)

    def step_time_s(gd: list[int]) -> float:  # every neighbour apart costs a transfer
        return 1.0 + _cuts(gd)

    result = train_placer(problem, step_time_s, RLConfig(iterations=40, samples=8, lr=0.01, entropy=0.05, seed=0))
    assert len(set(result.group_device)) == 1 and result.step_time_s == 1.0
    assert result.curve[-1]["mean_step_time_s"] < 0.5 * result.curve[0]["mean_step_time_s"]


def test_simulator_reward(transformer: Graph) -> None:
    from schedlab.search.objective import Evaluator

    problem = _problem(transformer, 4)
    machine = problem.machine
    ev = Evaluator(transformer, machine, random_cost(0))
    calls: list[tuple[tuple[int, ...], float]] = []

    def step_time_s(gd: list[int]) -> float:
        t = ev.evaluate(problem.to_plan(gd)).step_time_s
        calls.append((tuple(gd), t))
        return t

    result = train_placer(problem, step_time_s, RLConfig(iterations=3, samples=4, seed=1))
    assert math.isfinite(result.step_time_s)
    assert result.step_time_s == ev.evaluate(problem.to_plan(result.group_device)).step_time_s
    assert result.step_time_s <= result.curve[0]["mean_step_time_s"]
    assert result.step_time_s == result.curve[-1]["best_step_time_s"] == min(t for _, t in calls)
    assert result.evaluations == len(calls) == len({gd for gd, _ in calls})  # one call per placement


def test_same_seed_same_result_and_global_state_untouched(mlp: Graph) -> None:
    problem = _problem(mlp, 4)

    def step_time_s(gd: list[int]) -> float:
        return 1.0 + len(set(gd)) + 0.1 * gd[0]

    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    a = train_placer(problem, step_time_s, RLConfig(iterations=8, seed=3))
    assert torch.equal(rng, torch.get_rng_state()) and torch.get_num_threads() == threads
    b = train_placer(problem, step_time_s, RLConfig(iterations=8, seed=3))
    c = train_placer(problem, step_time_s, RLConfig(iterations=8, seed=4))
    assert _curve(a) == _curve(b) and a.group_device == b.group_device and a.evaluations == b.evaluations
    assert _curve(a) != _curve(c)


def test_resume_ends_as_an_uninterrupted_run(transformer: Graph, tmp_path: Path) -> None:
    problem = _problem(transformer, 4, split_fbw=True)
    calls: list[tuple[int, ...]] = []

    def step_time_s(gd: list[int]) -> float:
        calls.append(tuple(gd))
        return 1.0 + _cuts(gd) + 0.5 * sum(d == 3 for d in gd)

    config = RLConfig(iterations=8, samples=6, seed=2)
    whole = train_placer(problem, step_time_s, config)
    whole_calls = list(calls)

    class Killed(Exception):
        pass

    def kill_after_4(done: int, total: int) -> None:
        assert total == 8
        if done == 4:
            raise Killed

    calls.clear()
    ckpt = tmp_path / "rl" / "checkpoint.pt"
    with pytest.raises(Killed):
        train_placer(problem, step_time_s, config, checkpoint=ckpt, progress=kill_after_4)
    assert ckpt.exists() and list(ckpt.parent.iterdir()) == [ckpt]  # no temp file left beside it
    seen: list[tuple[int, int]] = []
    resumed = train_placer(problem, step_time_s, config, checkpoint=ckpt, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(i, 8) for i in range(4, 9)]
    assert _curve(resumed) == _curve(whole)
    assert resumed.group_device == whole.group_device and resumed.step_time_s == whole.step_time_s
    assert resumed.evaluations == whole.evaluations
    assert calls == whole_calls  # the reward cache came back: no placement evaluated twice
    assert [r["wall_s"] for r in resumed.curve] == sorted(r["wall_s"] for r in resumed.curve)

    again = train_placer(problem, step_time_s, config, checkpoint=ckpt)  # finished: nothing more to do
    assert _curve(again) == _curve(whole) and calls == whole_calls
    with pytest.raises(SchedlabError, match="another training"):
        train_placer(problem, step_time_s, dataclasses.replace(config, lr=0.02), checkpoint=ckpt)
    longer = train_placer(problem, step_time_s, dataclasses.replace(config, iterations=10), checkpoint=ckpt)
    assert len(longer.curve) == 10 and _curve(longer)[:8] == _curve(whole)


def test_placements_over_memory_are_penalised_not_run(transformer: Graph) -> None:
    problem = _problem(transformer, 4, split_fbw=True)
    total = sum(problem.group_mem_bytes)
    cap = max(max(problem.group_mem_bytes), math.ceil(0.4 * total))  # needs at least three devices
    small = dataclasses.replace(problem, capacity_bytes=(cap,) * problem.n_devices)

    def step_time_s(gd: list[int]) -> float:  # prefers few devices, which do not fit
        assert small.memory_fits(gd), "a placement over memory was run"
        return 1.0 + _cuts(gd)

    result = train_placer(small, step_time_s, RLConfig(iterations=30, seed=0))
    assert small.memory_fits(result.group_device) and math.isfinite(result.step_time_s)
    assert len(set(result.group_device)) >= 3
    assert result.step_time_s == step_time_s(result.group_device)
    assert min(r["feasible_share"] for r in result.curve) < 1.0


def test_memory_penalty_is_below_every_feasible_reward(transformer: Graph) -> None:
    """With one step time T for every placement that fits, a batch's mean reward is
    -sqrt(T) when all fit and below it when some do not."""
    problem = _problem(transformer, 4, split_fbw=True)
    cap = max(max(problem.group_mem_bytes), math.ceil(0.3 * sum(problem.group_mem_bytes)))
    small = dataclasses.replace(problem, capacity_bytes=(cap,) * problem.n_devices)
    result = train_placer(small, lambda gd: 4.0, RLConfig(iterations=30, seed=0))
    assert small.memory_fits(result.group_device) and result.step_time_s == 4.0
    first = next(i for i, r in enumerate(result.curve) if r["feasible_share"] > 0)
    rows = result.curve[first + 1 :]
    assert any(r["feasible_share"] < 1 for r in rows)
    for r in rows:
        assert r["mean_reward"] == -2.0 if r["feasible_share"] == 1 else r["mean_reward"] < -2.0


def test_infeasible_answers_from_the_callback(mlp: Graph) -> None:
    problem = _problem(mlp, 4)

    def step_time_s(gd: list[int]) -> float:
        if gd[0] == 0:
            raise SchedlabError("invalid plan")
        if gd[0] == 1:
            return math.inf
        return 1.0 + len(set(gd))

    result = train_placer(problem, step_time_s, RLConfig(iterations=10, seed=0))
    assert result.group_device[0] in (2, 3) and result.step_time_s == step_time_s(result.group_device)
    assert min(r["feasible_share"] for r in result.curve) < 1.0

    def never(gd: list[int]) -> float:
        raise SchedlabError("out of memory")

    none = train_placer(problem, never, RLConfig(iterations=3, samples=4, seed=0))
    assert none.step_time_s == math.inf and len(none.group_device) == problem.n_groups
    assert all(r["best_step_time_s"] is None and r["mean_step_time_s"] is None and r["feasible_share"] == 0 for r in none.curve)


def test_config_is_checked(mlp: Graph) -> None:
    with pytest.raises(SchedlabError):
        RLConfig(samples=0)
    with pytest.raises(SchedlabError):
        RLConfig(groups=0)
    problem = _problem(mlp, 2)
    result = train_placer(problem, lambda gd: 1.0, RLConfig(groups=8, iterations=2, samples=2))  # more groups than atoms
    assert len(result.group_device) == problem.n_groups and result.step_time_s == 1.0
