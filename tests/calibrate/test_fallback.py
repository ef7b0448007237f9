"""The roofline fallback and coverage report, the co-run split of a kernel, version-1 files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from schedlab.calibrate import Profile
from schedlab.calibrate.corun import CorunFigures
from schedlab.calibrate.dispatch import probe_graph
from schedlab.calibrate.roofline import Roofline, measure_roofline
from schedlab.errors import SchedlabError
from schedlab.exec.threads import set_intra_op_threads
from tests.calibrate.factories import DISPATCH, FALLBACK_MODEL, MM_MODEL, make_graph, make_op, make_profile

ROOF = Roofline(gflops={1: 100.0, 2: 180.0}, gbps={1: 10.0, 2: 16.0}, a_us=1.0)


def test_roofline_is_the_slower_of_compute_and_memory_plus_a_fixed_cost() -> None:
    assert ROOF.kernel_us(1e9, 0, 1) == pytest.approx(1.0 + 1e4)  # 1 GFLOP at 100 GFLOP/s
    assert ROOF.kernel_us(0, 10**7, 1) == pytest.approx(1.0 + 1e3)  # 10 MB at 10 GB/s
    assert ROOF.kernel_us(1e9, 10**7, 2) == pytest.approx(1.0 + 1e9 / 180e3)
    assert ROOF.compute_us(1e9, 4) == ROOF.compute_us(1e9, 2)  # beyond the measured: stays
    three = Roofline(gflops={1: 100.0, 3: 300.0}, gbps={1: 10.0}, a_us=0.0)
    assert three.compute_us(2e5, 2) == pytest.approx(1.0)  # interpolated: 200 GFLOP/s
    assert ROOF.memory_share(0, 10**6) == 1.0 and ROOF.memory_share(1e9, 0) == 0.0
    assert Roofline.from_json(ROOF.to_json()) == ROOF


def test_measured_roofline_is_positive_and_never_slower_with_more_threads() -> None:
    before = set_intra_op_threads(1)
    try:
        roof = measure_roofline((1, 2), set_intra_op_threads, reps=1)
    finally:
        set_intra_op_threads(before)
    assert roof.gflops[1] > 0 and roof.gbps[1] > 0
    assert roof.gflops[2] >= roof.gflops[1] and roof.gbps[2] >= roof.gbps[1]


def test_unknown_class_takes_the_roofline_and_the_coverage_report_names_it() -> None:
    p = dataclasses.replace(make_profile(), roofline=ROOF)
    weird = make_op(target="aten.weird_op.default", flops=1e9, nbytes=10**6)
    assert p.kernel_us(weird, 1) == pytest.approx(ROOF.kernel_us(1e9, 10**6, 1))
    assert p.is_fallback(weird) and not p.is_fallback(make_op())
    g = make_graph()  # mm (measured class), t (view), relu (never measured)
    cov = p.coverage(g)
    assert cov == {"ops": 2, "fallback_ops": 1, "fallback_classes": {"relu": 1}, "fallback_model": "roofline"}
    assert make_profile().coverage(g)["fallback_model"] == "memory-bound fit"  # no roofline: the old fallback
    assert make_profile().kernel_us(weird, 1) == pytest.approx(FALLBACK_MODEL.kernel_us(1e9, 10**6, 1))


@pytest.mark.parametrize(("train_mape", "heldout_mape", "trusted"), [
    (20.0, 30.0, True), (20.0, None, True), (117.0, 30.0, False), (20.0, 3257.0, False), (100.0, 200.0, True),
])
def test_a_fit_that_misses_its_own_calibration_points_gives_way_to_the_roofline(
    train_mape: float, heldout_mape: float | None, trusted: bool
) -> None:
    base = dataclasses.replace(make_profile(), roofline=ROOF)
    fit = dataclasses.replace(base.classes["mm"], train_mape=train_mape, heldout_mape=heldout_mape)
    p = dataclasses.replace(base, classes={**base.classes, "mm": fit})
    unseen = make_op(flops=3e8, nbytes=10**6)  # class mm, signature not in the table
    assert not p._row(unseen)
    assert fit.trusted is trusted
    want = MM_MODEL.kernel_us(3e8, 10**6, 1) if trusted else ROOF.kernel_us(3e8, 10**6, 1)
    assert p.kernel_us(unseen, 1) == pytest.approx(want)
    assert p.is_fallback(unseen) is (not trusted)
    # Without a roofline (a version-1 file) the fit stays: nothing better was measured.
    old = dataclasses.replace(p, roofline=None)
    assert old.kernel_us(unseen, 1) == pytest.approx(MM_MODEL.kernel_us(3e8, 10**6, 1)) and not old.is_fallback(unseen)


def test_corun_plans_charge_the_serial_window_under_the_lock_and_the_fitted_latency() -> None:
    corun = CorunFigures(1.0, 1.0, 1.0, True, serial_window_us=5.0, latency_us={1: 4.0, 2: 1.0})
    p = dataclasses.replace(make_profile(), corun=corun)
    op = make_op()  # 22 us alone (2 fixed + 20 of work)
    alone = p.kernel_us(op, 1)
    assert alone == pytest.approx(MM_MODEL.kernel_us(op.flops, op.bytes_moved, 1))
    two = p.for_slots(2)
    assert two.dispatch_us(op) == pytest.approx(DISPATCH.corun_op_us + 5.0)
    assert two.kernel_us(op, 1) == pytest.approx(alone - 5.0 + 4.0)
    assert two.kernel_us(op, 2) == pytest.approx(p.kernel_us(op, 2) - 5.0 + 1.0)
    tiny = make_op(flops=2.0)
    assert two.kernel_us(tiny, 1) == pytest.approx(4.0)  # all of a tiny kernel goes under the lock
    assert p.dispatch_us(op) == DISPATCH.op_us and p.serial_us(op) == 0.0  # one slot: nothing moves
    assert corun.latency(8) == 1.0 and CorunFigures(1.0, 1.0, 1.0, True).latency(1) == 0.0


def test_a_version_1_profile_still_loads_and_predicts_as_it_did(tmp_path: Path) -> None:
    d = make_profile().to_json()
    d["version"] = 1
    for key in ("views", "roofline", "context"):
        del d[key]
    for key in ("serial_window_us", "latency_us"):
        del d["corun"][key]
    del d["dispatch"]["corun_contended_op_us"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d))
    p = Profile.load(path, check_machine=False)
    assert p.roofline is None and p.views.signatures == {} and p.corun.latency_us == {}
    op = make_op()
    assert p.kernel_us(op, 1) == make_profile().kernel_us(op, 1)
    assert p.for_slots(2).dispatch_us(op) == DISPATCH.corun_op_us


def test_a_corrupt_roofline_is_one_clear_error(tmp_path: Path) -> None:
    d = dataclasses.replace(make_profile(), roofline=ROOF).to_json()
    d["roofline"]["gbps"] = {"1": -3}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SchedlabError, match=r"bad roofline: gbps needs thread counts >= 1 and finite rates > 0"):
        Profile.load(path, check_machine=False)


def test_probe_without_views_is_one_chain_of_arithmetic() -> None:
    graph, _ = probe_graph(10, views=False)
    assert len(graph.ops) == 10 and not any(op.is_view for op in graph.ops)
    assert [op.id for op in graph.ops] == list(range(10))
    assert all(graph.ops[i].inputs[0] == graph.ops[i - 1].outputs[0] for i in range(1, 10))
    both, _ = probe_graph(10)
    assert len(both.ops) == 20 and sum(op.is_view for op in both.ops) == 10


def test_simulate_reports_the_ops_that_fell_back_in_json_and_text(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.cli import main
    from schedlab.machine import detect_host

    profile = dataclasses.replace(make_profile(machine=detect_host().fingerprint), roofline=ROOF)
    path = profile.save(tmp_path / "p.json")  # measured: mm only; mlp has addmm, relu, ...
    args = ["simulate", "mlp", "--size", "tiny", "--profile", str(path), "--out", str(tmp_path / "s.json")]
    assert main([*args, "--json"]) == 0
    fell = json.loads(capsys.readouterr().out)["fallback_ops"]
    assert fell["fallback_model"] == "roofline" and fell["fallback_ops"] == sum(fell["fallback_classes"].values())
    assert "addmm" in fell["fallback_classes"] and "mm" not in fell["fallback_classes"]
    assert main(args) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "never calibrated" in line]
    assert len(note) == 1 and f"{fell['fallback_ops']} of " in note[0] and "roofline" in note[0]
