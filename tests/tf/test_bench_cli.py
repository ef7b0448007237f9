"""`schedlab bench --backend tensorflow`: TF's step beside eager PyTorch's, and its refusals."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tensorflow")

from schedlab.cli import main


def test_tf_and_torch_steps_side_by_side(capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["bench", "mlp", "--backend", "tensorflow", "--size", "tiny", "--intra-op", "1", "--inter-op", "1",
               "--rounds", "1", "--repeats", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["tf_threads"] == {"intra_op": 1, "inter_op": 1}
    assert out["torch_plan"]["threads"] == 1  # torch runs at TF's intra-op thread count
    row = out["results"]["mlp"]
    assert row["numerics_ok"] is True
    assert len(row["tf_step_times_s"]) == len(row["eager_step_times_s"]) == len(row["exec_step_times_s"]) == 2
    assert row["ratio_tf_vs_eager"] == pytest.approx(row["tf_step_s"] / row["eager_step_s"])
    assert row["tf_nodes"] > 0 and row["torch_ops"] > 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("bench", "gru-tagger", "--backend", "tensorflow"), "no TensorFlow version of 'gru-tagger'"),
        (("bench", "mlp", "--backend", "tensorflow", "--ddp"), "drop --backend tensorflow"),
        (("bench", "mlp", "--intra-op", "2"), "add --backend tensorflow"),
        (("bench", "mlp", "--backend", "tensorflow", "--rounds", "0"), "--rounds must be >= 1"),
    ],
)
def test_what_the_tf_bench_cannot_do_is_refused(capsys, argv: tuple[str, ...], says: str) -> None:  # type: ignore[no-untyped-def]
    assert main(list(argv)) != 0
    assert says in capsys.readouterr().err


@pytest.mark.slow
def test_adam_runs_on_both_sides(capsys) -> None:  # type: ignore[no-untyped-def]
    """--optimizer reaches TF's worker, not only torch's step: both sides name the optimizer they built."""
    rc = main(["bench", "mlp", "--backend", "tensorflow", "--size", "tiny", "--intra-op", "1", "--inter-op", "1",
               "--rounds", "1", "--repeats", "2", "--optimizer", "adam", "--json"])
    out = json.loads(capsys.readouterr().out)
    row = out["results"]["mlp"]
    assert rc == 0 and row["numerics_ok"] is True
    assert out["optimizer"] == row["tf_optimizer"] == row["torch_optimizer"] == "adam"


def test_tf_fidelity_and_search_ask_their_workers_for_the_optimizer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every TF worker request of fidelity, search and validation carries the optimizer asked for."""
    from schedlab.calibrate import tf_fidelity
    from schedlab.errors import SchedlabError
    from schedlab.machine import detect_host
    from schedlab.search import tf_search
    from schedlab.tf.runtime import TFThreads

    asked: list[str] = []

    def fake_worker(req, timeout_s):  # type: ignore[no-untyped-def]
        asked.append(req.optimizer)
        raise SchedlabError("stop here")

    monkeypatch.setattr(tf_fidelity, "run_tf_worker", fake_worker)
    monkeypatch.setattr(tf_search, "run_tf_worker", fake_worker)
    machine = detect_host()
    with pytest.raises(SchedlabError, match="stop here"):
        tf_fidelity.tf_fidelity("mlp", "tiny", [TFThreads(1, 1)], None, machine, optimizer="adam")
    with pytest.raises(SchedlabError, match="stop here"):
        tf_search.search_tf("mlp", "tiny", machine, None, optimizer="adam")
    assert asked == ["adam", "adam"]
