"""The pipeline-schedule search space (``--space schedule``): which schedule, how many
micro-batches, where the stages are cut.

A trial picks a schedule family (`FAMILIES`: gpipe, 1f1b, interleaved:V for V = 2, 3, 4
stages per device, looped-bfs, zb-h1, zb-h2, zbv, ooo, and tessel: Tessel's repetend
search on the model's own stage times, `search.tessel.model`; those whose stage count
the model's layers cannot fill are left out), a micro-batch count (the divisors of the batch up to `MAX_MICRO_BATCHES`) and the
stage cuts: ``equal`` shares of layers, or ``balanced`` by the cost model's layer times
(`schedlab.layer_split.balanced_stage_cuts`). Each stage count is the family's own on the
machine's devices (one stage per device for 1F1B, two for ZBV, ...), one schedule row per
device. On 4 or more devices a trial also picks a data-parallel degree R (`replica_counts`:
each replica's pipeline on len(devices) / R >= 2 devices, `schedlab.pipeline_replicas`),
with its own micro-batch parameter ``micro_batches_r{R}`` (the counts that split a
replica's share of the batch); with one degree possible the parameters are as before. The plan is built by `schedlab.pipeline_plan.with_named_schedule`, so it is the
plan `schedlab plan --schedule ... --micro-batches ... --stage-cuts ...` writes; a
tessel plan carries the searched actions as its schedule rows (one search per stage cuts
and micro-batch count, under 1F1B's activation memory, else twice it, else none).

A model that normalises over the batch (batch norm in training) is searched at one
micro-batch only: more would give each micro-batch its own statistics and change the
results, which the numerics guard refuses (`schedlab plan --split-batch-stats` writes
such a plan by hand, accepting it).

The micro-batch count changes the graph a plan resolves against (one micro-batch's step,
`schedlab.microbatch.pipeline_step`), so `MicroBatchEvaluator` keeps one `Evaluator` per
count, each built on first use from the caller's `graph_of(M)`.

``--space all`` on several devices searches these plans beside placements, with each
device's concurrency (`search.composed_space`). The micro-batch graphs live in the run
directory (`search.micro_graphs`), so ``--workers`` processes simulate them too.

Tessel's non-chain shapes (a block sharded over every device) do not map onto a model's
stages yet: on a model it searches the V shape, one stage per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from schedlab.data_parallel import uses_batch_stats
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, InputRole
from schedlab.layer_split import balanced_stage_cuts, layers_in_order
from schedlab.machine import Machine
from schedlab.pipeline.generators import stages_per_device
from schedlab.pipeline_plan import with_named_schedule
from schedlab.plan import Plan
from schedlab.search.objective import Evaluation, Evaluator
from schedlab.search.tessel.model import TESSEL, with_tessel_schedule
from schedlab.sim.cost import CostModel, op_cost_us

SCHEDULE_SPACE = "schedule"
FAMILIES = ("gpipe", "1f1b", "interleaved:2", "interleaved:3", "interleaved:4", "looped-bfs", "zb-h1", "zb-h2",
            "zbv", "ooo", TESSEL)
# Tessel's memory limits on a model, tried in turn: 1F1B's activations, twice them, none
TESSEL_MEMORY_FACTORS: tuple[float | None, ...] = (1.0, 2.0, None)
STAGE_CUTS = ("equal", "balanced")
MAX_MICRO_BATCHES = 16


def batch_size(graph: Graph) -> int:
    """The batch of `graph`: the leading dimension of its first user input."""
    for i in graph.inputs:
        meta = graph.values[i.value]
        if i.role is InputRole.USER and meta is not None and meta.shape:
            return int(meta.shape[0])
    raise SchedlabError(f"graph {graph.name!r} has no user input with a batch dimension to split into micro-batches")


def micro_batch_choices(batch: int, limit: int = MAX_MICRO_BATCHES) -> tuple[int, ...]:
    """Micro-batch counts that split `batch` evenly, up to `limit`."""
    return tuple(m for m in range(1, min(batch, limit) + 1) if batch % m == 0)


def micro_batch_counts(graph: Graph) -> tuple[int, ...]:
    """The micro-batch counts the space searches for `graph` (the full step): those that
    split its batch, or only 1 when it normalises over the batch."""
    if uses_batch_stats(graph):  # more micro-batches would change the batch statistics
        return (1,)
    return micro_batch_choices(batch_size(graph))


def replica_counts(graph: Graph, n_devices: int) -> tuple[int, ...]:
    """The data-parallel degrees the space searches pipelines at on `n_devices`: those that
    divide the devices into groups of at least two (a pipeline each) and split `graph`'s
    batch evenly; only 1 when it normalises over the batch."""
    if uses_batch_stats(graph):  # each replica would see statistics of its part only
        return (1,)
    batch = batch_size(graph)
    return tuple(r for r in range(1, n_devices // 2 + 1) if n_devices % r == 0 and batch % r == 0)


def searches_pipelines(space: str, machine: Machine) -> bool:
    """Whether `space` on `machine` holds pipeline plans, each simulated on its micro-batch
    count's graph: ``schedule``, and ``all`` on several devices (`search.composed_space`)."""
    return space == SCHEDULE_SPACE or (space == "all" and len(machine.devices) > 1)


