"""What a many-core host (a lent machine's 16 cores) calibrates and is judged on."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.calibrate.fidelity import concurrency_spread, plan_spread
from schedlab.cli import main
from schedlab.machine import usable_cores


def test_two_cores_keep_the_spread_they_always_had() -> None:
    assert concurrency_spread(2) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert concurrency_spread(1) == [(1, 1)]
    assert len(plan_spread(2)) == 16


def test_many_cores_get_the_concurrency_papers_spread_within_the_cores() -> None:
    pairs = concurrency_spread(16)
    assert {t for s, t in pairs if s == 1} == {1, 2, 4, 8, 16}
    assert {s for s, _ in pairs} == {1, 2, 4}
    assert all(s * t <= 16 for s, t in pairs) and len(pairs) == 12
    assert (1, 12) in concurrency_spread(12)  # the core count itself, not a power of two
    assert len(plan_spread(16)) == 48


def test_calibrate_threads_takes_a_list_and_refuses_more_threads_than_cores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "p.json"
    too_many = usable_cores() + 1
    assert main(["calibrate", "--quick", "--threads", f"1,{too_many}", "--out", str(out), "--no-progress"]) == 2
    assert f"cannot benchmark {too_many} intra-op threads on {usable_cores()} cores" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["calibrate", "--threads", "1,x", "--out", str(out)])
    assert "expected thread counts like 1,2,4,8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["calibrate", "--threads", "0", "--out", str(out)])
    assert "thread counts must be >= 1" in capsys.readouterr().err
