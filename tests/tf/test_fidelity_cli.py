"""`schedlab fidelity --backend tensorflow`: refusals by name, and the results contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from schedlab.cli import main


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--held-out", "gru-tagger"), "gru-tagger: not a TensorFlow held-out model"),
        (("--rounds", "0"), "--rounds must be >= 1"),
        (("--devices", "2"), "--devices is not available"),
        (("gru-tagger",), "'gru-tagger' has no TensorFlow version"),
    ],
)
def test_what_tensorflow_fidelity_cannot_do_is_refused_before_anything_runs(
    capsys, tmp_path: Path, extra: tuple[str, ...], says: str  # type: ignore[no-untyped-def]
) -> None:
    out = tmp_path / "f.json"
    rc = main(["fidelity", "--backend", "tensorflow", "--size", "tiny", "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc != 0 and says in err
    assert not out.exists()


@pytest.mark.slow
def test_results_file_contract_and_report(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.calibrate import run_calibration
    from tests.calibrate.test_run import TINY

    profile = tmp_path / "profile.json"
    run_calibration(quick=True, out=profile, progress=False, config=TINY)
    out = tmp_path / "fidelity-tf.json"
    rc = main(["fidelity", "--backend", "tensorflow", "mlp", "--size", "tiny", "--steps", "2",
               "--profile", str(profile), "--out", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed == saved
    assert saved["backend"] == "tensorflow" and saved["set"] == "built-in"
    plans = saved["plans"]
    cores = saved["cores"]
    assert len(plans) == (1 if cores == 1 else 4)
    assert {p["plan_kind"] for p in plans} == {"tensorflow"}
    assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 for p in plans)
    assert [p["in_calibration"] for p in plans] == [p["plan"].endswith("-inter1") for p in plans]
    assert saved["costs"][0]["workload"] == "mlp" and saved["costs"][0]["numerics_ok"] is True
    assert saved["costs"][0]["ops_from_torch_profile"] == {}  # every kernel was timed in its own trace
    for key in ("mape", "mape_unseen_plans", "worst_error", "workloads", "workloads_unseen_plans", "tensorflow"):
        assert key in saved
    # the torch protocol's report draws it
    assert main(["report", str(out)]) == 0
    assert list(tmp_path.glob("fidelity-tf-report/*.png"))


def test_held_out_names_the_tf_held_out_models() -> None:
    """--held-out runs every TF held-out model, or those named, with or without their module."""
    import argparse

    from schedlab.cli.fidelity_tf import tf_models
    from schedlab.tf.heldout import SPEC_PREFIX, TF_HELDOUT

    args = argparse.Namespace(held_out=True, devices=None, plan_list=[], no_trace_calibration=False, optimizer="sgd")
    assert tf_models(args, []) == [SPEC_PREFIX + m for m in TF_HELDOUT]
    assert tf_models(args, ["wide_regressor", SPEC_PREFIX + "gru_tagger"]) == [
        SPEC_PREFIX + "wide_regressor", SPEC_PREFIX + "gru_tagger"]