def need_several_devices(machine: Machine) -> None:
    """One clear error when `machine` has one device: nothing to pipeline over."""
    if len(machine.devices) < 2:
        raise SchedlabError(
            f"--space schedule pipelines a model over several devices; machine {machine.name!r} has one: "
            "give --devices N (N local ranks of this host) or a --machine with several devices")


class ScheduleSpace:
    """Pipeline plans over every device of `machine` (see the module docstring)."""

    name = SCHEDULE_SPACE

    def __init__(self, graph: Graph, machine: Machine, cost: CostModel, families: Sequence[str] = FAMILIES) -> None:
        need_several_devices(machine)
        self.devices = tuple(d.id for d in machine.devices)
        n_layers = len(layers_in_order(graph))
        P = len(self.devices)
        self.stages = {f: _stage_count(f, P) for f in families}  # without replicas: a stage on every device
        self.families = tuple(f for f in families if self.stages[f] <= n_layers)
        if not self.families:
            raise SchedlabError(f"{graph.name!r} has {n_layers} layer(s): too few for a stage on each of {P} devices")
        self.micro_batches = micro_batch_counts(graph)
        self.replicas = replica_counts(graph, P)
        # per replica count, the micro-batch counts that split each replica's part of the batch
        self.micro_batches_of = {r: self.micro_batches if r == 1 else tuple(
            m for m in self.micro_batches if batch_size(graph) % (r * m) == 0) for r in self.replicas}
        self.shapes = tuple((r, m) for r in self.replicas for m in self.micro_batches_of[r])  # (replicas, micro-batches)
        self._cuts: dict[int, tuple[int, ...]] = {}
        self._tessel: dict[tuple[int, int, int | tuple[int, ...]], Plan] = {}
        self._graph, self._op_cost_us = graph, op_cost_us(cost)

    def suggest(self, trial: Any) -> Plan:
        family = trial.suggest_categorical("schedule", self.families)
        r = trial.suggest_categorical("replicas", self.replicas) if len(self.replicas) > 1 else 1
        # each replica count its own micro-batch parameter: the counts that fit differ
        m = trial.suggest_categorical("micro_batches" if r == 1 else f"micro_batches_r{r}", self.micro_batches_of[r])
        cuts = trial.suggest_categorical("stage_cuts", STAGE_CUTS)
        return self.plan(family, m, cuts, r)

    def plan(self, family: str, micro_batches: int, cuts: str, replicas: int = 1) -> Plan:
        """The pipeline plan of one point of the space: with `replicas` R, each replica's
        pipeline on its group of len(devices) / R devices (`schedlab.pipeline_replicas`)."""
        if replicas not in self.replicas:
            raise SchedlabError(f"{replicas} replicas are not in the space; it has {', '.join(map(str, self.replicas))}")
        devices = self.devices[: len(self.devices) // replicas]
        n = _stage_count(family, len(devices))
        if cuts == "equal":
            stages: int | tuple[int, ...] = n
        elif cuts == "balanced":
            if n not in self._cuts:  # layer costs of the full step: the same shares as a micro-batch's
                self._cuts[n] = balanced_stage_cuts(self._graph, n, self._op_cost_us)
            stages = self._cuts[n]
        else:
            raise SchedlabError(f"unknown stage cuts {cuts!r}; use one of: {', '.join(STAGE_CUTS)}")
        if family == TESSEL:
            return self._tessel_plan(micro_batches, stages, replicas)
        return with_named_schedule(Plan(replicas=replicas), devices, family, micro_batches, stages)

    def _tessel_plan(self, micro_batches: int, stages: int | tuple[int, ...], replicas: int) -> Plan:
        """Tessel's schedule for these stages (weighed on the full step, whose shares a
        micro-batch keeps), searched once per (replicas, micro-batches, stages)."""
        key = (replicas, micro_batches, stages)
        if key not in self._tessel:
            last = ""
            for factor in TESSEL_MEMORY_FACTORS:
                try:
                    self._tessel[key], _ = with_tessel_schedule(
                        Plan(replicas=replicas), self.devices[: len(self.devices) // replicas], self._graph,
                        micro_batches, stages, self._op_cost_us, memory_factor=factor,
                    )
                    break
                except SchedlabError as e:
                    last = str(e)
            else:  # pragma: no cover - a chain has a repetend when memory is not limited
                raise SchedlabError(f"Tessel's search found no schedule for {self._graph.name!r}: {last}")
        return self._tessel[key]


def _stage_count(family: str, n_devices: int) -> int:
    """The stages `family` runs on `n_devices` (Tessel's search here: one per device)."""
    return n_devices if family == TESSEL else n_devices * stages_per_device(family, n_devices)


def optional_schedule_space(graph: Graph, machine: Machine, cost: CostModel) -> ScheduleSpace | None:
    """`graph`'s schedule space on `machine`, or None where it has nothing to search (too
    few layers for a stage on each device, no batch to split): ``--space all`` then
    searches placements only."""
    try:
        return ScheduleSpace(graph, machine, cost)
    except SchedlabError:
        return None


def searched_shapes(space: str, graph: Graph, machine: Machine, cost: CostModel) -> tuple[tuple[int, int], ...]:
    """The (replicas, micro-batches) a search of `space` simulates pipeline plans at: none
    where it holds no pipelines; for ``schedule`` a model it cannot pipeline is its one
    clear error."""
    if not searches_pipelines(space, machine):
        return ()
    if space == SCHEDULE_SPACE:
        return ScheduleSpace(graph, machine, cost).shapes
    piped = optional_schedule_space(graph, machine, cost)
    return piped.shapes if piped is not None else ()


class MicroBatchEvaluator:
    """An `Evaluator` per micro-batch count: a plan is simulated on the graph its
    `micro_batches` resolves against (`graph_of(M)`, asked once per M). The space is small
    and categorical, so a sampler proposes the same plan again (16 to 24 of 60 trials, in
    three searches): each distinct plan is simulated once (the simulator is
    deterministic) and its evaluation reused under the new trial's name."""

    def __init__(self, graph_of: Callable[[int, int], Graph], machine: Machine, cost: CostModel) -> None:
        self.graph_of, self.machine, self.cost = graph_of, machine, cost
        self._evaluators: dict[tuple[int, int], Evaluator] = {}
        self._seen: dict[tuple[str, bool], Evaluation] = {}

    def evaluator(self, micro_batches: int, replicas: int = 1) -> Evaluator:
        key = (replicas, micro_batches)
        if key not in self._evaluators:
            self._evaluators[key] = Evaluator(self.graph_of(micro_batches, replicas), self.machine, self.cost)
        return self._evaluators[key]

    def evaluate(self, plan: Plan, record: bool = False) -> Evaluation:
        key = (plan.hash, record)
        if key not in self._seen:
            self._seen[key] = self.evaluator(plan.micro_batches, plan.replicas).evaluate(plan, record=record)
        return dataclasses.replace(self._seen[key], plan=plan)
