"""Tessel-fast (Lin et al., TPDS 2024, the faster construction that the Tessel code ships
beside the solver): build the repetend directly instead of searching for it.

1. Pack: each device lays its blocks back to back from time 0, ignoring dependencies
   (they are met later by offsets). Blocks that span several devices go to the two
   sides, their forwards first and their backwards last, so they find every device free
   at once; the rest keep their order within one micro-batch. On *flipped* devices the
   single-device blocks go in reverse order (backward before forward), which staggers
   neighbouring devices the way 1F1B does and keeps fewer micro-batches in flight.
2. Offsets: in dependency order, a block takes the largest offset of its predecessors,
   plus one where a predecessor ends after the block starts in the pattern (the block
   then serves a micro-batch one repetition older).

Three flip patterns are tried (none, odd devices, even devices); the repetend kept is
the shortest that meets the memory limit, then the one with the fewest offsets. The
length is the lower bound whenever the packing is tight (balanced shapes); memory is
where it loses to the solvers, which trade offsets against it.
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.pipeline import Kind
from schedlab.search.tessel.blocks import TIME_TOL, BlockProblem, Repetend

FLIPS = ("none", "odd", "even")


def fast_repetend(problem: BlockProblem, memory_limit: float | None) -> Repetend:
    """The best Tessel-fast repetend under `memory_limit`; an error names the least
    memory any of its flip patterns needs."""
    candidates = [_construct(problem, flip) for flip in FLIPS]
    fits = [r for r in candidates if memory_limit is None or max(r.peak_memory()) <= memory_limit + TIME_TOL]
    if not fits:
        least = min(max(r.peak_memory()) for r in candidates)
        raise SchedlabError(
            f"Tessel-fast's repetends for {problem.shape.name or 'this shape'} hold at least {least:g} on some "
            f"device, over the memory limit {memory_limit:g}; raise the limit to {least:g} or search with "
            f"solver='highs', which trades repetend length for memory"
        )
    return min(fits, key=lambda r: (r.length, r.max_offset, max(r.peak_memory())))


def _construct(problem: BlockProblem, flip: str) -> Repetend:
    blocks = problem.blocks
    asap = [0.0] * problem.n_blocks
    for j in problem.topological:
        for i in problem.preds[j]:
            asap[j] = max(asap[j], asap[i] + blocks[i].duration)

    def side(j: int) -> int:
        if len(blocks[j].devices) == 1:
            return 0
        return -1 if blocks[j].kind is Kind.F else 1

    busy: list[list[tuple[float, float]]] = [[] for _ in range(problem.shape.n_devices)]
    starts: dict[int, float] = {}
    for d, on_d in enumerate(problem.on_device):
        order = sorted(on_d, key=lambda j: (side(j), asap[j], j))
        if _flipped(d, flip):
            singles = [j for j in order if side(j) == 0][::-1]
            order = [j for j in order if side(j) < 0] + singles + [j for j in order if side(j) > 0]
        for j in order:
            if j in starts:
                continue
            t = _first_fit(busy, blocks[j].devices, blocks[j].duration)
            starts[j] = t
            for dev in blocks[j].devices:
                busy[dev].append((t, t + blocks[j].duration))
    length = max(starts[j] + blocks[j].duration for j in starts)
    offsets = [0] * problem.n_blocks
    for j in problem.topological:
        for i in problem.preds[j]:
            crosses = starts[j] < starts[i] + blocks[i].duration - TIME_TOL
            offsets[j] = max(offsets[j], offsets[i] + int(crosses))
    starts_t = tuple(starts[j] for j in range(problem.n_blocks))
    return Repetend(problem, length, starts_t, tuple(offsets)).normalized()


def _flipped(device: int, flip: str) -> bool:
    return (flip == "odd" and device % 2 == 1) or (flip == "even" and device % 2 == 0)


def _first_fit(busy: list[list[tuple[float, float]]], devices: tuple[int, ...], duration: float) -> float:
    """The earliest start at which every one of `devices` is free for `duration`."""
    t = 0.0
    while True:
        clash = [e for d in devices for s, e in busy[d] if s < t + duration - TIME_TOL and t < e - TIME_TOL]
        if not clash:
            return t
        t = max(clash)
