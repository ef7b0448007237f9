"""The team-stall probe: what it times, and how a calibration keeps it."""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

import schedlab.calibrate.team_stall as ts
from schedlab.calibrate import Profile, run_calibration
from schedlab.calibrate.team_stall import StallLevel, describe, measure_team_stall, time_team_stall
from schedlab.cli import calibrate_cmd
from tests.calibrate.test_run import TINY

two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a one-core host has no second team to stall beside")


@two_cores
def test_a_level_is_the_extra_over_each_calls_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    beside: list[float] = []
    timed = ts._beside_us

    def spy(call: object, calls: int) -> list[float]:
        out = timed(call, calls)  # type: ignore[arg-type]
        beside.extend(out)
        return out

    monkeypatch.setattr(ts, "_beside_us", spy)
    lv = time_team_stall(2, calls=12, side_us=500.0)
    assert lv.threads == 2 and lv.calls == len(beside) == 3 * 12  # three small calls, twelve times each
    assert 0.0 < lv.alone_us < min(beside)  # a call beside a busy team never beats its time alone
    assert 0.0 <= lv.median_us <= lv.p90_us <= max(beside)
    assert 0.0 <= lv.mean_us < statistics.fmean(beside)  # less each call's own time
    back = StallLevel(**lv.to_json())
    assert back.calls == lv.calls and back.median_us == pytest.approx(lv.median_us, abs=0.01)


def test_thread_counts_below_two_or_above_the_cores_are_not_timed() -> None:
    assert measure_team_stall([1], cores=2) == []
    assert measure_team_stall([1, 2, 4], cores=1) == []
    with pytest.raises(ValueError, match="two or more threads"):
        time_team_stall(1)
    with pytest.raises(ValueError, match="and a call"):
        time_team_stall(2, calls=0)


def test_describe_names_each_thread_count() -> None:
    line = describe([StallLevel(2, 120.4, 61.2, 210.0, 12.0, 450)])
    assert line == ("team stall (a small call beside a busy team, recorded, not charged): "
                    "2 thr median 61 us, p90 210, mean 120")


@two_cores
def test_a_calibration_keeps_the_stall_in_its_meta_and_prints_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ts, "CALLS", 5)
    monkeypatch.setattr(ts, "SIDE_US", 500.0)
    out = tmp_path / "p.json"
    cfg = replace(TINY, threads=(1, 2), wake_reps=1, corun_steps=0, team_stall=True)
    profile = run_calibration(quick=True, out=out, progress=False, config=cfg)
    kept = Profile.load(out).meta["team_stall"]
    assert kept == profile.meta["team_stall"]
    assert [lv["threads"] for lv in kept] == [2] and kept[0]["calls"] == 15
    calibrate_cmd._print_table(calibrate_cmd.summary(profile, out, 1.0))
    assert "team stall (a small call beside a busy team, recorded, not charged): 2 thr median " in capsys.readouterr().out
