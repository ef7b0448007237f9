"""``--space all`` on several devices: a placement or a pipeline, each with every device's
concurrency, in one study.

A trial first picks ``parallelism``:

- ``placement``: `search.placement.space.PlacementSpace`'s ``all`` parameters (a device
  per group of ops, each device's co-run slots and intra-op threads, the op order);
- ``pipeline``: `search.schedule_space.ScheduleSpace`'s (schedule family, micro-batch
  count, stage cuts) and the same per-device slots and threads
  (`search.placement.space.sample_concurrency`); each device's op order is the
  schedule's, and co-run slots take ready ops in that order.

So the search compares placing a model against pipelining it, and tunes concurrency
inside either. A model whose layers cannot fill a stage on every device is searched over
placements only. Plans of M > 1 micro-batches are simulated on one micro-batch's step
(`search.schedule_space.MicroBatchEvaluator`); a placement plan is M = 1.
"""

from __future__ import annotations

from typing import Any

from schedlab.errors import SchedlabError
from schedlab.machine import Machine
from schedlab.plan import Plan
from schedlab.search.placement.space import PlacementSpace, sample_concurrency, with_concurrency
from schedlab.search.schedule_space import ScheduleSpace

PLACEMENT, PIPELINE = "placement", "pipeline"


class ComposedSpace:
    """Placement or pipeline plans over every device of `machine` (see the module docstring)."""

    name = "all"

    def __init__(self, placement: PlacementSpace, schedule: ScheduleSpace | None, machine: Machine) -> None:
        if placement.name != "all":
            raise SchedlabError(f"the composed space takes the placement space 'all', not {placement.name!r}")
        self.placement, self.schedule = placement, schedule
        self.devices = tuple(machine.devices)
        self.choices = (PLACEMENT, PIPELINE) if schedule is not None else (PLACEMENT,)
        self.micro_batches = schedule.micro_batches if schedule is not None else (1,)
        self.shapes = schedule.shapes if schedule is not None else ((1, 1),)

    def suggest(self, trial: Any) -> Plan:
        kind = trial.suggest_categorical("parallelism", self.choices)
        if kind == PLACEMENT:
            return self.placement.suggest(trial)
        assert self.schedule is not None
        plan = self.schedule.suggest(trial)
        return with_concurrency(plan, sample_concurrency(trial, self.devices), plan.pipeline_devices)
