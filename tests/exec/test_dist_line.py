"""A one-slot rank's straight line, in this process (a one-rank gloo group)."""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from schedlab.exec.dist import RankExecutor
from schedlab.exec.runner import run_steps
from schedlab.machine import host_ranks
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_rank_runs_the_step_the_one_process_executor_runs_and_is_freed_with_its_last_reference(
        one_rank: None) -> None:
    _, c = captured_workload("mlp")
    graph, inputs = c.graph, c.input_values  # type: ignore[attr-defined]
    machine = host_ranks(1)
    resolved = resolve(graph, Plan(threads=1), machine)
    ex = RankExecutor(graph, resolved, machine, 0)
    out, rec = ex.step(inputs)
    want = run_steps(graph, inputs, Plan(threads=1), machine, steps=1, warmup=0).outputs
    assert want is not None and set(out) == set(want)
    for v, t in out.items():
        torch.testing.assert_close(t, want[v], rtol=0, atol=0)
    ends = [b for _, b, _ in rec.spans]
    assert all(a <= b for a, b, _ in rec.spans) and all(x <= y for x, y in itertools.pairwise(ends))
    # A timed loop takes the clock readings (`run_step`) and makes spans after it (`record`):
    # the same record, the step's wall time not counting the pass over its ops.
    _, stamps = ex.run_step(inputs)
    later = ex.record(stamps)
    assert later.wall_ns == stamps.wall_ns and len(later.spans) == len(rec.spans)
    assert later.spans[-1][1] <= later.wall_ns and all(a <= b for a, b, _ in later.spans)
    # No reference cycle through the compiled line: the executor (and the process groups it
    # holds) goes when its last reference does, not whenever the collector runs.
    gc.disable()
    try:
        ref = weakref.ref(ex)
        del ex
        assert ref() is None
    finally:
        gc.enable()
