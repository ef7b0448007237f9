"""Fidelity re-scored: saved measurements predicted again, the executor not run.

Comparing two profiles (or two versions of the simulator) by running `schedlab fidelity`
once with each mixes the machine's drift between the runs into the comparison: on the
2-core development VM the same held-out plan measured 0.8-1.8x apart in clean runs
minutes apart (per model, the medians 1.0-1.33x apart). Re-scoring predicts the plans of
one or more saved results files from a profile, against the median of their measured
times, so every profile is scored on the same measurements. The files are one-device
runs (the slots x threads x orders spread, `calibrate.fidelity`) or multi-rank ones
(`--devices N`, the spread of `calibrate.rank_fidelity` on N local ranks), all alike.

It also says how far each run is from that median (`run_spread`: the MAPE that a
simulator predicting the median exactly would score against that one run), the floor
under a fidelity figure taken from a single run.

Held-out one-device runs are also re-scored trace-calibrated where their results file
names the calibration plan's trace (`calibrate.cal_traces`; the first file that has one for
the model): the Profile given, trace-calibrated on it, predicts the other plans, as the run
itself did. A trace recorded from another graph than today's capture (the capture changed)
is left out with the reason, and that model re-scores profile-only.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.calibrate import cal_traces
from schedlab.calibrate.fidelity import (
    CALIBRATION_PLAN,
    PROFILE_ONLY,
    PROTOCOL_SETS,
    TRACE_CALIBRATED,
    FidelityRow,
    error_summary,
    overall_summary,
    plan_spread,
    predict,
    resolve_all,
    shape_errors,
    sim_cost,
    sim_cost_overall,
)
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.rank_fidelity import ONE_DEVICE, StepOf, rank_cases, rank_plan_spread
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, same_capture
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan


@dataclass(frozen=True)
class SavedRuns:
    """The measured step times of fidelity results files: per (workload, plan), one per file."""

    paths: tuple[str, ...]
    size: str
    optimizer: str
    cores: int
    times_s: dict[tuple[str, str], tuple[float, ...]]  # in file order; plans every file measured
    # the same plans' round medians, every round of every file (a file of one round: its median)
    rounds_s: dict[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)  # the first file's machine, versions, steps per plan
    devices: int = 1  # local ranks the plans ran on (1: the one-device spread)
    set_name: str = "held-out"  # "held-out", "dev" (the held-out protocol's two sets) or "built-in" models
    # workload -> (results file, its calibration trace relative to it): the first file naming one
    traces: dict[str, tuple[Path, str]] = field(default_factory=dict)

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(w for w, _ in self.times_s))


def load_runs(paths: Sequence[str | Path]) -> SavedRuns:
    """Read fidelity results files (`schedlab fidelity` output, one-device or `--devices N`)
    measured under the same conditions; the plans every file measured are kept."""
    if not paths:
        raise SchedlabError("give at least one fidelity results file to re-score")
    per_file: list[dict[tuple[str, str], float]] = []
    rounds: dict[tuple[str, str], list[float]] = {}
    conds: set[tuple[str, str, str, int, int]] = set()
    first: dict[str, Any] = {}
    traces: dict[str, tuple[Path, str]] = {}
    for path in paths:
        d = _read(Path(path))
        first = first or {k: d[k] for k in ("machine", "versions", "steps_per_plan") if k in d}
        conds.add((str(d["set"]), str(d["size"]), str(d["optimizer"]), int(d["cores"]), int(d.get("devices") or 1)))
        for m in d.get("models", []):
            if isinstance(m, dict) and isinstance(m.get(cal_traces.KEY), str):
                traces.setdefault(str(m["workload"]), (Path(path), m[cal_traces.KEY]))
        times: dict[tuple[str, str], float] = {}
        for row in d["plans"]:
            try:
                key, t = (str(row["workload"]), str(row["plan"])), float(row["measured_s"])
            except (KeyError, TypeError, ValueError) as e:
                raise SchedlabError(f"{path}: a plan row lacks workload, plan or measured_s ({e})") from e
            if not t > 0:
                raise SchedlabError(f"{path}: plan {key[0]}/{key[1]} has measured_s {t}; it must be > 0")
            if key not in times:  # a plan's one measurement is in every method's row
                times[key] = t
                rounds.setdefault(key, []).extend(_round_medians(row, t))
        if not times:
            raise SchedlabError(f"{path}: no plan rows; is it a `schedlab fidelity` results file?")
        per_file.append(times)
    if len(conds) > 1:
        raise SchedlabError(
            "the results files were measured under different conditions (models, size, optimizer, cores, ranks): "
            + "; ".join(f"{m}/{s}/{o}/{c} cores/{n} rank(s)" for m, s, o, c, n in sorted(conds))
        )
    common = [k for k in per_file[0] if all(k in f for f in per_file[1:])]
    if not common:
        raise SchedlabError("the results files share no measured plan")
    (set_name, size, optimizer, cores, devices), = conds
    return SavedRuns(
        paths=tuple(str(p) for p in paths), size=size, optimizer=optimizer, cores=cores,
        times_s={k: tuple(f[k] for f in per_file) for k in common}, conditions=first,
        rounds_s={k: tuple(rounds[k]) for k in common},
        devices=devices, set_name=set_name, traces=traces if devices == 1 and set_name in PROTOCOL_SETS else {},
    )


def _round_medians(row: dict[str, Any], measured_s: float) -> list[float]:
    """A saved plan row's round medians, or its one median (a file of one round, or older)."""
    xs = row.get("round_medians_s")
    if isinstance(xs, list) and xs and all(isinstance(x, (int, float)) and x > 0 for x in xs):
        return [float(x) for x in xs]
    return [measured_s]


