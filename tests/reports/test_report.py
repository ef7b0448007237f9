"""`schedlab report`: every figure as PNG and PDF, an index page, figures.json with conditions,
per-workload speedup for a suite, skipped figures noted, and one clear error for a bad run dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.reports import FIGURE_NAMES
from schedlab.reports.figures import gantt
from schedlab.reports.load import file_sha256
from tests.reports.fake_run import make_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _figures(report: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    d = json.loads((report / "figures.json").read_text())
    assert d["schema"] == "schedlab.report"
    return {f["name"] if not d["suite"] else f"{f['run']}.{f['name']}".lstrip("."): f for f in d["figures"]}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str]:
    """One fake run dir, reported once: (run dir, study sha before, stdout, stderr)."""
    run_dir = make_run_dir(tmp_path_factory.mktemp("runs") / "mlp-tiny")
    before = file_sha256(run_dir / "study.db")
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["report", str(run_dir)])
    assert rc == 0, err.getvalue()
    return run_dir, before, out.getvalue(), err.getvalue()


def test_report_writes_every_figure_png_and_pdf(reported: tuple[Path, str, str, str]) -> None:
    run_dir, _, out, _ = reported
    report = run_dir / "report"
    figs = _figures(report)
    skipped = json.loads((report / "figures.json").read_text())["skipped"]
    drawn = set(figs)
    # The profile may not be constructible while calibrate/ changes; then it must be noted as skipped.
    assert drawn | {s["name"] for s in skipped} == set(FIGURE_NAMES)
    assert {"speedup", "pred_vs_meas", "gantt", "history"} <= drawn
    for name in drawn:
        png, pdf = report / f"{name}.png", report / f"{name}.pdf"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
        assert pdf.read_bytes()[:5] == b"%PDF-"
        assert figs[name]["files"] == [f"{name}.png", f"{name}.pdf"]
    assert str(report / "index.html") in out


def test_figures_json_carries_conditions(reported: tuple[Path, str, str, str]) -> None:
    run_dir, _, _, _ = reported
    results = json.loads((run_dir / "results.json").read_text())
    best_plan = results["candidates"][results["best"]]["plan"]
    from schedlab.graph import Graph
    from schedlab.plan import Plan

    graph_hash = Graph.load(run_dir / "graph.json").hash
    plan_hash = Plan.from_json(best_plan).hash
    figs = _figures(run_dir / "report")
    for name, f in figs.items():
        text = f["conditions_text"]
        assert "testhost" in text and "torch 2.13.0+cpu" in text, name
        assert f["sources"] and all((run_dir / "report" / s).exists() for s in f["sources"]), name
        assert set(f["source_sha256"]) == set(f["sources"])
        assert f["redraw"].startswith("python -m schedlab.reports.figures.")
    assert graph_hash in figs["gantt"]["conditions_text"] and plan_hash in figs["gantt"]["conditions_text"]
    assert figs["gantt"]["conditions"]["plan_hash"] == plan_hash
    assert figs["gantt"]["conditions"]["measured_median_ms"] > 0
    assert "median" in figs["speedup"]["conditions_text"] and "IQR" in figs["speedup"]["conditions_text"]
    assert figs["pred_vs_meas"]["conditions"]["repeats"] == 5
    assert len(figs["pred_vs_meas"]["conditions"]["points"]) == 7
    assert figs["history"]["basis"] == "simulated"
    assert figs["history"]["conditions"]["trials"] == 29  # 30 trials, one failed
    assert figs["history"]["conditions"]["trials_not_shown"] == 1
    sp = figs["speedup"]["conditions"]["workloads"]["mlp/tiny"]["baselines"]["pytorch-default"]
    assert sp["speedup"] == pytest.approx(
        results["baselines"]["pytorch-default"]["measured_step_time_s"]
        / results["candidates"][0]["measured_step_time_s"]
    )


def test_index_html_shows_figures_and_conditions(reported: tuple[Path, str, str, str]) -> None:
    run_dir, _, _, _ = reported
    html = (run_dir / "report" / "index.html").read_text()
    for name in _figures(run_dir / "report"):
        assert f'<img src="{name}.png"' in html and f'href="{name}.pdf"' in html
    assert "simulated" in html and "testhost" in html and "5 repeats" in html
    if "thread_scaling" not in _figures(run_dir / "report"):
        assert "Not drawn" in html and "thread_scaling" in html


def test_report_leaves_the_study_unchanged(reported: tuple[Path, str, str, str]) -> None:
    run_dir, before, _, _ = reported
    assert file_sha256(run_dir / "study.db") == before


def test_single_figure_redraws_from_stored_files(reported: tuple[Path, str, str, str], tmp_path: Path) -> None:
    run_dir, _, _, _ = reported
    assert gantt.main_for(gantt.draw, "gantt", [str(run_dir), str(tmp_path)]) == 0
    assert (tmp_path / "gantt.png").read_bytes()[:8] == PNG_MAGIC and (tmp_path / "gantt.pdf").is_file()


def test_suite_gives_one_speedup_group_per_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    make_run_dir(suite / "mlp-tiny", model="mlp", n_trials=8, profile=False)
    make_run_dir(suite / "deep-tiny", model="deep", layers=5, seed=1, n_trials=8, profile=False, scale=2.5)
    (suite / "notes").mkdir()  # not a run dir: ignored
    rc, out, err = _run(capsys, "report", str(suite))
    assert rc == 0, err
    report = suite / "report"
    figs = _figures(report)
    assert set(figs["speedup"]["conditions"]["workloads"]) == {"mlp/tiny", "deep/tiny"}
    assert (report / "speedup.png").is_file() and (report / "speedup.pdf").is_file()
    for run in ("mlp-tiny", "deep-tiny"):
        for name in ("pred_vs_meas", "gantt", "history"):
            assert f"{run}.{name}" in figs
            assert (report / f"{run}.{name}.png").is_file() and (report / f"{run}.{name}.pdf").is_file()
    skipped = json.loads((report / "figures.json").read_text())["skipped"]
    assert {(s["run"], s["name"]) for s in skipped} == {("deep-tiny", "thread_scaling"), ("mlp-tiny", "thread_scaling")}
    assert "suite of 2 runs" in out


def test_missing_data_skips_figures_with_a_note(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run", n_trials=4)
    assert _run(capsys, "report", str(run_dir))[0] == 0
    assert (run_dir / "report" / "gantt.png").is_file()
    shutil.rmtree(run_dir / "traces")
    (run_dir / "study.db").unlink()
    (run_dir / "graph.json").write_text("{not json")
    rc, _, err = _run(capsys, "report", str(run_dir))
    assert rc == 0
    report = run_dir / "report"
    skipped = {s["name"]: s["reason"] for s in json.loads((report / "figures.json").read_text())["skipped"]}
    assert set(skipped) == {"gantt", "thread_scaling", "history"}
    assert "traces/best.sim.json missing" in skipped["gantt"] and "schedlab validate" in skipped["gantt"]
    assert "graph.json unreadable" in skipped["thread_scaling"]
    assert "study.db" in skipped["history"] or "study" in skipped["history"]
    assert not (report / "gantt.png").exists()  # no stale drawing left from the first report
    assert (report / "speedup.png").is_file() and (report / "pred_vs_meas.png").is_file()
    html = (report / "index.html").read_text()
    assert "Not drawn" in html and "traces/best.sim.json missing" in html
    assert "skipped gantt" in err


def test_missing_results_is_one_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run", n_trials=2, profile=False)
    (run_dir / "results.json").unlink()
    rc, out, err = _run(capsys, "report", str(run_dir))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "results.json missing" in err and f"schedlab validate {run_dir}" in err
    assert not (run_dir / "report").exists()


@pytest.mark.parametrize(
    ("content", "expect"),
    [("{oops", "not valid JSON"), ('{"schema": "schedlab.results", "candidates": [], "best": 3}', "bad best"),
     ('{"schema": "schedlab.results", "candidates": [{"plan": {}}]}', "candidates[0]")],
)
def test_corrupt_results_is_one_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, expect: str
) -> None:
    run_dir = make_run_dir(tmp_path / "run", n_trials=2, profile=False)
    (run_dir / "results.json").write_text(content)
    rc, _, err = _run(capsys, "report", str(run_dir))
    assert rc == 2 and err.count("\n") == 1
    assert "results.json" in err and expect in err and "schedlab validate" in err


def test_not_a_run_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = _run(capsys, "report", str(tmp_path))
    assert rc == 2 and "run.json missing" in err and "schedlab search" in err
    rc, _, err = _run(capsys, "report", str(tmp_path / "nope"))
    assert rc == 2 and "not a directory" in err


def test_failed_plans_and_a_winning_baseline_are_reported_not_hidden(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run_dir(tmp_path / "run", n_trials=10, profile=False, baseline_wins=True, objectives=("time", "memory"))
    rc, _, err = _run(capsys, "report", str(run_dir))
    assert rc == 0, err
    figs = _figures(run_dir / "report")
    sp = figs["speedup"]["conditions"]["workloads"]["mlp/tiny"]
    assert sp["searched_plan_won"] is False and sp["best"]["role"] == "baseline"
    # The best plan is the winning baseline: 1.00x over itself, faster than the other one.
    assert sp["baselines"]["tensorflow-recommended"]["speedup"] == 1.0
    assert sp["baselines"]["tensorflow-recommended"]["speedup_iqr"] is None
    assert sp["baselines"]["pytorch-default"]["speedup"] > 1.0
    assert sp["best_searched"]["speedup"]["tensorflow-recommended"] < 1.0  # and how the searched best fared
    caption = figs["speedup"]["caption"]
    assert "a baseline was faster than every searched plan" in caption and "tensorflow-recommended" in caption
    assert sp["excluded"] and "OpFailed" in sp["excluded"][0][1]
    # Baselines listed among the candidates (as validate writes them) are drawn once, as baselines.
    points = figs["pred_vs_meas"]["conditions"]["points"]
    assert sorted(p["role"] for p in points) == ["baseline"] * 2 + ["candidate"] * 5
    assert "Left out (no clean measurement)" in figs["pred_vs_meas"]["caption"]
    html = (run_dir / "report" / "index.html").read_text()
    assert "not measured cleanly" in html and "OpFailed" in html
    assert "best plan (= baseline tensorflow-recommended)" in html
    assert figs["history"]["conditions"]["trials"] == 9  # two objectives: the step time is drawn


@pytest.mark.parametrize("baseline_wins", [False, True])
def test_speedup_and_gantt_agree_on_the_best_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, baseline_wins: bool
) -> None:
    """Both figures draw the plan results.json names best: a baseline when a baseline won."""
    from schedlab.plan import Plan

    run_dir = make_run_dir(tmp_path / "run", n_trials=4, profile=False, baseline_wins=baseline_wins)
    results = json.loads((run_dir / "results.json").read_text())
    best = results["candidates"][results["best"]]
    assert (best["baseline"] == "tensorflow-recommended") is baseline_wins
    rc, _, err = _run(capsys, "report", str(run_dir))
    assert rc == 0, err
    figs = _figures(run_dir / "report")
    want = Plan.from_json(best["plan"]).hash
    speedup_best = figs["speedup"]["conditions"]["workloads"]["mlp/tiny"]["best"]
    gantt = figs["gantt"]["conditions"]
    assert speedup_best["plan_hash"] == gantt["plan_hash"] == want
    assert speedup_best["is"] == gantt["plan_is"]
    assert gantt["plan_is"] == ("best plan (= baseline tensorflow-recommended)" if baseline_wins else "best plan")
    # The traces are of that plan too: the Gantt chart names one plan, not a disagreement.
    assert f"plan {want}" in figs["gantt"]["conditions_text"] and "plans " not in figs["gantt"]["conditions_text"]


def test_a_report_that_fails_midway_leaves_the_previous_one_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Figures, index and figures.json are replaced together or not at all; no temp folders remain."""
    from schedlab.reports import build

    run_dir = make_run_dir(tmp_path / "run", n_trials=4, profile=False)
    assert _run(capsys, "report", str(run_dir))[0] == 0
    report = run_dir / "report"
    before = {p.relative_to(report): file_sha256(p) for p in report.rglob("*") if p.is_file()}
    assert Path("index.html") in before and Path("gantt.png") in before
    entries = sorted(p.name for p in run_dir.iterdir())

    def explode(run: object, stem: Path) -> object:
        raise RuntimeError("figure failed")

    # New data, so that every figure drawn now differs; speedup and pred_vs_meas are drawn
    # (into the new folder) before the Gantt chart fails.
    results = json.loads((run_dir / "results.json").read_text())
    (run_dir / "results.json").write_text(json.dumps({**results, "repeats": 7}))
    monkeypatch.setattr(build, "PER_RUN", tuple((n, explode if n == "gantt" else d) for n, d in build.PER_RUN))
    with pytest.raises(RuntimeError, match="figure failed"):
        build.build_report(run_dir)
    after = {p.relative_to(report): file_sha256(p) for p in report.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in run_dir.iterdir()) == entries  # no .report.new.* left behind


def test_a_new_report_replaces_the_whole_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run", n_trials=4, profile=False)
    (run_dir / "report").mkdir()
    (run_dir / "report" / "stale.png").write_bytes(b"old drawing")
    rc, out, err = _run(capsys, "report", str(run_dir), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert not (run_dir / "report" / "stale.png").exists()
    assert d["index"] == str(run_dir / "report" / "index.html") and Path(d["index"]).is_file()
    assert all(Path(f).is_file() and Path(f).parent == run_dir / "report" for r in d["figures"] for f in r["files"])
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []
