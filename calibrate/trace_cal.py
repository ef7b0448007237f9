"""Trace-driven calibration: an op signature seen in a real step costs what it cost there.

From an executor Trace of a Graph we take, per (signature, threads), the mean of the
durations of the op's events once stalls are dropped (`robust_mean`) minus the executor's in-event floor, which is the op's kernel time as
the Profile defines it (`kernel_us` = event time - dispatch, as the simulator adds them):

- one slot (the straight-line step): back-to-back events hold all the executor's Python,
  so the floor is the dispatch figure ``op_us``;
- several slots: events hold the op call only, so the floor is ``corun_event_floor_us``.

The slot count is read from the trace's plan (`meta.plan.slots`; 1 if absent).

- Only executor traces (`meta.source == "exec"`): a simulated trace would feed the model
  its own output.
- Events that overlap another event on the same device in the same step are left out:
  they ran next to another kernel and include its slowdown, and the signature table holds
  kernels alone. (A plan that co-runs everything teaches the table nothing; trace the
  graph once under a one-slot plan to calibrate it.)
- Every recorded step counts: the executor leaves its warm-up steps out of the trace.
- Views and events of kind OVERHEAD or COMM are not kernels and are skipped.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlab.calibrate.signature import signature
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, same_capture
from schedlab.trace import Trace, TraceEvent

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile
    from schedlab.machine import Machine
    from schedlab.order import OpCostUs

_NOT_KERNELS = ("OVERHEAD", "COMM")


@dataclass(frozen=True)
class TraceFigures:
    signatures: dict[str, dict[int, float]]  # signature -> threads -> kernel_us
    n_events_used: int
    n_events_overlapping: int
    slots: int
    # Ops (not views) whose every event overlapped another: the trace gives them no time.
    ops_without_clean_event: frozenset[int] = frozenset()
    # What a typical step spends in the used events over what the table sums to for them
    # (`step_factor`): callers scale the table by it.
    step_factor: float = 1.0


STALL_FACTOR = 3.0  # an event over this many times the op's fastest is a stall
STALL_SLACK_NS = 20_000.0


def robust_mean(durs: Sequence[float]) -> float:
    """The op's typical cost from repeated events, not a stall's.

    On a shared or virtual machine an op now and then takes 10x its time (a core taken
    away in the middle of an OpenMP region); the median of three steps still lands on a
    stall when two of them stalled. Stalls only ever add time, and far more than an
    op's own variation: events over STALL_FACTOR times the fastest (plus a little slack)
    are dropped, and the mean of the rest is the op's cost. (Durations in ns.)

    The mean, not the median: an op's events below the stall line are skewed to the slow
    side, and a step costs the sum of its ops. Over the one-slot traces of 20 models the
    sum of the ops' medians fell 0-7% short of the step's summed events (median 3%), the
    sum of their means 0-2% (`docs/heldout-fidelity-log.md`, session 48).
    """
    lo = min(durs)
    # Durations may be below zero once `less_us` is taken off (an estimate); the fastest is always kept.
    kept = [d for d in durs if d <= STALL_FACTOR * max(lo, 0.0) + STALL_SLACK_NS]
    return statistics.fmean(kept)


def trace_slots(trace: Trace) -> int:
    """Co-run slots of the plan the trace was recorded under (1 when not recorded)."""
    plan = trace.meta.get("plan")
    slots = plan.get("slots", 1) if isinstance(plan, dict) else 1
    return int(slots) if isinstance(slots, int) and slots >= 1 else 1


def _check(trace: Trace, graph: Graph) -> None:
    if trace.source != "exec":
        raise SchedlabError(
            f"trace-driven calibration needs an executor trace (meta.source 'exec'), not {trace.source!r}"
        )
    recorded = trace.meta.get("graph_hash")
    if recorded is not None and not same_capture(graph, recorded, trace.meta.get("schedule_hash")):
        raise SchedlabError(
            f"the trace was recorded for graph {recorded}, but the graph given is {graph.hash}; "
            "pass the graph the trace was recorded from"
        )
    for e in trace.events:
        if e.kind not in _NOT_KERNELS and not 0 <= e.op < len(graph.ops):
            raise SchedlabError(f"trace event names op {e.op}, but graph {graph.name!r} has {len(graph.ops)} ops")


def _overlapping(events: list[TraceEvent]) -> set[int]:
    """Indexes (into `events`) of events that overlap another event on the same device
    in the same step (times count from the start of each step)."""
    out: set[int] = set()
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        groups[(e.device, e.step)].append(i)
    for idxs in groups.values():
        idxs.sort(key=lambda i: (events[i].start_ns, events[i].end_ns))
        reach_end, reach_idx = -1, -1
        for i in idxs:
            e = events[i]
            if e.start_ns < reach_end:
                out.add(i)
                out.add(reach_idx)
            if e.end_ns > reach_end:
                reach_end, reach_idx = e.end_ns, i
    return out


def trace_figures(
    trace: Trace, graph: Graph, floor_us: float, less_us: Callable[[Op, int], float] | None = None,
    kernel_of: Callable[[Op, int, float], float] | None = None,
) -> TraceFigures:
    """Kernel times per (signature, threads) seen in `trace`: `robust_mean` event - `floor_us`.

    `less_us(op, threads)` is taken off each of `op`'s events first: what the event holds
    beyond the op's kernel in a step (the first use of its target, `calibrate.context`;
    its data not in the caches, `calibrate.cold`), and what is left beyond the floor (us)
    is read back by `kernel_of(op, threads, us)` to the op's time back to back (the step's
    convolutions taking turns, `calibrate.in_turn`), so that the table keeps what the op
    costs wherever it runs.
    """
    _check(trace, graph)
    events = [e for e in trace.events if e.kind not in _NOT_KERNELS]
    overlapping = _overlapping(events)
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    used: list[tuple[int, tuple[str, int], float]] = []  # (step, table key, net ns) of each event used
    clean: set[int] = set()
    for i, e in enumerate(events):
        op = graph.ops[e.op]
        if op.is_view or i in overlapping:
            continue
        clean.add(e.op)
        key = (signature(op), max(1, e.threads))
        less_ns = less_us(op, key[1]) * 1e3 if less_us is not None else 0.0
        net_ns = e.dur_ns - less_ns
        if kernel_of is not None:
            net_ns = kernel_of(op, key[1], (net_ns / 1e3 - floor_us)) * 1e3 + floor_us * 1e3
        durations[key].append(net_ns)
        used.append((e.step, key, net_ns))
    table: dict[str, dict[int, float]] = defaultdict(dict)
    for (sig, threads), durs in durations.items():
        table[sig][threads] = max(0.0, robust_mean(durs) / 1e3 - floor_us)
    busy: dict[int, float] = defaultdict(float)
    typical: dict[int, float] = defaultdict(float)
    for step, (sig, threads), net_ns in used:
        busy[step] += max(0.0, net_ns / 1e3 - floor_us)
        typical[step] += table[sig][threads]
    return TraceFigures(
        signatures=dict(table), n_events_used=len(used), n_events_overlapping=len(overlapping),
        slots=trace_slots(trace),
        ops_without_clean_event=frozenset(e.op for e in events if not graph.ops[e.op].is_view) - clean,
        step_factor=step_factor(list(busy.values()), list(typical.values())),
    )


STEP_FACTOR_RANGE = (0.5, 2.0)  # beyond it a trace's steps and its table disagree too much to trust either


def step_factor(busy_us: Sequence[float], typical_us: Sequence[float]) -> float:
    """What a typical step spends in its kernels over what the table (each signature's
    typical event) sums to for the same events: per step, the events' kernel time
    (`busy_us`) and the table's sum (`typical_us`); the median of one over the median of
    the other, clamped to STEP_FACTOR_RANGE (1.0: nothing timed). Each op's times are
    right-skewed on a shared host (a preempted kernel, a cold cache) and every step pays
    some of that somewhere, so the sum of per-op typical times falls short of a typical
    step: a TensorFlow attention encoder's 389 nodes summed to 25.0 ms where a median step
    spent 29-30 ms in them (24.7-33.8 over ten steps), and even the settings calibrated on
    were predicted 14-17% fast."""
    if not busy_us or statistics.median(typical_us) <= 0:
        return 1.0
    lo, hi = STEP_FACTOR_RANGE
    return min(hi, max(lo, statistics.median(busy_us) / statistics.median(typical_us)))


def calibrate_with_traces(
    profile: Profile,
    graph: Graph,
    input_values: dict[int, Any],
    machine: Machine,
    steps: int,
    step_times_s: dict[int, float] | None = None,
    rounds: int = 1,
    one_thread_order: str = "topo",
) -> Profile:
    """The Profile plus the op times of `graph` measured in a few real steps under one
    slot, program order, 1 thread and all threads (the one-thread steps in
    `one_thread_order`): the trace-driven calibration. With
    `rounds`, the thread counts alternate that many times and each count's runs are joined
    (`joined_traces`), so that a slow spell of a shared host lands on both counts' medians
    alike instead of deciding one of them (one search's calibration of mlp predicted
    PyTorch's default plan at 366 ms, where the profile alone said 285 and validation
    measured 277).
    `step_times_s`, if given, gets each thread count's step time (median over its runs' steps)."""
    from schedlab.sim.cost import op_cost_us

    if rounds < 1:
        raise SchedlabError(f"rounds must be at least 1, got {rounds}")
    traces: OneProcessTraces = {}
    times: dict[int, list[float]] = {}
    weights = op_cost_us(profile)
    for _ in range(rounds):
        one_process_traces(graph, input_values, machine, steps, into=traces, step_times_s=times,
                           one_thread_order=one_thread_order, weights=weights)
    if step_times_s is not None:
        step_times_s.update({n: statistics.median(ts) for n, ts in times.items()})
    return with_one_process_traces(profile, graph, traces)


OneProcessTraces = dict[int, list[Trace]]  # threads -> its runs' traces


def one_process_traces(
    graph: Graph,
    input_values: dict[int, Any],
    machine: Machine,
    steps: int,
    into: OneProcessTraces | None = None,
    step_times_s: dict[int, list[float]] | None = None,
    one_thread_order: str = "topo",
    weights: OpCostUs | None = None,
) -> OneProcessTraces:
    """One round of `calibrate_with_traces`: `steps` steps (after one untimed) of `graph`
    under one slot, 1 thread in `one_thread_order`, then all of `machine`'s threads in
    program order; each run's trace added to `into`'s, its step times to `step_times_s`'s.
    `weights`: the cost model's op times a critical-path order ranks by (`resolve`), as the
    search's plans are ranked."""
    from schedlab.exec import Executor, run_steps
    from schedlab.plan import Plan, resolve

    out: OneProcessTraces = {} if into is None else into
    for threads in sorted({1, machine.default_device.cores}):
        order = one_thread_order if threads == 1 else "topo"
        plan = Plan(threads=threads, order=order)
        executor = None
        if order != "topo" and weights is not None:  # ranked as the search ranks its plans
            resolved = resolve(graph, plan, machine, op_cost_us=weights)
            executor = Executor(resolved.run_graph(graph), resolved)
        res = run_steps(graph, input_values, plan, machine, steps=steps, warmup=1, executor=executor)
        out.setdefault(threads, []).append(res.trace)
        if step_times_s is not None:
            step_times_s.setdefault(threads, []).extend(res.step_times_s)
    return out


def with_one_process_traces(profile: Profile, graph: Graph, traces: OneProcessTraces) -> Profile:
    """`profile` plus each thread count's op times over all its runs (`joined_traces`)."""
    for _, runs in sorted(traces.items()):
        profile = profile.with_trace(joined_traces(runs), graph)
    return profile


def joined_traces(runs: Sequence[Trace]) -> Trace:
    """Several runs of one graph as one trace: the later runs' steps numbered after the earlier ones'."""
    if len(runs) == 1:
        return runs[0]
    events: list[TraceEvent] = []
    offset = 0
    for tr in runs:
        events.extend(dataclasses.replace(e, step=e.step + offset) for e in tr.events)
        offset += 1 + max((e.step for e in tr.events), default=-1)
    return Trace(tuple(events), {**runs[0].meta, "joined_runs": len(runs)})
