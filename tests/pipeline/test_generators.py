"""Schedule generators: every one valid over a grid of devices and micro-batches, and each
checked against its closed form or its paper's claim, under the one timing model."""

from __future__ import annotations

import re

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import Schedule, Timeline, chain, check_schedule, time_schedule
from schedlab.pipeline.generators import SCHEDULES, default_shape, generate, schedule_names

NAMES = ("gpipe", "1f1b", "interleaved:2", "interleaved:3", "looped-bfs", "zb-h1", "zb-h2", "zbv", "ooo")
DEVICES = (1, 2, 3, 4, 8)


def _bubble_time(t: Timeline) -> float:
    return t.makespan * len(t.busy) - sum(t.busy)


def _idle_inside(s: Schedule, t: Timeline) -> float:
    """Most idle time any device has between the start of its first action and the end
    of its last: 0 for a schedule with no bubble in its steady state."""
    return max(max(t.end[a] for a in o) - min(t.start[a] for a in o) - t.busy[d] for d, o in enumerate(s.orders))


def test_names() -> None:
    assert schedule_names() == ("gpipe", "1f1b", "interleaved:V", "looped-bfs", "zb-h1", "zb-h2", "zbv", "ooo")
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "looped-bfs", "zb-h1", "zb-h2", "zbv", "ooo"}


# Interleaved 1F1B splits M into M // P equal rounds; these (P, M) do not split.
NOT_IN_ROUNDS = [(2, 5), (2, 7), (2, 9), (2, 11), (2, 13), (2, 15), (3, 7), (3, 10), (3, 11), (3, 13), (3, 14)]
NOT_IN_ROUNDS += [(3, 16), (4, 9), (4, 11), (4, 13), (4, 14)]


@pytest.mark.parametrize("name", NAMES)
def test_every_schedule_is_valid_for_p_1_to_8_and_m_1_to_16(name: str) -> None:
    refused = []
    for p in DEVICES:
        shape = default_shape(name, p)
        for m in range(1, 17):
            try:
                s = generate(name, shape, m)
            except SchedlabError as e:
                assert re.search(rf"M={m} does not split so; use M=\d+ or M=\d+", str(e)), e
                refused.append((p, m))
                continue
            t = check_schedule(s)
            kinds_per_stage = 3 if SCHEDULES[s.name.split(":")[0]].split_backward else 2
            assert s.n_actions() == shape.n_stages * m * kinds_per_stage
            assert t.makespan > 0
    assert refused == (NOT_IN_ROUNDS if name.startswith("interleaved") else [])


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 1), (2, 5), (3, 7), (4, 2), (4, 4), (4, 8), (8, 16)])
def test_1f1b_unit_costs_meet_the_closed_forms(p: int, m: int) -> None:
    t = time_schedule(generate("1f1b", chain(p, f_time=1, b_time=1), m))
    assert t.makespan == 2 * m + 2 * (p - 1)
    assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert t.peak_memory == tuple(min(p - d, m) for d in range(p))


def test_1f1b_bubble_figures() -> None:
    def bubble(m: int) -> float:
        return time_schedule(generate("1f1b", chain(4, f_time=1, b_time=1), m)).bubble_fraction

    assert round(100 * bubble(4), 2) == 42.86
    assert round(100 * bubble(8), 2) == 27.27


@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 4), (4, 8), (8, 12)])
def test_gpipe_matches_1f1b_in_time_and_holds_every_micro_batch(p: int, m: int) -> None:
    shape = chain(p, f_time=1, b_time=1)
    g, one = time_schedule(generate("gpipe", shape, m)), time_schedule(generate("1f1b", shape, m))
    assert g.makespan == one.makespan == 2 * m + 2 * (p - 1)
    assert g.peak_memory[0] == m
    assert one.peak_memory[0] == min(p, m)


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 4), (8, 16, 2)])
def test_interleaved_bubble_shrinks_with_v(p: int, m: int, v: int) -> None:
    # each of the V chunks does 1/V of a stage's work, so a micro-batch's work is unchanged
    shape = chain(p, v * p, "loop", f_time=1 / v, b_time=1 / v)
    t = check_schedule(generate(f"interleaved:{v}", shape, m))
    assert t.bubble_fraction == pytest.approx((p - 1) / (m * v + p - 1))
    assert t.makespan == pytest.approx(2 * m + 2 * (p - 1) / v)


