"""`schedlab trace --backend tensorflow`: the JSON contract, refusals, a dead or slow worker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from schedlab.cli import main
from schedlab.graph import Graph, OutputRole
from schedlab.trace import Trace


def _run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _workers_under(folder: Path) -> list[int]:
    """Pids of TensorFlow workers whose job folder is inside `folder`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "schedlab.exec.tf_worker" in cmd and str(folder) in cmd:
            pids.append(int(pid))
    return pids


def test_trace_json_contract(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out_path = tmp_path / "tf.json"
    rc, out, _ = _run(capsys, "trace", "mlp", "--size", "tiny", "--backend", "tensorflow", "--intra-op", "1",
                      "--inter-op", "2", "--steps", "3", "--out", str(out_path), "--json")
    assert rc == 0
    d = json.loads(out)
    for key in ("step_time_s", "step_times_s", "max_abs_grad_diff", "trace", "chrome_trace"):
        assert key in d, key
    assert len(d["step_times_s"]) == 3 and d["step_time_s"] > 0
    assert d["backend"] == "tensorflow" and d["threads"] == {"intra_op": 1, "inter_op": 2}
    assert d["numerics_ok"] and d["torch_check"]["numerics_ok"]
    assert d["torch_max_abs_grad_diff"] < 1e-5
    trace = Trace.load(d["trace"])
    assert trace.meta["backend"] == "tensorflow" and trace.meta["threads"]["inter_op"] == 2
    assert {e.threads for e in trace.events} == {1}
    graph = Graph.load(d["graph"])
    assert trace.meta["graph_hash"] == graph.hash
    assert len([o for o in graph.outputs if o.role is OutputRole.GRAD]) == 6  # 3 Linear layers
    chrome = json.loads(Path(d["chrome_trace"]).read_text())
    assert any(e.get("ph") == "X" for e in chrome["traceEvents"])


def test_a_plan_tensorflow_cannot_honour_is_refused_before_anything_runs(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    assert _run(capsys, "plan", "mlp", "--size", "tiny", "--order", "critical-path", "--slots", "2",
                "-o", str(plan))[0] == 0
    rc, _, err = _run(capsys, "trace", "mlp", "--size", "tiny", "--backend", "tensorflow", "--plan", str(plan))
    assert rc == 2  # an order needs one slot on TF: its control dependencies run nodes one at a time
    assert "cannot run on the TensorFlow backend" in err and "op order" in err and "needs slots 1" in err


def test_tensorflow_flags_without_the_backend_are_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "trace", "mlp", "--size", "tiny", "--intra-op", "2")
    assert rc == 2 and "--backend tensorflow" in err


def test_a_model_without_a_tensorflow_version_is_refused(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = _run(capsys, "trace", "heldout:encoder-classifier", "--size", "tiny", "--backend", "tensorflow",
                      "--out", str(tmp_path / "x.json"))
    assert rc == 2 and "no TensorFlow version" in err
    assert not (tmp_path / "x.json").exists()


def test_a_worker_error_is_its_one_message_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from schedlab.errors import SchedlabError
    from schedlab.exec.tf_job import TFRequest
    from schedlab.exec.tf_launch import run_tf_worker
    from schedlab.tf.runtime import TFThreads

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # The worker itself refuses a model without a TensorFlow version (a caller that skipped the check).
    with pytest.raises(SchedlabError) as e:
        run_tf_worker(TFRequest("heldout:gru-tagger", "tiny", TFThreads(1, 1), steps=1, warmup=0), timeout_s=60)
    msg = str(e.value)
    assert msg.startswith("TensorFlow worker (intra-op 1, inter-op 1): ") and "no TensorFlow version" in msg
    assert "oneDNN" not in msg  # TF's start-up chatter stays in the log
    assert not list(tmp_path.glob("schedlab-tf-*"))  # the job folder is gone
    assert not _workers_under(tmp_path)


def test_a_worker_that_makes_no_progress_is_stopped_within_the_timeout(  # type: ignore[no-untyped-def]
    capsys, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # Starting TensorFlow alone takes seconds: with a 0.5 s timeout the worker is stopped first.
    rc, _, err = _run(capsys, "trace", "mlp", "--size", "tiny", "--backend", "tensorflow", "--timeout-s", "0.5",
                      "--out", str(tmp_path / "x.json"))
    assert rc == 2
    assert "TensorFlow worker" in err and "0.5 s" in err
    assert not _workers_under(tmp_path)
    assert not list(tmp_path.glob("schedlab-tf-*"))
