"""`python -m schedlab.calibrate.sim_bench`: the random DAGs timed with a Profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.calibrate.sim_bench import main
from tests.calibrate.factories import make_profile


def test_the_bench_times_each_size_and_slot_count_with_the_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(make_profile().to_json()))
    main(["--profile", str(path), "--sizes", "40,60", "--repeats", "1", "--slots", "1,2"])
    out = capsys.readouterr().out
    assert str(path) in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("40", "1"), ("40", "2"), ("60", "1"), ("60", "2")]
    assert all(float(r[-1]) > 0 and float(r[4].replace(",", "")) > 0 for r in rows)  # a step, and cold ops per second


def test_the_bench_needs_a_profile(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--sizes", "40"])
    assert "--profile" in capsys.readouterr().err
