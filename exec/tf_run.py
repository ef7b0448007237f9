"""Run a training step in TensorFlow's own runtime and record it in schedlab's Trace schema.

This is the TensorFlow executor's in-process half (the worker process calls it; see
`tf_launch.py` for why each threading setting gets a fresh process):

1. build the step's TF1 graph (`schedlab.tf.step`) and a Session with the threading;
2. the numerics check: the first step's loss, gradients and updated parameters against
   the same `loss_fn` run eagerly under `tf.GradientTape`, and, for a workload built
   from a torch module, its gradients against eager PyTorch's;
3. one fully traced step with the partition graphs: the executed graph, captured as a
   schedlab Graph (`schedlab.tf.capture`);
4. warm-up, then timed steps, each traced (`step_stats`): wall time per `Session.run` and
   one Trace event per captured op (source "exec", backend "tensorflow").
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from schedlab.errors import SchedlabError
from schedlab.exec.check import NumericCheck, Tolerance, compare
from schedlab.graph import Graph, OutputRole
from schedlab.plan import Plan
from schedlab.tf.capture import graph_from_run, node_runs
from schedlab.tf.model import TFModel
from schedlab.tf.order import apply_order, order_honoured, order_sequence, reversed_pairs
from schedlab.tf.placement import apply_placement, device_index, honoured, node_devices
from schedlab.tf.runtime import TFThreads, import_tensorflow, session_config
from schedlab.tf.step import TFStep, build_step, eager_loss_and_grads, expected_update
from schedlab.trace import Trace, TraceEvent, base_meta

# TensorFlow's graph runtime against its own eager mode: Grappler and oneDNN fuse kernels
# (MatMul + BiasAdd + Relu in one) and so round differently from eager's separate ones.
TF_GRAPH_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
# TensorFlow against PyTorch on the same weights: different kernels, summation orders and
# formulas for the same maths. Elementwise, float32 rounding amplified through eight batch
# norms (cnn default) reaches 1.2e-3; per tensor it stays within 4.8e-3 of the gradient's
# 2-norm, as far as torch's own float32 gradients are from its float64 ones (4.6e-3;
# tests/tf/test_builtins.py). So each gradient passes when ||tf - torch|| <= 1e-2 ||torch||,
# and the loss when |tf - torch| <= 1e-5 + 1e-4 |torch|.
CROSS_FRAMEWORK_GRAD_REL_NORM = 1e-2
CROSS_FRAMEWORK_LOSS = Tolerance(atol=1e-5, rtol=1e-4)


@dataclass(frozen=True)
class CrossFrameworkCheck:
    """The TensorFlow step's loss and gradients against eager PyTorch's on the same weights."""

    max_abs_loss_diff: float
    max_abs_grad_diff: float  # elementwise, over every gradient
    max_rel_norm_grad_diff: float  # max over gradients of ||tf - torch|| / ||torch||
    worst_tensor: str  # the gradient with the largest relative norm difference
    grad_rel_norm_tolerance: float
    loss_ok: bool

    @property
    def numerics_ok(self) -> bool:
        return self.loss_ok and self.max_rel_norm_grad_diff <= self.grad_rel_norm_tolerance

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "numerics_ok": self.numerics_ok}


def cross_framework_check(
    loss: float, grads: Mapping[str, np.ndarray], ref_loss: float, ref_grads: Mapping[str, np.ndarray]
) -> CrossFrameworkCheck:
    """`grads` (torch layout) against PyTorch's `ref_grads`; see CROSS_FRAMEWORK_GRAD_REL_NORM."""
    worst_abs, worst_rel, worst_name = 0.0, 0.0, ""
    for name, ref in ref_grads.items():
        if name not in grads:
            raise SchedlabError(f"TensorFlow step has no gradient for torch parameter {name!r}")
        got = grads[name]
        if got.shape != ref.shape:
            raise SchedlabError(f"gradient {name}: TensorFlow shape {got.shape}, torch {ref.shape}")
        diff = got.astype(np.float64) - ref.astype(np.float64)
        worst_abs = max(worst_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        norm = float(np.linalg.norm(ref.astype(np.float64)))
        rel = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff))
        if rel >= worst_rel:
            worst_rel, worst_name = rel, name
    loss_diff = abs(float(loss) - float(ref_loss))
    tol = CROSS_FRAMEWORK_LOSS
    return CrossFrameworkCheck(loss_diff, worst_abs, worst_rel, worst_name, CROSS_FRAMEWORK_GRAD_REL_NORM,
                               loss_ok=loss_diff <= tol.atol + tol.rtol * abs(float(ref_loss)))


