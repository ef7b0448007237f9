"""The natural baseline for a shape without a hand-written schedule: 1F1B's rule run as a
list scheduler over any stage DAG.

Whenever devices are free, the ready actions are taken in 1F1B's priority: backward
before forward (oldest micro-batch first), and forwards in one of two orders: ``oldest``
(micro-batch, then stage: 1F1B's own) or ``shallowest`` (the stage's depth in the DAG,
then micro-batch: a block sharded over every device runs for the next micro-batches
while the V is busy with older ones, where ``oldest`` would hold it back until the V
frees every device at once). `best_1f1b_like` keeps whichever is faster. The memory cap
(1F1B's bound on the micro-batches in flight) and the sharing of devices are
`list_schedule`'s. On a chain with the cap P, this is 1F1B's steady state.
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.pipeline import Action, Kind, PipeShape, Schedule, check_schedule
from schedlab.search.tessel.listsched import list_schedule

_EPS = 1e-9


def default_memory_cap(shape: PipeShape) -> float:
    """1F1B's bound on a chain: P micro-batches in flight on the device that holds the
    most per micro-batch."""
    per_device = [sum(shape.stages[s].f_mem for s in shape.stages_on(d)) for d in range(shape.n_devices)]
    return shape.n_devices * max(per_device)


PRIORITIES = ("oldest", "shallowest")


def best_1f1b_like(shape: PipeShape, n_microbatches: int, memory_limit: float | None = None) -> Schedule:
    """The faster of the two priorities' schedules (each passes check_schedule); a
    priority that runs out of memory (every device waiting to free some) is skipped."""
    best: tuple[float, Schedule] | None = None
    errors = []
    for priority in PRIORITIES:
        try:
            s = greedy_1f1b(shape, n_microbatches, memory_limit, priority=priority)
        except SchedlabError as e:
            errors.append(f"{priority}: {e}")
            continue
        makespan = check_schedule(s, memory_limit=memory_limit).makespan
        if best is None or makespan < best[0] - _EPS:
            best = (makespan, s)
    if best is None:
        raise SchedlabError("; ".join(errors))
    return best[1]


def greedy_1f1b(
    shape: PipeShape, n_microbatches: int, memory_limit: float | None = None, *, priority: str = "oldest"
) -> Schedule:
    """The list-scheduled 1F1B-like schedule of `shape` under `memory_limit` (default:
    `default_memory_cap`), forwards in `priority` order (one of PRIORITIES)."""
    if priority not in PRIORITIES:
        raise SchedlabError(f"unknown baseline priority {priority!r}; choose one of: {', '.join(PRIORITIES)}")
    cap = default_memory_cap(shape) if memory_limit is None else memory_limit
    depth = _depths(shape)

    def urgency(a: Action) -> tuple[int, int, int, int]:
        if a.kind is Kind.B:
            return (0, a.mb, 0, a.stage)
        if priority == "oldest":
            return (1, a.mb, 0, a.stage)
        return (1, depth[a.stage], a.mb, a.stage)

    return list_schedule(shape, n_microbatches, cap, urgency, name=f"1f1b-like-{priority}")


def _depths(shape: PipeShape) -> list[int]:
    """Per stage, the most stages on a path from a source to it."""
    depth = [0] * shape.n_stages
    indeg = [len(p) for p in shape.prev]
    ready = [s for s, k in enumerate(indeg) if k == 0]
    while ready:
        s = ready.pop()
        for n in shape.stages[s].next:
            depth[n] = max(depth[n], depth[s] + 1)
            indeg[n] -= 1
            if indeg[n] == 0:
                ready.append(n)
    return depth
