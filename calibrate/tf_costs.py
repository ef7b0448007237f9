"""What TensorFlow's runtime costs on this machine, measured from its own traces.

The simulator predicts TensorFlow with the same model of devices, workers and cores as
torch's executor (`sim.model`), parameterised by this cost model instead of the torch
Profile:

- **kernels**: per (signature, intra-op threads), the kernel times `step_stats` recorded
  (`calibrate.trace_cal.trace_figures`: stalls dropped, co-running events left out), at
  the thread counts measured, each run's scaled by its step factor (what a median step
  spends in its kernels over the table's sum, `calibrate.trace_cal.step_factor`); other
  counts interpolated as the Profile does (`calibrate.profile.row_kernel_us`). A kernel no trace timed falls back on the torch
  Profile's model of the aten class it computes (`schedlab.tf.opcost`), and is counted;
- **dispatch**: TensorFlow's executor cost per node outside its kernel (`node_us`), from
  one-inter-op-thread traces: the step's span less the time inside events, per node;
- **session**: each `Session.run`'s fixed cost outside the nodes (`session_us`): the step's
  wall time less the span of its events. The simulator does not model it; `predict` adds it;
- **co-running**: TF's inter-op pool is the plan's co-run slots, its intra-op threads the
  plan's threads; kernels that co-run slow each other by the torch Profile's measured
  factors (memory bandwidth and caches are the machine's, not the framework's), but not by
  its oversubscription factor (`TFCosts.corun_slowdown`). The pool is shared, so a kernel
  holds only the cores its measured speedup keeps busy (`sim.cost.shares_idle_threads`):
  a kernel too small for Eigen to split leaves the other cores to co-running kernels.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from schedlab.calibrate.profile import Profile, row_kernel_us
from schedlab.calibrate.signature import signature
from schedlab.calibrate.trace_cal import trace_figures
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op
from schedlab.trace import Trace

TF_COSTS_SCHEMA = "schedlab.tf_costs"


@dataclass(frozen=True)
class TFCalibrationRun:
    """One TensorFlow run that calibrates: its captured graph, trace and wall step times."""

    graph: Graph
    trace: Trace
    step_times_s: tuple[float, ...]
    intra_op: int  # threads its kernels had
    inter_op: int


@dataclass(frozen=True)
class TFCosts:
    """A `sim.cost.CostModel` of TensorFlow's runtime (see the module docstring)."""

    # TF's intra-op threads are one pool: a kernel occupies only the cores its speedup keeps busy
    shares_idle_threads: ClassVar[bool] = True

    signatures: dict[str, dict[int, float]]  # signature -> intra-op threads -> kernel us
    node_us: float
    session_us: float
    base: Profile | None = None  # the machine's torch Profile: unseen kernels and co-run slowdowns
    meta: dict[str, Any] = field(default_factory=dict)

    def kernel_us(self, op: Op, threads: int) -> float:
        if op.is_view:
            return 0.0
        n = max(1, int(threads))
        row = self.signatures.get(signature(op))
        if self.base is None:
            if row is None:
                return 0.0
            return row_kernel_us(row, n, lambda k: 1.0)
        model = self.base.model_of(op)
        if row is None:
            return max(0.0, model.kernel_us(op.flops, op.bytes_moved, n))
        return row_kernel_us(row, n, lambda k: model.kernel_us(op.flops, op.bytes_moved, k))

    def dispatch_us(self, op: Op) -> float:
        return self.node_us

    def step_time_s(self, simulated_s: float) -> float:
        """A TensorFlow step's predicted time: the simulated nodes plus Session.run's fixed cost."""
        return simulated_s + self.session_us / 1e6

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        """The torch Profile's memory and cache contention, without its oversubscription
        factor: TensorFlow's intra-op threads are one shared pool that co-running kernels
        queue their shards on, so they never run more threads than the pool has, and no
        OpenMP team waits at a barrier for a descheduled thread."""
        if self.base is None:
            return 1.0
        return self.base.corun_slowdown(op, min(busy_cores, total_cores - 1), total_cores)

    def unseen(self, graph: Graph) -> dict[str, int]:
        """Ops of `graph` (not views) no trace timed, by class: what fell back on the torch Profile."""
        out: dict[str, int] = {}
        for op in graph.ops:
            if not op.is_view and signature(op) not in self.signatures:
                out[op.op_class] = out.get(op.op_class, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": TF_COSTS_SCHEMA, "version": 1, "node_us": self.node_us, "session_us": self.session_us,
            "signatures": {s: {str(k): v for k, v in row.items()} for s, row in self.signatures.items()},
            "meta": self.meta,
        }


def tf_costs_from_json(d: Any, base: Profile | None, source: str = "tf_costs.json") -> TFCosts:
    """A TFCosts written by `TFCosts.to_json` (the torch Profile, not stored there, given as `base`)."""
    if not isinstance(d, dict) or d.get("schema") != TF_COSTS_SCHEMA:
        raise SchedlabError(f'{source} is not a TensorFlow cost model (missing "schema": "{TF_COSTS_SCHEMA}")')
    try:
        signatures = {str(sig): {int(k): float(v) for k, v in row.items()} for sig, row in d["signatures"].items()}
        return TFCosts(signatures=signatures, node_us=float(d["node_us"]), session_us=float(d["session_us"]),
                       base=base, meta=dict(d.get("meta", {})))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SchedlabError(f"corrupt {source}: {type(e).__name__}: {e}") from None


def _span_and_busy_ns(events: Sequence[Any]) -> tuple[int, int, int]:
    """(span, time inside events, events) of one step's events."""
    span = max(e.end_ns for e in events) - min(e.start_ns for e in events)
    return span, sum(e.dur_ns for e in events), len(events)


def tf_costs(runs: Sequence[TFCalibrationRun], base: Profile | None) -> TFCosts:
    """The TensorFlow cost model from calibration runs (at least one with one inter-op thread)."""
    if not runs:
        raise SchedlabError("TensorFlow calibration needs at least one traced run")
    table: dict[str, dict[int, float]] = {}
    gaps_us: list[float] = []
    session_us: list[float] = []
    step_factors: list[float] = []
    for run in runs:
        figs = trace_figures(run.trace, run.graph, floor_us=0.0)
        step_factors.append(figs.step_factor)
        for sig, row in figs.signatures.items():
            table.setdefault(sig, {}).update({k: us * figs.step_factor for k, us in row.items()})
        steps = sorted({e.step for e in run.trace.events})
        for k, step in enumerate(steps):
            evs = run.trace.step_events(step)
            if not evs:
                continue
            span, busy, n = _span_and_busy_ns(evs)
            if run.inter_op == 1:
                gaps_us.append(max(0.0, (span - busy) / n / 1e3))
            if k < len(run.step_times_s):
                session_us.append(max(0.0, run.step_times_s[k] * 1e6 - span / 1e3))
    if not gaps_us:
        raise SchedlabError("TensorFlow calibration needs a run with one inter-op thread (its nodes run one at a time)")
    return TFCosts(
        signatures=table,
        node_us=statistics.median(gaps_us),
        session_us=statistics.median(session_us) if session_us else 0.0,
        base=base,
        meta={"runs": [{"graph": r.graph.name, "graph_hash": r.graph.hash, "intra_op": r.intra_op,
                        "inter_op": r.inter_op, "steps": len(r.step_times_s), "step_factor": round(f, 4)}
                       for r, f in zip(runs, step_factors, strict=True)]},
    )
