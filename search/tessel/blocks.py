"""The repetend problem: one micro-batch's blocks (a forward and a backward per stage),
what each costs and holds, and the repetend that places them.

A repetend of length L gives each block j a start time t_j in [0, L) and a micro-batch
offset k_j >= 0: in repetition r, block j runs for micro-batch r - k_j. So one repetition
holds exactly one micro-batch's worth of every block, drawn from up to K + 1 different
micro-batches (K = the largest offset). The pattern is a circle: a block that starts near
L runs on into the next repetition. In absolute time, block j of micro-batch m starts at
(m + k_j) L + t_j, which makes the constraints:

- dependency i -> j (same micro-batch): t_j + k_j L >= t_i + d_i + k_i L;
- device exclusivity: blocks sharing a device do not overlap on the circle (a block that
  spans several devices occupies all of them at once);
- memory: on a device, stage s holds m_s for every micro-batch whose forward ran there
  and whose backward did not. At the start of a repetition that is k_B - k_F
  micro-batches; walking the device's blocks in start order, F adds m_s and B frees it.
  The peak, right after some forward, is what a limit bounds, exactly as
  `schedlab.pipeline.timing.peak_memory` walks an unrolled schedule.

The lower bound on L is the largest per-device work per micro-batch
(`PipeShape.work_per_microbatch`); a repetend at that bound has no bubble.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

from schedlab.errors import SchedlabError
from schedlab.pipeline import Kind, PipeShape

# Times from a solver are floats within its tolerance (1e-6 for HiGHS); values this close
# to a round one are read as it, and comparisons allow this much.
TIME_TOL = 1e-5


@dataclass(frozen=True)
class Block:
    """Stage `stage`'s forward or full backward, one micro-batch's worth."""

    stage: int
    kind: Kind  # F or B
    devices: tuple[int, ...]
    duration: float
    mem: float  # what its stage holds per device between F and B

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}"


class BlockProblem:
    """The blocks of one micro-batch of `shape`, their dependency edges and the pairs of
    blocks that share a device. Block index 2s is stage s's F, 2s + 1 its B."""

    def __init__(self, shape: PipeShape) -> None:
        self.shape = shape
        blocks: list[Block] = []
        for s, st in enumerate(shape.stages):
            blocks.append(Block(s, Kind.F, st.devices, st.f_time, st.f_mem))
            blocks.append(Block(s, Kind.B, st.devices, st.b_time, st.f_mem))
        self.blocks = tuple(blocks)
        edges: list[tuple[int, int]] = []
        for s, st in enumerate(shape.stages):
            edges += [(self.f(p), self.f(s)) for p in shape.prev[s]]
            edges.append((self.f(s), self.b(s)))
            edges += [(self.b(n), self.b(s)) for n in st.next]
        self.edges = tuple(edges)
        self.preds: tuple[tuple[int, ...], ...] = tuple(
            tuple(i for i, j in self.edges if j == b) for b in range(len(blocks))
        )

    @staticmethod
    def f(stage: int) -> int:
        return 2 * stage

    @staticmethod
    def b(stage: int) -> int:
        return 2 * stage + 1

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @cached_property
    def on_device(self) -> tuple[tuple[int, ...], ...]:
        """Per device, the blocks that run on it."""
        return tuple(tuple(j for j, b in enumerate(self.blocks) if d in b.devices) for d in range(self.shape.n_devices))

    @cached_property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """Every pair (x < y) of blocks that share at least one device."""
        out: set[tuple[int, int]] = set()
        for blocks in self.on_device:
            out.update(itertools.combinations(blocks, 2))
        return tuple(sorted(out))

    @cached_property
    def topological(self) -> tuple[int, ...]:
        indeg = [len(p) for p in self.preds]
        succs: list[list[int]] = [[] for _ in self.blocks]
        for i, j in self.edges:
            succs[i].append(j)
        ready = [j for j, k in enumerate(indeg) if k == 0]
        out: list[int] = []
        while ready:
            j = ready.pop(0)
            out.append(j)
            for n in succs[j]:
                indeg[n] -= 1
                if indeg[n] == 0:
                    ready.append(n)
        return tuple(out)

    @property
    def lower_bound(self) -> float:
        """The largest per-device work per micro-batch: no repetend is shorter."""
        return max(self.shape.work_per_microbatch(split_backward=False))

    @property
    def serial_time(self) -> float:
        """One micro-batch's blocks one after another: a repetend this long always exists."""
        return sum(b.duration for b in self.blocks)

    @property
    def longest_chain(self) -> int:
        """Edges on the longest dependency path: enough offsets for any repetend."""
        depth = [0] * self.n_blocks
        for j in self.topological:
            for i in self.preds[j]:
                depth[j] = max(depth[j], depth[i] + 1)
        return max(depth)


