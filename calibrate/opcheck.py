"""Where a prediction goes wrong: an executor trace's op times against the Profile's, per class.

A step-time error says that the model is off, not where. This compares, op by op, what
the executor measured with what the Profile predicts for the same op, and sums both per
op class (views per view class, as ``view:split``), so the class or the cost term that is
wrong stands out:

- measured: the op's event time in the trace, `trace_cal.robust_mean` over the steps (a
  stall of the machine is not the op's cost);
- predicted: what the same event holds in the Profile's terms. One slot (events are
  back to back and hold all the executor's Python): ``dispatch_us + kernel_us``. Several
  slots (events hold the op call only, see `calibrate.dispatch`): the co-run event floor
  plus ``kernel_us`` plus a view's extra, i.e. the op alone; what co-running adds shows
  up as the difference.

    rows = op_check(trace, graph, profile)
    print(format_rows(rows))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from schedlab.calibrate.profile import Profile
from schedlab.calibrate.trace_cal import robust_mean, trace_slots
from schedlab.graph import Graph, Op
from schedlab.trace import Trace

_NOT_KERNELS = ("OVERHEAD", "COMM")


@dataclass(frozen=True)
class ClassCheck:
    op_class: str  # "view:<class>" for views
    ops: int  # ops of the class in one step
    measured_us: float  # per step, summed over the class's ops
    predicted_us: float
    fallback_ops: int  # ops whose kernel came from the roofline / fallback

    @property
    def error(self) -> float:
        """Signed relative error of the prediction (0 when nothing was measured)."""
        return self.predicted_us / self.measured_us - 1.0 if self.measured_us > 0 else 0.0


def predicted_event_us(profile: Profile, op: Op, threads: int, slots: int) -> float:
    """The Profile's time for `op`'s event in an executor trace with `slots` slots."""
    kernel = profile.kernel_us(op, threads)
    if slots <= 1:
        return profile.for_slots(1).dispatch_us(op) + kernel
    d = profile.dispatch
    if op.is_view:  # the probe view's in-event time, scaled like the op's, plus the view's own
        return d.corun_event_floor_us * d.view_us / max(d.op_us, 1e-9) + profile.view_extra_us(op)
    return d.corun_event_floor_us + kernel


def op_check(trace: Trace, graph: Graph, profile: Profile) -> list[ClassCheck]:
    """Measured and predicted event time per op class, worst total difference first
    (`profile` bound to `graph`, see `Profile.for_graph`)."""
    profile = profile.for_graph(graph)
    slots = trace_slots(trace)
    durs: dict[int, list[float]] = defaultdict(list)
    threads: dict[int, int] = {}
    for e in trace.events:
        if e.kind in _NOT_KERNELS or not 0 <= e.op < len(graph.ops):
            continue
        durs[e.op].append(float(e.dur_ns))
        threads[e.op] = max(1, e.threads)
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for i, ds in durs.items():
        op = graph.ops[i]
        key = f"view:{op.op_class}" if op.is_view else op.op_class
        row = acc[key]
        row[0] += 1
        row[1] += robust_mean(ds) / 1e3
        row[2] += predicted_event_us(profile, op, threads[i], slots)
        row[3] += profile.is_fallback(op)
    rows = [ClassCheck(k, int(r[0]), r[1], r[2], int(r[3])) for k, r in acc.items()]
    return sorted(rows, key=lambda r: -abs(r.predicted_us - r.measured_us))


def format_rows(rows: list[ClassCheck], limit: int = 20) -> str:
    """A plain table: class, ops, measured and predicted us per op and in total, error."""
    total_m = sum(r.measured_us for r in rows)
    total_p = sum(r.predicted_us for r in rows)
    lines = [f"{'op class':34s} {'ops':>5s} {'meas us/op':>10s} {'pred us/op':>10s} {'meas ms':>8s} {'pred ms':>8s} {'error':>7s}"]
    for r in rows[:limit]:
        lines.append(
            f"{r.op_class:34s} {r.ops:5d} {r.measured_us / r.ops:10.2f} {r.predicted_us / r.ops:10.2f} "
            f"{r.measured_us / 1e3:8.2f} {r.predicted_us / 1e3:8.2f} {r.error:+7.0%}"
        )
    err = total_p / total_m - 1.0 if total_m > 0 else 0.0
    lines.append(f"{'all ops':34s} {sum(r.ops for r in rows):5d} {'':10s} {'':10s} {total_m / 1e3:8.2f} {total_p / 1e3:8.2f} {err:+7.0%}")
    return "\n".join(lines)
