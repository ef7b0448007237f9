"""Read a run directory, or a suite of them, into plain dataclasses. Reads only.

A run directory follows `search/RUN_DIR.md`. `run.json` (from `schedlab search`) and
`results.json` (from `schedlab validate`) are required: a missing or corrupt one is one
SchedlabError naming the file and the command that writes it. Everything else (graph,
traces, study, profile) is optional: what cannot be read is kept as a reason in
`RunData.problems`, and the figures that need it are skipped with that note.

A *suite* is a directory whose subdirectories are run directories (each has a run.json).
"""

from __future__ import annotations

import hashlib
import math
import urllib.parse
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.io import read_json
from schedlab.plan import Plan
from schedlab.search.run_dir import RunPaths
from schedlab.trace import Trace

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile

T = TypeVar("T")

# The run directory's file names, relative to it, from the one place that defines them.
_NAMES = RunPaths(Path())
RUN_JSON = str(_NAMES.run)
RESULTS_JSON = str(_NAMES.results)
SEARCH_JSON = str(_NAMES.search)
GRAPH_JSON = str(_NAMES.graph)
STUDY_DB = str(_NAMES.study_db)
PROFILE_JSON = str(_NAMES.profile)  # the trace-calibrated profile search kept, if any
TRACE_FILES = {
    "best.exec": str(_NAMES.best_exec),
    "best.sim": str(_NAMES.best_sim),
    "baseline.exec": str(_NAMES.baseline_exec),
}

# Which command writes each file (for the error messages).
_SEARCH = "schedlab search MODEL --run-dir {dir}"
_VALIDATE = "schedlab validate {dir}"
WRITERS = {
    RUN_JSON: _SEARCH,
    GRAPH_JSON: _SEARCH,
    SEARCH_JSON: _SEARCH,
    STUDY_DB: _SEARCH,
    RESULTS_JSON: _VALIDATE,
    **{path: _VALIDATE for path in TRACE_FILES.values()},
}


def _hint(name: str, run_dir: Path) -> str:
    return WRITERS.get(name, "schedlab search").format(dir=run_dir)


# ---- records ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One plan run on the real executor: a validated candidate or a baseline."""

    label: str  # "#3 tpe" for a candidate, the baseline's name for a baseline
    role: str  # "candidate" or "baseline"
    plan: Plan
    predicted_s: float | None  # simulated step time
    measured_s: float  # median measured step time
    times_s: tuple[float, ...]  # every measured step time
    spread_s: tuple[float, float] | None  # [p25, p75] of the measured step times
    strategy: str = ""
    trial: int | None = None
    max_rel_diff: float | None = None  # numerics vs eager PyTorch
    speedup: dict[str, float] = field(default_factory=dict)  # baseline -> measured speedup

    @property
    def plan_hash(self) -> str:
        return self.plan.hash


@dataclass(frozen=True)
class Results:
    """results.json: the plans measured cleanly, and those that were not (with why).

    `best` is what results.json names best (a baseline when no searched plan beat them):
    the plan every figure calls the run's best (`best_plan`). `best_searched` is the
    fastest searched candidate, which figures show beside it.
    """

    candidates: tuple[Measured, ...]  # searched plans measured cleanly (baselines not repeated)
    baselines: dict[str, Measured]  # baselines measured cleanly
    best: Measured | None
    excluded: tuple[tuple[str, str], ...]  # (label, why) of plans without a clean measurement
    repeats: int | None
    steps_per_repeat: int | None
    machine: dict[str, Any]
    versions: dict[str, str]
    created_unix_s: float | None

    @property
    def best_searched(self) -> Measured | None:
        return min(self.candidates, key=lambda m: m.measured_s, default=None)

    @property
    def searched_plan_won(self) -> bool:
        return self.best is not None and self.best.role == "candidate"


class NoBestPlan(SchedlabError):
    """results.json names no plan with a clean measurement as best."""


