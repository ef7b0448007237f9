"""One search, end to end: run directory, study, baselines, the strategy's trials, summary.

    summary = run_search(run_dir, config, graph, machine, cost, workers=2)

`config` (a `RunConfig`, written as run.json) says what to search and where the study
lives; the graph is written as graph.json so that workers and reports need no model. The
summary is search.json's content (see search/RUN_DIR.md).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, same_capture
from schedlab.machine import Machine
from schedlab.plan import Plan
from schedlab.search.baselines import baseline_plans
from schedlab.search.micro_graphs import MicroGraphs
from schedlab.search.objective import Evaluator
from schedlab.search.placement.strategies import PLACEMENT_STRATEGIES
from schedlab.search.run_dir import RunConfig, RunPaths, write_run, write_search
from schedlab.search.schedule_space import SCHEDULE_SPACE, MicroBatchEvaluator, need_several_devices, searches_pipelines
from schedlab.search.space import make_space
from schedlab.search.strategies import OPTUNA, strategy_plans
from schedlab.search.study import (
    completed_trials,
    create_study,
    fail_stale_trials,
    make_sampler,
    open_storage,
    optimize,
    plan_hash,
    record_plans,
)
from schedlab.sim.cost import CostModel

if TYPE_CHECKING:
    from schedlab.search.placement.rl import RLConfig

TOP_DISTINCT = 10  # plans listed in search.json "best"
SEED_SPACE = "fixed"  # the "space" of a seed strategy's trials: its own fixed candidates


def sampler_seed(base_seed: int, worker_index: int, n_trials_before: int) -> int:
    """A distinct seed per worker and per resumption (a resumed search does not replay its draws)."""
    return (base_seed * 1_000_003 + worker_index * 7919 + n_trials_before) % (2**31)


def prepare_run_dir(run_dir: Path, config: RunConfig, graph: Graph, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Write run.json and graph.json and create the study (before any worker starts)."""
    paths = RunPaths(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if paths.graph.exists():
        old = Graph.load(paths.graph)
        if not same_capture(graph, old.hash, old.schedule_hash):
            raise SchedlabError(
                f"{run_dir} holds another graph ({old.name}, hash {old.hash}) than this search's "
                f"({graph.name}, hash {graph.hash}); use another --run-dir"
            )
    else:
        graph.save(paths.graph)
    write_run(run_dir, config)
    study = create_study(storage, config.study, config.objectives)
    have = study.user_attrs.get("graph_hash")
    if have is None:
        study.set_user_attr("graph_hash", graph.hash)
        study.set_user_attr("schedule_hash", graph.schedule_hash)
        study.set_user_attr("model", f"{config.model}/{config.size}/{config.optimizer}/seed{config.seed}")
    elif not same_capture(graph, have, study.user_attrs.get("schedule_hash")):
        raise SchedlabError(
            f"study {config.study!r} was searched on another graph (hash {have}, this one {graph.hash}); "
            "use another --study"
        )
    return study


def evaluate_baselines(evaluator: Evaluator) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, plan in baseline_plans(evaluator.machine).items():
        ev = evaluator.evaluate(plan)
        out[name] = {
            "plan": plan.to_json(),
            "predicted_step_time_s": ev.step_time_s if ev.step_time_s != float("inf") else None,
            "predicted_peak_memory_bytes": ev.peak_memory_bytes,
        }
        if ev.error:
            out[name]["error"] = ev.error
    return out


def run_search(
    run_dir: Path,
    config: RunConfig,
    graph: Graph,
    machine: Machine,
    cost: CostModel,
    *,
    workers: int = 1,
    progress: bool = True,
    baseline_machine: Machine | None = None,
    rl: RLOptions | None = None,
    graph_of: Callable[[int, int], Graph] | None = None,
) -> dict[str, Any]:
    """Run the search `config` asks for (resuming whatever the study already has).

    `machine` is what the plans are simulated on; `baseline_machine` (default `machine`)
    what the baselines are: a placement over this host's local ranks is measured against
    the one-process baselines on the whole host. `rl` configures the ``rl`` strategy.
    `graph_of(M)`: the graph a plan of M micro-batches resolves against (pipeline plans of
    ``--space schedule`` and of ``all`` on several devices; default: captured from
    `config`'s model), kept in the run directory (`search.micro_graphs`)."""
    from tqdm import tqdm

    if workers < 1:
        raise SchedlabError("--workers must be >= 1")
    if config.trials < 1:
        raise SchedlabError("--trials must be >= 1")
    if config.space == SCHEDULE_SPACE:  # before anything is written
        check_schedule_search(machine, config.strategy)
    t0 = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(config.storage)
    study = prepare_run_dir(run_dir, config, graph, storage)
    fail_stale_trials(study, storage)
    evaluator: Any = Evaluator(graph, machine, cost)
    base_eval = evaluator if baseline_machine is None else Evaluator(graph, baseline_machine, cost)
    graphs = MicroGraphs(run_dir, graph, graph_of or _capture_of(config))
    if searches_pipelines(config.space, machine):
        evaluator = MicroBatchEvaluator(graphs, machine, cost)
    baselines = evaluate_baselines(base_eval)
    study.set_user_attr("baselines", baselines)

    strategy, space_name = config.strategy, config.space
    key_space = space_name if strategy == OPTUNA else SEED_SPACE
    before = completed_trials(study, strategy, key_space)
    target = config.trials
    bar = tqdm(
        total=target,
        initial=min(before, target),
        desc=f"search {config.model} ({strategy})",
        unit="trial",
        file=sys.stderr,
        disable=None if progress else True,
    )

    def on_trial(complete: int) -> None:
        bar.n = min(complete, target)
        bar.refresh()

    t_loop = time.perf_counter()
    try:
        if strategy == OPTUNA:
            space = make_space(space_name, graph, machine, cost, split_fbw=config.split_fbw)
            if workers == 1:
                n_before = len(study.get_trials(deepcopy=False))
                sampler = make_sampler(config.objectives, sampler_seed(config.seed, 0, n_before))
                optimize(study, storage, space, evaluator, config.objectives, target, sampler=sampler, on_trial=on_trial)
            else:
                from schedlab.search.workers import run_workers

                graphs.fill(getattr(space, "shapes", ()))  # the workers capture nothing
                run_workers(run_dir, workers, study, strategy, space_name, target, on_progress=on_trial)
        else:
            if strategy not in PLACEMENT_STRATEGIES and len(machine.devices) > 1:
                raise SchedlabError(f"strategy {strategy} searches one device; machine {machine.name!r} has several: "
                                    f"use one of {', '.join(PLACEMENT_STRATEGIES)} or optuna")
            if strategy in PLACEMENT_STRATEGIES:
                plans = placement_plans(run_dir, config, graph, machine, cost, evaluator, rl or RLOptions(), bar)
            else:
                plans = strategy_plans(strategy, graph, machine, cost)[:target]
            record_plans(study, plans, evaluator, config.objectives, strategy, key_space)
            bar.total = min(target, len(plans))
            on_trial(completed_trials(study, strategy, key_space))
    finally:
        bar.close()
    loop_s = time.perf_counter() - t_loop
    after = completed_trials(study, strategy, key_space)
    wall_s = time.perf_counter() - t0
    walls = dict(study.user_attrs.get("strategy_wall_s", {}))
    walls[strategy] = float(walls.get(strategy, 0.0)) + loop_s
    study.set_user_attr("strategy_wall_s", walls)
    new = max(0, after - before)
    summary = summarize(study, baselines, config.objectives)
    summary.update(
        {
            "trials_per_s": new / loop_s if loop_s > 0 and new else 0.0,
            "wall_s": wall_s,
            "new_trials": new,
            "strategy": strategy,
            "space": space_name,
            "study": config.study,
            "storage": config.storage,
            "workers": workers,
        }
    )
    write_search(run_dir, summary)
    return summary


def check_schedule_search(machine: Machine, strategy: str) -> None:
    """One clear error for a schedule search that cannot run."""
    need_several_devices(machine)
    if strategy != OPTUNA:
        raise SchedlabError(f"--space schedule is searched by optuna; strategy {strategy} is not a schedule search")


def _capture_of(config: RunConfig) -> Callable[[int, int], Graph]:
    """(M, R) -> one replica's micro-batch step of the run's model, captured (`graph_of`'s default)."""

    def capture(micro_batches: int, replicas: int) -> Graph:
        from schedlab.search.placement.validate import plan_step

        return plan_step(config, micro_batches, replicas).graph  # type: ignore[no-any-return]

    return capture


@dataclass(frozen=True)
class RLOptions:
    """The ``rl`` strategy's training (`search.placement.rl.RLConfig`) and its reward:
    "simulated", or "measured" with `measure(plan) -> step time s` on the real executor."""

    config: RLConfig | None = None  # None: RLConfig()'s defaults
    reward: str = "simulated"
    measure: Callable[[Plan], float] | None = None


def placement_plans(
    run_dir: Path, config: RunConfig, graph: Graph, machine: Machine, cost: CostModel, evaluator: Evaluator,
    rl: RLOptions, bar: Any,
) -> list[Plan]:
    """The plans of placement strategy `config.strategy`: a seed strategy's one plan, or the
    best placement RL training found (training resumes from the run directory)."""
    from schedlab.search.placement.problem import build_problem
    from schedlab.search.placement.strategies import RL, seed_placement_plans

    if config.space not in ("placement", "all") or len(machine.devices) < 2:
        raise SchedlabError(
            f"strategy {config.strategy} places ops on devices: use --space placement with --devices N (N >= 2) "
            "or a --machine of several devices"
        )
    problem = build_problem(graph, machine, cost, split_fbw=config.split_fbw)
    if config.strategy != RL:
        return seed_placement_plans(config.strategy, problem, cost)

    def simulated(plan: Plan) -> float:
        ev = evaluator.evaluate(plan)
        return ev.step_time_s if ev.ok else math.inf

    from schedlab.search.placement.rl import RLConfig
    from schedlab.search.placement.rl_run import run_rl

    rl_config = rl.config or RLConfig()
    step_time = rl.measure if rl.reward == "measured" and rl.measure is not None else simulated
    if rl.reward == "measured" and rl.measure is None:
        raise SchedlabError("--reward measured needs the real executor: search on this host's ranks (--devices N)")
    bar.total = rl_config.iterations
    bar.set_description(f"search {config.model} (rl, {rl.reward} reward)")

    def on_iteration(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    plan, _ = run_rl(run_dir, problem, step_time, rl_config, reward=rl.reward, progress=on_iteration)
    return [plan]


def _row(t: optuna.trial.FrozenTrial, objectives: tuple[str, ...]) -> dict[str, Any]:
    values = t.values or []
    mem_i = objectives.index("memory") if "memory" in objectives else None
    return {
        "trial": t.number,
        "strategy": t.user_attrs.get("strategy", ""),
        "plan": t.user_attrs.get("plan"),
        "predicted_step_time_s": values[objectives.index("time")] if "time" in objectives else None,
        "predicted_peak_memory_bytes": int(values[mem_i]) if mem_i is not None else t.user_attrs.get("peak_memory_bytes"),
    }


def summarize(
    study: optuna.Study, baselines: dict[str, dict[str, Any]], objectives: tuple[str, ...]
) -> dict[str, Any]:
    """search.json's content from what the study holds (every strategy, every run)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE and t.values]
    time_i = objectives.index("time")
    ranked = sorted(complete, key=lambda t: (t.values[time_i], t.number))
    best: list[dict[str, Any]] = []
    seen: set[str] = set()
    for t in ranked:
        h = plan_hash(t)
        if not h or h in seen:
            continue
        seen.add(h)
        best.append(_row(t, objectives))
        if len(best) >= TOP_DISTINCT:
            break
    walls = study.user_attrs.get("strategy_wall_s", {})
    strategies: dict[str, dict[str, Any]] = {}
    for t in ranked:
        name = str(t.user_attrs.get("strategy", "?"))
        s = strategies.setdefault(name, {"best_predicted_step_time_s": t.values[time_i], "trials": 0, "wall_s": walls.get(name)})
        s["trials"] += 1
    summary: dict[str, Any] = {
        "best": best,
        "baselines": baselines,
        "strategies": strategies,
        "n_trials": len(complete),
        "objectives": list(objectives),
    }
    if len(objectives) > 1:
        summary["pareto"] = [_row(t, objectives) for t in sorted(study.best_trials, key=lambda t: t.values[time_i])]
    return summary
