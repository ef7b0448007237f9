"""A pipeline schedule's timeline as text: one row per device, time left to right.

Each action is drawn over the columns its start and end fall in, as its kind's letter
(F, B, I, W) followed by its micro-batch number where the action is wide enough, and
``-`` over the rest of it; ``.`` is idle time:

    time 0..22, 2 columns per time unit
         0         5         10        15        20
    d0 |F0F1F2F3B0F4B1F5B2F6B3F7B4..B5..B6..B7|

The scale is the first of these that fits `width`: the shortest action wide enough for
its label, else one column for the shortest action, else the makespan over the width
(then actions shorter than a column may not show).
"""

from __future__ import annotations

import math

from schedlab.pipeline import Timeline

IDLE = "."
TAIL = "-"
_ROW_HEAD = "d{device:<{digits}} |"


def columns_per_unit(timeline: Timeline, width: int) -> float:
    """The drawing scale, in columns per time unit, for a picture at most `width` wide."""
    durations = [timeline.end[a] - timeline.start[a] for a in timeline.end]
    shortest = min((d for d in durations if d > 0), default=1.0)
    makespan = timeline.makespan if timeline.makespan > 0 else 1.0
    label_cols = 1 + len(str(max(timeline.schedule.n_microbatches - 1, 0)))
    room = max(10, width - len(_head(0, timeline.schedule.n_devices)) - 1)
    for cols in (label_cols / shortest, 1 / shortest):
        if math.ceil(makespan * cols) <= room:
            return cols
    return room / makespan


def ascii_gantt(timeline: Timeline, width: int = 100) -> str:
    """The picture described in the module docstring, lines joined, ending in a newline."""
    schedule = timeline.schedule
    cols = columns_per_unit(timeline, width)
    n_cols = max(1, math.ceil(timeline.makespan * cols - 1e-9))

    def col(t: float) -> int:
        return min(n_cols, round(t * cols))

    rows = []
    for d, order in enumerate(schedule.orders):
        cells = [IDLE] * n_cols
        for a in order:
            lo, hi = col(timeline.start[a]), col(timeline.end[a])
            if hi <= lo:
                continue  # shorter than half a column at this scale
            label = f"{a.kind.value}{a.mb}"
            text = label if len(label) <= hi - lo else a.kind.value
            cells[lo:hi] = list(text.ljust(hi - lo, TAIL))
        rows.append(_head(d, schedule.n_devices) + "".join(cells) + "|")
    if cols >= 1:
        scale = f"{cols:g} column{'s' if cols != 1 else ''} per time unit"
    else:
        scale = f"1 column per {1 / cols:.3g} time units"
    lines = [f"time 0..{timeline.makespan:g}, {scale}", _ruler(timeline.makespan, cols, n_cols, schedule.n_devices)]
    return "\n".join([*lines, *rows]) + "\n"


def _head(device: int, n_devices: int) -> str:
    return _ROW_HEAD.format(device=device, digits=len(str(n_devices - 1)))


def _ruler(makespan: float, cols: float, n_cols: int, n_devices: int) -> str:
    """Time labels over the columns they start at, at a round step (1, 2, 5 x 10^k) that
    leaves room for each label."""
    widest = max(8, len(f"{makespan:g}") + 2)
    step = 1.0
    for k in range(-3, 12):
        for m in (1, 2, 5):
            step = m * 10.0**k
            if step * cols >= widest:
                break
        else:
            continue
        break
    line = [" "] * (n_cols + 1)
    t = 0.0
    while t <= makespan + 1e-9:
        label = f"{t:g}"
        c = round(t * cols)
        if c + len(label) <= len(line):
            line[c : c + len(label)] = list(label)
        t = round(t + step, 9)
    return " " * len(_head(0, n_devices)) + "".join(line).rstrip()
