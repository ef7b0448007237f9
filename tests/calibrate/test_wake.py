"""What co-running ops pay to wake throttled OpenMP helpers: the fit, the Profile, the probe."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.signature import signature
from schedlab.calibrate.wake import (
    POOLED,
    WakeFit,
    WakePoint,
    fit_wake,
    fit_wake_scale,
    forks_small,
    region_share,
    side_thread,
    throttled_omp,
    time_wake,
    wake_reps,
    wake_share,
)
from schedlab.errors import SchedlabError
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import cpu_machine
from tests.calibrate.factories import MM_MODEL, make_graph, make_op, make_profile

# A class that runs below its grain size (h_us) on one thread: small ops have no helper to wake.
GRAINY = WorkThreadsModel(a_us=1.0, us_per_gflop=0.0, us_per_mb=100.0, us_per_mb_dram=0.0, cache_mb=1.0,
                          p_max=0.9, h_us=50.0, c_us=0.0)


def test_region_share_grows_with_the_work_past_the_grain_size() -> None:
    assert region_share(GRAINY, 0.0, 0.0) == 0.0
    small, large = region_share(GRAINY, 0.0, 1e4), region_share(GRAINY, 0.0, 1e7)  # 1 us and 1 ms of work
    assert 0.0 < small < 0.05 and large > 0.9


def test_fit_recovers_a_fixed_wake_and_one_that_grows_with_the_work() -> None:
    points = [WakePoint("mm", f, 0.0, 2, 70.0) for f in (1e7, 3e7, 1e8, 3e8)]  # 100 us .. 3 ms of work
    points += [WakePoint("rnn", f, 0.0, 2, 20.0 + 0.5 * f * 1e-5) for f in (1e7, 3e7, 1e8, 3e8)]
    points += [WakePoint("rare", 1e8, 0.0, 2, 500.0)]  # too few points for a fit of its own
    points += [WakePoint("unknown", 1e8, 0.0, 2, 1e6)]  # no class model: left out
    models = {"mm": MM_MODEL, "rnn": MM_MODEL, "rare": MM_MODEL}
    fits = fit_wake(points, models.get)
    assert set(fits) == {"mm", "rnn", POOLED}
    assert fits["mm"].base_us == pytest.approx(70.0, rel=1e-6) and fits["mm"].per_work == pytest.approx(0.0, abs=1e-9)
    assert fits["rnn"].base_us == pytest.approx(20.0, rel=1e-6) and fits["rnn"].per_work == pytest.approx(0.5, rel=1e-6)
    assert fits[POOLED].n_points == 9 and fits["mm"].threads == 2


def test_fewer_threads_pay_the_measured_share_of_the_fit_at_the_most() -> None:
    at_most = [WakePoint("mm", f, 0.0, 16, 70.0) for f in (1e7, 3e7, 1e8, 3e8)]
    half = [WakePoint("mm", f, 0.0, 4, 35.0) for f in (1e7, 3e7, 1e8)]
    few = [WakePoint("mm", 1e8, 0.0, 2, 7.0)]  # one case: no share of its own
    small = [WakePoint("mm", 1e3, 0.0, 4, 1e4)]  # outside the parallel regime: left out
    fits = fit_wake(at_most + half + few + small, {"mm": MM_MODEL}.get)
    assert fits["mm"].threads == 16 and fits["mm"].n_points == 4  # fitted at the most threads only
    assert fits["mm"].base_us == pytest.approx(70.0, rel=1e-6)
    assert fit_wake_scale(at_most + half + few + small, fits, {"mm": MM_MODEL}.get) == {4: pytest.approx(0.5, rel=1e-3)}


def test_the_share_interpolates_in_log2_threads_up_to_the_fits_own_count() -> None:
    scale = {2: 0.4, 4: 0.5}
    assert wake_share(scale, 16, 2) == pytest.approx(0.4)
    assert wake_share(scale, 16, 3) == pytest.approx(0.4 + 0.1 * (math.log2(3) - 1.0))
    assert wake_share(scale, 16, 8) == pytest.approx(0.75)  # halfway from 4 (0.5) to 16 (1.0) in log2
    assert wake_share(scale, 16, 16) == 1.0 and wake_share(scale, 16, 32) == 1.0
    assert wake_share({4: 0.5}, 16, 2) == 0.5  # below the least count measured: its share
    assert wake_share({}, 16, 2) == 1.0  # no scale measured (2 cores): the fit as it is


def test_profile_charges_the_class_fit_else_the_pooled_one_and_never_one_thread_or_views() -> None:
    base = make_profile()
    op = make_op(flops=2e7)  # 200 us of one-thread work under MM_MODEL
    assert base.wake_us(op, 2) == 0.0  # calibrated before wake costs
    p = dataclasses.replace(base, wake={"mm": WakeFit(40.0, 0.1, 2, 5), POOLED: WakeFit(7.0, 0.0, 2, 50)})
    assert p.wake_us(op, 2) == pytest.approx(40.0 + 0.1 * 200.0, rel=1e-6)
    assert p.wake_us(op, 1) == 0.0
    assert p.wake_us(make_op(is_view=True), 2) == 0.0
    only_pooled = dataclasses.replace(base, wake={POOLED: WakeFit(7.0, 0.0, 2, 50)})
    assert only_pooled.wake_us(op, 2) == pytest.approx(7.0, rel=1e-6)
    many = dataclasses.replace(base, wake={POOLED: WakeFit(60.0, 0.0, 16, 50)}, wake_scale={2: 0.25})
    assert many.wake_us(op, 2) == pytest.approx(15.0, rel=1e-6) and many.wake_us(op, 16) == pytest.approx(60.0, rel=1e-6)


def test_wake_fits_round_trip_and_a_corrupt_one_is_one_clear_error(tmp_path: Path) -> None:
    p = dataclasses.replace(
        make_profile(), wake={"mm": WakeFit(40.0, 0.1, 8, 5), "convolution": WakeFit(250.0, 0.04, 8, 9, cap_us=900.0,
                                                                                       floor_us=190.0),
                              POOLED: WakeFit(7.0, 0.0, 8, 50)}, wake_scale={2: 0.3, 4: 0.6}
    )
    path = p.save(tmp_path / "p.json")
    q = Profile.load(path, check_machine=False)
    assert q.wake == p.wake and q.wake_scale == {2: 0.3, 4: 0.6} and q.to_json() == p.to_json()
    d = json.loads(path.read_text())
    bad = json.loads(json.dumps(d))
    bad["wake_scale"] = {"1": 0.5}
    path.write_text(json.dumps(bad))
    with pytest.raises(SchedlabError, match=r"bad wake_scale: .*must be >= 2"):
        Profile.load(path, check_machine=False)
    bad = json.loads(json.dumps(d))
    bad["wake"]["convolution"]["floor_us"] = -1.0
    path.write_text(json.dumps(bad))
    with pytest.raises(SchedlabError, match=r"bad wake\.convolution: .*floor_us must be >= 0"):
        Profile.load(path, check_machine=False)
    del d["wake"]["convolution"]["floor_us"]  # a fit of before 2026-12-07: no floor
    path.write_text(json.dumps(d))
    assert Profile.load(path, check_machine=False).wake["convolution"].floor_us == 0.0
    d["wake"]["mm"]["base_us"] = -3.0
    path.write_text(json.dumps(d))
    with pytest.raises(SchedlabError, match=r"corrupt .*: bad wake\.mm: .*base_us and per_work must be >= 0"):
        Profile.load(path, check_machine=False)
    del d["wake"]  # a Profile of before: no wake cost
    path.write_text(json.dumps(d))
    assert Profile.load(path, check_machine=False).wake == {}


@pytest.mark.parametrize("mm_at_two_threads_us", [55.0, 100.0])
def test_a_co_run_plan_of_two_threads_is_predicted_slower_with_the_wake(mm_at_two_threads_us: float) -> None:
    """The mm runs a parallel region at two threads (55 us against 100 at one) and pays the
    wake under two slots of two threads; no faster at two threads, it ran inline
    (`sim.cost.team_or_inline`) and has no helpers to wake."""
    g = make_graph()
    m = cpu_machine(2)
    plain = make_profile(signatures={signature(g.ops[0]): {1: 100.0, 2: mm_at_two_threads_us}})
    woken = dataclasses.replace(plain, wake={POOLED: WakeFit(50.0, 0.0, 2, 10)})
    parallel = mm_at_two_threads_us < 100.0
    for plan, slower in ((Plan(slots=2, threads=2), parallel), (Plan(slots=1, threads=2), False),
                         (Plan(slots=2, threads=1), False)):
        r = resolve(g, plan, m)
        a = simulate(g, r, m, plain.for_graph(g).for_slots(plan.slots)).step_time_s
        b = simulate(g, r, m, woken.for_graph(g).for_slots(plan.slots)).step_time_s
        assert (b > a) if slower else (b == a), plan


def test_one_regions_wake_is_the_fit_over_every_class_at_a_small_call() -> None:
    p = dataclasses.replace(make_profile(), wake={"mm": WakeFit(400.0, 0.1, 8, 5),
                                                  POOLED: WakeFit(60.0, 0.5, 8, 50, floor_us=5.0)},
                            wake_scale={2: 0.5})
    assert p.region_wake_us(8) == pytest.approx(65.0)  # floor and base, not the class's own fit
    assert p.region_wake_us(16) == pytest.approx(65.0)
    assert p.region_wake_us(2) == pytest.approx(32.5)  # the share measured at two threads
    assert p.region_wake_us(1) == 0.0
    assert make_profile().region_wake_us(8) == 0.0  # no wake fits


def test_throttled_omp_holds_an_idle_team_only_while_inside() -> None:
    def holders() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "schedlab-idle-team")

    with throttled_omp(2):
        assert holders() == 1
    assert holders() == 0


def test_long_calls_get_fewer_timed_calls_but_at_least_two() -> None:
    assert wake_reps(1.0) == 7
    assert wake_reps(5_000.0) == 3  # 20 ms of budget over 5.3 ms per gapped call
    assert wake_reps(50_000.0) == 2
    assert wake_reps(1.0, most=1) == 2


def test_time_wake_measures_a_non_negative_extra_and_restores_the_thread_count() -> None:
    x = torch.ones(1 << 16)
    before = torch.get_num_threads()
    extra = time_wake(torch.add, (x, x), {}, threads=2, cores=2, reps=2, rounds=1)
    assert 0.0 <= extra < 1e5
    assert torch.get_num_threads() == before


def test_a_few_cases_timed_far_off_do_not_set_the_class_fit() -> None:
    """Least absolute deviation: two cases a halted helper slowed tens of times (the way
    convolution_backward's calibration read 4 and 17 ms among cases of 55-1,000 us) leave
    the fit on the rest, where least squares would be pulled to them."""
    works = (1e7, 2e7, 3e7, 5e7, 1e8, 2e8, 3e8, 5e8)  # 100 us .. 5 ms of work
    points = [WakePoint("conv", f, 0.0, 2, 200.0 + 0.01 * f * 1e-5) for f in works]
    points += [WakePoint("conv", 1e8, 0.0, 2, 4000.0), WakePoint("conv", 3e8, 0.0, 2, 17000.0)]
    fit = fit_wake(points, {"conv": MM_MODEL}.get)["conv"]
    assert fit.base_us == pytest.approx(200.0, rel=0.02) and fit.per_work == pytest.approx(0.01, rel=0.05)
    assert fit.n_points == 10


def test_a_class_whose_small_calls_pay_a_wake_gets_a_floor_and_is_capped() -> None:
    """oneDNN's LSTM layer and convolutions fork a region however flat their thread scaling:
    their small cases pay hundreds of microseconds at a region share near 0. Such a class
    gets a floor that every call pays, under the share-gated part (at most its cases'
    largest extra); one whose small cases pay nothing keeps the share-gated fit."""
    small = (1e3, 2e3, 5e3, 1e4, 2e4, 5e4)  # bytes: 0.1-5 us of work under GRAINY's 50 us grain, share under 0.1
    points = [WakePoint("rnn", 0.0, b, 2, 400.0 + 2.0 * b * 1e-4) for b in small]
    points += [WakePoint("mm", 0.0, b, 2, 0.0) for b in small]  # small calls run inline: nothing to wake
    points += [WakePoint("mm", 0.0, b, 2, 70.0) for b in (5e6, 1e7, 2e7)]
    fits = fit_wake(points, {"rnn": GRAINY, "mm": GRAINY}.get)
    rnn, mm = fits["rnn"], fits["mm"]
    assert rnn.forks_at_any_size and rnn.share_gated and rnn.floor_us == pytest.approx(400.0, rel=1e-3)
    assert rnn.cap_us == pytest.approx(400.0 + 2.0 * 5.0)
    assert rnn.extra_us(0.0, 1.0) == pytest.approx(400.0, rel=1e-3)  # a call that never reaches the grain pays it
    assert rnn.extra_us(1.0, 1e4) == rnn.cap_us  # no further than its cases went
    assert mm.share_gated and mm.floor_us == 0.0 and mm.cap_us is None and mm.extra_us(0.0, 1.0) == 0.0
    assert not mm.forks_at_any_size and not fits[POOLED].forks_at_any_size


def test_whether_small_calls_fork_is_read_off_their_median_wake() -> None:
    assert forks_small([(0.01, 1.0, 0.0)] * 5 + [(0.01, 1.0, 300.0)] * 2) is False  # most paid nothing
    assert forks_small([(0.05, 1.0, 60.0)] * 3 + [(0.9, 1e3, 0.0)] * 9) is True  # the big ones do not count
    assert forks_small([(0.05, 1.0, 60.0)] * 2 + [(0.5, 1e3, 60.0)] * 9) is None  # too few small ones to tell


def test_with_too_few_small_calls_the_better_fitting_form_decides() -> None:
    """A class whose cases are all past a tenth of its grain cannot show whether small calls
    fork: it takes the fit without the share where that misses its cases by at most half."""
    mid = (3e5, 4e5, 6e5, 8e5, 1e6, 1.5e6)  # bytes: 30-150 us of work, shares 0.4-0.75 under GRAINY
    points = [WakePoint("lstm", 0.0, b, 2, 500.0) for b in mid]
    fits = fit_wake(points, {"lstm": GRAINY}.get)
    assert not fits["lstm"].share_gated and fits["lstm"].base_us == pytest.approx(500.0, rel=1e-3)
    assert fits["lstm"].floor_us == 0.0 and fits["lstm"].forks_at_any_size


def test_a_class_that_forks_at_any_size_holds_its_team_and_pays_its_wake(tmp_path: Path) -> None:
    """The mm is no faster at two threads (so it would run inline, `sim.cost.team_or_inline`,
    and wake nothing), but its class's wake fit is not share-gated: it forks at any size, holds
    its team and pays its wake under two slots of two threads, in the scalar Profile and its
    columns alike; the fit round-trips through the saved Profile."""
    g = make_graph()
    m = cpu_machine(2)
    plain = make_profile(signatures={signature(g.ops[0]): {1: 100.0, 2: 100.0}})
    gated = dataclasses.replace(plain, wake={"mm": WakeFit(50.0, 0.0, 2, 10), POOLED: WakeFit(50.0, 0.0, 2, 10)})
    forks = dataclasses.replace(gated, wake={**gated.wake, "mm": WakeFit(50.0, 0.0, 2, 10, share_gated=False, cap_us=60.0)})
    op = g.ops[0]
    assert not gated.forks_at_any_size(op) and forks.forks_at_any_size(op)
    assert forks.team_basis_us(op, 2) == pytest.approx(forks.team_basis_us(op, 1) / 2)
    ids = np.arange(len(g))
    assert forks.team_basis_column(g, ids, 2)[0] == pytest.approx(forks.team_basis_us(op, 2))
    assert forks.wake_column(g, ids, 2)[0] == pytest.approx(forks.wake_us(op, 2)) == pytest.approx(50.0)
    r = resolve(g, Plan(slots=2, threads=2), m)
    a = simulate(g, r, m, gated.for_graph(g).for_slots(2)).step_time_s
    b = simulate(g, r, m, forks.for_graph(g).for_slots(2)).step_time_s
    assert b > a
    q = Profile.load(forks.save(tmp_path / "p.json"), check_machine=False)
    assert q.wake == forks.wake
    d = json.loads((tmp_path / "p.json").read_text())
    d["wake"]["mm"]["share_gated"] = "no"
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(SchedlabError, match=r"bad wake\.mm: .*share_gated must be true or false"):
        Profile.load(tmp_path / "p.json", check_machine=False)


def test_calibrations_summary_names_the_classes_that_fork_at_any_size() -> None:
    from schedlab.cli.calibrate_cmd import _wake_summary

    p = dataclasses.replace(make_profile(), wake={
        "mkldnn_rnn_layer": WakeFit(400.0, 2.0, 2, 13, share_gated=False, cap_us=5500.0),
        "convolution": WakeFit(250.0, 0.04, 2, 49, cap_us=960.0, floor_us=190.0),
        "mm": WakeFit(70.0, 0.0, 2, 40), POOLED: WakeFit(60.0, 0.03, 2, 1200)})
    s = _wake_summary(p)
    assert s is not None and s["classes"] == 3 and s["any_size"] == ["convolution", "mkldnn_rnn_layer"]


def test_side_thread_runs_while_inside_and_is_stopped_and_joined_on_leaving() -> None:
    seen: list[str] = []
    names: list[str] = []

    def run(ready: threading.Event, stop: threading.Event) -> None:
        names.append(threading.current_thread().name)
        ready.set()
        stop.wait(timeout=5.0)
        seen.append("stopped" if stop.is_set() else "timed out")

    with side_thread(run, "schedlab-test-side"):
        assert names == ["schedlab-test-side"] and seen == []
    assert seen == ["stopped"]
    assert not any(t.name == "schedlab-test-side" for t in threading.enumerate())
