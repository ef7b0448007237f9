"""Validation of plan files: each plan checked, measured and predicted, beside the baselines.

`schedlab validate MODEL --plan A.json --plan B.json` takes the plans `simulate`, `trace`
and `bench` take, multi-device and data-parallel ones included. For each plan and for the
two single-process baselines (`search.baselines`: PyTorch's default, one slot and every
core; TensorFlow's recommended threading), on this host:

1. numerics: one step against eager PyTorch (a plan changes speed, never results). A plan
   on several devices runs on local ranks (`exec.launch.run_ranks`) and its first step's
   outputs (for a data-parallel plan: every replica's, as the full batch's:
   `PlanStep.as_full`) are compared, as `schedlab trace` does;
2. measurement: `repeats` rounds, each running every plan for `warmup` + `steps` steps
   (`warmup` unless given: one untimed step in one process, `exec.launch.RANK_WARMUP` on
   several ranks, whose first steps are slow),
   round-robin with the starting plan rotating (as `search.validate.measure`), so noise
   falls on all plans alike; a multi-rank plan starts its ranks once per round. Its step
   time is the median of every timed step, [p25, p75] its spread (`Measurement`). A
   steady-state plan (`ResolvedPlan.steps` > 1, e.g. a reverse-first-k order) runs its
   steps back to back, each time a run's wall time over its steps, as `schedlab trace`;
3. prediction: the simulator's step under the same resolved plan on the same ranks, with
   the Profile's fitted links (`calibrate.links.apply_link_fit`), as `schedlab simulate`;
   `error_pct` = (predicted - measured) / measured x 100.

Speedup over a baseline is the baseline's median over the plan's. A plan that fails its
check or cannot run is a result (its `error`), not a crash.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from schedlab.backend import BackendRun
from schedlab.calibrate.round_cal import RoundCalibration
from schedlab.data_parallel import PlanStep
from schedlab.errors import SchedlabError
from schedlab.exec.launch import warmup_for
from schedlab.machine import Machine
from schedlab.plan import Plan, ResolvedPlan
from schedlab.search.validate import NUMERIC_KEYS, Measurement, _one_line
from schedlab.trace import library_versions

PLAN_RESULTS_SCHEMA = "schedlab.plan_validation"
PLAN_RESULTS_VERSION = 1


@dataclass(frozen=True)
class PlanCase:
    """One plan to validate: a plan file's, or a baseline's (`baseline` its name)."""

    name: str  # the plan file as given, or the baseline's name
    plan: Plan
    machine: Machine  # this host as the ranks the plan runs on (one process: `detect_host`)
    step: PlanStep  # the captured step; with replicas, the per-replica steps too
    resolved: ResolvedPlan  # `resolve(step.graph, plan, machine, ...)`
    baseline: str | None = None

    @property
    def ranks(self) -> int:
        return len(self.machine.processes) if self.resolved.multi_device else 1


class _Runner(Protocol):
    def check(self) -> Any:
        """The numeric check (`exec.NumericCheck`) of one step against eager PyTorch."""
        ...

    def time(self, steps: int, warmup: int) -> BackendRun:
        """The timed steps (seconds each) and the trace of the run."""
        ...


class _LocalRunner:
    """A plan on one device, in this process (`exec.Executor`)."""

    def __init__(self, case: PlanCase, workload: str) -> None:
        from schedlab.exec import Executor

        self.case, self.workload = case, workload
        self.graph = case.step.graph  # the full step; one micro-batch's for a pipeline plan
        self.run_graph = case.resolved.run_graph(self.graph)  # unrolled for a steady-state plan, or pipelined
        self.inputs = case.step.inputs_for(self.run_graph)
        self.executor = Executor(self.run_graph, case.resolved)

    def check(self) -> Any:
        from schedlab.exec import check_step
        from schedlab.steps import as_step_outputs

        full, run = self.case.step.full, self.run_graph
        return check_step(self.case.step.workload.module, full.graph, full.input_values,
                          lambda iv: as_step_outputs(full.graph, run, self.executor.step(
                              {v: t.clone() for v, t in self.inputs.items()})[0]),
                          steps=self.case.resolved.steps, run_graph=run)

    def time(self, steps: int, warmup: int) -> BackendRun:
        from schedlab.exec import run_steps

        c = self.case
        res = run_steps(self.graph, self.inputs, c.plan, c.machine, steps=steps, warmup=warmup,
                        workload=self.workload, executor=self.executor)
        return BackendRun(tuple(res.step_times_s), res.trace)


class _RankRunner:
    """A plan on several devices: one process per rank (`exec.launch.run_ranks`)."""

    def __init__(self, case: PlanCase, workload: str, timeout_s: float) -> None:
        self.case, self.workload, self.timeout_s = case, workload, timeout_s
        self.run_graph = case.resolved.run_graph(case.step.graph)

    def _run(self, steps: int, warmup: int, want_outputs: bool) -> Any:
        from schedlab.exec import run_ranks

        c = self.case
        return run_ranks(c.step.graph, c.resolved, c.machine, c.step.inputs_for(self.run_graph), steps=steps,
                         warmup=warmup, timeout_s=self.timeout_s, want_outputs=want_outputs, workload=self.workload)

    def check(self) -> Any:
        from schedlab.exec import check_step

        full = self.case.step.full
        first = self.case.step.as_full(self.run_graph, self._run(1, 0, want_outputs=True).outputs or {})
        return check_step(self.case.step.workload.module, full.graph, full.input_values, lambda iv: first,
                          steps=self.case.resolved.steps, run_graph=self.run_graph)

    def time(self, steps: int, warmup: int) -> BackendRun:
        res = self._run(steps, warmup, want_outputs=False)
        return BackendRun(tuple(res.step_times_s), res.trace)


def measure_cases(
    cases: list[PlanCase],
    *,
    repeats: int,
    steps: int,
    warmup: int | None,
    timeout_s: float,
    workload: str = "",
    on_progress: Callable[[], None] | None = None,
    before_round: Callable[[], None] | None = None,
) -> list[Measurement]:
    """Check, then time every case round-robin (see the module docstring); one Measurement per
    case, its trace the last timed run's. `before_round` runs at the start of each round."""
    def tick() -> None:
        if on_progress is not None:
            on_progress()

    out: list[Measurement] = []
    runners: list[_Runner | None] = []
    for case in cases:
        m = Measurement(case.plan)
        out.append(m)
        runner: _Runner | None = None
        try:
            runner = _RankRunner(case, workload, timeout_s) if case.resolved.multi_device else _LocalRunner(case, workload)
            check = runner.check()
            m.max_rel_diff, m.numeric_ok, m.numerics = check.max_rel_diff, check.ok(), check.to_json()
            if not check.ok():
                m.error = f"numerics differ from eager PyTorch: {check.describe()}"
        except Exception as e:  # a plan the executor cannot run is a result, not a crash
            m.error = f"cannot run: {_one_line(e)}"
        runners.append(runner if m.error is None else None)
        tick()
    live = [i for i, r in enumerate(runners) if r is not None]
    for r in range(repeats):
        if before_round is not None and live:
            before_round()
        k = r % len(live) if live else 0
        for i in live[k:] + live[:k]:
            m, runner = out[i], runners[i]
            if m.error is None and runner is not None:
                try:
                    run = runner.time(steps, warmup_for(cases[i].resolved.multi_device, warmup))
                    m.step_times_s.extend(run.step_times_s)
                    m.trace = run.trace
                except Exception as e:
                    m.error = f"failed while timing: {_one_line(e)}"
            tick()
        for _ in range(len(cases) - len(live)):
            tick()
    return out