@dataclass(frozen=True)
class TFRun:
    """What one TensorFlow run measured."""

    graph: Graph
    step_times_s: tuple[float, ...]
    trace: Trace
    check: NumericCheck  # against TF eager
    torch_check: CrossFrameworkCheck | None  # against eager PyTorch (built from a torch module)

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_times_s)


def _t(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a)))


def _check(
    loss: float, grads: Mapping[str, np.ndarray], ref_loss: float, ref_grads: Mapping[str, np.ndarray],
    tol: Tolerance, params: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> NumericCheck:
    tols = {torch.float32: tol, torch.float64: tol}
    diffs = [(OutputRole.LOSS, compare("loss", _t(np.float32(loss)), _t(np.float32(ref_loss)), tols))]
    diffs += [(OutputRole.GRAD, compare(f"grad {n}", _t(g), _t(ref_grads[n]), tols)) for n, g in grads.items()]
    for n, (got, want) in (params or {}).items():
        diffs.append((OutputRole.PARAM, compare(f"param {n}", _t(got), _t(want), tols)))
    return NumericCheck.of(diffs)


def _intra_threads(threads: TFThreads) -> int:
    """The intra-op threads a kernel gets: TF's default is one per usable core."""
    return threads.intra_op or len(os.sched_getaffinity(0))


def run_tensorflow(
    model: TFModel,
    threads: TFThreads,
    *,
    steps: int,
    warmup: int,
    optimizer: str = "sgd",
    lr: float | None = None,
    plan: Plan | None = None,
    torch_reference: Callable[[], tuple[float, dict[str, np.ndarray]]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TFRun:
    """Run `model`'s step in TensorFlow (see the module docstring). A `plan` that places ops
    on `threads.cpu_devices` logical CPU devices, or orders them, is resolved on the step
    as TF executes it unplaced first (`schedlab.tf.placement`, `schedlab.tf.order`).
    `torch_reference` gives eager PyTorch's loss and gradients (torch layout) on the same
    weights."""
    tf = import_tensorflow(threads)
    step = build_step(model, optimizer, lr)
    planned: dict[str, int] | None = None
    sequence: list[str] | None = None
    if plan is not None and (plan.multi_device or plan.order != "topo"):
        unplaced = _capture_unplaced(tf, step, threads)
        step = build_step(model, optimizer, lr)
        if plan.multi_device:
            planned = node_devices(unplaced, plan, threads.cpu_devices)
            apply_placement(step.graph, planned)
        if plan.order != "topo":
            sequence = order_sequence(unplaced, plan)
            apply_order(step.graph, sequence)
    session = tf.compat.v1.Session(graph=step.graph, config=session_config(threads))
    try:
        step.initialize(session)
        check, torch_check = _numerics(session, step, torch_reference)
        graph = _capture(tf, session, step)
        if planned is not None:
            graph = dataclasses.replace(graph, meta={**graph.meta, "placement_honoured": honoured(planned, graph)})
        names = {op.name: op.id for op in graph.ops}
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
        times: list[float] = []
        events: list[TraceEvent] = []
        workers: dict[tuple[str, int], int] = {}
        intra = _intra_threads(threads)
        for i in range(warmup + steps):
            md = tf.compat.v1.RunMetadata()
            t0 = time.perf_counter()
            session.run([step.loss, step.train_op], options=opts, run_metadata=md)
            wall = time.perf_counter() - t0
            if progress is not None:
                progress(i + 1, warmup + steps)
            if i < warmup:
                continue
            times.append(wall)
            runs = node_runs(md.step_stats)
            t_start = min(r.start_ns for r in runs)
            for r in sorted(runs, key=lambda r: r.start_ns):
                op_id = names.get(r.name)
                if op_id is None:
                    continue  # variables and fetch plumbing: not ops of the captured graph
                w = workers.setdefault((r.device, r.thread), len(workers))
                op = graph.ops[op_id]
                events.append(TraceEvent(op_id, op.name, op.kind.value, f"cpu{device_index(r.device)}", w, intra,
                                         r.start_ns - t_start, r.end_ns - t_start, step=len(times) - 1))
    finally:
        session.close()
    if sequence is not None:
        first = {graph.ops[e.op].name: e.start_ns for e in events if e.step == 0}
        reversed_ = [list(pair) for pair in reversed_pairs(sequence, first)]
        graph = dataclasses.replace(graph, meta={**graph.meta, "order_honoured": order_honoured(sequence, first),
                                                 "order_reversed": reversed_})
    meta = base_meta(
        "exec", backend="tensorflow", workload=model.name, size=model.size, graph_hash=graph.hash,
        tensorflow=tf.__version__, threads={"intra_op": threads.intra_op, "inter_op": threads.inter_op,
                                            "cpu_devices": threads.cpu_devices},
        numeric_check=check.to_json(), traced="software",
    )
    return TFRun(graph=graph, step_times_s=tuple(times), trace=Trace(tuple(events), meta), check=check,
                 torch_check=torch_check)


def _numerics(
    session: Any, step: TFStep, torch_reference: Callable[[], tuple[float, dict[str, np.ndarray]]] | None,
) -> tuple[NumericCheck, CrossFrameworkCheck | None]:
    """The first step (it updates the weights) against TF eager and, if given, PyTorch.

    The loss and gradients are held to TF eager's; the updated parameters to the
    optimizer's rule applied to the graph's own gradients (as the torch guard does): Adam
    turns the rounding noise of a gradient that is zero in exact arithmetic (a convolution
    bias before batch norm) into a step of +-lr, so eager's noise would be a different step."""
    model = step.model
    ref_loss, ref_grads = eager_loss_and_grads(model)
    got = session.run({"loss": step.loss, "grads": step.grads, "train": step.train_op})
    new_params = session.run(step.reads)
    expected = {p.name: expected_update(step.optimizer, step.lr, p.value, got["grads"][p.name]) for p in model.params}
    params = {n: (new_params[n], expected[n]) for n in new_params}
    check = _check(got["loss"], got["grads"], ref_loss, ref_grads, TF_GRAPH_TOLERANCE, params)
    torch_check = None
    if torch_reference is not None:
        t_loss, t_grads = torch_reference()
        as_torch = {p.name: p.layout.to_torch(got["grads"][p.name]) for p in model.params}
        torch_check = cross_framework_check(float(got["loss"]), as_torch, t_loss, t_grads)
    return check, torch_check


def _capture_unplaced(tf: Any, step: TFStep, threads: TFThreads) -> Graph:
    """The graph TF executes for `step` as built (no placement, no order): what a plan's
    placement and order are resolved on. Its session is closed: the step runs in another."""
    session = tf.compat.v1.Session(graph=step.graph, config=session_config(threads))
    try:
        step.initialize(session)
        return _capture(tf, session, step)
    finally:
        session.close()


def _capture(tf: Any, session: Any, step: TFStep) -> Graph:
    """The graph TensorFlow executes for a timed step, from one fully traced run of it."""
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True)
    md = tf.compat.v1.RunMetadata()
    session.run([step.loss, step.train_op], options=opts, run_metadata=md)
    return graph_from_run(step, md.partition_graphs, md.step_stats, tf.__version__)
