"""The run directory (see search/RUN_DIR.md): run.json, graph.json, study.db, search.json,
results.json and traces/, each JSON written atomically."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.io import read_json, write_json_atomic

RUN_SCHEMA = "schedlab.run"
RUN_VERSION = 1
RESULTS_SCHEMA = "schedlab.results"
RESULTS_VERSION = 1
STUDY_DB = "study.db"


@dataclass(frozen=True)
class RunPaths:
    """Where each file of a run directory lives."""

    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run.json"

    @property
    def graph(self) -> Path:
        return self.root / "graph.json"

    def micro_graph(self, micro_batches: int, replicas: int = 1) -> Path:
        """The graph a plan of `micro_batches` and `replicas` (not both 1) resolves against:
        one replica's micro-batch step."""
        name = f"m{micro_batches}" if replicas == 1 else f"r{replicas}-m{micro_batches}"
        return self.root / "graphs" / f"{name}.json"

    @property
    def study_db(self) -> Path:
        return self.root / STUDY_DB

    @property
    def profile(self) -> Path:
        """The trace-calibrated profile the search simulated with."""
        return self.root / "profile.json"

    @property
    def search(self) -> Path:
        return self.root / "search.json"

    @property
    def results(self) -> Path:
        return self.root / "results.json"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def best_exec(self) -> Path:
        return self.traces / "best.exec.json"

    @property
    def best_sim(self) -> Path:
        return self.traces / "best.sim.json"

    @property
    def baseline_exec(self) -> Path:
        return self.traces / "baseline.exec.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def default_storage(run_dir: str | Path) -> str:
    """The embedded SQLite file of a run directory, as an Optuna storage URL."""
    return f"sqlite:///{(Path(run_dir) / STUDY_DB).resolve()}"


@dataclass(frozen=True)
class RunConfig:
    """run.json: what was searched, where the study lives, and on what machine."""

    model: str
    size: str
    optimizer: str
    seed: int
    space: str
    strategy: str
    study: str
    storage: str
    trials: int
    profile: str
    machine: dict[str, Any]
    created_unix_s: float = field(default_factory=time.time)
    objectives: tuple[str, ...] = ("time",)
    devices: int | None = None  # --devices: local ranks of the host, or the first N of a preset
    machine_spec: str = "host"  # --machine: "host", a preset or a machine file
    split_fbw: bool = False  # placement groups split a layer's F, B, W and OPT work
    backend: str = "torch"  # the runtime searched for: "torch" (schedlab's executor) or "tensorflow"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "version": RUN_VERSION,
            "model": self.model,
            "size": self.size,
            "optimizer": self.optimizer,
            "seed": self.seed,
            "space": self.space,
            "strategy": self.strategy,
            "study": self.study,
            "storage": self.storage,
            "trials": self.trials,
            "profile": self.profile,
            "machine": self.machine,
            "created_unix_s": self.created_unix_s,
            "objectives": list(self.objectives),
            "devices": self.devices,
            "machine_spec": self.machine_spec,
            "split_fbw": self.split_fbw,
            "backend": self.backend,
        }

    @staticmethod
    def from_json(d: Any, source: str = "run.json") -> RunConfig:
        if not isinstance(d, dict) or d.get("schema") != RUN_SCHEMA:
            raise SchedlabError(f'{source} is not a schedlab run file (missing "schema": "{RUN_SCHEMA}")')
        if d.get("version") != RUN_VERSION:
            raise SchedlabError(f"{source} has version {d.get('version')!r}; this schedlab reads {RUN_VERSION}")
        try:
            return RunConfig(
                model=str(d["model"]),
                size=str(d["size"]),
                optimizer=str(d["optimizer"]),
                seed=int(d["seed"]),
                space=str(d["space"]),
                strategy=str(d["strategy"]),
                study=str(d["study"]),
                storage=str(d["storage"]),
                trials=int(d["trials"]),
                profile=str(d["profile"]),
                machine=dict(d["machine"]),
                created_unix_s=float(d["created_unix_s"]),
                objectives=tuple(str(o) for o in d.get("objectives", ["time"])),
                devices=None if d.get("devices") is None else int(d["devices"]),
                machine_spec=str(d.get("machine_spec", "host")),
                split_fbw=bool(d.get("split_fbw", False)),
                backend=str(d.get("backend", "torch")),
            )
        except (KeyError, TypeError, ValueError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise SchedlabError(f"corrupt {source}: {what}") from None


def read_run(run_dir: str | Path) -> RunConfig:
    paths = RunPaths(Path(run_dir))
    if not paths.run.exists():
        raise SchedlabError(
            f"{run_dir} is not a run directory (no run.json); run `schedlab search MODEL --run-dir {run_dir}` first"
        )
    return RunConfig.from_json(read_json(paths.run, what="run"), source=str(paths.run))


def write_run(run_dir: str | Path, config: RunConfig) -> Path:
    return write_json_atomic(RunPaths(Path(run_dir)).run, config.to_json(), indent=1)


def storage_url(run_dir: str | Path, config: RunConfig) -> str:
    """The study's storage. A run directory that was moved keeps finding its own study.db."""
    url = config.storage
    if url.startswith("sqlite:///") and url.endswith("/" + STUDY_DB):
        recorded = Path(url.removeprefix("sqlite:///"))
        here = RunPaths(Path(run_dir)).study_db
        if not recorded.exists() and here.exists():
            return default_storage(run_dir)
    return url


def read_search(run_dir: str | Path) -> dict[str, Any]:
    path = RunPaths(Path(run_dir)).search
    if not path.exists():
        raise SchedlabError(f"{run_dir} has no search.json: the search has not finished; run `schedlab search` again")
    d = read_json(path, what="search")
    if not isinstance(d, dict) or "best" not in d or "baselines" not in d:
        raise SchedlabError(f"corrupt {path}: expected an object with 'best' and 'baselines'")
    return d


def write_search(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    return write_json_atomic(RunPaths(Path(run_dir)).search, summary, indent=1)


def write_results(run_dir: str | Path, results: dict[str, Any]) -> Path:
    return write_json_atomic(RunPaths(Path(run_dir)).results, results, indent=1)
