"""Fitting a saved profile's co-run waits again on the steps it kept (`calibrate --refit-waits`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from schedlab.calibrate import Profile, run_calibration
from schedlab.calibrate.run import refit_waits
from schedlab.cli import calibrate_cmd
from schedlab.errors import SchedlabError
from schedlab.machine import detect_host
from tests.calibrate.test_run import TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, Path]:
    out = tmp_path_factory.mktemp("refit") / "profile.json"
    return run_calibration(quick=True, out=out, progress=False, config=TINY), out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="schedlab")
    calibrate_cmd.register(p.add_subparsers(dest="command"))
    return p


def test_a_refit_of_unchanged_steps_gives_the_waits_the_calibration_fitted(tiny: tuple[Profile, Path]) -> None:
    profile, _ = tiny
    rows = profile.meta["corun_fit"]
    assert rows and all(r["graph"] for r in rows)  # each row names the graph it ran
    again = refit_waits(profile, detect_host())
    for n, wait in profile.corun.latency_us.items():  # the rows keep ms to 3 decimals: the 0.1 us grid may move one step
        assert again.corun.latency_us[n] == pytest.approx(wait, abs=0.25)
    assert again.meta["refit_from"]["latency_us"] == {str(k): round(v, 4) for k, v in profile.corun.latency_us.items()}
    assert [r["source"] for r in again.meta["corun_fit"]] == [r["source"] for r in rows]


def test_a_graph_captured_again_in_another_form_of_the_same_schedule_is_refitted(tiny: tuple[Profile, Path]) -> None:
    """A capture may read a gradient from another of a producer's equal outputs than the
    calibration's did (an LSTM's two bias gradients, `Graph.schedule_hash`): its hash then
    differs, its schedule does not, and the refit goes on."""
    profile, _ = tiny
    rows = profile.meta["corun_fit"]
    assert all(r["schedule"] for r in rows)
    other = [{**r, "graph": "0" * 16} for r in rows]
    again = refit_waits(replace(profile, meta={**profile.meta, "corun_fit": other}), detect_host())
    assert again.corun.latency_us == refit_waits(profile, detect_host()).corun.latency_us


def test_slower_kept_steps_fit_a_longer_wait(tiny: tuple[Profile, Path]) -> None:
    profile, _ = tiny
    slower = [{**r, "median_ms": r["median_ms"] * 3} if r["slots"] == 2 else r for r in profile.meta["corun_fit"]]
    base = refit_waits(profile, detect_host())
    again = refit_waits(replace(profile, meta={**profile.meta, "corun_fit": slower}), detect_host())
    assert all(again.corun.latency_us[n] > base.corun.latency_us[n] for n in base.corun.latency_us)


def test_a_graph_that_changed_since_calibration_is_refused(tiny: tuple[Profile, Path]) -> None:
    profile, _ = tiny
    rows = [{**r, "graph": "0" * 16, "schedule": "1" * 16} for r in profile.meta["corun_fit"]]
    with pytest.raises(SchedlabError, match=r"is not the one the profile measured .*changed since"):
        refit_waits(replace(profile, meta={**profile.meta, "corun_fit": rows}), detect_host())
    rows = [{k: v for k, v in {**r, "graph": "0" * 16}.items() if k != "schedule"} for r in profile.meta["corun_fit"]]
    with pytest.raises(SchedlabError, match="keeps no schedule hash"):  # a profile from before the schedule hash
        refit_waits(replace(profile, meta={**profile.meta, "corun_fit": rows}), detect_host())
    with pytest.raises(SchedlabError, match="kept no co-run calibration steps"):
        refit_waits(replace(profile, meta={**profile.meta, "corun_fit": []}), detect_host())
    rows = [{**r, "source": "lenet/tiny/sgd"} for r in profile.meta["corun_fit"]]
    with pytest.raises(SchedlabError, match="graphs this version does not calibrate: lenet/tiny/sgd"):
        refit_waits(replace(profile, meta={**profile.meta, "corun_fit": rows}), detect_host())


def test_the_command_rewrites_the_profile_and_reports_both_waits(
    tiny: tuple[Profile, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, src = tiny
    out = tmp_path / "q.json"
    out.write_text(src.read_text())
    args = parser().parse_args(["calibrate", "--refit-waits", "--out", str(out), "--json", "--no-progress"])
    assert args.handler(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(out) and set(shown["before"]) == {"latency_us", "team_latency_us"}
    kept = Profile.load(out)
    assert kept.meta["refit_from"] == shown["before"]
    assert {str(k): round(v, 4) for k, v in kept.corun.latency_us.items()} == shown["after"]["latency_us"]
    assert kept.classes.keys() == profile.classes.keys()  # nothing else moved
    args = parser().parse_args(["calibrate", "--refit-waits", "--out", str(out)])
    assert args.handler(args) == 0
    assert "co-run wait per op: " in capsys.readouterr().out


def test_the_command_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    for argv, match in (
        (["--refit-waits", "--links"], "goes alone"),
        (["--refit-waits", "--threads", "1"], "goes alone"),
        (["--refit-waits", "--out", str(tmp_path / "none.json")], "no profile at"),
    ):
        args = parser().parse_args(["calibrate", *argv])
        with pytest.raises(SchedlabError, match=match):
            args.handler(args)
    assert not (tmp_path / "none.json").exists()
