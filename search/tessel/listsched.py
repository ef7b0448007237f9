"""A list scheduler over a shape's actions: whenever devices are free, start the most
urgent ready actions. The 1F1B-like baseline and Tessel's completion both use it, with
their own notion of urgent.

An action is ready when the actions it depends on (within its micro-batch) have ended.
A forward waits while it would put one of its devices over the memory cap; an action
that spans several devices starts when all of them are free, and while it is the most
urgent ready action none of them starts anything less urgent, so a sharded block is not
starved by the single-device work around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.pipeline import Action, Kind, PipeShape, Schedule, dependencies

_EPS = 1e-9


def list_schedule(
    shape: PipeShape,
    n_microbatches: int,
    memory_cap: float,
    urgency: Callable[[Action], Any],
    name: str = "list",
) -> Schedule:
    """Per-device orders from list scheduling every F and B of `n_microbatches`
    micro-batches by `urgency` (smaller first); an error if memory runs out with work
    left (every device waiting for a backward that needs a forward over the cap)."""
    every = {Action(s, k, m) for s in range(shape.n_stages) for k in (Kind.F, Kind.B) for m in range(n_microbatches)}
    deps = {a: dependencies(shape, a, every) for a in every}
    waiting_on = {a: len(deps[a]) for a in every}
    users: dict[Action, list[Action]] = {a: [] for a in every}
    for a, needs in deps.items():
        for dep in needs:
            users[dep].append(a)
    ready = {a for a, n in waiting_on.items() if n == 0}
    busy_until = [0.0] * shape.n_devices
    held = [0.0] * shape.n_devices
    orders: list[list[Action]] = [[] for _ in range(shape.n_devices)]
    running: list[tuple[float, Action]] = []
    left = len(every)
    now = 0.0
    while left:
        claimed: set[int] = set()
        for a in sorted(ready, key=urgency):
            st = shape.stages[a.stage]
            if claimed.intersection(st.devices):
                continue
            if a.kind is Kind.F and any(held[d] + st.f_mem > memory_cap + _EPS for d in st.devices):
                continue  # over the cap: wait for a backward to free memory
            claimed.update(st.devices)
            if any(busy_until[d] > now + _EPS for d in st.devices):
                continue  # the most urgent action for these devices: they keep for it
            finish = now + (st.f_time if a.kind is Kind.F else st.b_time)
            for d in st.devices:
                busy_until[d] = finish
                held[d] += st.f_mem if a.kind is Kind.F else -st.f_mem
                orders[d].append(a)
            running.append((finish, a))
            ready.discard(a)
            left -= 1
        if not running:
            if left:
                raise SchedlabError(
                    f"list scheduling ran out of memory under the cap {memory_cap:g}: every device waits for "
                    f"memory with work left; raise the cap"
                )
            break
        now = min(t for t, _ in running)
        for t, a in [r for r in running if r[0] <= now + _EPS]:
            running.remove((t, a))
            for u in users[a]:
                waiting_on[u] -= 1
                if waiting_on[u] == 0:
                    ready.add(u)
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=tuple(tuple(o) for o in orders), name=name)
