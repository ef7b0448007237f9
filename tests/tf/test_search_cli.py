"""`schedlab search|validate|report` with `--backend tensorflow`: TF's threading searched in
simulation and measured in TensorFlow, in a run directory of the usual layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from schedlab.cli import main
from schedlab.machine import detect_host
from schedlab.search.tf_search import TF_DEFAULT, TF_RECOMMENDED, tf_baselines, tf_settings
from schedlab.tf.runtime import TFThreads


def test_the_space_is_every_pair_and_the_baselines_are_tfs() -> None:
    assert tf_settings(2) == [TFThreads(1, 1), TFThreads(1, 2), TFThreads(2, 1), TFThreads(2, 2)]
    assert len(tf_settings(16)) == 256
    base = tf_baselines(detect_host())
    assert base[TF_DEFAULT] == TFThreads(0, 0)
    assert base[TF_RECOMMENDED].intra_op >= 1 and base[TF_RECOMMENDED].inter_op >= 1


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--devices", "2"), "--devices: not for --backend tensorflow"),
        (("--strategy", "ooo"), "strategy exhaustive"),
    ],
)
def test_what_a_tf_search_cannot_do_is_refused(capsys, tmp_path: Path, extra: tuple[str, ...], says: str) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    assert main(["search", "mlp", "--size", "tiny", "--backend", "tensorflow", "--run-dir", str(run_dir), *extra]) != 0
    assert says in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_model_without_a_tf_version_is_refused(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert main(["search", "heldout:gru-tagger", "--backend", "tensorflow", "--run-dir", str(tmp_path / "r")]) != 0
    assert "has no TensorFlow version" in capsys.readouterr().err


def test_simulating_tf_needs_a_tf_search(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "mlp", "--size", "tiny", "--backend", "tensorflow", "--run-dir", str(tmp_path)]) != 0
    assert "holds no TensorFlow search" in capsys.readouterr().err
    assert main(["simulate", "mlp", "--size", "tiny", "--intra-op", "1"]) != 0
    assert "are for --backend tensorflow" in capsys.readouterr().err


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short calibration: the machine's co-run contention and unseen kernels for the TF cost model."""
    from schedlab.calibrate import run_calibration
    from tests.calibrate.test_run import TINY

    out = tmp_path_factory.mktemp("tf-search") / "profile.json"
    run_calibration(quick=True, out=out, progress=False, config=TINY)
    return out


