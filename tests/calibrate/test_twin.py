"""The rank calibration's twin (`calibrate.twin`): the same step on another core, started
and stopped around a calibration, never left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedlab.calibrate.twin import Twin
from schedlab.errors import SchedlabError
from tests.conftest import captured_workload

needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


@needs_two_cores
def test_a_twin_runs_pinned_beside_the_block_and_is_gone_after_it() -> None:
    _, c = captured_workload("mlp")
    core = max(os.sched_getaffinity(0))
    with Twin(c.graph, c.input_values, core) as twin:  # type: ignore[attr-defined]
        proc, folder = twin._proc, twin._dir
        assert proc is not None and folder is not None
        assert proc.poll() is None  # running: it printed that it ran a step
        assert os.sched_getaffinity(proc.pid) == {core}
    assert proc.poll() is not None  # stopped when the block ended
    assert not folder.exists()


@needs_two_cores
def test_a_twin_that_cannot_start_is_one_clear_error_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    _, c = captured_workload("mlp")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    bad = dict(c.input_values)  # type: ignore[attr-defined]
    bad.pop(next(iter(bad)))  # a graph input without its tensor: the twin's first step fails
    with pytest.raises(SchedlabError, match="twin step failed"), Twin(c.graph, bad, max(os.sched_getaffinity(0))):  # type: ignore[attr-defined]
        pass
    assert list(tmp_path.iterdir()) == []


@needs_two_cores
def test_the_rank_calibration_runs_beside_a_twin_or_alone() -> None:
    from schedlab.calibrate.rank_fidelity import calibration_traces
    from schedlab.cli.common import plan_steps_of

    step_of = plan_steps_of("mlp", "tiny", "sgd")
    for twin in (True, False):
        traces = calibration_traces(step_of, [(2, 1)], steps=2, warmup=1, twin=twin)
        _, runs = traces[(2, 1)]
        assert len(runs) == 1 and runs[0].events
