"""A placement search on this host's local ranks, run for real.

`validate_placement_run(run_dir)` (what `schedlab validate RUN_DIR` does for a placement
search): the best plan of every strategy in the study, on the local ranks it was searched
for, beside the two one-process baselines on the whole host, through the machinery of
`search.validate_plans` (numerics against eager PyTorch, then rounds of timed steps,
round-robin). results.json and traces/ keep the run directory's format (search/RUN_DIR.md): each
candidate names its strategy (``strategies``: every strategy whose best it is) with its
prediction, measurement and spread, and ``error_pct`` = (predicted - measured) / measured.

A pipeline-schedule search (``--space schedule``, one strategy) is validated the same way,
with its `top` distinct fastest plans instead of one per strategy, and ``--space all``
(placements and pipelines) with both; each plan runs on the step its micro-batch count
needs (`plan_step`).

`measured_reward(...)`: the RL strategy's ``--reward measured``: a plan's median step time
on the real ranks (no numerics check: the validation checks the winners).

A placement searched on a preset (a machine this host is not) cannot be run here: that is
one clear error.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from schedlab.errors import SchedlabError
from schedlab.io import staging_dir, swap_dir
from schedlab.machine import Machine, detect_host, host_ranks
from schedlab.plan import Plan, resolve
from schedlab.search.run_dir import (
    RESULTS_SCHEMA,
    RESULTS_VERSION,
    RunConfig,
    RunPaths,
    read_run,
    storage_url,
    write_results,
)
from schedlab.trace import library_versions

DEFAULT_MEASURE_STEPS = 3


def is_placement_run(config: RunConfig) -> bool:
    return config.space == "placement" or len(config.machine.get("devices", [])) > 1


def rank_machine(config: RunConfig, profile: Any) -> Machine:
    """The local ranks a placement run was searched for, with the Profile's fitted links."""
    from schedlab.calibrate.links import apply_link_fit

    if config.machine_spec != "host" or not config.devices:
        raise SchedlabError(
            f"this search ran on machine {config.machine_spec!r} (simulated): its plans cannot run on this host. "
            "Search with --devices N (this host's local ranks) to validate on real ranks"
        )
    return apply_link_fit(host_ranks(config.devices), profile)


def strategy_winners(study: optuna.Study) -> list[tuple[Plan, float, int, list[str]]]:
    """(plan, predicted step s, trial, strategies) of each strategy's fastest complete trial,
    one entry per distinct plan, fastest first."""
    best: dict[str, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        name = str(t.user_attrs.get("strategy", ""))
        if t.values and t.user_attrs.get("plan") and (name not in best or t.values[0] < best[name].values[0]):
            best[name] = t
    by_plan: dict[str, tuple[Plan, float, int, list[str]]] = {}
    for name, t in sorted(best.items(), key=lambda kv: kv[1].values[0]):
        plan = Plan.from_json(t.user_attrs["plan"])
        if plan.hash in by_plan:
            by_plan[plan.hash][3].append(name)
        else:
            by_plan[plan.hash] = (plan, float(t.values[0]), t.number, [name])
    return list(by_plan.values())


def top_plans(study: optuna.Study, top: int) -> list[tuple[Plan, float, int, list[str]]]:
    """(plan, predicted step s, trial, [strategy]) of the `top` fastest distinct plans among
    the study's complete trials, fastest first."""
    trials = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if t.values and t.user_attrs.get("plan")), key=lambda t: (t.values[0], t.number))
    out: dict[str, tuple[Plan, float, int, list[str]]] = {}
    for t in trials:
        plan = Plan.from_json(t.user_attrs["plan"])
        if plan.hash not in out:
            out[plan.hash] = (plan, float(t.values[0]), t.number, [str(t.user_attrs.get("strategy", ""))])
        if len(out) == top:
            break
    return list(out.values())


def plans_to_validate(study: optuna.Study, space: str, top: int) -> list[tuple[Plan, float, int, list[str]]]:
    """What `validate_placement_run` runs: a schedule search's `top` fastest distinct plans;
    ``all`` (placements and pipelines): those and every strategy's best, fastest first; a
    placement search: every strategy's best."""
    if space == "schedule":
        return top_plans(study, top)
    winners = strategy_winners(study)
    if space != "all":
        return winners
    have = {plan.hash for plan, *_ in winners}
    more = [w for w in top_plans(study, top) if w[0].hash not in have]
    return sorted([*winners, *more], key=lambda w: (w[1], w[2]))


