"""Validation: the top searched plans and the baselines, run on the real executor.

The searched plans are the top K of search.json, one per concurrency setting first
(`pick`). For each distinct plan: one step is checked against eager PyTorch (a plan changes speed,
never results), then `repeats` rounds run every plan for `warmup` + `steps` steps, round-
robin (the starting plan rotates each round) so that noise from the machine falls on all
plans alike. The measured step time is the median of every timed step, with [p25, p75]
as its spread; speedup over a baseline is the baseline's median over the plan's.

The baselines are among what validation may pick: `best` is the fastest measured plan
whose numerics match, searched or baseline, and `searched_plan_won` says which. The
candidates list the searched plans first, then the baselines (``"baseline": name``), so
``best`` is always an index into it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.exec.launch import PROCESS_WARMUP
from schedlab.graph import Graph, same_capture
from schedlab.io import staging_dir, swap_dir
from schedlab.machine import Machine, detect_host
from schedlab.order import OpCostUs
from schedlab.plan import Plan, resolve
from schedlab.search.run_dir import (
    RESULTS_SCHEMA,
    RESULTS_VERSION,
    RunConfig,
    RunPaths,
    read_run,
    read_search,
    storage_url,
    write_results,
)
from schedlab.trace import Trace, library_versions

DEFAULT_TOP = 3
DEFAULT_REPEATS = 5
DEFAULT_STEPS = 3
DEFAULT_WARMUP = PROCESS_WARMUP
# The numeric check's verdict in detail, per plan in results.json: the worst tensor, how far
# past (above 1) or within its tolerance it was, its max |diff| and the tolerances used.
NUMERIC_KEYS = ("worst_tensor", "worst_ratio", "worst_abs_diff", "atol", "rtol")


@dataclass(frozen=True)
class Contender:
    """A plan to measure: a searched candidate or a baseline."""

    plan: Plan
    predicted_step_time_s: float | None
    trial: int | None = None
    strategy: str = ""
    baseline: str | None = None  # the baseline's name, for a baseline


@dataclass
class Measurement:
    """What the executor gave for one plan (shared by contenders with the same plan)."""

    plan: Plan
    step_times_s: list[float] = field(default_factory=list)
    max_rel_diff: float | None = None
    numeric_ok: bool = False
    numerics: dict[str, Any] = field(default_factory=dict)  # the numeric check's JSON (exec.NumericCheck)
    error: str | None = None
    trace: Trace | None = None
    executor: Any = None

    @property
    def usable(self) -> bool:
        return self.error is None and self.numeric_ok and bool(self.step_times_s)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.step_times_s) if self.step_times_s else None

    @property
    def spread_s(self) -> list[float] | None:
        xs = self.step_times_s
        if not xs:
            return None
        if len(xs) == 1:
            return [xs[0], xs[0]]
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return [q[0], q[2]]


def _concurrency(plan: dict[str, Any]) -> tuple[Any, ...]:
    return (
        plan.get("slots"),
        plan.get("threads"),
        tuple(sorted(dict(plan.get("class_threads", {})).items())),
        tuple(sorted(dict(plan.get("op_threads", {})).items())),
        plan.get("device"),
        repr(plan.get("placement")),  # where ops run is a setting of its own, not an order
        plan.get("replicas"),
    )


def pick(rows: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """`top` of search.json's best plans (fastest first), one per concurrency setting before any
    second one: plans that differ only in order often measure alike, and a spread of settings
    guards against a simulator that misjudges one of them."""
    first: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for row in rows:
        key = _concurrency(row.get("plan") or {})
        (rest if key in seen else first).append(row)
        seen.add(key)
    chosen = (first + rest)[: max(0, top)]
    return sorted(chosen, key=rows.index)


def contenders_of(search: dict[str, Any], top: int) -> list[Contender]:
    """The `top` searched plans of search.json to validate (see `pick`), then its baselines."""
    out: list[Contender] = []
    for row in pick(list(search.get("best", [])), top):
        out.append(
            Contender(
                plan=Plan.from_json(row["plan"]),
                predicted_step_time_s=row.get("predicted_step_time_s"),
                trial=row.get("trial"),
                strategy=str(row.get("strategy", "")),
            )
        )
    for name, b in search.get("baselines", {}).items():
        out.append(
            Contender(
                plan=Plan.from_json(b["plan"]),
                predicted_step_time_s=b.get("predicted_step_time_s"),
                strategy="baseline",
                baseline=name,
            )
        )
    return out


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def measure(
    graph: Graph,
    module: Any,
    input_values: dict[int, Any],
    plans: list[Plan],
    machine: Machine,
    *,
    repeats: int,
    steps: int,
    warmup: int,
    workload: str = "",
    on_progress: Callable[[], None] | None = None,
    op_cost_us: OpCostUs | None = None,
) -> dict[str, Measurement]:
    """Check and time every plan (keyed by plan hash); see the module docstring.
    `op_cost_us`: the critical-path weights the plans were simulated with (`resolve`)."""
    from schedlab.exec import Executor, check_step, compile_graph, run_steps

    def tick() -> None:
        if on_progress is not None:
            on_progress()

    out: dict[str, Measurement] = {}
    program = compile_graph(graph)  # one compilation serves every plan of the graph
    for plan in plans:
        if plan.hash in out:
            continue
        m = out[plan.hash] = Measurement(plan)
        try:
            ex = Executor(graph, resolve(graph, plan, machine, op_cost_us=op_cost_us), program)
            check = check_step(module, graph, input_values, _one_step(ex))
            m.executor, m.max_rel_diff, m.numeric_ok = ex, check.max_rel_diff, check.ok()
            m.numerics = check.to_json()
            if not check.ok():
                m.error = f"numerics differ from eager PyTorch: {check.describe()}"
        except Exception as e:  # a plan the executor cannot run is a result, not a crash
            m.error = f"cannot run: {_one_line(e)}"
        tick()
    runnable = [m for m in out.values() if m.error is None]
    rounds: dict[str, list[tuple[float, Trace]]] = {}  # plan hash -> (round median, trace)
    for r in range(repeats):
        k = r % len(runnable) if runnable else 0
        for m in runnable[k:] + runnable[:k]:
            if m.error is not None:
                tick()
                continue
            try:
                res = run_steps(
                    graph, input_values, m.plan, machine, steps=steps, warmup=warmup, workload=workload, executor=m.executor
                )
            except Exception as e:
                m.error = f"failed while timing: {_one_line(e)}"
            else:
                m.step_times_s.extend(res.step_times_s)
                rounds.setdefault(m.plan.hash, []).append((res.step_time_s, res.trace))
            tick()
        for _ in range(len(out) - len(runnable)):
            tick()
    for m in out.values():
        m.executor = None
        # Keep the trace of the round closest to the plan's median, not the last one:
        # one stalled round would otherwise draw a Gantt chart unlike the figures.
        if m.plan.hash in rounds and m.step_times_s:
            med = statistics.median(m.step_times_s)
            m.trace = min(rounds[m.plan.hash], key=lambda rt: abs(rt[0] - med))[1]
    return out


def _one_step(ex: Any) -> Callable[[dict[int, Any]], dict[int, Any]]:
    def step(inputs: dict[int, Any]) -> dict[int, Any]:
        outputs: dict[int, Any] = ex.step(inputs)[0]
        return outputs

    return step


def _entry(c: Contender, m: Measurement) -> dict[str, Any]:
    return {
        "trial": c.trial,
        "strategy": c.strategy,
        "baseline": c.baseline,
        "plan": c.plan.to_json(),
        "predicted_step_time_s": c.predicted_step_time_s,
        "measured_step_time_s": m.median_s,
        "measured_step_times_s": list(m.step_times_s),
        "spread_s": m.spread_s,
        "max_rel_diff": m.max_rel_diff,
        "numeric_ok": m.numeric_ok,
        **{k: m.numerics.get(k) for k in NUMERIC_KEYS},
        "error": m.error,
    }


def results_of(
    contenders: list[Contender], measured: dict[str, Measurement]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], int | None]:
    """(candidates, baselines, index of the best candidate) of results.json."""
    baselines: dict[str, dict[str, Any]] = {}
    for c in contenders:
        if c.baseline is not None:
            e = _entry(c, measured[c.plan.hash])
            baselines[c.baseline] = {k: e[k] for k in (
                "plan", "predicted_step_time_s", "measured_step_time_s", "measured_step_times_s", "spread_s",
                "max_rel_diff", "numeric_ok", *NUMERIC_KEYS, "error",
            )}
    candidates: list[dict[str, Any]] = []
    for c in contenders:
        m = measured[c.plan.hash]
        e = _entry(c, m)
        e["speedup"] = {
            name: (b["measured_step_time_s"] / m.median_s)
            if m.usable and b["measured_step_time_s"] and m.median_s
            else None
            for name, b in baselines.items()
        }
        candidates.append(e)
    usable = [i for i, c in enumerate(contenders) if measured[c.plan.hash].usable]
    # Fastest measured; on a tie (a searched plan identical to a baseline is measured
    # once, so ties are exact) the baseline is credited: a searched plan wins only by
    # being measured faster than every baseline.
    best = (
        min(
            usable,
            key=lambda i: (
                measured[contenders[i].plan.hash].median_s or float("inf"),
                candidates[i]["baseline"] is None,
                i,
            ),
        )
        if usable
        else None
    )
    return candidates, baselines, best


def _beyond_noise(candidates: list[dict[str, Any]], best: int | None, better: dict[str, Any] | None) -> bool | None:
    """Whether the best plan, if searched, is faster than the better baseline beyond the
    spread of both: its 75th percentile step below the baseline's 25th. None when the
    best is a baseline (nothing to tell apart) or a spread is missing."""
    if best is None or better is None or candidates[best]["baseline"] is not None:
        return None
    mine, theirs = candidates[best].get("spread_s"), better.get("spread_s")
    if not mine or not theirs:
        return None
    return bool(mine[1] < theirs[0])


def validate_run(
    run_dir: Path,
    *,
    top: int = DEFAULT_TOP,
    repeats: int = DEFAULT_REPEATS,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    progress: bool = True,
) -> dict[str, Any]:
    """Validate a run directory's search; writes results.json and traces/, returns the results."""
    from tqdm import tqdm

    from schedlab.capture import capture
    from schedlab.workloads import load_workload

    if top < 0 or repeats < 1 or steps < 1 or warmup < 0:
        raise SchedlabError("--top must be >= 0, --repeats and --steps >= 1, --warmup >= 0")
    config = read_run(run_dir)
    search = read_search(run_dir)
    paths = RunPaths(run_dir)
    workload = load_workload(config.model, config.size, seed=config.seed)
    captured = capture(workload, config.optimizer)
    graph = captured.graph
    if paths.graph.exists():
        searched = Graph.load(paths.graph)
        if not same_capture(graph, searched.hash, searched.schedule_hash):
            raise SchedlabError(
                f"the model captured now (graph {graph.hash}) is not the one searched (graph.json {searched.hash}); "
                "was schedlab, torch or the model changed since the search?"
            )
    machine = detect_host()
    contenders = contenders_of(search, top)
    if not contenders:
        raise SchedlabError(f"{paths.search} lists no plans to validate")
    n_plans = len({c.plan.hash for c in contenders})
    notes: list[str] = []
    order_cost_us = _searched_op_costs(config, machine, notes)
    t0 = time.perf_counter()
    bar = tqdm(
        total=n_plans * (1 + repeats), desc=f"validate {config.model}", unit="run", file=sys.stderr,
        disable=None if progress else True,
    )
    try:
        measured = measure(
            graph, workload.module, captured.input_values, [c.plan for c in contenders], machine,
            repeats=repeats, steps=steps, warmup=warmup, workload=config.model, on_progress=lambda: bar.update(1),
            op_cost_us=order_cost_us,
        )
    finally:
        bar.close()
    candidates, baselines, best = results_of(contenders, measured)
    better_baseline = min(
        (n for n, b in baselines.items() if b["measured_step_time_s"] is not None),
        key=lambda n: baselines[n]["measured_step_time_s"],
        default=None,
    )
    with staging_dir(paths.traces) as staged:
        # traces/ and results.json are replaced together: a failed or interrupted validation
        # leaves the previous pair, never new traces beside old results (or stale traces of
        # a plan that is no longer best beside new results).
        trace_paths = _write_traces(staged, paths, config, graph, machine, contenders, measured, best, better_baseline, notes)
        results: dict[str, Any] = {
            "schema": RESULTS_SCHEMA,
            "version": RESULTS_VERSION,
            "model": config.model,
            "size": config.size,
            "optimizer": config.optimizer,
            "candidates": candidates,
            "baselines": baselines,
            "best": best,
            "searched_plan_won": best is not None and candidates[best]["baseline"] is None,
            "beyond_noise": _beyond_noise(candidates, best, baselines.get(better_baseline) if better_baseline else None),
            "better_baseline": better_baseline,
            "best_speedup_over_better_baseline": (
                candidates[best]["speedup"].get(better_baseline) if best is not None and better_baseline else None
            ),
            "repeats": repeats,
            "steps_per_repeat": steps,
            "warmup": warmup,
            "machine": machine.to_json(),
            "versions": library_versions(),
            "created_unix_s": time.time(),
            "wall_s": time.perf_counter() - t0,
            "traces": trace_paths,
            "notes": notes,
        }
        swap_dir(staged, paths.traces, then=lambda: write_results(run_dir, results))
    _record_in_study(run_dir, config, results, notes)
    if notes:
        write_results(run_dir, results)
    return results


