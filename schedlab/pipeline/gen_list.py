"""List scheduling: build each device's order by playing the pipeline forward in time.

Whenever a device is free it starts, of the actions whose dependencies have finished,
the one that ranks first; a schedule is then just its ranking and a memory bound. This
is how Zero Bubble's ZB-V and out-of-order backprop's fast-forwarding place their work:
the input-gradient backward I first, since the previous stage waits for it, and the
weight-gradient backward W only where nothing else is ready. Every backward is split
into I and W. The times are the shape's own (communication free), so the orders fit the
costs they were built for; the timing model then measures them like any other schedule.

Memory bound without deadlock: a forward that brings a micro-batch onto a device for the
first time (its admission) runs only while the device, with it, holds no more than
`admit_limit[d]` of activations (or holds none). A later forward of an admitted
micro-batch that would pass the limit is never refused, only ranked behind any other
ready work. A micro-batch admitted on every device it visits never waits again, and by
induction over the devices in the order a micro-batch first reaches them, every admitted
micro-batch finishes, so the loop cannot stall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind
from schedlab.pipeline.gen_layout import chain_layout
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape
from schedlab.pipeline.timing import action_time, dependencies

Rank = Callable[[Action], tuple[float, ...]]


def list_schedule(
    shape: PipeShape, n_microbatches: int, rank: Rank, admit_limit: Sequence[float], name: str
) -> Schedule:
    """Orders from greedy list scheduling with `rank` (smallest first) and per-device
    admission limits (activation memory, in the shape's unit)."""
    layout = chain_layout(shape, name)
    m = n_microbatches
    present = {Action(s, k, mb) for s in range(shape.n_stages) for k in (Kind.F, Kind.I, Kind.W) for mb in range(m)}
    deps = {a: dependencies(shape, a, present) for a in present}
    succs: dict[Action, list[Action]] = {a: [] for a in present}
    for a, ds in deps.items():
        for dep in ds:
            succs[dep].append(a)
    unmet = {a: len(ds) for a, ds in deps.items()}
    ready_at: dict[Action, float] = {}  # actions whose dependencies are all placed
    candidates: list[set[Action]] = [set() for _ in range(layout.n_devices)]
    for a, k in unmet.items():
        if k == 0:
            ready_at[a] = 0.0
            candidates[layout.device_of[a.stage]].add(a)
    end: dict[Action, float] = {}
    clock = [0.0] * layout.n_devices
    held = [0.0] * layout.n_devices
    admitted: set[tuple[int, int]] = set()
    orders: list[list[Action]] = [[] for _ in range(layout.n_devices)]

    def allowed(d: int, a: Action) -> bool:
        if a.kind is not Kind.F or (d, a.mb) in admitted or held[d] == 0:
            return True
        return held[d] + shape.stages[a.stage].f_mem <= admit_limit[d] + 1e-9

    def over(d: int, a: Action) -> bool:  # a forward past the limit waits behind any other ready work
        return a.kind is Kind.F and held[d] + shape.stages[a.stage].f_mem > admit_limit[d] + 1e-9

    while len(end) < len(present):
        best: tuple[float, int] | None = None
        for d, cands in enumerate(candidates):
            starts = [ready_at[a] for a in cands if allowed(d, a)]
            if starts:
                t = max(clock[d], min(starts))
                if best is None or t < best[0]:
                    best = (t, d)
        if best is None:  # the admission rule makes this unreachable; say so if it is not
            raise SchedlabError(f"list scheduling of {name!r} stalled with {len(present) - len(end)} actions left")
        t, d = best
        a = min((a for a in candidates[d] if ready_at[a] <= t and allowed(d, a)), key=lambda a: (over(d, a), rank(a)))
        candidates[d].remove(a)
        orders[d].append(a)
        end[a] = clock[d] = t + action_time(shape, a)
        st = shape.stages[a.stage]
        if a.kind is Kind.F:
            admitted.add((d, a.mb))
            held[d] += st.f_mem
        else:
            held[d] -= st.f_mem - st.w_mem if a.kind is Kind.I else st.w_mem
        for n in succs[a]:
            unmet[n] -= 1
            if unmet[n] == 0:
                ready_at[n] = max(end[p] for p in deps[n])
                candidates[layout.device_of[n.stage]].add(n)
    return Schedule(shape=shape, n_microbatches=m, orders=tuple(tuple(o) for o in orders), name=name)


def fast_forward_rank(a: Action) -> tuple[float, ...]:
    """I before F before W. I's and F's of later stages first (a micro-batch heads for the
    loss, and its gradient back, before new work starts), then the older micro-batch; W's
    oldest first."""
    if a.kind is Kind.I:
        return (0, -a.stage, a.mb)
    if a.kind is Kind.F:
        return (1, -a.stage, a.mb)
    return (2, a.mb, a.stage)


def one_f_one_b_memory(shape: PipeShape) -> tuple[float, ...]:
    """Per device, the activation memory 1F1B holds at its peak on device 0 when the model
    is split evenly: P micro-batches of the device's share (the sum of its stages'
    `f_mem`). ZB-V and the fast-forwarded loop are bounded by it."""
    share = [0.0] * shape.n_devices
    for st in shape.stages:
        for d in st.devices:
            share[d] += st.f_mem
    return tuple(shape.n_devices * x for x in share)
