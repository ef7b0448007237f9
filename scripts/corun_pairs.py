"""Which ops of a model stretch when two workers co-run them, and beside what.

Runs the executor on one model twice, in program order: at one slot (each op alone) and at
two slots, both at `--threads` intra-op threads. For every op of at least `--min-us` at two
slots it prints its median time alone and co-run, the op of the other worker it overlapped
most (and that op's time alone), the share of its time that overlap covers, and how long
after that op's end it ended. Then per op class: the mean time alone and co-run, as the
simulator's co-run model should reproduce them.

What it showed on the 2-core Intel Xeon VM (2026-12-07, the log's "Session 52"): at two
slots of two threads, two two-thread kernels that overlap do not share the cores as
processor sharing says. One keeps most of its speed and the other stalls: a pair of `mm`
of 440 and 518 us alone took 1,354 and 619 us, a `sum` of 75 us beside an `mm` of 527 us
781 us. The pair ends later than the two run one after the other. An `nn.LSTM` layer's two
directions, equal and started together, share about fairly (1.7-1.9x each), and an op of
the other worker's that is mostly its Python call is held back for most of a long
two-thread kernel: `t` of 17 us alone took 1,503 us beside a 1,427 us `max_pool2d`.

Usage: python scripts/corun_pairs.py MODEL [--threads N] [--steps N] [--min-us US] [--per-op]
"""

from __future__ import annotations

import argparse
import collections
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from schedlab.capture import capture
from schedlab.exec import ExecBackend
from schedlab.graph import Graph
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from schedlab.trace import TraceEvent
from schedlab.workloads import load_workload


@dataclass(frozen=True)
class Overlap:
    """One co-run call of an op: its time, the other worker's op it overlapped most, the
    share of its time that overlap covers, and its end minus that op's end."""

    dur_us: float
    other: int  # -1: it overlapped nothing
    share: float
    end_after_us: float


def _op_events(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    return [e for e in events if e.op >= 0]


def alone_us(events: Sequence[TraceEvent]) -> dict[int, float]:
    """Median time of each op over the steps of a one-slot run."""
    per: dict[int, list[float]] = collections.defaultdict(list)
    for e in _op_events(events):
        per[e.op].append(e.dur_ns / 1e3)
    return {op: statistics.median(v) for op, v in per.items()}


def overlaps(events: Sequence[TraceEvent], min_us: float) -> dict[int, list[Overlap]]:
    """Each op's co-run calls of at least `min_us`, step by step."""
    by_step: dict[int, list[TraceEvent]] = collections.defaultdict(list)
    for e in _op_events(events):
        by_step[e.step].append(e)
    out: dict[int, list[Overlap]] = collections.defaultdict(list)
    for step_events in by_step.values():
        for e in step_events:
            if e.dur_ns < min_us * 1e3:
                continue
            best, best_ns = None, 0
            for f in step_events:
                if f.worker != e.worker and f.end_ns > e.start_ns and f.start_ns < e.end_ns:
                    ns = min(f.end_ns, e.end_ns) - max(f.start_ns, e.start_ns)
                    if ns > best_ns:
                        best, best_ns = f, ns
            out[e.op].append(Overlap(
                dur_us=e.dur_ns / 1e3,
                other=best.op if best is not None else -1,
                share=best_ns / e.dur_ns if best is not None and e.dur_ns else 0.0,
                end_after_us=(e.end_ns - best.end_ns) / 1e3 if best is not None else 0.0,
            ))
    return out


def report(graph: Graph, alone: dict[int, float], corun: dict[int, list[Overlap]], per_op: bool) -> str:
    lines = []
    by_class: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    if per_op:
        lines.append(f"{'op class':30s} {'alone us':>9s} {'co-run':>8s} {'x':>5s}  "
                     f"{'main co-runner':26s} {'alone us':>8s} {'share':>5s} {'ends after':>10s}")
    for op in sorted(corun):
        calls = corun[op]
        dur = statistics.median(c.dur_us for c in calls)
        other = collections.Counter(c.other for c in calls).most_common(1)[0][0]
        a = alone.get(op, float("nan"))
        cls = graph.ops[op].op_class
        row = by_class[cls]
        row[0] += a
        row[1] += dur
        row[2] += 1
        if per_op:
            share = statistics.median(c.share for c in calls)
            after = statistics.median(c.end_after_us for c in calls)
            name = graph.ops[other].op_class if other >= 0 else "-"
            lines.append(f"{cls:30s} {a:9.0f} {dur:8.0f} {dur / a:5.1f}  {name:26s} "
                         f"{alone.get(other, float('nan')):8.0f} {share:5.2f} {after:+10.0f}")
    lines.append(f"{'op class':30s} {'ops':>4s} {'alone us':>9s} {'co-run us':>10s} {'ratio':>6s}")
    for cls, (a, d, n) in sorted(by_class.items(), key=lambda kv: kv[1][0] - kv[1][1]):
        lines.append(f"{cls:30s} {n:4.0f} {a / n:9.0f} {d / n:10.0f} {d / a:6.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a workload name, e.g. heldout:mixer or dev:dwconv")
    ap.add_argument("--size", default="default", help="workload size (default: default)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every op (default 2)")
    ap.add_argument("--steps", type=int, default=12, help="steps of each run (default 12)")
    ap.add_argument("--min-us", type=float, default=30.0, help="co-run calls shorter than this are left out (default 30)")
    ap.add_argument("--per-op", action="store_true", help="print every op, not only the classes")
    args = ap.parse_args()
    if args.threads < 1 or args.steps < 1:
        ap.error("--threads and --steps must be at least 1")
    workload = load_workload(args.model, args.size)
    cap = capture(workload, "sgd")
    graph, machine = cap.graph, detect_host()
    ex = ExecBackend(cap.input_values, warmup=2, workload=args.model)

    def run(slots: int) -> list[TraceEvent]:
        plan = resolve(graph, Plan(slots=slots, threads=args.threads, order="topo"), machine)
        return list(ex.run(graph, plan, machine, steps=args.steps).trace.events)

    alone = alone_us(run(1))
    corun = overlaps(run(2), args.min_us)
    print(f"{args.model}: {len(corun)} ops of at least {args.min_us:g} us at two slots of {args.threads} threads, "
          f"{args.steps} steps each run")
    print(report(graph, alone, corun, args.per_op))


if __name__ == "__main__":
    main()
