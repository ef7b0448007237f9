"""From a repetend to a full schedule of M micro-batches: warm-up, R = M - K repetitions,
cool-down.

Repetition r runs block j for micro-batch r - k_j. Running repetitions r = 0 .. M + K - 1
and keeping only the block instances whose micro-batch is in 0..M-1 gives every block
of every micro-batch exactly once: the first K repetitions are the warm-up (the newer
micro-batches' blocks not yet started), the last K the cool-down (the older ones
finishing), and the R between are whole repetends.

Each device runs its instances in (repetition, start) order. That order is the order of
the instances' absolute start times (m + k_j) L + t_j, in which every dependency runs
forward, so no device waits on one that waits on it: the schedule cannot deadlock, even
with blocks that span devices. Memory: right after any forward, a device holds at most
what the steady state holds at that point (warm-up and cool-down only leave instances
out), so the repetend's memory limit holds for the whole schedule.

The timing model then starts every action as early as its order and dependencies allow,
which squeezes the warm-up and cool-down's holes. `complete` also list-schedules the same
instances by their pattern times (a device that would idle in the warm-up takes the next
ready instance instead of waiting for the one its order names), under the same memory
bound, and keeps whichever of the two finishes first; both pass check_schedule.
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.pipeline import Action, Schedule, check_schedule
from schedlab.search.tessel.blocks import Repetend
from schedlab.search.tessel.listsched import list_schedule


def n_repetitions(repetend: Repetend, n_microbatches: int) -> int:
    """R: the whole repetends between warm-up and cool-down (0 when M <= K)."""
    return max(0, n_microbatches - repetend.max_offset)


def unroll(repetend: Repetend, n_microbatches: int, name: str = "tessel") -> Schedule:
    """The full schedule of `n_microbatches` micro-batches built on `repetend`."""
    problem = repetend.problem
    orders: list[tuple[Action, ...]] = []
    for pattern in repetend.orders():
        acts: list[Action] = []
        for r in range(n_microbatches + repetend.max_offset):
            for j in pattern:
                mb = r - repetend.offsets[j]
                if 0 <= mb < n_microbatches:
                    b = problem.blocks[j]
                    acts.append(Action(b.stage, b.kind, mb))
        orders.append(tuple(acts))
    return Schedule(shape=problem.shape, n_microbatches=n_microbatches, orders=tuple(orders), name=name)


def listed(repetend: Repetend, n_microbatches: int, memory_cap: float, name: str = "tessel-listed") -> Schedule:
    """The same instances list-scheduled by their absolute pattern times."""
    problem = repetend.problem
    index = {(b.stage, b.kind): j for j, b in enumerate(problem.blocks)}

    def pattern_time(a: Action) -> tuple[float, int]:
        j = index[a.stage, a.kind]
        return ((a.mb + repetend.offsets[j]) * repetend.length + repetend.starts[j], j)

    return list_schedule(problem.shape, n_microbatches, memory_cap, pattern_time, name=name)


def complete(repetend: Repetend, n_microbatches: int, memory_limit: float | None) -> Schedule:
    """The faster of the unrolled and the list-scheduled completions, both checked
    against `memory_limit` (None: the repetend's own peak bounds the list scheduler)."""
    best = unroll(repetend, n_microbatches, name="tessel-unrolled")
    best_makespan = check_schedule(best, memory_limit=memory_limit).makespan
    cap = max(repetend.peak_memory()) if memory_limit is None else memory_limit
    try:
        other = listed(repetend, n_microbatches, cap)
    except SchedlabError:
        return best  # the list scheduler ran out of memory; the unrolled order cannot
    makespan = check_schedule(other, memory_limit=memory_limit).makespan
    return other if makespan < best_makespan - 1e-9 else best
