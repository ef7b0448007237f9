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
    eager_times_s: tuple[float, ...] = ()  # every timed step, in order
    exec_times_s: tuple[float, ...] = ()

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
        eager_times_s=tuple(eager_s),
        exec_times_s=tuple(exec_s),
    )


def ratio_stats(num_s: list[float] | tuple[float, ...], den_s: list[float] | tuple[float, ...]) -> tuple[float, tuple[float, float]]:
    """(median, (25th, 75th percentile)) of the per-pair ratios num/den."""
    ratios = sorted(x / e for x, e in zip(num_s, den_s, strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return statistics.median(ratios), (q[0], q[2])


def _side_by_side(
    step: PlanStep,
    resolved: ResolvedPlan,
    machine: Machine,
    spec: str,
    side: dict[str, Any],
    *,
    repeats: int,
    warmup: int,
    timeout_s: float,
    want_outputs: bool = False,
) -> tuple[DistResult, tuple[float, ...], tuple[float, ...], float, tuple[float, float]]:
    """The plan's steps on its ranks, each followed in the same ranks by the framework's own
    step that `side` describes (DDP or torch pipelining); both sides' step times
    (SPAN_STEP_TIME_DEFINITION) and the median and IQR of their per-pair ratios."""
    graph = step.graph
    dist = run_ranks(
        graph, resolved, machine, step.inputs_for(resolved.run_graph(graph)), steps=repeats, warmup=warmup,
        timeout_s=timeout_s, want_outputs=want_outputs, workload=spec, ddp=side,
    )
    ours, theirs = dist.span_step_times_s, dist.ddp_step_times_s
    ratio, spread = ratio_stats(ours, theirs)
    return dist, ours, theirs, ratio, spread


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
    dist, ours, theirs, ratio, spread = _side_by_side(
        step, resolved, machine, spec, ddp, repeats=repeats, warmup=warmup, timeout_s=timeout_s,
        want_outputs=want_params,
    )
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


@dataclass(frozen=True)
class PipeliningResult:
    """A pipeline plan's step against torch.distributed.pipelining's, same ranks, alternating."""

    ranks: int
    stages: int
    micro_batches: int
    schedule: str  # the plan's schedule name
    torch_schedule: str  # the torch.distributed.pipelining class it ran as
    threads: int  # intra-op threads of each rank, both sides
    schedlab_step_s: float  # median
    pipelining_step_s: float  # median
    ratio_vs_pipelining: float  # median of per-step ratios schedlab / torch pipelining
    ratio_spread: tuple[float, float]  # 25th and 75th percentile of those ratios
    schedlab_step_times_s: tuple[float, ...]
    pipelining_step_times_s: tuple[float, ...]
    repeats: int
    step_time: str = SPAN_STEP_TIME_DEFINITION

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ratio_spread"] = list(self.ratio_spread)
        d["schedlab_step_times_s"] = list(self.schedlab_step_times_s)
        d["pipelining_step_times_s"] = list(self.pipelining_step_times_s)
        return d


def stage_ranks(plan: Plan, machine: Machine) -> tuple[int, ...]:
    """The rank that runs each of the plan's stages. torch's schedules place stage s on the
    rank its stage map says for device index d = rank d, so the plan's pipeline devices
    must be its ranks in order (cpu0, cpu1, ...); anything else is refused."""
    from schedlab.pipeline import stage_devices
    from schedlab.pipeline_plan import plan_devices

    devices = plan_devices(plan, machine)
    procs = [machine.device(d).process for d in devices]
    if procs != list(range(len(procs))):
        raise SchedlabError(
            f"the plan's pipeline devices {list(devices)} run on ranks {procs}; torch's pipeline schedules put "
            f"device index d on rank d: list them in rank order ({', '.join(f'cpu{k}' for k in range(len(procs)))})"
        )
    return tuple(procs[d] for d in stage_devices(plan.n_stages, len(devices), plan.stage_map))


def compare_with_pipelining(
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
) -> tuple[PipeliningResult, DistResult]:
    """Run `repeats` (+ `warmup`) steps of the pipeline plan on its ranks, each rank
    following each step with a torch.distributed.pipelining step of the same stages,
    micro-batches and schedule on workload `spec` (`size`, `seed`: the one `step` was
    captured from; see `schedlab.exec.pipelining`). Step times as SPAN_STEP_TIME_DEFINITION."""
    from schedlab.exec.pipelining import PIPELINING_KIND, torch_schedule_name
    from schedlab.pipeline_stages import stage_layers

    plan = resolved.plan
    if not plan.pipelined:
        raise SchedlabError(
            "--pipelining compares a pipeline plan with torch.distributed.pipelining: the plan has no stages; write "
            "one with `schedlab plan MODEL --devices 2 --stages 2 --micro-batches 2 --schedule 1f1b -o PLAN.json`"
        )
    if repeats < 1:
        raise SchedlabError("repeats must be >= 1")
    cls_name = torch_schedule_name(plan.schedule)
    graph = step.graph
    threads = plan_threads(resolved)
    side = {
        "kind": PIPELINING_KIND, "spec": spec, "size": size, "seed": seed,
        "optimizer": str(graph.meta["optimizer"]), "lr": float(graph.meta["lr"]), "threads": threads,
        "schedule": str(plan.schedule), "micro_batches": plan.micro_batches,
        "stage_layers": [list(st) for st in stage_layers(graph, plan.stages)],
        "stage_ranks": list(stage_ranks(plan, machine)), "want_params": want_params,
        "replicas": plan.replicas, "bucket_mb": plan.bucket_mb,
    }
    dist, ours, theirs, ratio, spread = _side_by_side(
        step, resolved, machine, spec, side, repeats=repeats, warmup=warmup, timeout_s=timeout_s
    )
    return PipeliningResult(
        ranks=dist.ranks,
        stages=plan.n_stages,
        micro_batches=plan.micro_batches,
        schedule=str(plan.schedule),
        torch_schedule=cls_name,
        threads=threads,
        schedlab_step_s=statistics.median(ours),
        pipelining_step_s=statistics.median(theirs),
        ratio_vs_pipelining=ratio,
        ratio_spread=spread,
        schedlab_step_times_s=ours,
        pipelining_step_times_s=theirs,
        repeats=repeats,
    ), dist
