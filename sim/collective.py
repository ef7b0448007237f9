"""How long a collective takes: the cost model's fitted all-reduce, or the ring model.

A ring all-reduce of B bytes over n ranks takes `schedlab.collectives.ring_allreduce_s`:

    t(B, n) = 2(n-1)/n * B / bw  +  2(n-1) * latency

with the bandwidth of the narrowest hop of the ring and the latency of the slowest one
(the ring moves at the pace of its slowest hop). The simulator splits t into a
*bandwidth part*, which runs on the wires of the ring's links and so shares them with
transfers and other collectives (`sim.interconnect`), and a *latency part*, which does
not contend.

A cost model that measured collectives (a Profile with link fits, `calibrate.links`)
answers `allreduce_us(nbytes, n_ranks)` (`CollectiveCost`); its value at 0 bytes is then
the latency part and the rest the bandwidth part. The fit was measured between local
ranks, so it prices a ring only of such links (`LOOPBACK_LINK`, as `host_ranks` names
them); a ring over other links (a preset's NVLink or PCIe), or a None answer (no fits),
takes the ring model on the machine's links.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from schedlab.collectives import ring_allreduce_s
from schedlab.errors import SchedlabError
from schedlab.machine import LOOPBACK_LINK, Link, Machine

__all__ = ["CollectiveCost", "CollectiveTime", "allreduce_time", "link_index", "ring_links"]


@runtime_checkable
class CollectiveCost(Protocol):
    """Optional part of a cost model: a fitted all-reduce time."""

    def allreduce_us(self, nbytes: float, n_ranks: int) -> float | None:
        """Time (µs) of an all-reduce of `nbytes` per rank across `n_ranks` ranks alone on its
        links; None when the model has no fit."""
        ...


@dataclass(frozen=True)
class CollectiveTime:
    """A collective's time alone, split into what contends for its links and what does not."""

    links: tuple[int, ...]  # indices into Machine.links: the ring's hop from each member to the next
    bw_us: float  # bandwidth part: runs on the wires of `links`
    latency_us: float  # latency part: after the bandwidth part, no contention
    source: str  # "fit" (the cost model's) or "ring" (the ring model on the machine's links)

    @property
    def alone_us(self) -> float:
        return self.bw_us + self.latency_us


def link_index(machine: Machine, src: str, dst: str) -> int:
    """Index into `machine.links` of the link a src->dst message takes: the first link
    src->dst, else the first dst->src (as `sim.interconnect.Network.route`)."""
    for i, lk in enumerate(machine.links):
        if lk.src == src and lk.dst == dst:
            return i
    for i, lk in enumerate(machine.links):
        if lk.src == dst and lk.dst == src:
            return i
    raise SchedlabError(f"machine {machine.name!r} has no link between {src!r} and {dst!r}; add one to its description")


def ring_links(machine: Machine, group: Sequence[str]) -> tuple[int, ...]:
    """The link of each ring hop group[i] -> group[i+1] (the last back to the first)."""
    n = len(group)
    if n <= 1:
        return ()
    return tuple(link_index(machine, group[i], group[(i + 1) % n]) for i in range(n))


def allreduce_time(machine: Machine, group: Sequence[str], nbytes: int, cost: object = None) -> CollectiveTime:
    """All-reduce of `nbytes` per member across `group` (device ids, ring order) on `machine`:
    `cost`'s fit when it has one (`CollectiveCost`), else the ring model."""
    links = ring_links(machine, group)
    n = len(group)
    if n <= 1:
        return CollectiveTime(links, 0.0, 0.0, "ring")
    if isinstance(cost, CollectiveCost) and all(machine.links[i].name == LOOPBACK_LINK for i in links):
        lat, total = cost.allreduce_us(0, n), cost.allreduce_us(nbytes, n)
        if lat is not None and total is not None:
            lat = max(0.0, float(lat))
            return CollectiveTime(links, max(0.0, float(total) - lat), lat, "fit")
    hops: list[Link] = [machine.links[i] for i in links]
    bw = min(lk.bw_bytes_per_s for lk in hops)
    alpha = max(lk.latency_s for lk in hops)
    lat_us = ring_allreduce_s(0, n, alpha, bw) * 1e6
    return CollectiveTime(links, ring_allreduce_s(nbytes, n, alpha, bw) * 1e6 - lat_us, lat_us, "ring")
