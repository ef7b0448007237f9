"""The classic synchronous schedules, each backward whole (B): GPipe, 1F1B, interleaved
1F1B and looped BFS. Each is a pure function of a chain-shaped pipeline and the number of
micro-batches, returning every device's order; the timing model measures them all.

Pictures are drawn at unit F and B per stage, one column per time unit: on a device's
first stage a digit is the forward of that micro-batch and B a backward; on its later
stages f and b.
"""

from __future__ import annotations

from collections import deque

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind
from schedlab.pipeline.gen_layout import chain_layout, require_layout
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape


def gpipe(shape: PipeShape, n_microbatches: int) -> Schedule:
    """GPipe: every forward, then every backward, micro-batches in order. It holds all
    M micro-batches' activations at once (peak M on every device).

        0: 0123      BBBB
        1:  0123    BBBB
        2:   0123  BBBB
        3:    0123BBBB
    """
    layout = chain_layout(shape, "gpipe")
    require_layout(layout, "gpipe", "loop", 1)
    m = range(n_microbatches)
    orders = tuple(
        tuple(Action(s, Kind.F, k) for k in m) + tuple(Action(s, Kind.B, k) for k in m) for (s,) in layout.stages_of
    )
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=orders, name="gpipe")


def one_f_one_b_order(
    stage: int, n_microbatches: int, n_warmup: int, *, split: bool = False, w_lag: int = 0
) -> tuple[Action, ...]:
    """One stage's order in the 1F1B family: `n_warmup` forwards, then for each micro-batch
    k in turn its backward (B, or I when `split`) and the next forward while any remain.

    Split, each I leaves a W to run later: while forwards remain a W runs after the
    forward once more than `w_lag` are waiting (so W trails I by `w_lag` micro-batches);
    after the last forward, one waiting W follows each I; the rest close the list.
    Zero Bubble's handcrafted schedules are this list with other warm-up counts and lags.
    """
    m = n_microbatches
    order = [Action(stage, Kind.F, k) for k in range(min(n_warmup, m))]
    next_f = len(order)
    waiting: deque[int] = deque()
    for k in range(m):
        order.append(Action(stage, Kind.I if split else Kind.B, k))
        waiting.append(k)
        has_forward = next_f < m
        if has_forward:
            order.append(Action(stage, Kind.F, next_f))
            next_f += 1
        if split and waiting and (len(waiting) > w_lag or not has_forward):
            order.append(Action(stage, Kind.W, waiting.popleft()))
    if split:
        order.extend(Action(stage, Kind.W, k) for k in waiting)
    return tuple(order)


def one_f_one_b(shape: PipeShape, n_microbatches: int) -> Schedule:
    """1F1B (PipeDream-flush): device d runs P - 1 - d warm-up forwards, then alternates
    one forward and one backward, then drains the backwards. Same makespan as GPipe,
    but device d holds at most P - d micro-batches (peak P on device 0).

        0: 0123   B4B5B6B7B B B B
        1:  012  B3B4B5B6B7B B B
        2:   01 B2B3B4B5B6B7B B
        3:    0B1B2B3B4B5B6B7B
    """
    layout = chain_layout(shape, "1f1b")
    require_layout(layout, "1f1b", "loop", 1)
    p = layout.n_devices
    orders = tuple(one_f_one_b_order(s, n_microbatches, p - d) for d, (s,) in enumerate(layout.stages_of))
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=orders, name="1f1b")


def interleaved_rounds(n_devices: int, n_microbatches: int) -> int:
    """How many micro-batches interleaved 1F1B runs through a device's stage before moving
    to its next stage (a round): M is split into M // P equal rounds (one round when
    M < 2P), as torch's Interleaved1F1B does; Megatron-LM asks for a multiple of P, which
    always splits into rounds of P."""
    p, m = n_devices, n_microbatches

    def splits(x: int) -> bool:
        return x % max(1, x // p) == 0

    if not splits(m):
        below = next(x for x in range(m - 1, 0, -1) if splits(x))
        above = next(x for x in range(m + 1, 2 * m + p) if splits(x))
        raise SchedlabError(
            f"interleaved 1F1B splits the micro-batches into M // P = {m // p} equal rounds, and M={m} does not "
            f"split so; use M={below} or M={above} (any multiple of P={p} does)"
        )
    return m // max(1, m // p)


def interleaved_1f1b(shape: PipeShape, n_microbatches: int) -> Schedule:
    """Interleaved 1F1B (Megatron-LM's virtual pipeline; torch's Interleaved1F1B): V stages
    per device mapped in a loop (stage c * P + d on device d). Forwards go through a
    round of micro-batches on the device's first stage, then the same round on its second,
    and so on; backwards the same with the stages reversed. Device d warms up with
    (V - 1) * round + 2 * (P - 1 - d) forwards, then alternates one forward and one
    backward. Each stage is 1/V of a device's share, so the warm-up and cool-down shrink
    V-fold: bubble (P - 1) / (M V + P - 1) for M a multiple of P.

    P = 2, V = 2, M = 4 (digits, B: the device's first stage; f, b: its second):

        0: 01ff2b3bfBfB b bBB
        1:  01fbfb2B3BfbfbBB
    """
    name = "interleaved"
    layout = chain_layout(shape, name)
    v = layout.stages_per_device
    if v < 2:
        raise SchedlabError(
            f"interleaved 1F1B needs at least 2 stages per device; this pipeline has {v}: use '1f1b' for one "
            f"stage per device, or build the shape with generators.default_shape('interleaved:V', P)"
        )
    require_layout(layout, f"{name}:{v}", "loop", v)
    p, m = layout.n_devices, n_microbatches
    per_round = interleaved_rounds(p, m)
    orders = []
    for d, stages in enumerate(layout.stages_of):
        fwd, bwd = [], []
        for i in range(m * v):
            rnd, r = divmod(i, per_round * v)
            c, k = divmod(r, per_round)
            mb = rnd * per_round + k
            fwd.append(Action(stages[c], Kind.F, mb))
            bwd.append(Action(stages[v - 1 - c], Kind.B, mb))
        n_warmup = min(m * v, (v - 1) * per_round + 2 * (p - 1 - d))
        order = fwd[:n_warmup]
        for j in range(m * v - n_warmup):
            order += [fwd[n_warmup + j], bwd[j]]
        order += bwd[m * v - n_warmup :]
        orders.append(tuple(order))
    return Schedule(shape=shape, n_microbatches=m, orders=tuple(orders), name=f"{name}:{v}")


def looped_bfs(shape: PipeShape, n_microbatches: int) -> Schedule:
    """Looped BFS (torch's ScheduleLoopedBFS; Lamy-Poirier's breadth-first pipeline): V
    stages per device in a loop; a device runs all micro-batches' forwards on its first
    stage, then on its next, ...; then the backwards with the stages reversed and the
    micro-batches last first. GPipe's memory (every micro-batch on every stage held),
    with the loop's shorter ramp.

    P = 2, V = 2, M = 2 (digits, B: the device's first stage; f, b: its second):

        0: 01ff  bbBB
        1:  01ffbbBB
    """
    layout = chain_layout(shape, "looped-bfs")
    require_layout(layout, "looped-bfs", "loop")
    m = range(n_microbatches)
    orders = tuple(
        tuple(Action(s, Kind.F, k) for s in stages for k in m)
        + tuple(Action(s, Kind.B, k) for s in reversed(stages) for k in reversed(m))
        for stages in layout.stages_of
    )
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=orders, name="looped-bfs")