def test_interleaved_figure() -> None:
    t = time_schedule(generate("interleaved:2", chain(4, 8, "loop", f_time=0.5, b_time=0.5), 8))
    assert round(100 * t.bubble_fraction, 2) == 15.79


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m_over_p", [1, 2, 3])
def test_zb_h1_has_a_third_of_1f1bs_bubble_at_its_memory(p: int, m_over_p: int) -> None:
    m = p * m_over_p
    shape = chain(p, f_time=1, i_time=1, w_time=1)  # T_F = T_I = T_W; 1F1B's B = 2
    one = check_schedule(generate("1f1b", shape, m))
    h1 = check_schedule(generate("zb-h1", shape, m))
    assert _bubble_time(one) == 3 * p * (p - 1)  # (P - 1)(T_F + T_I + T_W) per device
    assert _bubble_time(h1) == pytest.approx(_bubble_time(one) / 3)
    assert h1.peak_memory == one.peak_memory


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_zb_h2_has_no_bubble_in_steady_state_for_more_memory(p: int, extra: int) -> None:
    # Exact check: with T_F = T_I = T_W and M >= 2P - 1, every device computes without a
    # gap from its first action to its last (the parallelogram), and the makespan is the
    # bound: the last device cannot start before (P - 1) T_F and then has 3M units of work.
    m = 2 * p - 1 + extra
    shape = chain(p, f_time=1, i_time=1, w_time=1)
    s = generate("zb-h2", shape, m)
    h2 = check_schedule(s)
    h1 = check_schedule(generate("zb-h1", shape, m))
    assert _idle_inside(s, h2) == 0
    assert _idle_inside(generate("zb-h1", shape, m), h1) == p - 1  # device 0 waits for its first I
    assert h2.makespan == (p - 1) + 3 * m
    assert h2.peak_memory[0] == 2 * p - 1 > h1.peak_memory[0] == p


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 8), (3, 5), (4, 4), (4, 8), (4, 16), (8, 8), (8, 16)])
def test_zbv_and_ooo_beat_1f1b_and_zb_h1_at_equal_work_and_memory(p: int, m: int) -> None:
    # default_shape splits the same work per device over each schedule's stages
    t = {
        n: check_schedule(generate(n, default_shape(n, p), m)) for n in ("1f1b", "zb-h1", "interleaved:2", "zbv", "ooo")
    }
    bound = (p - 1) / 2 + 3 * m  # two stages a device: the ramp is P - 1 half-stage forwards
    for n in ("zbv", "ooo"):
        assert t[n].makespan == pytest.approx(bound)
        assert t[n].makespan < t["zb-h1"].makespan < t["1f1b"].makespan
        assert t[n].makespan < t["interleaved:2"].makespan
        assert max(t[n].peak_memory) <= max(t["1f1b"].peak_memory)


def test_zbv_steady_state_has_no_gap_once_m_reaches_2p_minus_1() -> None:
    for p in (2, 3, 4, 8):
        s = generate("zbv", default_shape("zbv", p), 2 * p - 1)
        assert _idle_inside(s, time_schedule(s)) == 0


def test_figures_at_p4_m8() -> None:
    span = {n: time_schedule(generate(n, default_shape(n, 4), 8)).makespan for n in NAMES}
    assert span == pytest.approx(
        {
            "gpipe": 33,
            "1f1b": 33,
            "interleaved:2": 28.5,
            "interleaved:3": 27,
            "looped-bfs": 28.5,
            "zb-h1": 27,
            "zb-h2": 27,
            "zbv": 25.5,
            "ooo": 25.5,
        }
    )


