"""The whole loop end to end (slow): calibrate-free demo on a tiny workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.machine import detect_host
from tests.calibrate.factories import make_profile


@pytest.mark.slow
def test_demo_runs_the_whole_loop(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    profile = make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")
    run_dir = tmp_path / "run"
    rc = main(["demo", "--model", "mlp", "--size", "tiny", "--trials", "20", "--top", "1",
               "--profile", str(profile), "--run-dir", str(run_dir)])
    assert rc == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert {"pytorch-default", "tensorflow-recommended"} <= set(results["baselines"])
    assert all(c["max_rel_diff"] <= 1e-5 for c in results["candidates"] if c.get("max_rel_diff") is not None)
    index = run_dir / "report" / "index.html"
    assert index.exists() and str(index.resolve()) in capsys.readouterr().out
    assert list((run_dir / "report").glob("*.png")) and list((run_dir / "report").glob("*.pdf"))
