"""The placement search's figures (placement_strategies, rl_curve, placement_map): drawn as PNG
and PDF from a placement run directory, each recording what it was drawn from; skipped with
a reason where their data is missing; on the report's index page of a placement run only."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from pathlib import Path

import pytest

from schedlab.plan import Plan, place
from schedlab.reports.build import PLACEMENT_FIGURE_NAMES, Report, build_report
from schedlab.reports.figures import (
    BOTH,
    MEASURED,
    SIMULATED,
    FigureRecord,
    FigureSkipped,
    placement_compare,
    placement_map,
    rl_curve,
)
from schedlab.reports.load import RunData, load_run
from tests.reports.fake_placement_run import (
    BASELINE_S,
    MEASURED_STRATEGIES,
    PREDICTED_S,
    STRATEGIES,
    make_placement_run_dir,
    rl_curve_json,
    strategy_plans,
    tiny_mlp_graph,
    two_gpus,
)
from tests.reports.fake_run import make_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DRAW = {placement_compare.NAME: placement_compare.draw, rl_curve.NAME: rl_curve.draw,
        placement_map.NAME: placement_map.draw}


@pytest.fixture(scope="module")
def placement(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Report]:
    """A placement run directory with every strategy, an RL curve and validated plans, reported once."""
    run_dir = make_placement_run_dir(tmp_path_factory.mktemp("runs") / "mlp-placement")
    return run_dir, build_report(run_dir)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> RunData:
    """A threads+order run (tests/reports/fake_run.py): not a placement search."""
    return load_run(make_run_dir(tmp_path_factory.mktemp("runs") / "mlp-plain", n_trials=4, profile=False))


def _record(report: Report, name: str) -> FigureRecord:
    return next(r for r in report.figures if r.name == name)


@pytest.mark.parametrize("name", PLACEMENT_FIGURE_NAMES)
def test_each_figure_is_written_png_and_pdf(placement: tuple[Path, Report], name: str) -> None:
    run_dir, report = placement
    rec = _record(report, name)
    png, pdf = rec.files
    assert png == run_dir / "report" / f"{name}.png" and pdf == run_dir / "report" / f"{name}.pdf"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20_000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5_000
    assert rec.sources and all(p.is_file() for p in rec.sources)
    assert rec.run == "mlp-placement" and "mlp/tiny" in rec.title
    assert "dgx-8gpu[:2]" in rec.conditions_text and "graph " + tiny_mlp_graph().hash in rec.conditions_text


def test_strategies_figure_uses_search_and_validated_times(placement: tuple[Path, Report]) -> None:
    run_dir, report = placement
    rec = _record(report, placement_compare.NAME)
    assert {p.name for p in rec.sources} == {"run.json", "search.json", "results.json"}
    assert rec.basis == BOTH and "simulated" in rec.conditions_text
    assert "dgx-8gpu[:2]" in rec.title
    c = rec.conditions
    assert list(c["strategies"]) == list(STRATEGIES)  # in the fixed strategy order
    assert {s: v["best_predicted_s"] for s, v in c["strategies"].items()} == PREDICTED_S
    assert c["strategies"]["rl"]["trials"] == 1600 and c["strategies"]["rl"]["wall_s"] == 95.0
    assert c["best_strategy"] == "rl" and c["devices"] == ["gpu0", "gpu1"]
    assert {s for s, v in c["strategies"].items() if v["measured"]} == set(MEASURED_STRATEGIES)
    results = json.loads((run_dir / "results.json").read_text())
    rl_cands = {cd["trial"]: cd for cd in results["candidates"] if cd["strategy"] == "rl"}
    measured = c["strategies"]["rl"]["measured"]
    # rl's first-ranked validated plan (lowest prediction), not its faster-measured second one.
    assert measured["trial"] == STRATEGIES.index("rl") and set(rl_cands) == {STRATEGIES.index("rl"), 99}
    assert measured["median_s"] == rl_cands[measured["trial"]]["measured_step_time_s"]
    assert measured["spread_s"] == rl_cands[measured["trial"]]["spread_s"]
    assert c["baselines_simulated_s"] == BASELINE_S
    assert c["baselines_measured_s"] == {n: b["measured_step_time_s"] for n, b in results["baselines"].items()}
    assert "not measured: m-topo, m-etf, optuna" in rec.caption


def test_rl_curve_records_the_curve_it_drew(placement: tuple[Path, Report]) -> None:
    run_dir, report = placement
    rec = _record(report, rl_curve.NAME)
    curve = json.loads((run_dir / "rl" / "curve.json").read_text())
    assert rec.basis == SIMULATED and "simulated reward" in rec.title
    assert run_dir / "rl" / "curve.json" in rec.sources
    c = rec.conditions
    assert c["iterations"] == len(curve["curve"]) == 40
    assert c["best_so_far_last_s"] == pytest.approx(min(p["best_step_time_s"] or 1.0 for p in curve["curve"]))
    assert c["best_step_time_s"] == curve["best_step_time_s"] and c["evaluations"] == curve["evaluations"]
    assert curve["curve"][0]["mean_step_time_s"] is curve["curve"][0]["best_step_time_s"] is None
    assert c["first_mean_step_time_s"] == curve["curve"][1]["mean_step_time_s"]  # iteration 1: none feasible
    assert c["entropy_first"] > c["entropy_last"] > 0
    assert c["feasible_share_min"] == 0.0 and c["config"]["groups"] == 3
    assert c["baseline"] == {"name": "one-device-gpu0", "step_time_s": BASELINE_S["one-device-gpu0"]}


def test_placement_map_shows_what_place_resolves(placement: tuple[Path, Report]) -> None:
    _, report = placement
    rec = _record(report, placement_map.NAME)
    assert {p.name for p in rec.sources} == {"run.json", "graph.json", "search.json"}
    c = rec.conditions
    graph, machine = tiny_mlp_graph(), two_gpus()
    plans = strategy_plans(graph)
    assert c["layers"] == ["body.0", "body.2", "head"] and c["kinds"] == ["F", "B", "W", "OPT"]
    assert list(c["strategies"]) == list(STRATEGIES) and c["fastest_strategy"] == "rl"
    for name, s in c["strategies"].items():
        assert s["plan_hash"] == plans[name].hash
        assert s["ops_per_device"] == dict(Counter(place(graph, plans[name], machine)))
    # Counted from the graph without place(): the layers strategy puts body.0 on gpu0, the rest on gpu1.
    body0 = sum(op.layer == "body.0" for op in graph.ops)
    assert c["strategies"]["layers"]["ops_per_device"] == {"gpu0": body0, "gpu1": len(graph.ops) - body0}
    assert c["strategies"]["layers"]["layer_devices"] == {"body.0": "gpu0", "body.2": "gpu1", "head": "gpu1"}
    assert c["strategies"]["optuna"]["layer_devices"]["head"] == "mixed"  # one head op moved by op id


def test_layer_map_counts_every_op_once() -> None:
    graph = tiny_mlp_graph()
    plan = Plan(device="gpu0", layer_devices={"body.0": "gpu1"})
    lm = placement_map.layer_map(graph, place(graph, plan, two_gpus()))
    assert sum(sum(cell.values()) for cell in lm.counts.values()) == len(graph.ops)
    assert sum(lm.ops_per_device.values()) == len(graph.ops)
    assert lm.layer_devices() == {"body.0": "gpu1", "body.2": "gpu0", "head": "gpu0"}


def test_report_index_shows_the_three_figures(placement: tuple[Path, Report]) -> None:
    _, report = placement
    html = report.index.read_text()
    figures = json.loads(report.figures_json.read_text())
    drawn = {f["name"] for f in figures["figures"]}
    assert set(PLACEMENT_FIGURE_NAMES) <= drawn
    for name in PLACEMENT_FIGURE_NAMES:
        assert f'<img src="{name}.png"' in html and f'href="{name}.pdf"' in html
    assert "dgx-8gpu[:2]" in html and "simulated reward" in html
    assert not {s["name"] for s in figures["skipped"]} & set(PLACEMENT_FIGURE_NAMES)


@pytest.mark.parametrize("name", PLACEMENT_FIGURE_NAMES)
def test_figures_skip_on_a_run_that_is_not_a_placement_search(
    plain_run: RunData, tmp_path: Path, name: str
) -> None:
    with pytest.raises(FigureSkipped, match=r"not a placement search \(run.json space: threads\+order\)"):
        DRAW[name](plain_run, tmp_path / name)
    assert not list(tmp_path.iterdir())


def test_report_of_a_non_placement_run_leaves_them_out(plain_run: RunData, tmp_path: Path) -> None:
    """They do not apply there: neither drawn nor listed as missing on the index page."""
    report = build_report(plain_run.path, tmp_path / "report")
    figures = json.loads(report.figures_json.read_text())
    names = {f["name"] for f in figures["figures"]} | {s["name"] for s in figures["skipped"]}
    assert not names & set(PLACEMENT_FIGURE_NAMES) and "pred_vs_meas" in names


def test_measured_reward_and_unvalidated_run(tmp_path: Path) -> None:
    run_dir = make_placement_run_dir(tmp_path / "run", strategies=("m-sct", "rl"), reward="measured", validated=False)
    run = load_run(run_dir)
    rec = rl_curve.draw(run, tmp_path / "rl")
    assert rec.basis == MEASURED and "measured reward" in rec.title and "measured" in rec.conditions_text
    assert rec.conditions["baseline"]["name"] in BASELINE_S  # a measured baseline, from results.json
    assert rec.conditions["baseline"]["step_time_s"] == pytest.approx(
        min(b.measured_s for b in run.results.baselines.values()))
    comp = placement_compare.draw(run, tmp_path / "cmp")
    assert list(comp.conditions["strategies"]) == ["m-sct", "rl"]
    assert not any(s["measured"] for s in comp.conditions["strategies"].values())
    assert "No strategy's plan was measured" in comp.caption
    assert (tmp_path / "cmp.png").stat().st_size > 10_000 and (tmp_path / "rl.pdf").is_file()


def test_missing_or_corrupt_data_is_a_reason(tmp_path: Path) -> None:
    run_dir = make_placement_run_dir(tmp_path / "run", strategies=("layers", "m-sct"), rl_curve=False)
    run = load_run(run_dir)
    with pytest.raises(FigureSkipped, match=r"rl/curve.json missing .*--strategy rl"):
        rl_curve.draw(run, tmp_path / "rl")
    bad = rl_curve_json()
    del bad["curve"][3]["entropy"]
    (run_dir / "rl").mkdir()
    (run_dir / "rl" / "curve.json").write_text(json.dumps(bad))
    with pytest.raises(FigureSkipped, match=r"corrupt .*curve.json: bad curve\[3\]: missing field 'entropy'"):
        rl_curve.draw(run, tmp_path / "rl")
    (run_dir / "graph.json").unlink()
    with pytest.raises(FigureSkipped, match=r"graph\.json"):
        placement_map.draw(load_run(run_dir), tmp_path / "map")
    search = json.loads((run_dir / "search.json").read_text())
    (run_dir / "search.json").write_text(json.dumps({**search, "strategies": {}}))
    with pytest.raises(FigureSkipped, match="lists no strategies"):
        placement_compare.draw(load_run(run_dir), tmp_path / "cmp")
    assert not list(tmp_path.glob("*.png"))


def test_unrecorded_wall_time_and_no_feasible_placement(tmp_path: Path) -> None:
    """search.json may hold no wall time for a strategy; an RL training may never find a placement that fits."""
    run_dir = make_placement_run_dir(tmp_path / "run", strategies=("m-sct", "rl"))
    search = json.loads((run_dir / "search.json").read_text())
    search["strategies"]["m-sct"]["wall_s"] = None
    (run_dir / "search.json").write_text(json.dumps(search))
    curve = rl_curve_json(iterations=6)
    for p in curve["curve"]:
        p.update(best_step_time_s=None, mean_step_time_s=None, feasible_share=0.0)
    curve["best_step_time_s"] = None
    (run_dir / "rl" / "curve.json").write_text(json.dumps(curve))
    run = load_run(run_dir)
    comp = placement_compare.draw(run, tmp_path / "cmp")
    assert comp.conditions["strategies"]["m-sct"]["wall_s"] is None
    assert comp.conditions["strategies"]["rl"]["wall_s"] == 95.0
    rec = rl_curve.draw(run, tmp_path / "rl")
    assert rec.conditions["best_so_far_last_s"] is None and rec.conditions["iterations"] == 6
    assert "No feasible placement found" in rec.caption
    assert (tmp_path / "rl.png").stat().st_size > 10_000 and (tmp_path / "cmp.pdf").is_file()


def test_a_placement_strategy_in_the_all_space_counts_as_a_placement_run(tmp_path: Path) -> None:
    run_dir = make_placement_run_dir(tmp_path / "run", strategies=("layers",), rl_curve=False)
    run_json = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run_json, "space": "all"}))
    rec = placement_map.draw(load_run(run_dir), tmp_path / "map")
    assert list(rec.conditions["strategies"]) == ["layers"]


@pytest.mark.parametrize("name", PLACEMENT_FIGURE_NAMES)
def test_each_figure_redraws_from_the_command_the_report_records(
    placement: tuple[Path, Report], name: str, tmp_path: Path
) -> None:
    run_dir, report = placement
    figure = next(f for f in json.loads(report.figures_json.read_text())["figures"] if f["name"] == name)
    command = figure["redraw"].split()
    assert command[:2] == ["python", "-m"] and command[-1] == str(run_dir)
    module = importlib.import_module(command[2])
    assert module.main([str(run_dir), str(tmp_path)]) == 0
    assert (tmp_path / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