def _write_traces(
    out_dir: Path,
    paths: RunPaths,
    config: RunConfig,
    graph: Graph,
    machine: Machine,
    contenders: list[Contender],
    measured: dict[str, Measurement],
    best: int | None,
    better_baseline: str | None,
    notes: list[str],
    sim_trace_of: Callable[[Plan], Trace | None] | None = None,
) -> dict[str, str]:
    """best.exec.json, best.sim.json and baseline.exec.json (see RUN_DIR.md), written into
    `out_dir` (the staged traces/ folder); returns where each will be, under `paths.traces`.
    `sim_trace_of(plan)`: the simulated trace of the best plan (default: the searched profile's)."""
    out: dict[str, str] = {}

    def save(trace: Trace, final: Path, key: str) -> None:
        stage_trace(trace, out_dir, final, key, out)

    if best is not None:
        m = measured[contenders[best].plan.hash]
        if m.trace is not None:
            save(m.trace, paths.best_exec, "best_exec")
        sim_trace = (sim_trace_of(m.plan) if sim_trace_of is not None
                     else _simulated_trace(config, graph, machine, m.plan, notes))
        if sim_trace is not None:
            save(sim_trace, paths.best_sim, "best_sim")
    if better_baseline is not None:
        c = next(c for c in contenders if c.baseline == better_baseline)
        bt = measured[c.plan.hash].trace
        if bt is not None:
            save(bt, paths.baseline_exec, "baseline_exec")
    return out