def best_plan(results: Results) -> Measured:
    """The run's best plan, the one every figure and the index page call best: the fastest
    plan measured cleanly, searched or baseline, as `schedlab validate` chose it (a baseline
    when no searched plan was measured faster). Raises NoBestPlan, saying why, without one."""
    if results.best is not None:
        return results.best
    why = "; ".join(f"{label}: {reason}" for label, reason in results.excluded) or "no plans"
    raise NoBestPlan(f"no plan was measured cleanly ({why})")


def best_label(best: Measured) -> str:
    """What to call the best plan: "best plan", or "best plan (= baseline NAME)"."""
    return "best plan" if best.role == "candidate" else f"best plan (= baseline {best.label})"


@dataclass(frozen=True)
class TrialPoint:
    number: int
    value_s: float  # objective: simulated step time
    strategy: str


@dataclass(frozen=True)
class History:
    """The search's Optuna study, reduced to what the history figure needs."""

    study_name: str
    storage: str
    trials: tuple[TrialPoint, ...]  # complete trials with a finite value, by number
    n_other: int  # failed, pruned, running or infinite trials (not drawn)


@dataclass(frozen=True)
class RunData:
    """Everything the figures of one run may use. Optional parts are None when unreadable."""

    path: Path
    run: dict[str, Any]
    results: Results
    search: dict[str, Any] | None = None
    graph: Graph | None = None
    traces: dict[str, Trace] = field(default_factory=dict)  # keys of TRACE_FILES
    history: History | None = None
    profile: Profile | None = None
    profile_path: Path | None = None
    problems: dict[str, str] = field(default_factory=dict)  # part -> why it is missing

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def workload(self) -> str:
        """e.g. "cnn/default", or "cnn/default (TF)" for a run searched for TensorFlow's runtime."""
        model = str(self.run.get("model", self.name))
        size = self.run.get("size")
        name = f"{model}/{size}" if size else model
        return f"{name} (TF)" if self.run.get("backend") == "tensorflow" else name

    @property
    def machine(self) -> dict[str, Any]:
        m = self.results.machine or self.run.get("machine") or {}
        return m if isinstance(m, dict) else {"name": str(m)}

    @property
    def host(self) -> str:
        """e.g. "vm: Intel(R) Xeon(R) Processor, 2 cores"."""
        return host_text(self.machine)

    @property
    def cores(self) -> int:
        devices = self.machine.get("devices") or [{}]
        try:
            return int(devices[0].get("cores", 1))
        except (TypeError, ValueError, AttributeError, IndexError):
            return 1

    @property
    def versions(self) -> dict[str, str]:
        if self.results.versions:
            return self.results.versions
        for t in self.traces.values():
            v = t.meta.get("versions")
            if isinstance(v, dict):
                return {str(k): str(x) for k, x in v.items()}
        return {}

    @property
    def graph_hash(self) -> str:
        if self.graph is not None:
            return self.graph.hash
        for t in self.traces.values():
            if t.meta.get("graph_hash"):
                return str(t.meta["graph_hash"])
        return ""


def host_text(machine: dict[str, Any]) -> str:
    host = machine.get("host") or {}
    name = str(host.get("hostname") or machine.get("name") or "unknown host")
    cpu = str(host.get("cpu_model") or "")
    devices = machine.get("devices") or []
    cores = devices[0].get("cores") if devices and isinstance(devices[0], dict) else None
    parts = [p for p in (cpu, f"{cores} cores" if cores else "") if p]
    return f"{name}: {', '.join(parts)}" if parts else name


@dataclass(frozen=True)
class Suite:
    """What `schedlab report PATH` draws from: one run directory or a suite of them."""

    root: Path
    runs: tuple[RunData, ...]
    is_suite: bool


# ---- loading ---------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return (path / RUN_JSON).is_file()


