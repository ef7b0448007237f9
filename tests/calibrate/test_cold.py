"""Cold costs: what an op pays in a step for its data not being in the caches (calibrate.cold)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest

from schedlab.calibrate import Profile
from schedlab.calibrate.cold import (
    MIB,
    SHARE_MIN_US,
    ColdCosts,
    ColdPoint,
    ReplayedOp,
    cold_lookup,
    fit_cold,
    fit_share,
    fit_slopes,
    share_points,
    time_cold,
)
from schedlab.calibrate.context import Occurrence, fit_context
from schedlab.errors import SchedlabError
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, make_graph, make_op, make_profile

M = int(MIB)


def test_slopes_are_per_class_and_thread_medians_per_mib_never_below_zero() -> None:
    points = [
        ColdPoint("relu", 4 * M, 1, 80.0),  # 20 us/MiB
        ColdPoint("relu", 2 * M, 1, 60.0),  # 30
        ColdPoint("relu", 8 * M, 1, 80.0),  # 10
        ColdPoint("relu", 4 * M, 2, 40.0),  # 10
        ColdPoint("mm", 4 * M, 1, -40.0),  # noise below hot
        ColdPoint("mm", 0, 1, 10.0),  # no bytes: left out
    ]
    slopes, pooled = fit_slopes(points)
    assert slopes["relu"] == {1: pytest.approx(20.0), 2: pytest.approx(10.0)}
    assert slopes["mm"] == {1: 0.0}
    assert pooled[1] == pytest.approx(15.0)  # median of 20, 30, 10, -10
    assert pooled[2] == pytest.approx(10.0)


def test_the_share_is_the_median_ratio_over_ops_with_a_measurable_cold_extra() -> None:
    big = 2 * SHARE_MIN_US
    hot = big  # a memory-bound op: its cold extra is as large as its hot time
    assert fit_share([(0.5 * big, big, hot), (0.7 * big, big, hot), (0.9 * big, big, hot), (500.0, 1.0, 1.0)]) == (
        pytest.approx(0.7), 3)
    assert fit_share([(5 * big, big, hot)]) == (1.0, 1)  # never more than all of it
    assert fit_share([(-big, big, hot)]) == (0.0, 1)
    assert fit_share([(3.0, 1.0, 1.0)]) == (0.0, 0)  # nothing measurable: a step pays nothing
    assert fit_share([(-big, big, 100 * big)]) == (0.0, 0)  # a matmul's cold extra is within its noise
    assert fit_share([]) == (0.0, 0)


def test_fit_cold_divides_each_replayed_op_by_its_own_cold_extra_else_its_class_slope() -> None:
    points = [
        ColdPoint("relu", 4 * M, 1, 100.0, "relu/a"),  # 25 us/MiB, and relu/a's own 100 us
        ColdPoint("relu", 4 * M, 2, 60.0, "relu/a"),
    ]

    cold_us = cold_lookup(points)
    assert cold_us("relu/a", "relu", 4 * M) == pytest.approx(100.0)  # its own, one thread
    assert cold_us("relu/b", "relu", 8 * M) == pytest.approx(200.0)  # not timed cold: the slope
    replayed = [ReplayedOp("relu/a", "relu", 4 * M, 70.0, 100.0), ReplayedOp("relu/b", "relu", 8 * M, 140.0, 200.0),
                ReplayedOp("relu/b", "relu", 8 * M, 150.0, 200.0)]

    costs = fit_cold(points, replayed)
    assert costs.share == pytest.approx(0.7) and costs.n_share_ops == 3 and costs.n_points == 2
    assert costs.extra_us("relu", 8 * M, 1) == pytest.approx(140.0)
    assert costs.extra_us("relu", 8 * M, 2) == pytest.approx(0.7 * 15.0 * 8)
    kept = share_points(points, replayed)  # what calibration keeps in meta.cold_share_points
    assert kept == [("relu", 70.0, pytest.approx(100.0), 100.0), ("relu", 140.0, pytest.approx(200.0), 200.0),
                    ("relu", 150.0, pytest.approx(200.0), 200.0)]
    assert fit_share((x, k, h) for _, x, k, h in kept) == (costs.share, costs.n_share_ops)


def costs() -> ColdCosts:
    return ColdCosts(0.5, {"relu": {1: 20.0, 2: 10.0}}, {1: 8.0, 4: 2.0}, n_points=3, n_share_ops=2)


def test_a_class_without_slopes_takes_the_pooled_ones_and_threads_take_the_nearest_below() -> None:
    c = costs()
    assert c.extra_us("relu", 2 * M, 1) == pytest.approx(0.5 * 20.0 * 2)
    assert c.extra_us("relu", 2 * M, 8) == pytest.approx(0.5 * 10.0 * 2)  # 8 threads: the 2-thread slope
    assert c.extra_us("gelu", M, 2) == pytest.approx(0.5 * 8.0)  # pooled, 1 thread is the nearest below 2
    assert c.extra_us("gelu", M, 4) == pytest.approx(0.5 * 2.0)
    assert ColdCosts(0.5, {}, {}).extra_us("gelu", M, 1) == 0.0
    assert c.extra_us("convolution", M, 1) == 0.0 and c.cold_us("convolution", M, 1) == pytest.approx(8.0)


def test_cold_costs_round_trip_and_reject_what_cannot_be_a_cost() -> None:
    c = costs()
    assert ColdCosts.from_json(json.loads(json.dumps(c.to_json()))) == c
    for bad in ({"share": -0.1}, {"share": 1.5}, {"share": float("nan")}, {"slope_us_per_mib": {"relu": {"1": -3}}},
                {"slope_us_per_mib": [1]}, {"pooled_us_per_mib": {"x": 1}}):
        with pytest.raises((TypeError, ValueError)):
            ColdCosts.from_json({**c.to_json(), **bad})


def cold_profile() -> Profile:
    return dataclasses.replace(make_profile(), cold=ColdCosts(0.5, {"relu": {1: 40.0, 2: 20.0}}, {1: 10.0}))


def test_the_profile_charges_memory_bound_ops_their_cold_extra_and_views_and_matmuls_nothing() -> None:
    plain, cold = make_profile(), cold_profile()
    op = make_op("aten.relu.default", flops=1e6, nbytes=3 * M, args=({"v": 0},))
    assert cold.kernel_us(op, 1) == pytest.approx(plain.kernel_us(op, 1) + 0.5 * 40.0 * 3)
    assert cold.kernel_us(op, 2) == pytest.approx(plain.kernel_us(op, 2) + 0.5 * 20.0 * 3)
    mm = make_op(nbytes=3 * M)  # compute-bound: its cold extra hides behind its arithmetic
    assert cold.cold_us(mm, 1) == 0.0 and cold.kernel_us(mm, 1) == pytest.approx(plain.kernel_us(mm, 1))
    view = make_op(is_view=True)
    assert cold.cold_us(view, 1) == 0.0 and plain.cold_us(op, 1) == 0.0


def test_a_profile_keeps_its_cold_costs_in_json_and_names_a_corrupt_section(tmp_path: Any) -> None:
    p = cold_profile()
    path = p.save(tmp_path / "p.json")
    assert Profile.load(path, check_machine=False).cold == p.cold
    d = p.to_json()
    assert Profile.from_json({**d, "cold": None}).cold is None  # a profile from before: nothing charged
    with pytest.raises(SchedlabError, match="bad cold"):
        Profile.from_json({**d, "cold": {"share": "most"}})


def test_with_trace_keeps_the_kernel_without_the_cold_extra() -> None:
    g = make_graph()
    p = dataclasses.replace(make_profile(), cold=ColdCosts(0.5, {"relu": {1: 8192.0}}, {}))  # relu: 256 B -> 1 us
    relu = g.ops[2]
    assert p.cold_us(relu, 1) == pytest.approx(1.0)
    events = tuple(
        TraceEvent(relu.id, relu.name, "F", "cpu0", 0, 1, 0, int(1e3 * (DISPATCH.op_us + 50.0)), step)
        for step in range(3)
    )
    trace = Trace(events=events, meta={"source": "exec", "graph_hash": g.hash, "plan": {"slots": 1}})
    traced = p.with_trace(trace, g)
    assert traced.signatures  # the trace's kernel is in the table, less the cold extra the Profile adds back
    assert traced.kernel_us(relu, 1) == pytest.approx(50.0)


def test_the_context_fit_takes_the_cold_extra_off_first() -> None:
    hot = {"relu/a": 10.0}
    occ = [Occurrence("relu/a", "relu", False, 40.0, 4 * M), Occurrence("relu/a", "relu", False, 40.0, 4 * M)]
    plain, _ = fit_context(occ, hot)
    assert plain.warm("relu") == pytest.approx(30.0)
    less, sig_warm = fit_context(occ, hot, lambda o: 25.0 * o.nbytes / MIB / 4)  # 25 us of it is cold
    assert less.warm("relu") == pytest.approx(5.0) and sig_warm == {"relu/a": pytest.approx(5.0)}


def test_time_cold_measures_what_a_call_pays_after_an_eviction() -> None:
    """A fake call that is slow only right after an eviction: 2 ms cold, nothing hot."""
    state = {"cold": False}
    threads_set: list[int] = []

    def call() -> None:
        if state["cold"]:
            time.sleep(0.002)
            state["cold"] = False

    def evict() -> None:
        state["cold"] = True

    extra = time_cold(call, (), {}, (1, 2), threads_set.append, evict, reps=3)
    assert threads_set == [1, 2]
    assert set(extra) == {1, 2}
    assert all(1500.0 < us < 20000.0 for us in extra.values())


def test_the_evictor_writes_at_most_its_cap() -> None:
    import torch

    from schedlab.calibrate.cold import EVICT_MAX_BYTES, Evictor

    assert Evictor(torch, llc=480 << 20).buf.numel() * 4 == EVICT_MAX_BYTES  # a VM listing its socket's L3
    assert Evictor(torch, llc=8 << 20).buf.numel() * 4 == 16 << 20  # twice a small one
