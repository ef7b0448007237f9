"""Summing across ranks as the executor and the calibrations do (`exec.reduce`): an
exchange over two directions' groups between two ranks, gloo's all-reduce among more."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from schedlab.exec.reduce import ExchangeWork, pair_directions
from tests.exec.spawned import run_spawned


def test_pair_directions_are_both_ways_of_each_two_rank_group() -> None:
    assert pair_directions([(0, 1), (0, 1, 2), (2, 3)]) == [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert pair_directions([(0, 1, 2, 3)]) == []


def _sum_rounds(rank: int, port: int, world: int, out: Any) -> None:
    import torch.distributed as dist

    from schedlab.exec.reduce import world_reducer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        reducer = world_reducer(rank, world)
        got = []
        # Rounds back to back with one tag, two in flight at once: matched in order.
        for k in range(0, 6, 2):
            a, b = torch.full((5,), float(rank + k)), torch.full((3, 2), float(10 * rank + k))
            wa, wb = reducer.start(a, tag=0), reducer.start(b, tag=0)
            wa.settle(30.0)
            wa.wait()
            wb.wait()
            got.append((a.tolist(), b.flatten().tolist(), type(wa).__name__))
        out.put((rank, got))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, kind", [(2, ExchangeWork.__name__), (3, "CollectiveWork")])
def test_the_sum_is_right_and_added_once_whatever_the_group(world: int, kind: str) -> None:
    results = run_spawned(_sum_rounds, world, world, timeout_s=60)
    assert len(results[0]) == 3
    for k in range(3):
        base = 2 * k
        want_a = float(sum(r + base for r in range(world)))
        want_b = float(sum(10 * r + base for r in range(world)))
        for rank in range(world):
            a, b, name = results[rank][k]
            assert a == [want_a] * 5 and b == [want_b] * 6
            assert name == kind