def load(path: str | Path) -> Suite:
    """Load a run directory or a suite; one SchedlabError if it is neither or a file is bad."""
    root = Path(path)
    if not root.is_dir():
        raise SchedlabError(f"{root} is not a directory (expected a run directory from `schedlab search`)")
    if is_run_dir(root):
        return Suite(root=root, runs=(load_run(root),), is_suite=False)
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and is_run_dir(p))
    if not subdirs:
        raise SchedlabError(
            f"{root} is neither a run directory ({RUN_JSON} missing: run `{_SEARCH.format(dir=root)}` first) "
            f"nor a suite (no subdirectory holds a {RUN_JSON})"
        )
    return Suite(root=root, runs=tuple(load_run(p) for p in subdirs), is_suite=True)


def load_run(run_dir: Path) -> RunData:
    run = _required_json(run_dir, RUN_JSON, "schedlab.run")
    problems: dict[str, str] = {}
    if run.get("space") == "placement" and not (run_dir / RESULTS_JSON).is_file():
        # A placement simulated on a preset cannot be validated here: report what was searched.
        empty = parse_results({"candidates": [], "baselines": {}, "best": None, "machine": run.get("machine", {})}, run_dir)
        why = ("not validated (a placement searched on a preset is simulated only; one on --devices N local ranks "
               "is validated with `schedlab validate RUN_DIR`)")
        results = replace(empty, excluded=((RESULTS_JSON, why),))
    else:
        results = parse_results(_required_json(run_dir, RESULTS_JSON, "schedlab.results"), run_dir)
    search = _optional(problems, SEARCH_JSON, run_dir, lambda p: _as_dict(read_json(p, what="search results")))
    graph = _optional(problems, GRAPH_JSON, run_dir, Graph.load)
    traces: dict[str, Trace] = {}
    for key, rel in TRACE_FILES.items():
        t = _optional(problems, rel, run_dir, Trace.load)
        if t is not None:
            traces[key] = t
    history = _load_history(run, run_dir, problems)
    profile, profile_path = _load_profile(run, run_dir, problems)
    return RunData(
        path=run_dir,
        run=run,
        results=results,
        search=search,
        graph=graph,
        traces=traces,
        history=history,
        profile=profile,
        profile_path=profile_path,
        problems=problems,
    )


def _required_json(run_dir: Path, name: str, schema: str) -> dict[str, Any]:
    path = run_dir / name
    hint = _hint(name, run_dir)
    if not path.is_file():
        raise SchedlabError(f"{name} missing in {run_dir}: run `{hint}` first")
    try:
        d = read_json(path, what=name)
    except SchedlabError as e:
        raise SchedlabError(f"{e} (re-run `{hint}` to rewrite it)") from None
    if not isinstance(d, dict) or d.get("schema", schema) != schema:
        raise SchedlabError(f"{path} is not a {schema} file (re-run `{hint}` to rewrite it)")
    return d


def _optional(problems: dict[str, str], rel: str, run_dir: Path, read: Callable[[Path], T]) -> T | None:
    path = run_dir / rel
    if not path.is_file():
        problems[rel] = f"{rel} missing (written by `{_hint(rel, run_dir)}`)"
        return None
    try:
        return read(path)
    except (SchedlabError, KeyError, TypeError, ValueError) as e:
        problems[rel] = f"{rel} unreadable: {e}"
        return None