def plan_step(config: RunConfig, micro_batches: int = 1, replicas: int = 1) -> Any:
    """The run's model captured for a plan of `micro_batches` and `replicas`
    (`microbatch.pipeline_step`): one step (`data_parallel.PlanStep`), or the full step and
    one replica's micro-batch step."""
    from schedlab.capture import capture
    from schedlab.microbatch import pipeline_step
    from schedlab.workloads import load_workload

    workload = load_workload(config.model, config.size, seed=config.seed)
    return pipeline_step(workload, micro_batches, lambda w: capture(w, config.optimizer), replicas)


def validate_placement_run(
    run_dir: Path, *, repeats: int, steps: int, warmup: int | None, timeout_s: float, progress: bool = True,
    top: int = 3, recalibrate: bool = True,
) -> dict[str, Any]:
    """Run every strategy's winner (a schedule search: its `top` plans) and the baselines on
    this host; writes results.json. With `recalibrate`, the search's calibration steps run
    again at the start of each round and predict every plan once more (`calibrate.round_cal`)."""
    from schedlab.calibrate.profile import Profile
    from schedlab.search.baselines import baseline_plans
    from schedlab.search.study import open_storage
    from schedlab.search.validate_plans import PlanCase, validate_plans
    from schedlab.sim.cost import op_cost_us

    config = read_run(run_dir)
    profile = Profile.load(config.profile, check_machine=False)
    machine = rank_machine(config, profile)
    study = optuna.load_study(storage=open_storage(storage_url(run_dir, config)), study_name=config.study)
    winners = plans_to_validate(study, config.space, top)
    if not winners:
        raise SchedlabError(f"{run_dir}: the study holds no complete trial to validate")
    steps_by_shape: dict[tuple[int, int], Any] = {}

    def step_for(micro_batches: int, replicas: int = 1) -> Any:
        if (replicas, micro_batches) not in steps_by_shape:
            steps_by_shape[replicas, micro_batches] = plan_step(config, micro_batches, replicas)
        return steps_by_shape[replicas, micro_batches]

    weights = op_cost_us(profile)
    cases: list[PlanCase] = []
    for plan, _, trial, names in winners:
        label = f"trial {trial} ({', '.join(names)})"
        s = step_for(plan.micro_batches, plan.replicas)
        cases.append(PlanCase(label, plan, machine, s, resolve(s.graph, plan, machine, op_cost_us=weights)))
    host = detect_host()
    step = step_for(1)
    for name, plan in baseline_plans(host).items():
        cases.append(PlanCase(name, plan, host, step, resolve(step.graph, plan, host, op_cost_us=weights), baseline=name))
    calibration = None
    if recalibrate:
        from schedlab.calibrate.round_cal import RoundCalibration
        from schedlab.search.placement.space import calibration_order

        shapes = sorted({(p.replicas, p.micro_batches) for p, *_ in winners if p.pipelined} - {(1, 1)})
        calibration = RoundCalibration(step.full.graph, step.full.input_values, host,
                                       micro_steps=lambda r, m: step_for(m, r), shapes=shapes,
                                       one_thread_order=calibration_order(config.space, len(machine.devices)),
                                       weights=weights)
    measured: list[Any] = []
    raw = validate_plans(cases, profile=profile, repeats=repeats, steps=steps, warmup=warmup, timeout_s=timeout_s,
                         workload=config.model, progress=progress, measured_out=measured, calibration=calibration)
    results = _as_run_results(config, raw, winners)
    paths = RunPaths(run_dir)
    with staging_dir(paths.traces) as staged:
        # traces/ and results.json are replaced together, as `search.validate` does
        results["traces"] = _write_traces(staged, paths, cases, measured, results, profile)
        swap_dir(staged, paths.traces, then=lambda: write_results(run_dir, results))
    return results


