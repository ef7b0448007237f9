"""How far the Profile is from a measured step, op class by op class.

A step's error mixes everything the simulator models: kernels, dispatch, co-running,
threads. To see whether the cost model itself predicts a model it never saw, compare each
op's kernel in a real one-slot trace with what the Profile would charge for it, where the
Profile has never measured that op's exact signature (the ops it must extrapolate to):

- measured: the op's kernel time in the trace as trace calibration reads it
  (`calibrate.trace_cal.trace_figures`: stalls dropped, the executor's in-event floor and
  the first use's extra taken off);
- predicted: `Profile.kernel_us(op, threads)` of the Profile bound to no graph (no
  first-use extra either).

Per class: the ops' summed times (per step, each signature counted as often as the graph
runs it), their ratio, and the mean absolute log error of predicted over measured (ops
weighted alike). The same measurement scores two Profiles with no host drift between them,
which a step-level comparison cannot (`schedlab fidelity --held-out` reports it per model
and pooled, from the trace of its calibration plan).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schedlab.calibrate.signature import graph_signatures
from schedlab.calibrate.trace_cal import trace_figures, trace_slots
from schedlab.graph import Graph, Op
from schedlab.trace import Trace

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile


@dataclass(frozen=True)
class ClassError:
    """One op class's unseen ops in one trace (or pooled over several), times per step."""

    op_class: str
    n_ops: int  # op runs per step
    measured_us: float
    predicted_us: float
    abs_log_sum: float  # sum over the op runs of |log(predicted / measured)|

    @property
    def ratio(self) -> float:
        """Predicted over measured (> 1: the Profile is slow)."""
        return self.predicted_us / self.measured_us if self.measured_us > 0 else math.inf

    @property
    def mean_abs_log(self) -> float:
        return self.abs_log_sum / self.n_ops if self.n_ops else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "op_class": self.op_class,
            "n_ops": self.n_ops,
            "measured_us": round(self.measured_us, 3),
            "predicted_us": round(self.predicted_us, 3),
            "ratio": round(self.ratio, 4) if math.isfinite(self.ratio) else None,
            "mean_abs_log": round(self.mean_abs_log, 4),
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ClassError:
        n = int(d["n_ops"])
        return ClassError(d["op_class"], n, float(d["measured_us"]), float(d["predicted_us"]),
                          float(d["mean_abs_log"]) * n)


def op_class_errors(graph: Graph, trace: Trace, profile: Profile) -> list[ClassError]:
    """Per op class, the Profile against `trace` on the ops whose signature it never
    measured; the classes by measured time, largest first."""
    figs = trace_figures(
        trace, graph, profile.dispatch.event_floor_us(trace_slots(trace)),
        profile.for_graph(graph).for_slots(trace_slots(trace)).step_extra_us
    )
    sigs = graph_signatures(graph)
    runs: Counter[str] = Counter()
    example: dict[str, Op] = {}
    for op, sig in zip(graph.ops, sigs, strict=True):
        if not op.is_view and sig not in profile.signatures:
            runs[sig] += 1
            example.setdefault(sig, op)
    per_signature = []
    for sig, row in figs.signatures.items():
        if sig not in runs:
            continue
        op, n = example[sig], runs[sig]
        for threads, measured in row.items():
            predicted = profile.kernel_us(op, threads)
            off = abs(math.log(predicted / measured)) if measured > 0 and predicted > 0 else 0.0
            per_signature.append(ClassError(op.op_class, n, n * measured, n * predicted, n * off))
    return pooled([per_signature])


def pooled(per_model: Iterable[Sequence[ClassError]]) -> list[ClassError]:
    """Rows summed class by class, largest measured first: one trace's signatures into its
    classes, or several traces' classes into one table."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for errors in per_model:
        for c in errors:
            a = acc[c.op_class]
            a[0] += c.n_ops
            a[1] += c.measured_us
            a[2] += c.predicted_us
            a[3] += c.abs_log_sum
    return sorted(
        (ClassError(cls, int(a[0]), a[1], a[2], a[3]) for cls, a in acc.items()),
        key=lambda c: -c.measured_us,
    )
