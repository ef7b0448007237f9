"""A run's study opens in optuna-dashboard, as the README says: `optuna-dashboard sqlite:///RUN/study.db`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def dashboard_cli() -> Path:
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install 'schedlab[dashboard]')")
    cli = Path(sys.executable).parent / "optuna-dashboard"
    if not cli.exists():
        pytest.skip(f"no optuna-dashboard command next to {sys.executable}")
    return cli


@pytest.fixture
def serve(dashboard_cli: Path) -> Iterator[Any]:
    """serve(storage_url) starts the dashboard on 127.0.0.1 and returns its base URL; stopped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(storage: str) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [str(dashboard_cli), storage, "--host", "127.0.0.1", "--port", str(port), "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"optuna-dashboard exited: {proc.stderr.read().decode()[-1000:]}"  # type: ignore[union-attr]
            try:
                _get(f"{base}/api/meta")
                return base
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "optuna-dashboard did not answer within 60 s"
                time.sleep(0.2)

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.mark.slow
def test_a_runs_study_reads_back_through_the_dashboards_api(tmp_path: Path, profile_path: Path, serve: Any) -> None:
    n = 12
    done = subprocess.run(
        [
            sys.executable, "-m", "schedlab", "search", "mlp", "--size", "tiny", "--trials", str(n), "--no-progress",
            "--run-dir", "runs/x", "--profile", str(profile_path),
        ],
        cwd=tmp_path, capture_output=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    study_name = json.loads((tmp_path / "runs" / "x" / "run.json").read_text())["study"]
    base = serve(f"sqlite:///{tmp_path / 'runs' / 'x' / 'study.db'}")

    summaries = _get(f"{base}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == [study_name]
    detail = _get(f"{base}/api/studies/{summaries[0]['study_id']}")
    assert detail["name"] == study_name
    complete = [t for t in detail["trials"] if t["state"] == "Complete"]
    assert len(complete) == n == len(detail["trials"])
    attrs = {a["key"]: a["value"] for a in complete[0]["user_attrs"]}
    assert attrs["strategy"] == "optuna" and "started_utc" in attrs
