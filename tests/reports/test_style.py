"""Small pure helpers of the report: tick choice, running best, speedup arithmetic."""

from __future__ import annotations

import pytest

from schedlab.plan import Plan
from schedlab.reports.figures.history import running_best
from schedlab.reports.figures.speedup import predicted_speedup, speedup_of, spread_of
from schedlab.reports.load import Measured
from schedlab.reports.style import log_ticks


@pytest.mark.parametrize(("lo", "hi"), [(15.0, 24.0), (40.0, 41.5), (0.3, 700.0), (1.0, 10.0), (2.2, 2.3)])
def test_log_ticks_gives_two_to_six_round_ticks_inside(lo: float, hi: float) -> None:
    ticks = log_ticks(lo, hi)
    assert 2 <= len(ticks) <= 6 or (hi / lo < 1.05 and len(ticks) >= 1)
    assert all(lo <= t <= hi for t in ticks) and ticks == sorted(ticks)
    assert all(len(f"{t:g}") <= 5 for t in ticks)


def test_running_best() -> None:
    assert running_best([3.0, 4.0, 2.0, 5.0, 1.0]) == [3.0, 3.0, 2.0, 2.0, 1.0]


def _m(median: float, spread: tuple[float, float] | None, pred: float | None = None) -> Measured:
    return Measured("x", "candidate", Plan(), pred, median, (), spread)


def test_speedup_and_its_spread() -> None:
    best, base = _m(10.0, (9.0, 11.0), 8.0), _m(15.0, (14.0, 18.0), 12.0)
    assert speedup_of(best, base, "b") == pytest.approx(1.5)
    assert spread_of(best, base) == pytest.approx((14.0 / 11.0, 18.0 / 9.0))
    assert predicted_speedup(best, base) == pytest.approx(1.5)
    assert spread_of(_m(10.0, None), base) is None
    stored = Measured("x", "candidate", Plan(), None, 10.0, (), None, speedup={"b": 1.42})
    assert speedup_of(stored, base, "b") == 1.42
