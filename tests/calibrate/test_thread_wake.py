"""The thread-wake benchmark: what it times, and how a calibration keeps it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

import schedlab.calibrate.thread_wake as tw
from schedlab.calibrate import Profile, run_calibration
from schedlab.calibrate.thread_wake import WakeLevel, describe, idle_state, measure_level, measure_thread_wake
from schedlab.cli import calibrate_cmd
from tests.calibrate.test_run import TINY


def test_a_level_times_each_wake_against_how_long_the_thread_was_blocked() -> None:
    lv = measure_level(200.0, rounds=20)
    assert lv.rounds == 20 and lv.gap_us == 200.0
    assert lv.blocked_us >= 200.0  # the waiter slept through the notifier's work, and more
    assert 0.0 < lv.p10_us <= lv.wake_us <= lv.p90_us
    back = WakeLevel(**lv.to_json())
    assert back.rounds == 20 and back.wake_us == pytest.approx(lv.wake_us, abs=1e-3)


def test_levels_come_in_ascending_gaps_and_sleep_longer_as_the_gap_grows() -> None:
    levels = measure_thread_wake(gaps_us=(2000.0, 0.0), rounds=10)
    assert [lv.gap_us for lv in levels] == [0.0, 2000.0]
    assert levels[1].blocked_us > levels[0].blocked_us + 1000.0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one level"):
        measure_thread_wake(gaps_us=(), rounds=5)
    with pytest.raises(ValueError, match="one round"):
        measure_thread_wake(gaps_us=(10.0,), rounds=0)


def test_idle_state_reads_the_settings_that_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "driver").write_text("haltpoll\n")
    monkeypatch.setattr(tw, "IDLE_FILES", {"cpuidle_driver": str(tmp_path / "driver"), "gone": str(tmp_path / "nope")})
    assert idle_state() == {"cpuidle_driver": "haltpoll"}
    line = describe([WakeLevel(0.0, 21.0, 24.6, 20.0, 30.0, 10), WakeLevel(1000.0, 1034.0, 55.2, 40.0, 70.0, 10)],
                    idle_state())
    assert line == ("thread wake (a blocked co-run worker, median): 25 us after 21 us, 55 us after 1.0 ms "
                    "(cpuidle_driver haltpoll)")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a one-core host has no co-run worker to wake")
def test_a_calibration_keeps_the_wakes_in_its_meta_and_prints_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tw, "ROUNDS", 5)
    monkeypatch.setattr(tw, "GAPS_US", (0.0, 300.0))
    out = tmp_path / "p.json"
    profile = run_calibration(quick=True, out=out, progress=False, config=replace(TINY, thread_wake=True))
    kept = Profile.load(out).meta["thread_wake"]
    assert kept == profile.meta["thread_wake"]
    assert [lv["gap_us"] for lv in kept["levels"]] == [0.0, 300.0]
    assert all(lv["wake_us"] > 0 and lv["rounds"] == 5 for lv in kept["levels"])
    calibrate_cmd._print_table(calibrate_cmd.summary(profile, out, 1.0))
    assert "thread wake (a blocked co-run worker, median): " in capsys.readouterr().out
