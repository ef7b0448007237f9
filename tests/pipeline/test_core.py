"""The schedule data, its validator and the one timing model, on hand-written schedules."""

from __future__ import annotations

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import (
    Action,
    Kind,
    PipeShape,
    Schedule,
    Stage,
    chain,
    check_schedule,
    parse_action,
    parse_text,
    stage_devices,
    time_schedule,
)

ONE_F_ONE_B_4x4 = """\
0: 0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3
1: 1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3
2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2B3
3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3
"""


def _schedule(text: str, shape: PipeShape) -> Schedule:
    orders, dropped = parse_text(text)
    return Schedule(shape=shape, n_microbatches=4, orders=orders, comm_dropped=dropped)


def test_action_text_round_trips_in_torchs_form() -> None:
    for text in ("0F1", "12B3", "2I5", "2W5", "1SEND_F0", "3RECV_B12"):
        assert str(parse_action(text)) == text
    assert parse_action("2F0") == Action(2, Kind.F, 0)
    with pytest.raises(SchedlabError, match="expected STAGE KIND MICROBATCH"):
        parse_action("F0")


def test_1f1b_unit_costs_meet_the_closed_forms() -> None:
    s = _schedule(ONE_F_ONE_B_4x4, chain(4, f_time=1, b_time=1))
    t = check_schedule(s)
    assert t.makespan == 2 * 4 + 2 * (4 - 1)
    assert t.bubble_fraction == pytest.approx(3 / 7)  # (P-1)/(M+P-1) = 42.86%
    assert t.peak_memory == (4, 3, 2, 1)
    assert s.to_text() == ONE_F_ONE_B_4x4


def test_communication_time_delays_each_crossing() -> None:
    s = _schedule(ONE_F_ONE_B_4x4, chain(4, f_time=1, b_time=1))
    # the first micro-batch crosses 3 links down and 3 back before device 0's first B
    assert time_schedule(s, comm_time=0.5).start[Action(0, Kind.B, 0)] == 4 + 3 + 3 * 0.5 * 2


def test_a_swapped_pair_deadlocks_with_a_message_naming_the_wait() -> None:
    text = ONE_F_ONE_B_4x4.replace("3: 3F0 3B0", "3: 3B0 3F0")
    with pytest.raises(SchedlabError, match=r"deadlocks: .*device 3 waits at 3B0 for 3F0"):
        check_schedule(_schedule(text, chain(4)))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace(" 0B3", ""), "missing 0B3"),
        (lambda t: t.replace("0: 0F0", "0: 0F0 0F0"), "more than once"),
        (lambda t: t.replace("1: 1F0", "1: 0F0 1F0"), "stage 0 runs on device"),
        (lambda t: t.replace(" 3B3", " 3B3 3F7"), "micro-batch 7"),
    ],
)
def test_the_validator_names_what_is_wrong(edit, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match=message):
        check_schedule(_schedule(edit(ONE_F_ONE_B_4x4), chain(4)))


def test_memory_limit_is_checked() -> None:
    s = _schedule(ONE_F_ONE_B_4x4, chain(4))
    check_schedule(s, memory_limit=4)
    with pytest.raises(SchedlabError, match="device 0 holds 4 at its peak, over the memory limit 3"):
        check_schedule(s, memory_limit=3)


def test_a_stage_spanning_every_device_starts_when_all_reach_it() -> None:
    # stage 0 sharded over both devices, then one stage per device (a small M shape's head)
    shape = PipeShape(
        stages=(Stage(devices=(0, 1), next=(1,), f_time=1, b_time=1), Stage((0,), (2,)), Stage((1,))),
        n_devices=2,
    )
    orders = (
        tuple(map(parse_action, ["0F0", "1F0", "1B0", "0B0"])),
        tuple(map(parse_action, ["0F0", "2F0", "2B0", "0B0"])),
    )
    t = check_schedule(Schedule(shape=shape, n_microbatches=1, orders=orders))
    assert t.start[Action(0, Kind.B, 0)] == 1 + 1 + 1 + 2 + 2  # after 0F0, 1F0, 2F0, 2B0, 1B0
    with pytest.raises(SchedlabError, match="device 1 does not run 0B0"):
        check_schedule(Schedule(shape=shape, n_microbatches=1, orders=(orders[0], orders[1][:-1])))


def test_stage_maps() -> None:
    assert stage_devices(8, 4, "loop") == (0, 1, 2, 3, 0, 1, 2, 3)
    assert stage_devices(8, 4, "v") == (0, 1, 2, 3, 3, 2, 1, 0)
    with pytest.raises(SchedlabError, match="do not split evenly"):
        stage_devices(6, 4)
    with pytest.raises(SchedlabError, match="form a cycle"):
        PipeShape(stages=(Stage((0,), (1,)), Stage((0,), (0,))), n_devices=1)


def test_completion_spacing_never_beats_the_busiest_devices_work() -> None:
    from schedlab.pipeline.generators import default_shape, generate

    # GPipe finishes its micro-batches in a burst, one B apart; a steady state still needs
    # F + B of every device per micro-batch.
    t = time_schedule(generate("gpipe", default_shape("gpipe", 4, f_time=1, b_time=1), 8))
    assert t.completion_spacing() == 2.0
    assert max(t.busy) / 8 == 2.0
