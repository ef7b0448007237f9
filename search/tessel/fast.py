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

Three flip patterns are tried (none, odd devices, even devices). Their length is the
lower bound whenever the packing is tight (balanced shapes), but they hold many
micro-batches in flight: on a V at 4 devices, 5 against 1F1B's 4.

So a fourth construction is tried beside them, one that is not in Tessel: modulo
scheduling, as compilers pipeline loops. Blocks are placed in dependency order, each at
the earliest absolute time after its predecessors end at which its devices are free on
the circle of length L; offset and start are that time's quotient and remainder by L.
Dependencies then hold by construction, and the V comes out as 1F1B. Where the circle
has no room, or the repetend holds more than the memory limit, L grows (by a quarter of
the shortest block) until it fits.

The repetend kept is the shortest that meets the memory limit, then the one with the
fewest offsets.
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.pipeline import Kind
from schedlab.search.tessel.blocks import TIME_TOL, BlockProblem, Repetend

FLIPS = ("none", "odd", "even")


def fast_repetend(problem: BlockProblem, memory_limit: float | None) -> Repetend:
    """The best fast repetend under `memory_limit`; an error names the least memory any
    of the constructions needs."""
    candidates = [pack_repetend(problem, flip) for flip in FLIPS]
    modulo = modulo_repetend(problem, memory_limit)
    if modulo is not None:  # over the limit too, when nothing fits: its peak is then the least
        candidates.append(modulo)
    fits = [r for r in candidates if _fits(r, memory_limit)]
    if not fits:
        least = min(max(r.peak_memory()) for r in candidates)
        raise SchedlabError(
            f"the fast constructions' repetends for {problem.shape.name or 'this shape'} hold at least {least:g} "
            f"on some device, over the memory limit {memory_limit:g}; raise the limit to {least:g} or search "
            f"with solver='highs', which trades repetend length for memory"
        )
    return min(fits, key=lambda r: (r.length, r.max_offset, max(r.peak_memory())))


def _fits(r: Repetend, memory_limit: float | None) -> bool:
    return memory_limit is None or max(r.peak_memory()) <= memory_limit + TIME_TOL


def modulo_repetend(problem: BlockProblem, memory_limit: float | None) -> Repetend | None:
    """The shortest modulo-scheduled repetend within `memory_limit`, from the lower bound
    up to one micro-batch run serially; where none fits, the last one built (the one
    holding least), and None only if the circle never had room."""
    step = min(b.duration for b in problem.blocks) / 4
    length = problem.lower_bound
    last = None
    while length <= problem.serial_time + TIME_TOL:
        r = _modulo(problem, length)
        if r is not None:
            if _fits(r, memory_limit):
                return r
            last = r
        length += step
    return last


def _modulo(problem: BlockProblem, length: float) -> Repetend | None:
    blocks = problem.blocks
    busy: list[list[tuple[float, float]]] = [[] for _ in range(problem.shape.n_devices)]  # (start, end) on the circle
    end = [0.0] * problem.n_blocks
    starts = [0.0] * problem.n_blocks
    offsets = [0] * problem.n_blocks
    for j in problem.topological:
        b = blocks[j]
        earliest = max((end[i] for i in problem.preds[j]), default=0.0)
        at = _circle_fit(busy, b.devices, b.duration, earliest, length)
        if at is None:
            return None
        k, t = divmod(at, length)
        if t >= length - TIME_TOL:
            k, t = k + 1, 0.0
        starts[j], offsets[j], end[j] = t, int(k), at + b.duration
        for d in b.devices:
            busy[d].append((t, t + b.duration))
    return Repetend(problem, length, tuple(starts), tuple(offsets)).normalized()


def _circle_fit(
    busy: list[list[tuple[float, float]]], devices: tuple[int, ...], duration: float, earliest: float, length: float
) -> float | None:
    """The earliest absolute time >= `earliest` at which `devices` are all free for
    `duration` on the circle of `length` (None: nowhere in one turn)."""
    base = earliest - earliest % length
    candidates = {earliest}
    for d in devices:
        for _, e in busy[d]:
            for turn in (0, 1):
                at = base + turn * length + e
                if earliest - TIME_TOL <= at < earliest + length:
                    candidates.add(at)
    for at in sorted(candidates):
        t = at % length
        if all(not _overlaps(t, duration, s, e, length) for d in devices for s, e in busy[d]):
            return at
    return None


def _overlaps(t: float, duration: float, s: float, e: float, length: float) -> bool:
    """Whether [t, t + duration) and [s, e) meet on the circle of `length`."""
    gap_after = (s - t) % length  # from this block's start to the other's
    gap_before = (t - s) % length
    return gap_after < duration - TIME_TOL or gap_before < (e - s) - TIME_TOL


def pack_repetend(problem: BlockProblem, flip: str) -> Repetend:
    """Tessel-fast's construction with flip pattern `flip` (one of FLIPS)."""
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
