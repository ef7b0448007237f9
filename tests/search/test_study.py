"""The trial budget: exact counts with several workers, resume, stale trials, infeasible plans."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import optuna
from optuna.trial import TrialState

from schedlab.machine import Device, Machine
from schedlab.search.objective import Evaluator
from schedlab.search.space import SearchSpace
from schedlab.search.study import create_study, fail_stale_trials, load_study, make_sampler, open_storage, optimize
from schedlab.sim.testing import cpu_machine, random_cost
from tests.conftest import captured_workload


def _setup(tmp_path: Path, machine: Machine | None = None):  # type: ignore[no-untyped-def]
    graph = captured_workload("mlp")[1].graph  # type: ignore[attr-defined]
    machine = machine or cpu_machine(2)
    cost = random_cost(0)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    create_study(storage, "s", ("time",))
    return graph, machine, cost, storage


def _study(storage, seed: int = 0) -> optuna.Study:  # type: ignore[no-untyped-def]
    return load_study(storage, "s", make_sampler(("time",), seed))


def _complete(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def test_optimize_reaches_the_target_and_resumes(tmp_path: Path) -> None:
    graph, machine, cost, storage = _setup(tmp_path)
    space = SearchSpace("all", graph, machine, cost)
    ev = Evaluator(graph, machine, cost)
    assert optimize(_study(storage), storage, space, ev, ("time",), 12) == 12
    first = {t.number: (t.params, t.values) for t in _complete(_study(storage))}
    assert len(first) == 12
    assert optimize(_study(storage, 1), storage, space, ev, ("time",), 20) == 8  # only the remainder
    assert optimize(_study(storage, 2), storage, space, ev, ("time",), 20) == 0
    after = {t.number: (t.params, t.values) for t in _complete(_study(storage))}
    assert len(after) == 20 and all(after[n] == v for n, v in first.items())
    t = _complete(_study(storage))[0]
    assert {"plan", "strategy", "peak_memory_bytes", "space", "worker"} <= set(t.user_attrs)
    assert t.user_attrs["strategy"] == "optuna" and t.user_attrs["peak_memory_bytes"] > 0


def test_concurrent_workers_never_exceed_the_target(tmp_path: Path) -> None:
    graph, machine, cost, storage = _setup(tmp_path)
    space = SearchSpace("concurrency", graph, machine, cost)
    errors: list[BaseException] = []
    done: list[int] = []

    def work(seed: int) -> None:
        try:
            st = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
            done.append(optimize(_study(st, seed), st, space, Evaluator(graph, machine, cost), ("time",), 30))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(done) == 30
    study = _study(storage)
    assert len(_complete(study)) == 30
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    surplus = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("surplus")]
    assert all(t.state is TrialState.FAIL for t in surplus)


def test_a_dead_workers_running_trial_is_failed_and_not_counted(tmp_path: Path) -> None:
    graph, machine, cost, storage = _setup(tmp_path)
    study = _study(storage)
    dead = 2**22 + 12345  # above the default pid_max: no such process
    assert not os.path.exists(f"/proc/{dead}")
    trial = study.ask()
    trial.set_user_attr("strategy", "optuna")
    trial.set_user_attr("space", "all")
    import socket

    trial.set_user_attr("worker", f"{socket.gethostname()}:{dead}")
    assert fail_stale_trials(study, storage) == 1
    assert study.get_trials(deepcopy=False)[0].state is TrialState.FAIL
    space = SearchSpace("all", graph, machine, cost)
    assert optimize(study, storage, space, Evaluator(graph, machine, cost), ("time",), 5) == 5


def test_plans_that_do_not_fit_are_pruned_with_the_reason(tmp_path: Path) -> None:
    small = Machine(name="small", devices=(Device(id="cpu0", kind="cpu", cores=2, memory_bytes=1024),))
    graph, machine, cost, storage = _setup(tmp_path, small)
    space = SearchSpace("concurrency", graph, machine, cost)
    n = optimize(_study(storage), storage, space, Evaluator(graph, machine, cost), ("time",), 5, max_attempts=6)
    assert n == 0
    trials = _study(storage).get_trials(deepcopy=False)
    assert len(trials) == 6 and all(t.state is TrialState.PRUNED for t in trials)
    assert all("out of memory" in t.user_attrs["fail_reason"] for t in trials)


def test_two_objectives_use_nsga2(tmp_path: Path) -> None:
    graph = captured_workload("mlp")[1].graph  # type: ignore[attr-defined]
    machine, cost = cpu_machine(2), random_cost(0)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    create_study(storage, "m", ("time", "memory"))
    study = load_study(storage, "m", make_sampler(("time", "memory"), 0))
    assert isinstance(make_sampler(("time", "memory"), 0), optuna.samplers.NSGAIISampler)
    space = SearchSpace("all", graph, machine, cost)
    optimize(study, storage, space, Evaluator(graph, machine, cost), ("time", "memory"), 10)
    trials = _complete(study)
    assert len(trials) == 10 and all(len(t.values) == 2 and t.values[1] == t.user_attrs["peak_memory_bytes"] for t in trials)
