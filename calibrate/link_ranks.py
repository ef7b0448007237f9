"""Local gloo ranks that time messages and all-reduces between themselves.

`run_world(n, task, timeout_s, on_progress)` starts `n` processes the way torchrun starts
ranks (env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), each pinned to its
share of this host's cores (`rank_cores`) with one intra-op thread, and returns what rank
0 measured: per message size, the median time of a send/recv ping-pong's one way (half
the round trip) and of an all-reduce (SUM of a float32 tensor, the slowest rank's median),
both made as the executor makes them: each way of the ping-pong on its own direction's
process group, the all-reduce as `exec.reduce` starts it.

Every wait has a timeout: the parent gives the whole world `timeout_s` (start-up,
rendezvous and measuring) and gloo's collectives time out after the same; a rank that
dies ends the run within a second with an error naming it. On any failure the parent
terminates, then kills, every rank it started; each rank also asks the kernel to end it
when the parent dies (Linux PR_SET_PDEATHSIG), so none is left behind.

With `RankTask.host` (2 ranks), the ranks also time what each communication op costs its
own thread as the executor makes its calls (`calibrate.comm_host.measure_host_costs`).

Repetitions: after `warmup` untimed calls of a size, every rank makes `pilot` more; rank
0 sets the repetitions per round from their median so the size's timed rounds take about
`target_s` in all (between `min_reps` and `max_reps` a round) and broadcasts that count,
so every rank makes the same calls. Then `rounds` rounds go over every size in turn, and
a size keeps its lowest round median, as `calibrate.timing` does for ops: on a shared
machine a neighbour's burst lands on some rounds, and interference only ever adds time.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing as mp
import os
import queue
import signal
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from schedlab.calibrate.comm_host import measure_host_costs
from schedlab.errors import SchedlabError
from schedlab.exec.reduce import Reducer, direction_groups, link, world_reducer

RANK_JOIN_S = 5.0  # how long a finished, terminated or killed rank is given to exit
_POLL_S = 0.5  # how often the parent looks for a dead rank while waiting


@dataclass(frozen=True)
class RankTask:
    """What every rank of one world measures (picklable: it crosses to the ranks)."""

    sizes: tuple[int, ...]  # message sizes in bytes, multiples of 4 (float32 elements)
    p2p: bool  # ping-pong between ranks 0 and 1
    allreduce: bool
    cores: tuple[tuple[int, ...], ...]  # per rank, the cores it is pinned to
    target_s: float = 0.15  # time of all a size's timed rounds
    rounds: int = 3  # rounds over every size; a size keeps its lowest round median
    min_reps: int = 3  # per round
    max_reps: int = 1000  # per round
    warmup: int = 2
    pilot: int = 3  # calls whose median sets the repetitions
    collective_timeout_s: float = 60.0
    host: bool = False  # also time each communication op's cost on its rank (`calibrate.comm_host`; 2 ranks)
    host_reps: int = 5  # repetitions of each host-cost case per round


@dataclass(frozen=True)
class WorldResult:
    """What rank 0 sends back: per size, the one-way and all-reduce times (s), each the
    lowest of its round medians."""

    p2p_s: dict[int, float]
    allreduce_s: dict[int, float]
    reps: dict[str, dict[int, int]]  # "p2p" / "allreduce" -> size -> repetitions per round
    rounds_s: dict[str, dict[int, list[float]]]  # "p2p" / "allreduce" -> size -> round medians
    host_us: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)  # part -> (bytes, tensors, us)


def rank_cores(n: int, cores: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """`n` ranks' shares of `cores`: equal contiguous blocks (the leftover cores unused);
    with more ranks than cores, one core each, round robin (oversubscribed)."""
    cs = sorted(cores)
    if not cs:
        raise SchedlabError("no usable cores to pin ranks to")
    if n <= len(cs):
        k = len(cs) // n
        return tuple(tuple(cs[i * k : (i + 1) * k]) for i in range(n))
    return tuple((cs[i % len(cs)],) for i in range(n))


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(
    n: int, task: RankTask, timeout_s: float, on_progress: Callable[[str], None] | None = None
) -> WorldResult:
    """Start `n` local ranks on `task` and return rank 0's measurements (module docstring).

    A port taken between choosing and binding it is retried once on another port.
    """
    if n < 2:
        raise SchedlabError(f"a link benchmark needs at least 2 ranks, got {n}")
    if len(task.cores) != n:
        raise SchedlabError(f"task pins {len(task.cores)} ranks, world has {n}")
    for attempt in range(2):
        try:
            return _run_world_once(n, task, timeout_s, on_progress, free_port())
        except _PortTaken:
            if attempt == 1:
                raise SchedlabError("link benchmark: two free ports were taken before rank 0 bound them") from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _run_world_once(
    n: int, task: RankTask, timeout_s: float, on_progress: Callable[[str], None] | None, port: int
) -> WorldResult:
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, n, port, task, results), name=f"schedlab-link-rank{r}", daemon=True)
        for r in range(n)
    ]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                alive = [r for r, p in enumerate(procs) if p.is_alive()]
                raise SchedlabError(
                    f"link benchmark on {n} ranks did not finish within {timeout_s:g} s "
                    f"(rank(s) {', '.join(map(str, alive)) or 'none'} still running); is the machine overloaded?"
                )
            try:
                msg = results.get(timeout=min(_POLL_S, remaining))
            except queue.Empty:
                _raise_if_dead(procs)
                continue
            kind = msg[0]
            if kind == "progress" and on_progress is not None:
                on_progress(msg[1])
            elif kind == "error":
                if "Address already in use" in msg[2] or "EADDRINUSE" in msg[2]:
                    raise _PortTaken()
                raise SchedlabError(f"link benchmark rank {msg[1]} of {n} failed: {msg[2]}")
            elif kind == "result":
                out: WorldResult = msg[1]
                break
        for p in procs:  # the ranks leave the process group and exit
            p.join(timeout=max(0.1, min(RANK_JOIN_S, deadline - time.monotonic())))
        return out
    finally:
        _reap(procs)
        results.close()
        results.cancel_join_thread()


def _raise_if_dead(procs: list[Any]) -> None:
    for r, p in enumerate(procs):
        if p.exitcode is not None and p.exitcode != 0:
            how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
            raise SchedlabError(f"link benchmark rank {r} of {len(procs)} died ({how}) before reporting")


def _reap(procs: list[Any]) -> None:
    """Terminate, then kill, every rank still alive; wait for each (bounded)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is None:  # never started
            continue
        p.join(timeout=RANK_JOIN_S)
        if p.is_alive():
            p.kill()
            p.join(timeout=RANK_JOIN_S)


