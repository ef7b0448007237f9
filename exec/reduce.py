"""Summing a buffer across a group of ranks: how the executor, the link calibration and the
host-cost calibration all start and finish one, so that what calibration times is what a
step runs.

- **Two ranks**: one exchange. Each rank sends its buffer to the other on its own
  direction's process group (`direction_groups`) and receives the other's on the other
  direction's, then adds it in (`ExchangeWork.wait`). gloo's `all_reduce` between two
  ranks sends both ways on one pair, which on this host stalls about 4 ms (a scheduler
  tick, HZ = 250) in most calls made right after compute: both ranks pinned to a core
  each, 3 ms of matrix products then the call, 40 calls per size, its median 0.25-4.4 ms
  against the exchange's 0.06-2.9 ms (16 KiB-4 MiB; scratch microbenchmark, 2026-11-27).
- **More ranks**: gloo's `all_reduce` on the group's own process group.

A rank's point-to-point traffic to a peer shares the direction's group with the exchanges
(distinct tags): each group carries one direction only, whatever sends on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from schedlab.collectives import sums_by_exchange
from schedlab.errors import SchedlabError

# Tags of the exchanges: apart from the transfers' (counting up from 0) and the clocks' (1 << 30).
EXCHANGE_TAG = 1 << 29


def direction_groups(directions: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """A process group for each (sender's rank, receiver's rank), created in sorted order:
    every rank of the world must call this with the same directions (`dist.new_group`'s rule)."""
    return {d: dist.new_group(sorted(d)) for d in sorted(set(directions))}


def pair_directions(groups: Iterable[tuple[int, ...]]) -> list[tuple[int, int]]:
    """Both directions of every two-rank group among `groups` (the ones `Reducer` exchanges over)."""
    out: set[tuple[int, int]] = set()
    for g in groups:
        if sums_by_exchange(len(g)):
            a, b = g
            out |= {(a, b), (b, a)}
    return sorted(out)


def link(groups: dict[tuple[int, int], Any], src: int, dst: int, me: int) -> tuple[Any, int]:
    """The group of direction src -> dst and the peer's rank in it, seen from rank `me`
    (one of the two); the group is called directly, which skips dist.isend's checks
    (~10-20 us a call here)."""
    group = groups[(src, dst)]
    return group, dist.get_group_rank(group, dst if me == src else src)


class ExchangeWork:
    """A two-rank sum in flight: the peer's buffer is being received into `buf`."""

    def __init__(self, flat: torch.Tensor, buf: torch.Tensor, recv: Any, send: Any) -> None:
        self.flat, self.buf, self.recv, self.send = flat, buf, recv, send
        self._settled = False

    def settle(self, timeout_s: float) -> None:
        """Block until both transfers are done, leaving the add to `wait` (gloo's point-to-
        point works say they completed only once waited on; the group's timeout bounds it)."""
        del timeout_s
        self.recv.wait()
        self.send.wait()  # gloo may still be reading `flat` until then
        self._settled = True

    def wait(self) -> None:
        if not self._settled:
            self.settle(0.0)
        self.flat.add_(self.buf)


class CollectiveWork:
    """gloo's all-reduce in flight."""

    def __init__(self, work: Any) -> None:
        self.work = work

    def settle(self, timeout_s: float) -> None:
        """Block until the collective completed, without waiting on it."""
        deadline = time.monotonic() + timeout_s
        while not self.work.is_completed():
            if time.monotonic() > deadline:
                raise SchedlabError(f"an all-reduce did not complete within {timeout_s:g} s")
            os.sched_yield()

    def wait(self) -> None:
        self.work.wait()


@dataclass(frozen=True)
class Reducer:
    """The sum of a buffer across `ranks` (sorted), as rank `rank` starts it."""

    ranks: tuple[int, ...]
    rank: int
    group: Any  # more than two ranks: their gloo group (None: the default group)
    send: tuple[Any, int] | None = None  # two ranks: this rank's direction's group, the peer in it
    recv: tuple[Any, int] | None = None

    def start(self, flat: torch.Tensor, tag: int) -> ExchangeWork | CollectiveWork:
        """Start summing `flat` in place; the returned work's `wait()` leaves the sum in `flat`
        (`settle()` blocks until only the finishing part is left). `tag` tells a step's
        exchanges apart."""
        if self.send is None or self.recv is None:
            return CollectiveWork(dist.all_reduce(flat, group=self.group, async_op=True))
        buf = torch.empty_like(flat)
        (sg, s_peer), (rg, r_peer) = self.send, self.recv
        recv = rg.recv([buf], r_peer, EXCHANGE_TAG + tag)
        return ExchangeWork(flat, buf, recv, sg.send([flat], s_peer, EXCHANGE_TAG + tag))


def make_reducer(ranks: tuple[int, ...], rank: int, directions: dict[tuple[int, int], Any],
                 group: Any = None) -> Reducer:
    """The reducer of `ranks` on rank `rank`: an exchange over `directions` (from
    `direction_groups`, holding both of the pair's) for two ranks; else gloo on `group`."""
    if not sums_by_exchange(len(ranks)):
        return Reducer(ranks, rank, group)
    a, b = ranks
    peer = b if rank == a else a
    return Reducer(ranks, rank, None, send=link(directions, rank, peer, rank), recv=link(directions, peer, rank, rank))


def world_reducer(rank: int, world: int, directions: dict[tuple[int, int], Any] | None = None) -> Reducer:
    """The reducer of every rank of the default group (what the calibrations time), over
    `directions` where the caller made them already (they must hold both of ranks 0 and 1's
    when `world` is 2), else over groups made here; every rank must call it alike."""
    ranks = tuple(range(world))
    if directions is None:
        directions = direction_groups(pair_directions([ranks]))
    return make_reducer(ranks, rank, directions)