def test_list_scheduled_orders_stay_valid_and_bounded_under_uneven_costs() -> None:
    for times in ({"f_time": 1, "i_time": 2, "w_time": 0.5, "w_mem": 0.4}, {"f_time": 2, "i_time": 1, "w_time": 3}):
        for name in ("zbv", "ooo"):
            for p, m in ((2, 3), (4, 8), (8, 9)):
                one = time_schedule(generate("1f1b", default_shape("1f1b", p, **times), m))
                t = check_schedule(generate(name, default_shape(name, p, **times), m))
                assert max(t.peak_memory) <= max(one.peak_memory) * 1.2


def test_golden_orders() -> None:
    shape = chain(2, f_time=1, i_time=1, w_time=1)
    assert (
        generate("zb-h1", shape, 3).to_text()
        == "0: 0F0 0F1 0I0 0F2 0W0 0I1 0W1 0I2 0W2\n1: 1F0 1I0 1F1 1I1 1F2 1W0 1I2 1W1 1W2\n"
    )
    assert (
        generate("zb-h2", shape, 3).to_text()
        == "0: 0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2\n1: 1F0 1I0 1F1 1I1 1F2 1I2 1W0 1W1 1W2\n"
    )
    assert generate("1f1b", chain(2), 3).to_text() == "0: 0F0 0F1 0B0 0F2 0B1 0B2\n1: 1F0 1B0 1F1 1B1 1F2 1B2\n"
    assert generate("looped-bfs", chain(2, 4), 2).to_text() == (
        "0: 0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0\n1: 1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0\n"
    )


def test_default_shape_builds_each_schedules_chain() -> None:
    assert default_shape("1f1b", 4).n_stages == 4
    interleaved = default_shape("interleaved:3", 4, f_time=3, b_time=6)
    assert interleaved.n_stages == 12 and interleaved.stages[4].devices == (0,)
    assert interleaved.stages[0].f_time == 1 and interleaved.stages[0].b_time == 2
    v = default_shape("zbv", 4)
    assert [st.devices[0] for st in v.stages] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert default_shape("ooo", 4).n_stages == 8
    assert default_shape("ooo", 4, n_stages=16).n_stages == 16
    assert default_shape("looped-bfs", 2, n_stages=6).stages[5].devices == (1,)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: generate("pipedream", chain(2), 2),
            "unknown pipeline schedule 'pipedream'; choose one of: gpipe, 1f1b",
        ),
        (lambda: generate("interleaved", chain(2, 4), 2), r"e\.g\. interleaved:2"),
        (lambda: generate("interleaved:1", chain(2), 2), "use 1f1b"),
        (lambda: generate("1f1b:2", chain(2), 2), "takes no ':' argument"),
        (lambda: generate("zbv", chain(2, 4, "loop"), 2), r"needs stages mapped 'v'.*default_shape\('zbv', 2\)"),
        (lambda: generate("zbv", chain(2, 8, "v"), 2), "needs 2 stage"),
        (lambda: generate("interleaved:2", chain(2, 4, "v"), 2), "needs stages mapped 'loop'"),
        (lambda: generate("interleaved:3", chain(2, 4), 2), "needs 3 stages per device; this pipeline has 2"),
        (lambda: generate("interleaved:2", chain(4, 8), 9), "M=9 does not split so; use M=8 or M=10"),
        (lambda: generate("1f1b", chain(2, 4), 2), r"needs 1 stage\(s\) per device"),
        (lambda: generate("ooo", chain(2), 2), "modulo layer allocation, at least 2 stages per device"),
        (lambda: generate("gpipe", chain(2), 0), "at least one micro-batch"),
        (lambda: default_shape("zbv", 4, n_stages=12), "runs 2 stage"),
        (lambda: default_shape("ooo", 4, n_stages=4), "at least 2 stages per device"),
        (lambda: default_shape("ooo", 4, n_stages=6), "do not split evenly"),
    ],
)
def test_impossible_requests_say_what_to_do(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match=message):
        call()
