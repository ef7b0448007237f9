"""Searches as real processes: SIGKILL then resume loses no trial; two workers share one budget."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _search(run_dir: Path, profile: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "schedlab", "search", "mlp", "--size", "tiny", "--run-dir", str(run_dir),
        "--profile", str(profile), "--no-progress", *extra,
    ]


def _env() -> dict[str, str]:
    return dict(os.environ)


def _trials(db: Path, state: str = "COMPLETE") -> dict[int, tuple[float, str]]:
    """trial number -> (value, params) of the trials in `state`, read straight from the SQLite file."""
    if not db.exists():
        return {}
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            rows = con.execute(
                "SELECT t.number, v.value, (SELECT group_concat(p.param_name || '=' || p.param_value, ',') "
                "FROM trial_params p WHERE p.trial_id = t.trial_id) "
                "FROM trials t LEFT JOIN trial_values v ON v.trial_id = t.trial_id WHERE t.state = ?",
                (state,),
            ).fetchall()
    except sqlite3.OperationalError:  # schema not created yet
        return {}
    return {n: (v, p or "") for n, v, p in rows}


def test_search_killed_with_sigkill_resumes_without_losing_trials(tmp_path: Path, profile_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "run" / "study.db"
    cmd = _search(run_dir, profile_path, "--trials", "60")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    before: dict[int, tuple[float, str]] = {}
    while time.monotonic() < deadline and proc.poll() is None:
        before = _trials(db)
        if len(before) >= 10:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"search ended before it could be killed: {proc.stderr.read().decode()[-500:]}"  # type: ignore[union-attr]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _trials(db)  # everything committed before the kill
    assert 10 <= len(before) < 60
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    after = _trials(db)
    assert len(after) == 60
    assert all(after.get(n) == v for n, v in before.items())  # every earlier trial kept, unchanged
    assert not _trials(db, "RUNNING")  # the trial the kill interrupted was failed on restart


@pytest.mark.slow
def test_two_workers_complete_the_asked_trials_together(tmp_path: Path, profile_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "run" / "study.db"
    n = 120
    done = subprocess.run(
        _search(run_dir, profile_path, "--trials", str(n), "--workers", "2", "--space", "concurrency"),
        cwd=tmp_path, env=_env(), capture_output=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    assert len(_trials(db)) == n
    assert not _trials(db, "RUNNING")
    with sqlite3.connect(db) as con:
        workers = {
            w for (w,) in con.execute(
                "SELECT DISTINCT a.value_json FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id "
                "WHERE a.key = 'worker' AND t.state = 'COMPLETE'"
            )
        }
    assert len(workers) == 2  # both processes contributed
    assert (run_dir / "logs" / "worker-0.log").exists() and (run_dir / "search.json").exists()