def _write_traces(out_dir: Path, paths: RunPaths, cases: list[Any], measured: list[Any], results: dict[str, Any],
                  profile: Any) -> dict[str, str]:
    """best.exec.json (the fastest candidate's last timed run), best.sim.json (its plan
    simulated with the searched profile) and baseline.exec.json (the faster baseline's),
    written into `out_dir`; where each will be, under `paths.traces`. Candidates are in the
    order of `cases` (`_as_run_results`)."""
    from schedlab.search.validate import stage_trace
    from schedlab.search.validate_plans import simulated_trace

    out: dict[str, str] = {}

    def save(trace: Any, final: Path, key: str) -> None:
        stage_trace(trace, out_dir, final, key, out)

    candidates = results["candidates"]
    if len(candidates) != len(cases) or len(measured) != len(cases):  # pragma: no cover - built together above
        raise SchedlabError(f"{len(candidates)} candidates and {len(measured)} measurements for {len(cases)} plans; "
                            "this is a schedlab bug")
    best = results["best"]
    if best is not None:
        save(measured[best].trace, paths.best_exec, "best_exec")
        save(simulated_trace(cases[best], profile), paths.best_sim, "best_sim")
    timed = [i for i, c in enumerate(candidates) if c["baseline"] is not None and c["measured_step_time_s"]]
    if timed:
        save(measured[min(timed, key=lambda i: candidates[i]["measured_step_time_s"])].trace, paths.baseline_exec,
             "baseline_exec")
    return out


def _as_run_results(config: RunConfig, raw: dict[str, Any], winners: list[tuple[Plan, float, int, list[str]]]) -> dict[str, Any]:
    keys = ("plan", "ranks", "devices", "predicted_step_time_s", "measured_step_time_s", "measured_step_times_s",
            "spread_s", "error_pct", "recalibrated_predicted_step_time_s", "recalibrated_error_pct", "max_rel_diff",
            "numeric_ok", "error", "speedup", "cost_sources")
    candidates: list[dict[str, Any]] = []
    for (_, _, trial, names), e in zip(winners, raw["plans"], strict=True):
        candidates.append({"trial": trial, "strategy": names[0], "strategies": names, "baseline": None,
                           **{k: e.get(k) for k in keys}})
    baselines = {name: {k: b.get(k) for k in keys} for name, b in raw["baselines"].items()}
    for name, b in baselines.items():
        candidates.append({"trial": None, "strategy": "", "strategies": [], "baseline": name, **b})
    usable = [i for i, c in enumerate(candidates) if c["measured_step_time_s"] and not c["error"]]
    best = min(usable, key=lambda i: (candidates[i]["measured_step_time_s"], candidates[i]["baseline"] is None, i),
               default=None)
    return {
        "schema": RESULTS_SCHEMA,
        "version": RESULTS_VERSION,
        "model": config.model,
        "size": config.size,
        "optimizer": config.optimizer,
        "space": config.space,  # placement, schedule or all
        "candidates": candidates,
        "baselines": baselines,
        "best": best,
        "searched_plan_won": best is not None and candidates[best]["baseline"] is None,
        "repeats": raw["repeats"],
        "steps_per_repeat": raw["steps_per_repeat"],
        "warmup": raw["warmup"],
        "warmup_ranks": raw["warmup_ranks"],
        "recalibration": raw["recalibration"],
        "machine": raw["machine"],
        "rank_machine": config.machine,
        "versions": library_versions(),
        "created_unix_s": time.time(),
        "wall_s": raw["wall_s"],
        "notes": raw["notes"],
    }


def measured_reward(
    config: RunConfig, machine: Machine, profile: Any, *, steps: int = DEFAULT_MEASURE_STEPS,
    warmup: int | None = None, timeout_s: float,
) -> Callable[[Plan], float]:
    """A plan's median measured step time (s) on `machine`'s local ranks (see the module docstring)."""
    from schedlab.exec.launch import warmup_for
    from schedlab.search.validate_plans import PlanCase, _LocalRunner, _RankRunner
    from schedlab.sim.cost import op_cost_us

    step = plan_step(config)
    weights = op_cost_us(profile)

    def measure(plan: Plan) -> float:
        resolved = resolve(step.graph, plan, machine, op_cost_us=weights)
        case = PlanCase(plan.name or "rl", plan, machine, step, resolved)
        runner = _RankRunner(case, config.model, timeout_s) if resolved.multi_device else _LocalRunner(case, config.model)
        return float(statistics.median(runner.time(steps, warmup_for(resolved.multi_device, warmup)).step_times_s))

    return measure
