"""The fidelity figure, drawn from a synthetic `schedlab fidelity` results file only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedlab.errors import SchedlabError
from schedlab.reports.figures import fidelity

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLANS = [f"s{s}-t{t}-{o}" for s in (1, 2) for t in (1, 2) for o in ("topo", "critical-path", "w-last", "random:0")]


def _row(
    workload: str, plan: str, method: str, measured: float, predicted: float, cal: bool, scored: bool = True
) -> dict[str, Any]:
    return {
        "workload": workload, "plan": plan, "method": method, "measured_s": measured,
        "measured_spread_s": [measured * 0.95, measured * 1.1], "predicted_s": predicted,
        "sim_wall_s": 1e-3, "sim_cold_s": 2e-3, "ops": 100, "in_calibration": cal,
        "error": predicted / measured - 1, "scored": scored, "foreign_cpu_frac": 0.5 if plan == "s2-t2-topo" else 0.1,
    }


def held_out_file(tmp_path: Path) -> Path:
    """Two models over the 16 plans; profile-only is 50% low everywhere, trace-calibrated exact
    except on the calibration plan, which is 100% high (so leaving it out is visible)."""
    rows = []
    for wi, (w, base) in enumerate((("heldout:gru-tagger", 0.150), ("heldout:mixer", 0.012))):
        for pi, plan in enumerate(PLANS):
            measured = base * (1 + 0.1 * pi + wi)
            cal = plan == "s1-t1-topo"
            rows.append(_row(w, plan, "profile-only", measured, measured * 0.5, False))
            rows.append(_row(w, plan, "trace-calibrated", measured, measured * (2.0 if cal else 1.0), cal, not cal))
    d = {
        "set": "held-out", "machine": {"hostname": "testhost", "cpu_model": "Test CPU"}, "cores": 2,
        "versions": {"torch": "2.13.0", "python": "3.11"}, "size": "default", "optimizer": "sgd",
        "steps_per_plan": 5, "calibration_plan": "s1-t1-topo", "plans": rows,
    }
    path = tmp_path / "fidelity-heldout.json"
    path.write_text(json.dumps(d))
    return path


def test_held_out_file_draws_two_panels_with_the_calibration_plan_left_out(tmp_path: Path) -> None:
    data = fidelity.load_fidelity(held_out_file(tmp_path))
    assert data.held_out and data.methods == ["profile-only", "trace-calibrated"]
    assert data.workloads == ["heldout:gru-tagger", "heldout:mixer"]
    assert sum(1 for p in data.points if not p.scored) == 2  # one calibration plan per model
    rec = fidelity.draw(data, tmp_path / "out" / "fidelity")
    png, pdf = rec.files
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20_000
    assert pdf.read_bytes()[:5] == b"%PDF-"
    panels = rec.conditions["panels"]
    assert panels["profile-only"]["mape_pct"] == pytest.approx(50.0) and panels["profile-only"]["n_scored"] == 32
    # exact on every scored plan: the 100% error of the calibration plans does not count
    assert panels["trace-calibrated"]["mape_pct"] == pytest.approx(0.0) and panels["trace-calibrated"]["n_scored"] == 30
    assert panels["trace-calibrated"]["median_kendall_tau"] == pytest.approx(1.0)
    assert rec.conditions["axes"] == "log-log"  # 12 ms to 0.6 s
    assert rec.conditions["models"]["mixer"]["profile-only"]["n_scored"] == 16
    assert rec.sources == (data.path,) and rec.basis == "measured and simulated"
    assert "held-out" in rec.title and "left out" in rec.caption and "Test CPU" in rec.conditions_text
    assert data.foreign_cpu_fracs.count(0.5) == 2  # one measurement per model and plan, not per prediction
    assert rec.conditions["foreign_cpu_frac"] == {"median": pytest.approx(0.1), "max": pytest.approx(0.5)}


def test_a_dev_set_file_draws_as_the_held_out_protocol_and_names_its_set(tmp_path: Path) -> None:
    path = held_out_file(tmp_path)
    d = json.loads(path.read_text())
    d["set"] = "dev"
    for r in d["plans"]:
        r["workload"] = r["workload"].replace("heldout:", "dev:")
    path.write_text(json.dumps(d))
    data = fidelity.load_fidelity(path)
    assert data.held_out and data.set_name == "dev" and data.methods == ["profile-only", "trace-calibrated"]
    rec = fidelity.draw(data, tmp_path / "out" / "fidelity")
    assert rec.title.endswith("dev models") and "dev models" in rec.caption and "left out" in rec.caption
    assert rec.conditions["set"] == "dev" and set(rec.conditions["models"]) == {"gru-tagger", "mixer"}


def test_builtin_file_without_methods_draws_one_panel(tmp_path: Path) -> None:
    # A built-in file as `schedlab fidelity` wrote it before rows named their method.
    rows = [_row("mlp", p, "", 0.1 + 0.001 * i, 0.1 + 0.001 * i, p.startswith("s1-") and p.endswith("topo"))
            for i, p in enumerate(PLANS)]
    for r in rows:
        del r["method"], r["scored"]
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps({"trace_calibration": False, "machine": {}, "plans": rows}))
    data = fidelity.load_fidelity(path)
    assert not data.held_out and data.methods == ["profile-only"] and all(p.scored for p in data.points)
    rec = fidelity.draw(data, tmp_path / "fidelity")
    assert rec.conditions["axes"] == "linear"  # 100 to 115 ms
    assert rec.conditions["panels"]["profile-only"]["mape_pct"] == pytest.approx(0.0)
    assert all(f.is_file() for f in rec.files)


@pytest.mark.parametrize(
    "content, msg",
    [
        ("{", "not valid JSON"),
        (json.dumps({"plans": "x"}), "not a fidelity results file"),
        (json.dumps({"plans": []}), "holds no plans"),
        (json.dumps({"plans": [{"workload": "w", "plan": "p", "measured_s": 0, "predicted_s": 1}]}), "plans[0]"),
        (json.dumps({"plans": [{"workload": "w", "plan": "p", "measured_s": 1, "predicted_s": 1, "method": "x"}]}),
         "method must be one of"),
    ],
)
def test_bad_file_is_one_clear_error(tmp_path: Path, content: str, msg: str) -> None:
    path = tmp_path / "f.json"
    path.write_text(content)
    with pytest.raises(SchedlabError) as info:
        fidelity.load_fidelity(path)
    assert msg in str(info.value) and "\n" not in str(info.value)


def test_schedlab_report_draws_a_fidelity_results_file(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.cli import main

    path = held_out_file(tmp_path)
    before = path.read_bytes()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    report = tmp_path / "fidelity-heldout-report"
    assert "fidelity results fidelity-heldout.json" in out and str(report) in out
    assert (report / "fidelity.png").read_bytes()[:8] == PNG_MAGIC and (report / "fidelity.pdf").is_file()
    index = (report / "index.html").read_text()
    assert "Simulator fidelity" in index and "a fidelity results file" in index and "fidelity.png" in index
    figs = json.loads((report / "figures.json").read_text())
    (fig,) = figs["figures"]
    assert fig["name"] == "fidelity" and fig["sources"] == ["../fidelity-heldout.json"]
    assert "schedlab.reports.figures.fidelity" in fig["redraw"] and figs["skipped"] == []
    assert path.read_bytes() == before  # reports only read


def test_schedlab_report_rejects_a_file_that_is_not_fidelity_results(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.cli import main

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"candidates": []}))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a fidelity results file" in err and "Traceback" not in err
    assert not (tmp_path / "results-report").exists()