def stage_trace(trace: Trace | None, out_dir: Path, final: Path, key: str, paths_out: dict[str, str]) -> None:
    """Write `trace` into the staged traces folder `out_dir` under `final`'s name and record
    in `paths_out[key]` where it will be once the folder is swapped in; nothing for None."""
    if trace is not None:
        trace.save(out_dir / final.name)
        paths_out[key] = str(final)


def _searched_op_costs(config: RunConfig, machine: Machine, notes: list[str]) -> OpCostUs | None:
    """The op times of the profile the search simulated with: the executor must resolve a
    critical-path order with the weights the simulator used, or it runs another order."""
    from schedlab.calibrate.profile import Profile
    from schedlab.sim.cost import op_cost_us

    try:
        return op_cost_us(Profile.load(config.profile, machine=machine, check_machine=False))
    except SchedlabError as e:
        notes.append(f"critical-path orders ranked with a rough roofline, not the searched profile's times: {e}")
        return None


def _simulated_trace(config: RunConfig, graph: Graph, machine: Machine, plan: Plan, notes: list[str]) -> Trace | None:
    from schedlab.calibrate.profile import Profile
    from schedlab.search.objective import Evaluator

    if not Path(config.profile).exists():
        notes.append(f"no simulated trace of the best plan: profile {config.profile} is gone")
        return None
    try:
        cost = Profile.load(config.profile, machine=machine, check_machine=False)
        ev = Evaluator(graph, machine, cost)
        return ev.simulate(ev.resolve(plan), record=True).trace
    except SchedlabError as e:
        notes.append(f"no simulated trace of the best plan: {e}")
        return None


def _record_in_study(run_dir: Path, config: RunConfig, results: dict[str, Any], notes: list[str]) -> None:
    """The measured figures, as the study's user attribute "validation" (finished trials are read-only)."""
    import optuna

    from schedlab.search.study import open_storage

    summary = {
        "created_unix_s": results["created_unix_s"],
        "best": results["best"],
        "searched_plan_won": results["searched_plan_won"],
        "candidates": [
            {k: c[k] for k in ("trial", "strategy", "baseline", "predicted_step_time_s", "measured_step_time_s", "spread_s", "speedup")}
            for c in results["candidates"]
        ],
        "baselines": {n: b["measured_step_time_s"] for n, b in results["baselines"].items()},
    }
    try:
        study = optuna.load_study(storage=open_storage(storage_url(run_dir, config)), study_name=config.study)
        study.set_user_attr("validation", summary)
        for c in summary["candidates"]:
            if c["trial"] is not None:
                study.set_user_attr(f"measured_step_time_s:trial{c['trial']}", c["measured_step_time_s"])
    except Exception as e:  # the results file is written either way
        notes.append(f"measured figures not written into the study: {_one_line(e)}")