@dataclass(frozen=True)
class Repetend:
    """A repeating pattern: `length`, and per block its start in [0, length) and its
    micro-batch offset (block j of repetition r runs micro-batch r - offsets[j])."""

    problem: BlockProblem
    length: float
    starts: tuple[float, ...]
    offsets: tuple[int, ...]

    @property
    def max_offset(self) -> int:
        return max(self.offsets)

    def orders(self) -> tuple[tuple[int, ...], ...]:
        """Per device, its blocks in start order."""
        return tuple(tuple(sorted(blocks, key=lambda j: (self.starts[j], j))) for blocks in self.problem.on_device)

    def peak_memory(self) -> tuple[float, ...]:
        """Per device, the steady state's peak activation memory."""
        out = []
        blocks = self.problem.blocks
        for d, order in enumerate(self.orders()):
            held = 0.0
            for s in self.problem.shape.stages_on(d):
                fb = self.problem.f(s), self.problem.b(s)
                held += blocks[fb[0]].mem * (self.offsets[fb[1]] - self.offsets[fb[0]])
            peak = held
            for j in order:
                if blocks[j].kind is Kind.F:
                    held += blocks[j].mem
                    peak = max(peak, held)
                else:
                    held -= blocks[j].mem
            out.append(peak)
        return tuple(out)

    def to_text(self) -> str:
        """Per device: `STAGE KIND -OFFSET @START`, e.g. `2F-1@3` is stage 2's forward of
        the micro-batch one repetition older than the newest, starting at 3."""
        lines = []
        for d, order in enumerate(self.orders()):
            cells = [f"{self.problem.blocks[j]}-{self.offsets[j]}@{self.starts[j]:g}" for j in order]
            lines.append(f"{d}: {' '.join(cells)}")
        return "\n".join(lines) + "\n"

    def check(self, memory_limit: float | None = None) -> None:
        """Raise if the repetend breaks a dependency, overlaps blocks on a device, runs
        past its length or holds more than `memory_limit` (a guard on every solver)."""
        p, L = self.problem, self.length
        for j, b in enumerate(p.blocks):
            if not -TIME_TOL <= self.starts[j] < L + TIME_TOL:
                raise SchedlabError(f"repetend: block {b} starts at {self.starts[j]:g}, outside [0, {L:g})")
            if self.offsets[j] < 0:
                raise SchedlabError(f"repetend: block {b} has a negative offset")
        for i, j in p.edges:
            lhs = self.starts[j] + self.offsets[j] * L
            rhs = self.starts[i] + p.blocks[i].duration + self.offsets[i] * L
            if lhs < rhs - TIME_TOL:
                raise SchedlabError(f"repetend: {p.blocks[j]} starts before {p.blocks[i]} of its micro-batch ends")
        for x, y in p.pairs:
            # on the circle: from x's start, y starts after x ends and x comes round after y ends
            gap_xy = (self.starts[y] - self.starts[x]) % L
            gap_yx = (self.starts[x] - self.starts[y]) % L
            if gap_xy < p.blocks[x].duration - TIME_TOL or gap_yx < p.blocks[y].duration - TIME_TOL:
                raise SchedlabError(f"repetend: {p.blocks[x]} and {p.blocks[y]} overlap on a device")
        if memory_limit is not None:
            for d, peak in enumerate(self.peak_memory()):
                if peak > memory_limit + TIME_TOL:
                    raise SchedlabError(f"repetend: device {d} holds {peak:g}, over the limit {memory_limit:g}")

    def normalized(self) -> Repetend:
        """Starts snapped to the tolerance and in [0, L) (a start at L is the next
        repetition's 0), offsets shifted so the smallest is 0."""
        length = _snap(self.length)
        starts, offsets = [], []
        for t, k in zip(self.starts, self.offsets):
            t = _snap(t)
            if t >= length - TIME_TOL:
                t, k = t - length, k + 1
            starts.append(_snap(max(t, 0.0)))
            offsets.append(k)
        low = min(offsets)
        return Repetend(self.problem, length, tuple(starts), tuple(k - low for k in offsets))


def _snap(x: float) -> float:
    """A solver's 2.9999999 read as 3; values far from a round one are kept."""
    r = round(x, 6)
    return float(round(r)) if abs(r - round(r)) <= TIME_TOL else r
