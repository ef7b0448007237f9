"""The ASCII Gantt chart: exact rows at one scale, labels where they fit, and rows that
never pass the width."""

from __future__ import annotations

import pytest

from schedlab.cli.ascii_gantt import ascii_gantt, columns_per_unit
from schedlab.pipeline import chain, time_schedule
from schedlab.pipeline.generators import default_shape, generate


def test_gpipe_rows_with_labels_and_tails() -> None:
    t = time_schedule(generate("gpipe", chain(2, f_time=1, b_time=2), 3))
    assert columns_per_unit(t, 100) == 2  # "F2" needs 2 columns, F lasts 1
    lines = ascii_gantt(t, 100).splitlines()
    assert lines[0] == "time 0..12, 2 columns per time unit"
    assert lines[2] == "d0 |F0F1F2......B0--B1--B2--|"
    assert lines[3] == "d1 |..F0F1F2B0--B1--B2--....|"


def test_letters_only_when_labels_do_not_fit_and_scaled_below_that() -> None:
    t = time_schedule(generate("1f1b", chain(2, f_time=1, b_time=1), 12))  # labels up to "F11": 3 columns
    wide = ascii_gantt(t, 200).splitlines()
    assert columns_per_unit(t, 200) == 3 and "F11" in wide[2]
    narrow = ascii_gantt(t, 40).splitlines()  # 26 units: 3 columns each do not fit in 35, 1 does
    assert columns_per_unit(t, 40) == 1
    assert narrow[2].startswith("d0 |FF.BFBFB") and all(len(line) <= 40 for line in narrow)
    tiny = ascii_gantt(t, 20).splitlines()
    assert columns_per_unit(t, 20) < 1 and "column per" in tiny[0]
    assert len(tiny) == 4 and all(len(line) <= 20 for line in tiny[1:])  # the ruler and rows; the caption wraps


@pytest.mark.parametrize("name", ["zbv", "interleaved:2", "ooo"])
def test_every_device_row_covers_the_makespan(name: str) -> None:
    t = time_schedule(generate(name, default_shape(name, 4), 8))
    rows = [line for line in ascii_gantt(t, 120).splitlines() if line.startswith("d")]
    cols = columns_per_unit(t, 120)
    assert len(rows) == 4
    assert {len(r) for r in rows} == {len("d0 |") + round(t.makespan * cols) + 1}
    busy_cols = [sum(c != "." for c in r[4:-1]) for r in rows]
    assert busy_cols == [round(b * cols) for b in t.busy]  # every action drawn, none overlapping
