"""Micro-batches: a workload's batch split along dim 0, and the captured step a pipeline
plan runs (`schedlab.pipeline_plan`).

The step is captured once, at the micro-batch size; every micro-batch runs that graph on
its own slice of the user inputs and on the same parameters. `PipelineStep` is to a
pipeline plan what `data_parallel.PlanStep` is to a data-parallel one: `graph` is what
`resolve()` takes, `inputs_for(run_graph)` the input tensors of the pipelined graph a
backend runs (micro-batch m's user inputs are named ``NAME@mM``), and `as_full` its
outputs as the full-batch step's, for the numerics guard: the pipelined graph's loss and
gradients already are means over the micro-batches, so they are matched by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import torch

from schedlab.capture import Captured
from schedlab.data_parallel import (
    PlanStep,
    full_batch_outputs,
    plan_step,
    replica_graph,
    replica_of,
    split_batch,
    split_workload,
)
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, InputRole
from schedlab.steps import as_step_outputs
from schedlab.workloads.loader import Workload

MICRO_SUFFIX = "@m"  # micro-batch m >= 1's copy of an input NAME is NAME@mM


def split_micro_batches(workload: Workload, micro_batches: int) -> list[Workload]:
    """The M micro-batch workloads: every user input sliced into M equal parts along dim 0."""
    return split_batch(
        workload,
        micro_batches,
        too_few=f"micro-batches must be >= 1, got {micro_batches}",
        indivisible=f"{micro_batches} micro-batches must divide the batch: input {{k}} of {{name}} has {{size}}; "
        "use a micro-batch count that divides it, or a larger --size",
    )


def micro_graph(graph: Graph, micro_batches: int) -> Graph:
    """`graph` (captured at the micro-batch size) marked as one of `micro_batches`."""
    return replace(graph, meta={**graph.meta, "micro_batches": micro_batches})


@dataclass(frozen=True)
class PipelineStep(PlanStep):
    """The full-batch step and one micro-batch's, with every micro-batch's input tensors.

    `parts` holds micro-batch 0's capture; `micro_inputs[r * M + m]` maps its graph's input
    value ids to replica r's micro-batch m's tensors (its own user inputs, the shared
    parameters). With `replicas` > 1 the batch is first split among the replicas, then each
    replica's part into M micro-batches (`schedlab.pipeline_replicas`)."""

    micro_inputs: tuple[dict[int, torch.Tensor], ...] = ()
    replicas: int = 1

    @property
    def micro_batches(self) -> int:
        return len(self.micro_inputs) // self.replicas

    @cached_property
    def graph(self) -> Graph:  # type: ignore[override]
        g = micro_graph(self.parts[0].graph, self.micro_batches)
        return replica_graph(g, self.replicas) if self.replicas > 1 else g

    def inputs_for(self, run_graph: Graph) -> dict[int, torch.Tensor]:
        base = {i.name: i.value for i in self.parts[0].graph.inputs}
        M = self.micro_batches
        out: dict[int, torch.Tensor] = {}
        for i in run_graph.inputs:
            name, r = replica_of(i.name) if self.replicas > 1 else (i.name, 0)
            m = 0
            head, sep, tail = name.rpartition(MICRO_SUFFIX)
            if sep and tail.isdigit() and head in base:
                name, m = head, int(tail)
            if name not in base or m >= M or r >= self.replicas:
                raise SchedlabError(f"pipelined graph input {i.name!r} is not an input of micro-batch {m}'s step")
            out[i.value] = self.micro_inputs[r * M + m][base[name]]
        return out

    def as_full(self, run_graph: Graph, outputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        if self.replicas > 1:
            return full_batch_outputs(run_graph, self.full.graph, outputs)
        return as_step_outputs(self.full.graph, run_graph, outputs)


def pipeline_step(
    workload: Workload, micro_batches: int, capture_fn: Callable[[Workload], Captured], replicas: int = 1
) -> PlanStep:
    """Capture `workload` for a plan with `micro_batches` (through `capture_fn`, e.g. the
    graph cache): the full step and, with micro-batches, micro-batch 0's step, captured
    once; the other micro-batches' inputs are their slices of the user inputs. With
    `replicas`, the batch is split among them first, and each replica's part into
    micro-batches (one micro-batch: the data-parallel step, `data_parallel.plan_step`)."""
    if micro_batches == 1:
        return plan_step(workload, replicas, capture_fn)
    full = capture_fn(workload)
    per_replica = split_workload(workload, replicas)
    try:
        parts = [p for r in per_replica for p in split_micro_batches(r, micro_batches)]
    except SchedlabError as e:
        if replicas == 1:
            raise
        raise SchedlabError(f"{e} (each of the {replicas} replicas splits its part of the batch, "
                            f"so the batch must divide by {replicas} x {micro_batches})") from None
    first = capture_fn(parts[0])
    users = {i.value: _user_index(i.name) for i in first.graph.inputs if i.role is InputRole.USER}
    micro_inputs: list[dict[int, torch.Tensor]] = []
    for part in parts:
        values = dict(first.input_values)
        for v, k in users.items():
            if part.inputs[k].shape != values[v].shape:  # pragma: no cover - equal chunks of one batch
                raise SchedlabError(
                    f"micro-batch input {k} has shape {tuple(part.inputs[k].shape)}, not {tuple(values[v].shape)}"
                )
            values[v] = part.inputs[k]
        micro_inputs.append(values)
    return PipelineStep(workload, full, (first,), tuple(micro_inputs), replicas)


def _user_index(name: str) -> int:
    """Which workload input a captured user input is: capture names the k-th one "inputK"."""
    k = name.removeprefix("input")
    if not k.isdigit():  # pragma: no cover - capture names every user input so
        raise SchedlabError(f"captured user input {name!r} is not named inputK; cannot match it to a micro-batch slice")
    return int(k)