def _read(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise SchedlabError(f"no results file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchedlabError(f"{path} is not a readable JSON results file: {e}") from e
    if not isinstance(d, dict) or d.get("set") not in (*PROTOCOL_SETS, "built-in") or d.get("rescored"):
        raise SchedlabError(f"{path} is not a fidelity results file of measured runs (its 'set' is not 'held-out', "
                            "'dev' or 'built-in', or it is a re-scored one); write one with `schedlab fidelity`")
    if d.get("backend", "torch") != "torch":
        raise SchedlabError(f"{path} measured the {d['backend']} backend; re-scoring predicts schedlab's executor")
    missing = [k for k in ("size", "optimizer", "cores", "plans") if k not in d]
    if missing or not isinstance(d["plans"], list):
        raise SchedlabError(f"{path}: a fidelity results file needs {', '.join(missing) or 'a list of plans'}")
    return d


@dataclass(frozen=True)
class SavedPlan:
    """One saved plan made again: its name in the results file, the graph it runs and the
    plan resolved on the machine that predicts it."""

    name: str
    graph: Graph
    resolved: ResolvedPlan
    kind: str = ONE_DEVICE  # or a multi-rank plan's kind (placed, data-parallel, ...)

    @property
    def ops(self) -> int:
        return len(self.resolved.run_graph(self.graph).ops)


PlansOf = Callable[[str, Collection[str]], list[SavedPlan]]  # (workload, plan names) -> those plans


def one_device_plans(capture: Callable[[str], Graph], machine: Machine) -> PlansOf:
    """The one-device spread (`calibrate.fidelity.plan_spread`) of each workload's graph
    (`capture(workload)`), resolved on `machine`, the named plans only."""
    cores = machine.default_device.cores

    def plans(workload: str, names: Collection[str]) -> list[SavedPlan]:
        graph = capture(workload)
        named = [(r.plan.name or r.plan.describe(), r) for r in resolve_all(graph, plan_spread(cores), machine)]
        return [SavedPlan(name, graph, r) for name, r in named if name in names]

    return plans


def rank_plans(step_of: Callable[[str], StepOf], machine: Machine, profile: Profile) -> PlansOf:
    """The multi-rank spread (`calibrate.rank_fidelity.rank_plan_spread`) on `machine`'s local
    ranks, each plan on the step `step_of(workload)` gives for its replicas and micro-batches."""
    from schedlab.sim.cost import op_cost_us

    def plans(workload: str, names: Collection[str]) -> list[SavedPlan]:
        specs = [sp for sp in rank_plan_spread(len(machine.devices)) if sp.name in names]
        cases = rank_cases(workload, step_of(workload), specs, machine, op_cost_us(profile))
        return [SavedPlan(c.spec.name, c.graph, c.resolved, c.spec.kind) for c in cases]

    return plans


def rescore(runs: SavedRuns, profile: Profile, machine: Machine, plans_of: PlansOf, host_cores: int) -> dict[str, Any]:
    """Profile-only predictions on `machine` of every saved plan (`plans_of`), scored
    against the median measured time; the spread of each run around that median. The
    runs must have been measured on a host of `host_cores` cores, as this one. Plain JSON."""
    if host_cores != runs.cores:
        raise SchedlabError(f"the runs were measured on {runs.cores} cores and this machine has "
                            f"{host_cores}: their plans are not this machine's spread")
    models: list[dict[str, Any]] = []
    rows: list[FidelityRow] = []
    learnt_rows: list[FidelityRow] = []  # trace-calibrated, the calibration plan left out
    skipped: dict[str, str] = {}  # workload -> why it was not trace-calibrated
    spread: list[list[float]] = [[] for _ in runs.paths]  # per run: |median / run - 1| of every plan
    for workload in runs.workloads():
        saved = plans_of(workload, {name for w, name in runs.times_s if w == workload})
        learnt = _trace_calibrated(runs, workload, saved, profile, skipped)
        mine: list[FidelityRow] = []
        theirs: list[FidelityRow] = []
        own: list[list[float]] = [[] for _ in runs.paths]  # the same, this model's plans
        for plan in saved:
            times = runs.times_s[(workload, plan.name)]
            med = statistics.median(times)
            for method, cost, out in ((PROFILE_ONLY, profile, mine), (TRACE_CALIBRATED, learnt, theirs)):
                if cost is None:
                    continue
                (pred,) = predict(plan.graph, [plan.resolved], cost, machine)
                out.append(FidelityRow(
                    workload=workload, plan=plan.name, measured_s=med, measured_spread_s=(min(times), max(times)),
                    predicted_s=pred.step_time_s, sim_wall_s=pred.sim_wall_s, sim_cold_s=pred.sim_cold_s,
                    ops=plan.ops, in_calibration=method == TRACE_CALIBRATED and plan.name == CALIBRATION_PLAN.name,
                    method=method, plan_kind=plan.kind, round_medians_s=runs.rounds_s.get((workload, plan.name), ()),
                ))
            for i, t in enumerate(times):
                own[i].append(abs(med / t - 1.0))
        for i, xs in enumerate(own):
            spread[i] += xs
        scored = [r for r in theirs if not r.in_calibration]
        rows += mine + theirs
        learnt_rows += scored
        models.append({
            "workload": workload, "ops": len(saved[0].graph.ops) if saved else 0, "profile_only": error_summary(mine),
            **({"trace_calibrated": error_summary(scored)} if theirs else {}),
            "run_spread": [statistics.fmean(x) if x else 0.0 for x in own],
            "sim_cost": sim_cost(mine),  # simulated here, against the saved median steps
        })
    profile_rows = [r for r in rows if r.method == PROFILE_ONLY]
    overall: dict[str, Any] = {
        "profile_only": overall_summary([r.error for r in profile_rows], [m["profile_only"] for m in models]),
    }
    if learnt_rows:
        overall["trace_calibrated"] = overall_summary(
            [r.error for r in learnt_rows], [m["trace_calibrated"] for m in models if "trace_calibrated" in m])
    return {
        "set": runs.set_name,
        "rescored": True,
        **runs.conditions,
        "runs": list(runs.paths),
        "size": runs.size,
        "optimizer": runs.optimizer,
        "cores": runs.cores,
        **({"devices": runs.devices} if runs.devices > 1 else {}),
        "note": "profile-only predictions of the saved plans, against the median of their measured step times "
        "over the runs, and trace-calibrated ones where a run kept its calibration plan's trace (that plan left "
        "out of their errors); run_spread: per run, the MAPE of the median against that run's measurements (the "
        "error an exact prediction of the median scores against one run). Errors are fractions: predicted / "
        "measured - 1.",
        "overall": {**overall, "run_spread": [statistics.fmean(s) if s else 0.0 for s in spread]},
        "models": models,
        "trace_calibration_skipped": skipped,
        "plan_shapes": shape_errors(profile_rows + learnt_rows),
        "sim_cost": sim_cost_overall(models),
        "plans": [{**r.__dict__, "error": r.error, "scored": not r.in_calibration} for r in rows],
    }


def _trace_calibrated(
    runs: SavedRuns, workload: str, saved: Sequence[SavedPlan], profile: Profile, skipped: dict[str, str]
) -> Profile | None:
    """`profile` trace-calibrated on the workload's saved calibration trace, or None where
    no run kept one (or it was recorded from another graph: the reason goes to `skipped`)."""
    where = runs.traces.get(workload)
    if where is None or not saved:
        return None
    trace = cal_traces.load_trace(*where)
    graph = saved[0].graph
    recorded = trace.meta.get("graph_hash")
    if recorded is not None and not same_capture(graph, recorded, trace.meta.get("schedule_hash")):
        skipped[workload] = (f"{where[1]} was recorded from graph {trace.meta['graph_hash']}, today's capture "
                             f"is {graph.hash}")
        return None
    return profile.with_trace(trace, graph)
