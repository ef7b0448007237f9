"""Benchmark (`make bench`): the one pipeline timing model at scale. A 64-stage pipeline
with 512 micro-batches (about 100k actions with ZB-H1's split backward) is generated,
validated and timed in at most 30 s (issue 12's target)."""

from __future__ import annotations

import time

import pytest

from schedlab.pipeline import check_schedule
from schedlab.pipeline.generators import default_shape, generate

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_64_stages_512_microbatches_time_within_30_s(benchmark, name: str) -> None:  # type: ignore[no-untyped-def]
    def run() -> tuple[int, float, float]:
        t0 = time.perf_counter()
        schedule = generate(name, default_shape(name, 64), 512)
        timeline = check_schedule(schedule)
        return schedule.n_actions(), timeline.makespan, time.perf_counter() - t0

    n_actions, makespan, wall_s = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update({"actions": n_actions, "makespan": makespan, "wall_s": wall_s})
    print(f"\n{name}: {n_actions} actions, generated + checked + timed in {wall_s:.2f} s, makespan {makespan:g}")
    assert n_actions >= 64 * 512 * 2
    assert wall_s <= 30.0
