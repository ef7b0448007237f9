"""Helpers shared by the simulator tests."""

from __future__ import annotations

from schedlab.sim import SimResult
from schedlab.trace import Trace


def rows(res: SimResult) -> list[list[object]]:
    """Every event of a recorded run's trace, as rows (engines agree when these are equal)."""
    assert res.trace is not None
    return [e.to_row() for e in res.trace.events]


def spans(trace: Trace | None) -> list[tuple[str, float, float, int]]:
    """(name, start µs, end µs, worker) of every event, in trace order."""
    assert trace is not None
    return [(e.name, e.start_ns / 1000, e.end_ns / 1000, e.worker) for e in trace.events]
