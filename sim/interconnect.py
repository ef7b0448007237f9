"""Links between devices: latency, bandwidth, and contention when transfers share a wire.

A *wire* is what transfers contend for. Links with the same non-empty `Link.name` are one
wire (e.g. a GPU's NVLink port, shared by everything it sends); an unnamed link is a wire
of its own, shared by every transfer on that src->dst pair. A wire is a processor-sharing
server: n transfers on it each get 1/n of their link's bandwidth, re-shared whenever one
starts or ends.

A transfer of B bytes on a link of bandwidth W and latency L first serialises its bytes
onto the wire (B/W alone, longer under contention) and then propagates for L:

    alone:                      end = start + B/W + L
    two started together:       end = start + 2B/W + L   (each)

Routing: the link src->dst; failing that, a link dst->src (a link listed once serves both
ways); failing that, a SchedlabError. A transfer within one device takes no time. Time is
in microseconds, the unit of the simulation's Environment.

A collective (`Network.collective`, timed by `sim.collective`) runs its bandwidth part as
one job on each distinct wire its ring crosses, so it shares those wires with transfers
and other collectives, then waits its latency part.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

import simpy

from schedlab.errors import SchedlabError
from schedlab.machine import Link, Machine
from schedlab.sim.fluid import FluidShare
from schedlab.sim.server import SimServer

__all__ = ["Network", "TransferRecord", "link_time_us"]


@dataclass(frozen=True)
class TransferRecord:
    """What one transfer did: the value of the process `Network.transfer` returns."""

    src: str
    dst: str
    nbytes: int
    link: int  # index into Machine.links; -1 for a transfer within one device
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


def link_time_us(link: Link, nbytes: int) -> float:
    """Time of a transfer alone on `link`: bytes over bandwidth, plus latency (µs)."""
    return nbytes * 1e6 / link.bw_bytes_per_s + link.latency_s * 1e6


class Network:
    """The links of a Machine inside one SimPy Environment."""

    def __init__(self, env: simpy.Environment, machine: Machine) -> None:
        self.env = env
        self.machine = machine
        self.links = machine.links
        wire_of_key: dict[str, int] = {}
        self._wire_of_link: list[int] = []
        for lk in self.links:
            key = f"name:{lk.name}" if lk.name else f"pair:{lk.src}->{lk.dst}"
            self._wire_of_link.append(wire_of_key.setdefault(key, len(wire_of_key)))
        self.wires = [SimServer(env, FluidShare(1)) for _ in wire_of_key]
        self._route: dict[tuple[str, str], int] = {}
        for i, lk in reversed(list(enumerate(self.links))):  # first listed link wins
            self._route[(lk.src, lk.dst)] = i
        for i, lk in reversed(list(enumerate(self.links))):
            self._route.setdefault((lk.dst, lk.src), i)
        self._next_key = 0
        self.records: list[TransferRecord] = []

    def route(self, src: str, dst: str) -> int:
        """Index into `machine.links` of the link a src->dst transfer takes."""
        try:
            return self._route[(src, dst)]
        except KeyError:
            raise SchedlabError(
                f"machine {self.machine.name!r} has no link between {src!r} and {dst!r}; "
                "add one to its description"
            ) from None

    def wire(self, link: int) -> int:
        """Index of the wire that `link` shares with others."""
        return self._wire_of_link[link]

    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Process:
        """Send `nbytes` from `src` to `dst` now; the process's value is a TransferRecord."""
        link = -1 if src == dst else self.route(src, dst)
        return self.env.process(self._transfer(src, dst, nbytes, link))

    def _transfer(self, src: str, dst: str, nbytes: int, link: int) -> Generator[simpy.Event, object, TransferRecord]:
        start = self.env.now
        if link >= 0:
            lk = self.links[link]
            key = self._next_key
            self._next_key += 1
            yield self.wires[self._wire_of_link[link]].run(key, 1, nbytes * 1e6 / lk.bw_bytes_per_s)
            if lk.latency_s > 0.0:
                yield self.env.timeout(lk.latency_s * 1e6)
        rec = TransferRecord(src, dst, nbytes, link, start, self.env.now)
        self.records.append(rec)
        return rec

    def collective(self, links: Sequence[int], bw_us: float, latency_us: float) -> simpy.Process:
        """Start a collective now: `bw_us` of work on each distinct wire of `links` (shared with
        whatever else runs there), then `latency_us`. The process's value is (start, end) µs."""
        return self.env.process(self._collective(links, bw_us, latency_us))

    def _collective(
        self, links: Sequence[int], bw_us: float, latency_us: float
    ) -> Generator[simpy.Event, object, tuple[float, float]]:
        start = self.env.now
        if bw_us > 0.0:
            jobs = []
            for w in sorted({self._wire_of_link[lk] for lk in links}):
                jobs.append(self.wires[w].run(self._next_key, 1, bw_us))
                self._next_key += 1
            if jobs:
                yield self.env.all_of(jobs)
        if latency_us > 0.0:
            yield self.env.timeout(latency_us)
        return start, self.env.now
