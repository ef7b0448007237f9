"""`schedlab validate` replaces results.json and traces/ together, or leaves both as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.reports.load import file_sha256


def _files(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): file_sha256(p)
        for p in [run_dir / "results.json", *sorted((run_dir / "traces").iterdir())]
    }


def test_a_failed_validation_keeps_the_previous_results_and_traces(
    tmp_path: Path, profile_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from schedlab.search import validate

    run_dir = tmp_path / "mlp"
    search = ["search", "mlp", "--size", "tiny", "--run-dir", str(run_dir), "--profile", str(profile_path)]
    assert main([*search, "--strategy", "paper-concurrency", "--no-trace-calibration", "--no-progress"]) == 0
    check = ["validate", str(run_dir), "--top", "1", "--repeats", "1", "--steps", "1", "--no-progress"]
    assert main(check) == 0
    before = _files(run_dir)
    assert {"results.json", "traces/best.exec.json", "traces/best.sim.json"} <= set(before)

    def disk_full(run_dir: Path, results: dict) -> Path:  # type: ignore[type-arg]
        raise OSError(28, "No space left on device")

    # The traces are written (into the staged folder) before results.json fails.
    monkeypatch.setattr(validate, "write_results", disk_full)
    with pytest.raises(OSError, match="No space left"):
        validate.validate_run(run_dir, top=1, repeats=1, steps=1, progress=False)
    assert _files(run_dir) == before
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []  # no .traces.new.* left behind
