"""The step factor (`calibrate.trace_cal.step_factor`) and the TensorFlow cost model that
scales its kernels by it, on a synthetic trace: no TensorFlow needed."""

from __future__ import annotations

import statistics

import pytest

from schedlab.calibrate.signature import signature
from schedlab.calibrate.tf_costs import TFCalibrationRun, tf_costs
from schedlab.calibrate.trace_cal import trace_figures
from schedlab.trace import Trace, TraceEvent
from tests.conftest import captured_workload


def _run(slow: float) -> tuple[TFCalibrationRun, list[int]]:
    """Five one-at-a-time steps of the tiny mlp's kernels, each op 10 us plus 1 us per op
    index, and in step k the k-th kernel `slow` times its time (a preempted kernel: not a
    stall, under the stall cut, so no op's typical time moves)."""
    _, c = captured_workload("mlp")
    graph = c.graph  # type: ignore[attr-defined]
    kernels = [op for op in graph.ops if not op.is_view]
    events, busy = [], []
    for step in range(5):
        t, total = 0, 0
        for i, op in enumerate(kernels):
            dur = int((10 + i) * 1e3 * (slow if i == step else 1.0))
            events.append(TraceEvent(op.id, op.name, op.kind.value, "cpu0", 0, 1, t, t + dur, step))
            t += dur + 2_000
            total += dur
        busy.append(total)
    trace = Trace(tuple(events), {"source": "exec"})
    run = TFCalibrationRun(graph, trace, tuple(b / 1e9 + 1e-3 for b in busy), intra_op=1, inter_op=1)
    return run, busy


def test_the_step_factor_scales_the_table_to_the_median_steps_kernels() -> None:
    run, busy = _run(slow=6.0)
    figs = trace_figures(run.trace, run.graph, floor_us=0.0)
    table, factor = figs.signatures, figs.step_factor
    # every op's typical time is its unslowed one (the slow event is over the stall line,
    # so its mean leaves it out), yet every step paid one slow kernel
    table_sum_us = sum(table[sig][1] for sig in _sigs_of_events(run))
    assert factor == pytest.approx(statistics.median(busy) / 1e3 / table_sum_us)
    assert factor > 1.01
    costs = tf_costs([run], base=None)
    assert costs.meta["runs"][0]["step_factor"] == pytest.approx(factor, abs=1e-4)
    for sig, row in table.items():
        assert costs.signatures[sig][1] == pytest.approx(row[1] * factor)


def test_steps_that_pay_nothing_beyond_their_typical_ops_are_left_alone() -> None:
    run, _ = _run(slow=1.0)
    assert trace_figures(run.trace, run.graph, floor_us=0.0).step_factor == pytest.approx(1.0)


def _sigs_of_events(run: TFCalibrationRun) -> list[str]:
    return [signature(run.graph.ops[e.op]) for e in run.trace.step_events(0)]
