"""Run a function in `world` spawned processes, rank by rank, and gather what each reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from schedlab.exec.launch import free_port


def run_spawned(target: Callable[..., None], world: int, *args: Any, timeout_s: float = 120.0) -> dict[int, Any]:
    """`target(rank, port, *args, out)` in `world` processes sharing a free rendezvous port;
    each puts `(rank, result)` on `out`. Returns rank -> result once every process exited 0."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=timeout_s) for _ in range(world))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results
