"""The one timing model every schedule is measured with.

Each device runs its list in order, one action at a time; an action that spans several
devices (a stage sharded over them) starts when all of them reach it. An action starts
once the work it depends on within its micro-batch has finished, plus `comm_time` when
that work ran on other devices. So a schedule's timeline is the longest path through the
DAG of dependencies and per-device order, computed once in topological order: exact for
the given costs, and a cycle in that DAG is a deadlock.

Dependencies within a micro-batch, for stage s:
- F(s) after F(p) of every stage p feeding s;
- B(s) or I(s) after F(s) and after the input-gradient backward (I, else B) of every
  stage s feeds;
- W(s) after I(s).

Unit costs and free communication give torch's own timing of its schedules
(`torch.distributed.pipelining._schedule_visualizer.add_schedule_op_spacing`: F = I = W = 1,
B = 2), and the closed forms: 1F1B's makespan 2M + 2(P - 1) with unit F and B.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape


def action_time(shape: PipeShape, a: Action) -> float:
    st = shape.stages[a.stage]
    if a.kind is Kind.F:
        return st.f_time
    if a.kind is Kind.B:
        return st.b_time
    if a.kind is Kind.I:
        return st.i_time
    if a.kind is Kind.W:
        return st.w_time
    raise SchedlabError(f"{a} is not a compute action; the timing model derives communication itself")


def dependencies(shape: PipeShape, a: Action, present: set[Action]) -> list[Action]:
    """The actions of a's micro-batch that must finish before a starts."""
    s, m = a.stage, a.mb
    if a.kind is Kind.F:
        return [Action(p, Kind.F, m) for p in shape.prev[s]]
    if a.kind in (Kind.B, Kind.I):
        out = [Action(s, Kind.F, m)]
        for n in shape.stages[s].next:
            i = Action(n, Kind.I, m)
            out.append(i if i in present else Action(n, Kind.B, m))
        return out
    if a.kind is Kind.W:
        return [Action(s, Kind.I, m)]
    raise SchedlabError(f"{a} is not a compute action")


@dataclass(frozen=True)
class Timeline:
    schedule: Schedule
    start: dict[Action, float]
    end: dict[Action, float]
    makespan: float
    busy: tuple[float, ...]  # per device: time spent computing
    peak_memory: tuple[float, ...]  # per device, in the shape's memory unit

    @property
    def bubble_fraction(self) -> float:
        """Share of device time idle within the makespan: 1 - busy / (P x makespan)."""
        total = self.makespan * len(self.busy)
        return 0.0 if total <= 0 else 1.0 - sum(self.busy) / total

    def completion_spacing(self) -> float:
        """Mean time between micro-batch completions over the middle half of the run, and
        never below the busiest device's work per micro-batch (its busy time over M), which
        no steady state can beat: a schedule-agnostic estimate of the steady state's time
        per micro-batch. At small M the middle half still holds warm-up or cool-down,
        whose completions bunch up (ZBV at P 4, M 8: spacing 2.25 against 3 of work per
        micro-batch on every device)."""
        floor = max(self.busy, default=0.0) / self.schedule.n_microbatches
        done: dict[int, float] = {}
        for a, t in self.end.items():
            done[a.mb] = max(done.get(a.mb, 0.0), t)
        times = sorted(done.values())
        if len(times) < 2:
            return max(self.makespan, floor)
        lo, hi = len(times) // 4, max(len(times) // 4 + 1, (3 * len(times)) // 4)
        hi = min(hi, len(times) - 1)
        return max((times[hi] - times[lo]) / (hi - lo), floor)


def time_schedule(schedule: Schedule, comm_time: float = 0.0) -> Timeline:
    """Start and end of every action, makespan, busy time and peak memory per device."""
    shape = schedule.shape
    present = schedule.actions()
    # Work on integer ids: 100k actions (64 stages x 512 micro-batches) time in about a second.
    acts = list(dict.fromkeys(a for order in schedule.orders for a in order))
    idx = {a: i for i, a in enumerate(acts)}
    devices_of = [frozenset(st.devices) for st in shape.stages]
    preds: list[list[tuple[int, float]]] = [[] for _ in acts]
    for i, a in enumerate(acts):
        for dep in dependencies(shape, a, present):
            j = idx.get(dep)
            if j is None:
                raise SchedlabError(
                    f"{a} depends on {dep}, which no device runs; every stage needs F and a backward "
                    f"(B, or I and W) for every micro-batch"
                )
            preds[i].append((j, comm_time if devices_of[dep.stage] != devices_of[a.stage] else 0.0))
    for order in schedule.orders:
        ids = [idx[a] for a in order]
        for before, after in pairwise(ids):
            preds[after].append((before, 0.0))
    succs: list[list[int]] = [[] for _ in acts]
    indeg = [len(ps) for ps in preds]
    for i, ps in enumerate(preds):
        for j, _ in ps:
            succs[j].append(i)
    dur = [action_time(shape, a) for a in acts]
    t_start = [0.0] * len(acts)
    t_end = [-1.0] * len(acts)
    ready = deque(i for i, k in enumerate(indeg) if k == 0)
    done = 0
    while ready:
        i = ready.popleft()
        t0 = max((t_end[j] + delay for j, delay in preds[i]), default=0.0)
        t_start[i] = t0
        t_end[i] = t0 + dur[i]
        done += 1
        for n in succs[i]:
            indeg[n] -= 1
            if indeg[n] == 0:
                ready.append(n)
    if done != len(acts):
        finished = {a: t_end[i] for i, a in enumerate(acts) if t_end[i] >= 0}
        raise SchedlabError(_deadlock_message(schedule, finished, shape, present))
    start = dict(zip(acts, t_start, strict=True))
    end = dict(zip(acts, t_end, strict=True))
    busy = tuple(sum(dur[idx[a]] for a in order) for order in schedule.orders)
    return Timeline(
        schedule=schedule,
        start=start,
        end=end,
        makespan=max(t_end, default=0.0),
        busy=busy,
        peak_memory=peak_memory(schedule),
    )


def peak_memory(schedule: Schedule) -> tuple[float, ...]:
    """Per device, the most activation memory held at once: F holds its stage's f_mem
    until B frees it, or I frees all but w_mem and W the rest; devices run their lists in
    order, so walking each list gives its peak."""
    out = []
    for order in schedule.orders:
        held = peak = 0.0
        for a in order:
            st = schedule.shape.stages[a.stage]
            if a.kind is Kind.F:
                held += st.f_mem
                peak = max(peak, held)
            elif a.kind is Kind.B:
                held -= st.f_mem
            elif a.kind is Kind.I:
                held -= st.f_mem - st.w_mem
            elif a.kind is Kind.W:
                held -= st.w_mem
        out.append(peak)
    return tuple(out)


def _deadlock_message(schedule: Schedule, end: dict[Action, float], shape: PipeShape, present: set[Action]) -> str:
    waits = []
    for d, order in enumerate(schedule.orders):
        pos = next((k for k, a in enumerate(order) if a not in end), None)
        if pos is None:
            continue
        head = order[pos]
        blocked_on = [str(p) for p in dependencies(shape, head, present) if p not in end]
        if pos and order[pos - 1] not in end:
            blocked_on.append(str(order[pos - 1]))
        waits.append(f"device {d} waits at {head} for {', '.join(blocked_on)}")
    return "the schedule deadlocks: " + "; ".join(waits)
