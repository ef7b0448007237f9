"""N worker processes on one study: `run_workers` starts them and waits, showing progress.

Each worker is ``python -m schedlab.search.worker RUN_DIR --index K``: it reads run.json and
graph.json, loads the profile, and runs `search.study.optimize` against the study's
storage until the study holds the asked number of COMPLETE trials. The study (and, for
SQLite, the schema) must exist before the workers start; `search.runner` creates it.
A worker's stderr goes to RUN_DIR/logs/worker-K.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from schedlab.errors import SchedlabError
from schedlab.search.run_dir import RunPaths
from schedlab.search.study import completed_trials

POLL_S = 0.25


def worker_command(run_dir: Path, index: int) -> list[str]:
    return [sys.executable, "-m", "schedlab.search.worker", str(run_dir), "--index", str(index)]


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_workers(
    run_dir: Path,
    n: int,
    study: optuna.Study,
    strategy: str,
    space: str,
    target: int,
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Start `n` workers on the run directory's study and wait for all of them."""
    logs = RunPaths(run_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for k in range(n):
            log = logs / f"worker-{k}.log"
            with open(log, "wb") as f:
                procs.append(
                    (
                        subprocess.Popen(
                            worker_command(run_dir, k), stdout=subprocess.DEVNULL, stderr=f, cwd=os.getcwd()
                        ),
                        log,
                    )
                )
        while any(p.poll() is None for p, _ in procs):
            if on_progress is not None:
                on_progress(completed_trials(study, strategy, space))
            time.sleep(POLL_S)
    finally:
        for p, _ in procs:  # interrupted: stop the workers we started
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if on_progress is not None:
        on_progress(completed_trials(study, strategy, space))
    failed = [(k, p.returncode, log) for k, (p, log) in enumerate(procs) if p.returncode != 0]
    if failed:
        k, rc, log = failed[0]
        raise SchedlabError(f"{len(failed)} of {n} search worker(s) failed; worker {k} exited {rc}: {_tail(log)} (log: {log})")
