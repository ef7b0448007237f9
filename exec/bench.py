"""Executor overhead: its step time under a plan against a plain eager PyTorch step, and
a data-parallel plan's step against torch's DistributedDataParallel on the same ranks.

Both are timed in the same run, interleaved step by step, so that noise from a shared
machine hits both alike; the figure that matters is the ratio (the median of per-pair
ratios, with its interquartile range).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from schedlab.data_parallel import PlanStep
from schedlab.errors import SchedlabError
from schedlab.exec.check import eager_reference, eager_step
from schedlab.exec.launch import DEFAULT_TIMEOUT_S, SPAN_STEP_TIME_DEFINITION, DistResult, run_ranks
from schedlab.exec.runner import Executor, next_inputs
from schedlab.exec.threads import set_intra_op_threads
from schedlab.graph import Graph
from schedlab.machine import Machine, detect_host
from schedlab.plan import Plan, ResolvedPlan, resolve


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
    ratio, spread = ratio_stats(exec_s, eager_s)
    e_med, x_med = statistics.median(eager_s), statistics.median(exec_s)
    return OverheadResult(
        ops=len(graph),
        eager_step_s=e_med,
        exec_step_s=x_med,
        ratio=ratio,
        ratio_spread=spread,
        repeats=repeats,
        per_op_overhead_us=(x_med - e_med) / len(graph) * 1e6,
    )


def ratio_stats(num_s: list[float] | tuple[float, ...], den_s: list[float] | tuple[float, ...]) -> tuple[float, tuple[float, float]]:
    """(median, (25th, 75th percentile)) of the per-pair ratios num/den."""
    ratios = sorted(x / e for x, e in zip(num_s, den_s, strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return statistics.median(ratios), (q[0], q[2])


@dataclass(frozen=True)
class DdpResult:
    """A data-parallel plan's step against DistributedDataParallel's, same ranks, alternating."""

    ranks: int
    replicas: int
    bucket_mb: float
    threads: int  # intra-op threads of each rank, both sides
    schedlab_step_s: float  # median
    ddp_step_s: float  # median
    ratio_vs_ddp: float  # median of per-step ratios schedlab / DDP
    ratio_spread: tuple[float, float]  # 25th and 75th percentile of those ratios
    schedlab_step_times_s: tuple[float, ...]
    ddp_step_times_s: tuple[float, ...]
    repeats: int
    step_time: str = SPAN_STEP_TIME_DEFINITION
    steps_per_run: int = 1  # > 1: both sides ran that many steps back to back per timed pair

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ratio_spread"] = list(self.ratio_spread)
        d["schedlab_step_times_s"] = list(self.schedlab_step_times_s)
        d["ddp_step_times_s"] = list(self.ddp_step_times_s)
        return d


def plan_threads(resolved: ResolvedPlan) -> int:
    """The intra-op thread count most of the per-replica step's ops run with (DDP gets it)."""
    base = resolved.threads[: resolved.base_ops] if resolved.base_ops else resolved.threads
    return Counter(base).most_common(1)[0][0]


def compare_with_ddp(
    step: PlanStep,
    resolved: ResolvedPlan,
    machine: Machine,
    *,
    spec: str,
    size: str,
    seed: int,
    repeats: int = 10,
    warmup: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    want_params: bool = False,
) -> tuple[DdpResult, DistResult]:
    """Run `repeats` (+ `warmup`) steps of the data-parallel plan on its ranks, each rank
    following each step with a DDP step on its part of the batch of workload `spec`
    (`size`, `seed`: the same one `step` was captured from). Both sides' step times are
    taken as SPAN_STEP_TIME_DEFINITION says."""
    plan = resolved.plan
    if plan.replicas < 2:
        raise SchedlabError(
            "--ddp compares a data-parallel plan with DistributedDataParallel: the plan has no replicas; "
            "write one with `schedlab plan MODEL --devices 2 --replicas 2 -o PLAN.json`"
        )
    if repeats < 1:
        raise SchedlabError("repeats must be >= 1")
    graph = step.graph
    threads = plan_threads(resolved)
    ddp = {
        "spec": spec, "size": size, "seed": seed, "optimizer": str(graph.meta["optimizer"]),
        "lr": float(graph.meta["lr"]), "bucket_mb": plan.bucket_mb, "threads": threads,
        "replicas": plan.replicas, "want_params": want_params,
    }
    run_graph = resolved.run_graph(graph)
    dist = run_ranks(
        graph, resolved, machine, step.inputs_for(run_graph), steps=repeats, warmup=warmup, timeout_s=timeout_s,
        want_outputs=want_params, workload=spec, ddp=ddp,
    )
    ours, theirs = dist.span_step_times_s, dist.ddp_step_times_s
    ratio, spread = ratio_stats(ours, theirs)
    return DdpResult(
        ranks=dist.ranks,
        replicas=plan.replicas,
        bucket_mb=plan.bucket_mb,
        threads=threads,
        schedlab_step_s=statistics.median(ours),
        ddp_step_s=statistics.median(theirs),
        ratio_vs_ddp=ratio,
        ratio_spread=spread,
        schedlab_step_times_s=ours,
        ddp_step_times_s=theirs,
        repeats=repeats,
        steps_per_run=resolved.steps,
    ), dist
