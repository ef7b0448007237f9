"""Held-out fidelity re-scored: saved measurements predicted again, the executor not run.

Comparing two profiles (or two versions of the simulator) by running `schedlab fidelity
--held-out` once with each mixes the machine's drift between the runs into the
comparison: on the 2-core development VM the same held-out plan measured 0.8-1.8x apart
in clean runs minutes apart (per model, the medians 1.0-1.33x apart). Re-scoring predicts
the plans of one or more saved held-out results files from a profile, against the median
of their measured times, so every profile is scored on the same measurements.

It also says how far each run is from that median (`run_spread`: the MAPE that a
simulator predicting the median exactly would score against that one run), the floor
under a fidelity figure taken from a single run.

Profile-only: a trace-calibrated prediction needs the calibration plan's trace, which a
results file does not keep.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.calibrate.fidelity import (
    PROFILE_ONLY,
    FidelityRow,
    error_summary,
    overall_summary,
    plan_spread,
    predict,
    resolve_all,
)
from schedlab.calibrate.profile import Profile
from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import Machine


@dataclass(frozen=True)
class SavedRuns:
    """The measured step times of held-out results files: per (workload, plan), one per file."""

    paths: tuple[str, ...]
    size: str
    optimizer: str
    cores: int
    times_s: dict[tuple[str, str], tuple[float, ...]]  # in file order; plans every file measured
    conditions: dict[str, Any] = field(default_factory=dict)  # the first file's machine, versions, steps per plan

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(w for w, _ in self.times_s))


def load_runs(paths: Sequence[str | Path]) -> SavedRuns:
    """Read held-out results files (`schedlab fidelity --held-out` output) measured under the
    same conditions; the plans every file measured are kept."""
    if not paths:
        raise SchedlabError("give at least one held-out results file to re-score")
    per_file: list[dict[tuple[str, str], float]] = []
    conds: set[tuple[str, str, int]] = set()
    first: dict[str, Any] = {}
    for path in paths:
        d = _read(Path(path))
        first = first or {k: d[k] for k in ("machine", "versions", "steps_per_plan") if k in d}
        conds.add((str(d["size"]), str(d["optimizer"]), int(d["cores"])))
        times: dict[tuple[str, str], float] = {}
        for row in d["plans"]:
            if row.get("method") != PROFILE_ONLY:
                continue  # each plan's measurement is in both methods' rows
            try:
                key, t = (str(row["workload"]), str(row["plan"])), float(row["measured_s"])
            except (KeyError, TypeError, ValueError) as e:
                raise SchedlabError(f"{path}: a plan row lacks workload, plan or measured_s ({e})") from e
            if not t > 0:
                raise SchedlabError(f"{path}: plan {key[0]}/{key[1]} has measured_s {t}; it must be > 0")
            times[key] = t
        if not times:
            raise SchedlabError(f"{path}: no profile-only plan rows; is it a `schedlab fidelity --held-out` results file?")
        per_file.append(times)
    if len(conds) > 1:
        raise SchedlabError(
            "the results files were measured under different conditions (size, optimizer, cores): "
            + "; ".join(f"{s}/{o}/{c} cores" for s, o, c in sorted(conds))
        )
    common = [k for k in per_file[0] if all(k in f for f in per_file[1:])]
    if not common:
        raise SchedlabError("the results files share no measured plan")
    (size, optimizer, cores), = conds
    return SavedRuns(
        paths=tuple(str(p) for p in paths), size=size, optimizer=optimizer, cores=cores,
        times_s={k: tuple(f[k] for f in per_file) for k in common}, conditions=first,
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise SchedlabError(f"no results file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchedlabError(f"{path} is not a readable JSON results file: {e}") from e
    if not isinstance(d, dict) or d.get("set") != "held-out":
        raise SchedlabError(f"{path} is not a held-out fidelity results file (its 'set' is not 'held-out'); "
                            "write one with `schedlab fidelity --held-out`")
    missing = [k for k in ("size", "optimizer", "cores", "plans") if k not in d]
    if missing or not isinstance(d["plans"], list):
        raise SchedlabError(f"{path}: a held-out results file needs {', '.join(missing) or 'a list of plans'}")
    return d


def rescore(
    runs: SavedRuns, profile: Profile, machine: Machine, capture: Callable[[str], Graph]
) -> dict[str, Any]:
    """Profile-only predictions of every saved plan from `profile`, scored against the
    median measured time; the spread of each run around that median. `capture(workload)`
    gives the workload's graph at the runs' size and optimizer. Plain JSON."""
    if machine.default_device.cores != runs.cores:
        raise SchedlabError(f"the runs were measured on {runs.cores} cores and this machine has "
                            f"{machine.default_device.cores}: their plans are not this machine's spread")
    models: list[dict[str, Any]] = []
    rows: list[FidelityRow] = []
    spread: list[list[float]] = [[] for _ in runs.paths]  # per run: |median / run - 1| of every plan
    for workload in runs.workloads():
        graph = capture(workload)
        named = [(r.plan.name or r.plan.describe(), r) for r in resolve_all(graph, plan_spread(runs.cores), machine)]
        named = [(name, r) for name, r in named if (workload, name) in runs.times_s]
        preds = predict(graph, [r for _, r in named], profile, machine)
        mine = []
        own: list[list[float]] = [[] for _ in runs.paths]  # the same, this model's plans
        for (name, _), pred in zip(named, preds, strict=True):
            times = runs.times_s[(workload, name)]
            med = statistics.median(times)
            mine.append(FidelityRow(
                workload=workload, plan=name, measured_s=med, measured_spread_s=(min(times), max(times)),
                predicted_s=pred.step_time_s, sim_wall_s=pred.sim_wall_s, sim_cold_s=pred.sim_cold_s,
                ops=len(graph.ops), in_calibration=False, method=PROFILE_ONLY,
            ))
            for i, t in enumerate(times):
                own[i].append(abs(med / t - 1.0))
        for i, xs in enumerate(own):
            spread[i] += xs
        rows += mine
        models.append({
            "workload": workload, "ops": len(graph.ops), "profile_only": error_summary(mine),
            "run_spread": [statistics.fmean(x) for x in own],
        })
    return {
        "set": "held-out",
        "rescored": True,
        **runs.conditions,
        "runs": list(runs.paths),
        "size": runs.size,
        "optimizer": runs.optimizer,
        "cores": runs.cores,
        "note": "profile-only predictions of the saved plans, against the median of their measured step times "
        "over the runs; run_spread: per run, the MAPE of the median against that run's measurements (the error "
        "an exact prediction of the median scores against one run). Errors are fractions: predicted / measured - 1.",
        "overall": {
            "profile_only": overall_summary([r.error for r in rows], [m["profile_only"]["kendall_tau"] for m in models]),
            "run_spread": [statistics.fmean(s) for s in spread],
        },
        "models": models,
        "plans": [{**r.__dict__, "error": r.error} for r in rows],
    }
