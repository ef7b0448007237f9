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
