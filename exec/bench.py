"""Executor overhead: its step time under a plan against a plain eager PyTorch step.

Both are timed in the same run, interleaved step by step, so that noise from a shared
machine hits both alike; the figure that matters is the ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from schedlab.exec.check import eager_reference, eager_step
from schedlab.exec.runner import Executor, next_inputs
from schedlab.exec.threads import set_intra_op_threads
from schedlab.graph import Graph
from schedlab.machine import Machine, detect_host
from schedlab.plan import Plan, resolve


@dataclass(frozen=True)
class OverheadResult:
    ops: int
    eager_step_s: float  # median
    exec_step_s: float  # median
    ratio: float  # median of per-pair ratios exec / eager
    ratio_spread: tuple[float, float]  # 25th and 75th percentile of the per-pair ratios
    repeats: int
    per_op_overhead_us: float  # (exec - eager) / ops

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def compare_with_eager(
    module: nn.Module,
    graph: Graph,
    input_values: dict[int, torch.Tensor],
    plan: Plan | None = None,
    machine: Machine | None = None,
    repeats: int = 10,
    warmup: int = 2,
    progress: Callable[[], None] | None = None,
) -> OverheadResult:
    plan = plan or Plan()
    machine = machine or detect_host()
    ex = Executor(graph, resolve(graph, plan, machine))
    ref, user, opt = eager_reference(module, graph, input_values)
    inputs = {v: t.clone() for v, t in input_values.items()}
    # Eager runs with the plan's thread count (one slot), as the executor's step does.
    threads = set_intra_op_threads(ex.resolved.threads[0]) if plan.slots == 1 else torch.get_num_threads()
    eager_s: list[float] = []
    exec_s: list[float] = []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        eager_step(ref, user, opt)
        t1 = time.perf_counter()
        out, _ = ex.step(inputs)
        t2 = time.perf_counter()
        inputs = next_inputs(graph, inputs, out)
        if r >= warmup:
            eager_s.append(t1 - t0)
            exec_s.append(t2 - t1)
        if progress is not None:
            progress()
    set_intra_op_threads(threads)
    ratios = sorted(x / e for x, e in zip(exec_s, eager_s, strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    e_med, x_med = statistics.median(eager_s), statistics.median(exec_s)
    return OverheadResult(
        ops=len(graph),
        eager_step_s=e_med,
        exec_step_s=x_med,
        ratio=statistics.median(ratios),
        ratio_spread=(q[0], q[2]),
        repeats=repeats,
        per_op_overhead_us=(x_med - e_med) / len(graph) * 1e6,
    )