def predict(case: PlanCase, profile: Any) -> tuple[float, dict[str, str], str]:
    """(predicted step s, which model costed each device, engine) of `case` (see the module docstring)."""
    res = _simulate(case, profile, record=False)
    return res.step_time_s, dict(res.cost_sources), res.engine


def simulated_trace(case: PlanCase, profile: Any) -> Any:
    """The simulator's trace of `case` (as `predict` times it); None without a profile."""
    return None if profile is None else _simulate(case, profile, record=True).trace


def _simulate(case: PlanCase, profile: Any, record: bool) -> Any:
    from schedlab.calibrate.links import apply_link_fit
    from schedlab.sim import simulate

    graph = case.step.graph
    machine = apply_link_fit(case.machine, profile)
    return simulate(graph, case.resolved, machine, profile.for_graph(graph).for_slots(case.plan.slots), record=record)


def validate_plans(
    cases: list[PlanCase],
    *,
    profile: Any,
    repeats: int,
    steps: int,
    warmup: int | None,
    timeout_s: float,
    workload: str = "",
    progress: bool = True,
    notes: list[str] | None = None,
    measured_out: list[Measurement] | None = None,
    calibration: RoundCalibration | None = None,
) -> dict[str, Any]:
    """Check, measure and predict every case; the results as one JSON object.

    `profile`: the Profile the predictions take (None: no predictions, a note says why).
    The baselines are the cases with `baseline` set; every other case is a plan.
    `measured_out`: given, it receives each case's Measurement (its trace among them), in order.
    `calibration`: given (and a profile), it runs at the start of each round, and every case
    is predicted again from `profile` with its op times: ``recalibrated_predicted_step_time_s``
    and ``recalibrated_error_pct`` (`calibrate.round_cal`).
    """
    from tqdm import tqdm

    if repeats < 1 or steps < 1 or (warmup is not None and warmup < 0):
        raise SchedlabError("--repeats and --steps must be >= 1, --warmup >= 0")
    if not any(c.baseline is None for c in cases):
        raise SchedlabError("no plan to validate: give one or more --plan PLAN.json")
    notes = list(notes or [])
    t0 = time.perf_counter()
    bar = tqdm(total=len(cases) * (1 + repeats), desc=f"validate {workload}", unit="run", file=sys.stderr,
               disable=None if progress else True)
    try:
        measured = measure_cases(cases, repeats=repeats, steps=steps, warmup=warmup, timeout_s=timeout_s,
                                 workload=workload, on_progress=lambda: bar.update(1),
                                 before_round=calibration.run if calibration is not None and profile is not None else None)
    finally:
        bar.close()
    if measured_out is not None:
        measured_out.extend(measured)
    entries = [_entry(c, m, profile, notes) for c, m in zip(cases, measured, strict=True)]
    recalibrated = calibration.apply(profile) if calibration is not None and calibration.rounds else None
    for c, e in zip(cases, entries, strict=True):
        e["recalibrated_predicted_step_time_s"] = e["recalibrated_error_pct"] = None
        if recalibrated is not None and e["predicted_step_time_s"] is not None:
            pred, _, _ = predict(c, recalibrated)
            meas = e["measured_step_time_s"]
            e["recalibrated_predicted_step_time_s"] = pred
            e["recalibrated_error_pct"] = (pred - meas) / meas * 100.0 if meas else None
    baselines = {e["baseline"]: e for e in entries if e["baseline"] is not None}
    plans = [e for e in entries if e["baseline"] is None]
    for e in entries:
        e["speedup"] = {
            name: b["measured_step_time_s"] / e["measured_step_time_s"]
            if e["usable"] and b["usable"] and e["measured_step_time_s"] else None
            for name, b in baselines.items()
        }
    host = next(c.machine for c in cases if c.baseline is not None) if baselines else cases[0].machine
    return {
        "schema": PLAN_RESULTS_SCHEMA,
        "version": PLAN_RESULTS_VERSION,
        "workload": workload,
        "plans": plans,
        "baselines": baselines,
        "repeats": repeats,
        "steps_per_repeat": steps,
        "warmup": warmup_for(False, warmup),  # untimed steps per round, one process
        "warmup_ranks": warmup_for(True, warmup),  # and on several ranks
        "recalibration": calibration.to_json() if recalibrated is not None and calibration is not None else None,
        "machine": host.to_json(),
        "versions": library_versions(),
        "created_unix_s": time.time(),
        "wall_s": time.perf_counter() - t0,
        "notes": notes,
    }


def _entry(case: PlanCase, m: Measurement, profile: Any, notes: list[str]) -> dict[str, Any]:
    predicted: float | None = None
    sources: dict[str, str] = {}
    engine = None
    if profile is not None:
        try:
            predicted, sources, engine = predict(case, profile)
        except SchedlabError as e:
            notes.append(f"no prediction for {case.name}: {e}")
    measured = m.median_s if m.usable else None
    return {
        "name": case.name,
        "baseline": case.baseline,
        "plan": case.plan.to_json(),
        "ranks": case.ranks,
        "devices": sorted(set(case.resolved.device)),
        "steps_per_run": case.resolved.steps,  # > 1: steady state, each time a run's wall time / steps_per_run
        "measured_step_time_s": measured,
        "measured_step_times_s": list(m.step_times_s),
        "spread_s": m.spread_s,
        "predicted_step_time_s": predicted,
        "error_pct": None if predicted is None or not measured else (predicted - measured) / measured * 100.0,
        "cost_sources": sources,
        "sim_engine": engine,
        "max_rel_diff": m.max_rel_diff,
        "numeric_ok": m.numeric_ok,
        **{k: m.numerics.get(k) for k in NUMERIC_KEYS},
        "error": m.error,
        "usable": m.usable,
    }