@pytest.mark.slow
def test_search_validate_report_in_tensorflow(capsys, tmp_path: Path, profile: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    assert main(["search", "mlp", "--size", "tiny", "--backend", "tensorflow", "--profile", str(profile),
                 "--run-dir", str(run_dir), "--no-progress", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)
    cores = detect_host().default_device.cores
    assert search["n_trials"] == cores * cores and search["backend"] == "tensorflow"
    assert set(search["baselines"]) == {TF_RECOMMENDED, TF_DEFAULT}
    times = [r["predicted_step_time_s"] for r in search["best"]]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert all(c["numerics_ok"] for c in search["calibration"])
    run = json.loads((run_dir / "run.json").read_text())
    assert run["backend"] == "tensorflow" and run["space"] == "tf-threading"
    assert (run_dir / "graph.json").exists() and (run_dir / "tf_costs.json").exists()

    # one setting predicted from the search's graph and cost model: what the search predicted for it
    row = search["best"][0]
    assert main(["simulate", "mlp", "--size", "tiny", "--backend", "tensorflow",
                 "--intra-op", str(row["tf_threads"]["intra_op"]), "--inter-op", str(row["tf_threads"]["inter_op"]),
                 "--run-dir", str(run_dir), "--out", str(tmp_path / "sim.json"), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["predicted_step_time_s"] == pytest.approx(row["predicted_step_time_s"], rel=1e-9)
    assert (tmp_path / "sim.json").exists()

    assert main(["validate", str(run_dir), "--top", "2", "--repeats", "1", "--steps", "2", "--no-progress",
                 "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results == {**json.loads((run_dir / "results.json").read_text()), "paths": results["paths"]}
    assert set(results["baselines"]) == {TF_RECOMMENDED, TF_DEFAULT}
    assert results["baselines"][TF_DEFAULT]["tf_threads"] == {"intra_op": 0, "inter_op": 0}
    for c in results["candidates"]:
        assert c["measured_step_time_s"] > 0 and c["numeric_ok"] and len(c["measured_step_times_s"]) == 2
    best = results["candidates"][results["best"]]
    assert best["measured_step_time_s"] == min(c["measured_step_time_s"] for c in results["candidates"])

    assert (run_dir / "traces" / "best.exec.json").exists() and (run_dir / "traces" / "best.sim.json").exists()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report" / "speedup.png").exists()
    assert (run_dir / "report" / "gantt.png").exists()  # the best setting, simulated beside measured
    assert "mlp/tiny (TF)" in (run_dir / "report" / "figures.json").read_text()  # told apart from a torch run

    # a second search into the same folder is refused: the run is whole already
    assert main(["search", "mlp", "--size", "tiny", "--backend", "tensorflow", "--run-dir", str(run_dir)]) != 0
    assert "not an empty folder" in capsys.readouterr().err


def test_layer_splits_cut_the_layer_groups_in_program_order() -> None:
    from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
    from schedlab.search.tf_search import layer_groups, layer_splits

    layers = ["tok_emb", "blocks.0.attn.qkv", "blocks.0.mlp", None, "blocks.1.attn.qkv", "head"]
    ops = tuple(Op(id=i, name=f"n{i}", target="tf.Relu", kind=OpKind.F, args=(), kwargs={}, inputs=(i,),
                   outputs=(i + 1,), flops=1.0, bytes_moved=8, layer=lay) for i, lay in enumerate(layers))
    g = Graph(name="g", inputs=(GraphInput(0, "x", InputRole.USER),), ops=ops,
              outputs=(GraphOutput(len(ops), "loss", OutputRole.LOSS),), values=(TensorMeta((2,), "float32", 8),) * 7)
    assert layer_groups(g) == ["tok_emb", "blocks.0", "blocks.1", "head"]
    assert layer_splits(g) == [
        {"blocks.0": "cpu1", "blocks.1": "cpu1", "head": "cpu1"},
        {"blocks.1": "cpu1", "head": "cpu1"},
        {"head": "cpu1"},
    ]


@pytest.mark.slow
def test_a_tf_placement_search_predicts_and_validates_placed_plans(capsys, tmp_path: Path, profile: Path) -> None:  # type: ignore[no-untyped-def]
    """--space placement: every threading setting also with each layer split on two CPU
    devices; `simulate --plan` repeats a placed row's prediction; validation runs a placed
    plan placed (search.json's best cut to that one row, so it is validated beside the baselines)."""
    from schedlab.plan import Plan

    run_dir = tmp_path / "run"
    assert main(["search", "mlp", "--size", "tiny", "--backend", "tensorflow", "--space", "placement",
                 "--profile", str(profile), "--run-dir", str(run_dir), "--no-progress", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)
    cores = detect_host().default_device.cores
    assert json.loads((run_dir / "run.json").read_text())["space"] == "tf-threading+placement"
    assert search["n_trials"] == cores * cores * 3  # unplaced, and each of 2 cuts of body.0 | body.2 | head
    placed = [r for r in json.loads((run_dir / "search.json").read_text())["best"] if r["plan"]["placement"]["layers"]]
    assert placed and all(r["tf_threads"]["cpu_devices"] == 2 for r in placed)
    row = placed[0]
    (tmp_path / "placed.json").write_text(json.dumps(row["plan"]))
    assert main(["simulate", "mlp", "--size", "tiny", "--backend", "tensorflow", "--plan", str(tmp_path / "placed.json"),
                 "--run-dir", str(run_dir), "--out", str(tmp_path / "sim.json"), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["predicted_step_time_s"] == pytest.approx(row["predicted_step_time_s"], rel=1e-9)
    assert sim["devices"] == 2 and sim["transfers"] > 0

    s = json.loads((run_dir / "search.json").read_text())
    (run_dir / "search.json").write_text(json.dumps({**s, "best": [row]}))
    assert main(["validate", str(run_dir), "--top", "1", "--repeats", "1", "--steps", "2", "--no-progress",
                 "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    (cand,) = [c for c in results["candidates"] if c["baseline"] is None]
    assert Plan.from_json(cand["plan"]).layer_devices == Plan.from_json(row["plan"]).layer_devices
    assert cand["tf_threads"]["cpu_devices"] == 2 and cand["numeric_ok"] and cand["measured_step_time_s"] > 0

    # the placement map draws TF's logical CPU devices: the fastest unplaced and placed settings
    (run_dir / "search.json").write_text(json.dumps(s))  # the search's own best list again
    assert main(["report", str(run_dir)]) == 0
    figures = json.loads((run_dir / "report" / "figures.json").read_text())
    pmap = next(f for f in figures["figures"] if f["name"] == "placement_map")["conditions"]
    assert pmap["devices"] == ["cpu0", "cpu1"] and set(pmap["strategies"]) == {"placed", "unplaced"}
    assert set(pmap["strategies"]["placed"]["ops_per_device"]) == {"cpu0", "cpu1"}