def _as_dict(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise SchedlabError("expected a JSON object")
    return d


# ---- results.json ------------------------------------------------------------------------


def parse_results(d: dict[str, Any], run_dir: Path) -> Results:
    """Parse results.json; a malformed field is one SchedlabError naming it.

    Plans whose measurement failed (an error, numerics that differ from eager PyTorch, no
    step times) are not errors of the file: they go to `Results.excluded` with the reason.
    Candidates that are baselines (validate measures them in one list) are kept once, as
    baselines.
    """
    where = "?"
    try:
        excluded: list[tuple[str, str]] = []
        baselines: dict[str, Measured] = {}
        for name, b in dict(d.get("baselines") or {}).items():
            where = f"baselines[{name!r}]"
            m, why = _measured(b, "baseline", str(name))
            if m is None:
                excluded.append((f"baseline {name}", why))
            else:
                baselines[str(name)] = m
        where = "candidates"
        raw = d["candidates"]
        if not isinstance(raw, list):
            raise TypeError("candidates must be a list")
        where = "best"
        best_i = d.get("best")
        if best_i is not None and not (isinstance(best_i, int) and 0 <= best_i < len(raw)):
            raise ValueError(f"best must be null or an index into the {len(raw)} candidates, not {best_i!r}")
        cands: list[Measured] = []
        best: Measured | None = None
        for i, c in enumerate(raw):
            where = f"candidates[{i}]"
            if c.get("baseline"):
                if i == best_i:
                    best = baselines.get(str(c["baseline"]))
                continue
            label = f"#{c.get('trial', i)} {c.get('strategy', '')}".strip()
            m, why = _measured(c, "candidate", label)
            if m is None:
                excluded.append((f"candidate {label}", why))
                continue
            cands.append(m)
            if i == best_i:
                best = m
        where = "machine/versions"
        machine = d.get("machine") or {}
        versions = {str(k): str(v) for k, v in dict(d.get("versions") or {}).items()}
        repeats = d.get("repeats")
        steps = d.get("steps_per_repeat")
        created = d.get("created_unix_s")
        return Results(
            candidates=tuple(cands),
            baselines=baselines,
            best=best,
            excluded=tuple(excluded),
            repeats=None if repeats is None else int(repeats),
            steps_per_repeat=None if steps is None else int(steps),
            machine=machine if isinstance(machine, dict) else {"name": str(machine)},
            versions=versions,
            created_unix_s=None if created is None else float(created),
        )
    except (KeyError, TypeError, ValueError, AttributeError, SchedlabError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise SchedlabError(
            f"corrupt {run_dir / RESULTS_JSON}: bad {where}: {detail} (re-run `{_hint(RESULTS_JSON, run_dir)}`)"
        ) from None


def _seconds(x: Any, what: str) -> float:
    v = float(x)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {x!r}")
    return v


def _measured(d: dict[str, Any], role: str, label: str) -> tuple[Measured | None, str]:
    """The entry as a Measured, or (None, why it has no clean measurement)."""
    plan = Plan.from_json(d["plan"])
    if d.get("error"):
        return None, str(d["error"]).splitlines()[0]
    if d.get("numeric_ok") is False:
        rel = d.get("max_rel_diff")
        return None, "numerics differ from eager PyTorch" + (f" (max rel diff {float(rel):.2e})" if rel is not None else "")
    if d.get("measured_step_time_s") is None:
        return None, "not measured"
    predicted = d.get("predicted_step_time_s")
    spread = d.get("spread_s")
    rel = d.get("max_rel_diff")
    trial = d.get("trial")
    m = Measured(
        label=label,
        role=role,
        plan=plan,
        predicted_s=None if predicted is None else _seconds(predicted, "predicted_step_time_s"),
        measured_s=_seconds(d["measured_step_time_s"], "measured_step_time_s"),
        times_s=tuple(float(t) for t in d.get("measured_step_times_s") or ()),
        spread_s=None if not spread else (float(spread[0]), float(spread[1])),
        strategy=str(d.get("strategy", "")),
        trial=None if trial is None else int(trial),
        max_rel_diff=None if rel is None else float(rel),
        speedup={str(k): float(v) for k, v in dict(d.get("speedup") or {}).items() if v is not None},
    )
    return m, ""


# ---- the Optuna study (read-only) --------------------------------------------------------


def readonly_storage_url(storage: str, run_dir: Path) -> tuple[str, Path | None]:
    """A read-only URL for a sqlite storage (and its file); other URLs unchanged.

    A relative sqlite path that does not exist from here (the run dir was moved, or
    `search` ran elsewhere) falls back to the run dir's own study.db.
    """
    prefix = "sqlite:///"
    if not storage.startswith(prefix):
        return storage, None
    path = Path(storage[len(prefix) :].split("?", 1)[0])
    if not path.is_file() and (run_dir / STUDY_DB).is_file():
        path = run_dir / STUDY_DB
    if not path.is_file():
        raise SchedlabError(f"study storage {path} missing (written by `{_hint(STUDY_DB, run_dir)}`)")
    quoted = urllib.parse.quote(str(path.resolve()))
    return f"sqlite:///file:{quoted}?mode=ro&uri=true", path


def _load_history(run: dict[str, Any], run_dir: Path, problems: dict[str, str]) -> History | None:
    study_name = run.get("study")
    storage = run.get("storage") or f"sqlite:///{run_dir / STUDY_DB}"
    if not study_name:
        problems[STUDY_DB] = f"{RUN_JSON} names no study"
        return None
    objectives = run.get("objectives") or ["time"]
    time_index = list(objectives).index("time") if "time" in objectives else 0
    try:
        return load_history(str(study_name), str(storage), run_dir, time_index)
    except SchedlabError as e:
        problems[STUDY_DB] = str(e)
    except Exception as e:  # optuna / sqlalchemy errors: a locked, old or foreign database
        problems[STUDY_DB] = f"study {study_name!r} unreadable from {storage}: {type(e).__name__}: {e}"
    return None


def load_history(study_name: str, storage: str, run_dir: Path, time_index: int = 0) -> History:
    """The trials of `study_name`, read without writing to the storage.

    `time_index`: which objective is the step time (a search may also minimise memory).
    """
    import optuna

    url, _ = readonly_storage_url(storage, run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if url.startswith("sqlite:"):
            rdb = optuna.storages.RDBStorage(url, skip_table_creation=True)
            study = optuna.load_study(study_name=study_name, storage=rdb)
        else:
            study = optuna.load_study(study_name=study_name, storage=url)
        frozen = study.get_trials(deepcopy=False)
    points = []
    other = 0
    for t in frozen:
        ok = t.state == optuna.trial.TrialState.COMPLETE and t.values and len(t.values) > time_index
        v = t.values[time_index] if ok else None
        if v is None or not math.isfinite(v):
            other += 1
            continue
        points.append(TrialPoint(number=t.number, value_s=float(v), strategy=str(t.user_attrs.get("strategy", "?"))))
    points.sort(key=lambda p: p.number)
    return History(study_name=study_name, storage=storage, trials=tuple(points), n_other=other)


# ---- the Profile -----------------------------------------------------------------------


def profile_candidates(run: dict[str, Any], run_dir: Path) -> list[Path]:
    """Where the run's Profile may be: a copy in the run dir, then the path run.json names."""
    out = [run_dir / PROFILE_JSON]
    named = run.get("profile")
    if named:
        p = Path(str(named))
        out += [p] if p.is_absolute() else [p, run_dir / p]
    return out


def _load_profile(run: dict[str, Any], run_dir: Path, problems: dict[str, str]) -> tuple[Profile | None, Path | None]:
    where = next((p for p in profile_candidates(run, run_dir) if p.is_file()), None)
    if where is None:
        named = run.get("profile")
        problems["profile"] = (
            f"profile {named} not found" if named else f"{RUN_JSON} names no profile"
        ) + " (run `schedlab calibrate`)"
        return None, None
    try:
        from schedlab.calibrate.profile import Profile

        return Profile.load(where, check_machine=False), where
    except Exception as e:  # the profile format is young: a bad profile skips one figure only
        problems["profile"] = f"profile {where} unreadable: {e}"
        return None, None


def file_sha256(path: Path) -> str:
    """First 16 hex digits of the file's SHA-256 (to tell which stored file a figure used)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]
