"""The TF-against-PyTorch figure from a saved `schedlab bench --backend tensorflow --json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.errors import SchedlabError
from schedlab.reports.figures.framework_bench import NAME, load_bench


def bench_file(path: Path, **row_changes: object) -> Path:
    row = {"tf_step_s": 0.27, "tf_step_times_s": [0.26, 0.3], "eager_step_s": 0.3, "eager_step_times_s": [0.29, 0.33],
           "exec_step_s": 0.31, "exec_step_times_s": [0.3, 0.32], "ratio_tf_vs_eager": 0.9, "numerics_ok": True,
           **row_changes}
    path.write_text(json.dumps({
        "machine": {"hostname": "vm", "cpu_model": "Test CPU"}, "size": "tiny", "optimizer": "adam", "rounds": 2,
        "repeats": 10, "tf_threads": {"intra_op": 2, "inter_op": 1}, "torch_plan": {"threads": 2},
        "results": {"mlp": row, "cnn": {**row, "numerics_ok": False}},
    }))
    return path


def test_report_draws_a_saved_tf_bench(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = bench_file(tmp_path / "bench.json")
    assert main(["report", str(src), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (fig,) = out["figures"]
    assert fig["name"] == NAME and fig["basis"] == "measured"
    assert all(Path(f).is_file() for f in fig["files"])
    figures = json.loads(Path(out["figures_json"]).read_text())
    assert "tf_over_eager" in json.dumps(figures) and Path(out["index"]).parent == tmp_path / "bench-report"
    data = load_bench(src)
    assert [r.workload for r in data.rows] == ["mlp", "cnn"] and not data.rows[1].numerics_ok
    assert data.optimizer == "adam" and data.torch_threads == 2


def test_a_bench_without_a_side_is_one_clear_error(tmp_path: Path) -> None:
    bad = bench_file(tmp_path / "bad.json", exec_step_s="fast")
    with pytest.raises(SchedlabError, match="no step times for every side"):
        load_bench(bad)
    with pytest.raises(SchedlabError, match="not a positive number"):
        load_bench(bench_file(tmp_path / "zero.json", tf_step_s=0.0))


def test_the_cli_says_what_it_drew(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert main(["report", str(bench_file(tmp_path / "b.json"))]) == 0
    assert "report of TensorFlow bench b.json: 1 figure(s)" in capsys.readouterr().out
