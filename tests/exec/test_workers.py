"""The co-run worker loop on kept workers: a pool serves step after step, with a helper
thread finishing the ops no worker runs (a rank's receives and all-reduces)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from schedlab.exec.workers import ReadyLoop, WorkerPool


def _chain_loop(ran: list[tuple[int, str]], helper_ran: list[int]) -> tuple[ReadyLoop, Callable[[], None]]:
    """Op 0 -> external op 1 -> op 2, and op 3 on its own: the helper waits for op 1's
    input and finishes it; every op's thread is recorded."""
    lock = threading.Lock()

    def run_op(i: int) -> None:
        with lock:
            ran.append((i, threading.current_thread().name))

    loop = ReadyLoop(
        ops=range(4), prio=[0, 1, 2, 3], succs=[[1], [2], [], []], indeg=[0, 1, 1, 0], threads=[1, 1, 1, 1],
        run_op=run_op, release=lambda i: None, fail=lambda i, e: e, n_spans=4, external={1},
    )

    def helper() -> None:
        if loop.wait_ready(1):
            t0 = time.perf_counter_ns()
            helper_ran.append(1)
            loop.complete(1, t0, time.perf_counter_ns(), -1)

    return loop, helper


def test_a_pool_runs_a_step_with_a_helper_each_step_on_the_same_threads() -> None:
    pool = WorkerPool(2)
    names: set[str] = set()
    try:
        for _ in range(3):
            ran: list[tuple[int, str]] = []
            helper_ran: list[int] = []
            loop, helper = _chain_loop(ran, helper_ran)
            spans = loop.run(2, helper, pool=pool)
            assert sorted(i for i, _ in ran) == [0, 2, 3] and helper_ran == [1]
            assert spans[1][2] == -1 and spans[2][0] >= spans[1][1]  # op 2 waited for the helper's op
            names |= {name for _, name in ran}
    finally:
        pool.close()
    assert names <= {"schedlab-worker-0", "schedlab-worker-1"}  # the pool's two threads, every step


def test_a_pool_of_another_size_is_refused() -> None:
    pool = WorkerPool(1)
    try:
        loop, _ = _chain_loop([], [])
        with pytest.raises(ValueError, match="a pool of 1 workers runs a step of 2 workers"):
            loop.run(2, pool=pool)
    finally:
        pool.close()


def test_closing_a_pool_waits_for_its_workers_to_end() -> None:
    """A rank's process must not exit with a worker still running (it aborts: the ranks of
    `make test-slow`'s co-run rank tests did before closing waited)."""
    pool = WorkerPool(2)
    loop, helper = _chain_loop([], [])
    loop.run(2, helper, pool=pool)
    pool.close()
    assert not any(t.is_alive() for t in pool._threads)
    pool.close()  # twice: harmless