# ---- in the rank ------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (best effort elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def rank_main(rank: int, world: int, port: int, task: RankTask, results: Any) -> None:
    """One rank: rendezvous through env://, measure `task`, rank 0 reports the result."""
    _die_with_parent()
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, task.cores[rank])  # before torch starts its thread pools
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=task.collective_timeout_s))
        try:
            # one group per direction between ranks 0 and 1, for the ping-pong and for a
            # two-rank world's exchanges alike, as the executor shares them
            directions = direction_groups([(0, 1), (1, 0)])
            reducer = world_reducer(rank, world, directions)
            p2p = _measure(rank, task, results, "p2p", _ping_pong(directions)) if task.p2p else _Series()
            ar = _measure(rank, task, results, "all-reduce", _allreduce(reducer)) if task.allreduce else _Series()
            host = {}
            if task.host:
                host = measure_host_costs(rank, reducer, task.sizes, task.host_reps, task.rounds,
                                          task.collective_timeout_s, lambda label: _progress(rank, results, label))
        finally:
            dist.destroy_process_group()
        if rank == 0:
            results.put(("result", WorldResult(p2p.median_s, ar.median_s, {"p2p": p2p.reps, "allreduce": ar.reps},
                                               {"p2p": p2p.rounds_s, "allreduce": ar.rounds_s}, host)))
    except BaseException as e:  # reported to the parent, which names the rank; no traceback on stderr
        text = str(e).strip()
        results.put(("error", rank, f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"))
        raise SystemExit(1) from None


@dataclass
class _Series:
    """Rank 0's figures of one kind of call, per size."""

    median_s: dict[int, float] = field(default_factory=dict)
    reps: dict[int, int] = field(default_factory=dict)  # per round
    rounds_s: dict[int, list[float]] = field(default_factory=dict)


def _ping_pong(directions: dict[tuple[int, int], Any]) -> Callable[[int, Any], Callable[[], float]]:
    """One way of a round trip between ranks 0 and 1 (other ranks do nothing), each way on
    its own direction's group as the executor sends (`exec.reduce.direction_groups`)."""

    def make(rank: int, buf: Any) -> Callable[[], float]:
        if rank > 1:
            return lambda: 0.0
        (out_group, out_peer), (in_group, in_peer) = (link(directions, rank, 1 - rank, rank),
                                                      link(directions, 1 - rank, rank, rank))

        def once() -> float:
            t0 = time.perf_counter()
            if rank == 0:
                out_group.send([buf], out_peer, 0).wait()
                in_group.recv([buf], in_peer, 0).wait()
            else:
                in_group.recv([buf], in_peer, 0).wait()
                out_group.send([buf], out_peer, 0).wait()
            return (time.perf_counter() - t0) / 2.0

        return once

    return make


def _allreduce(reducer: Reducer) -> Callable[[int, Any], Callable[[], float]]:
    """One all-reduce as the executor makes it (`exec.reduce`), a sum of zeros (the values
    stay finite however often it runs)."""

    def make(rank: int, buf: Any) -> Callable[[], float]:
        def once() -> float:
            t0 = time.perf_counter()
            reducer.start(buf, tag=0).wait()
            return time.perf_counter() - t0

        return once

    return make


def _measure(
    rank: int, task: RankTask, results: Any, label: str, make: Callable[[int, Any], Callable[[], float]]
) -> _Series:
    """Per size: warm up and pilot (repetitions, module docstring), then `task.rounds`
    rounds over every size; each round's median is the slowest rank's (a collective ends
    at the slowest), and a size keeps its lowest round median."""
    import torch
    import torch.distributed as dist

    calls = {nbytes: make(rank, torch.zeros(max(1, nbytes // 4), dtype=torch.float32)) for nbytes in task.sizes}
    out = _Series()
    for nbytes, once in calls.items():
        dist.barrier()
        for _ in range(task.warmup):
            once()
        one_s = statistics.median([once() for _ in range(max(1, task.pilot))])
        # a ping-pong repetition is a round trip: twice the one-way time it returns
        call_s = 2.0 * one_s if label == "p2p" else one_s
        want = math.ceil(task.target_s / task.rounds / max(call_s, 1e-7))
        n = torch.tensor([min(task.max_reps, max(task.min_reps, want))], dtype=torch.int64)
        dist.broadcast(n, src=0)  # every rank makes the same calls
        out.reps[nbytes] = int(n.item())
        _progress(rank, results, f"{label} pilot {nbytes} B")
    for r in range(task.rounds):
        for nbytes, once in calls.items():
            dist.barrier()
            times = [once() for _ in range(out.reps[nbytes])]
            slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
            if label != "p2p":
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            out.rounds_s.setdefault(nbytes, []).append(float(slowest.item()))
            _progress(rank, results, f"{label} round {r + 1}/{task.rounds} {nbytes} B")
    out.median_s = {nbytes: min(ms) for nbytes, ms in out.rounds_s.items()}
    dist.barrier()
    return out


def _progress(rank: int, results: Any, label: str) -> None:
    if rank == 0:
        results.put(("progress", label))
