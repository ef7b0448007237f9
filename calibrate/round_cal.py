"""A search's trace calibration run again beside a validation, one round at a time.

A search calibrates the simulator on a few real steps of the model (`calibrate.trace_cal`:
one process, one slot, program order, 1 thread and all threads; for pipeline plans also
one micro-batch's step pinned to one core, `calibrate.rank_fidelity.trace_calibrated`),
then predicts every plan from that. Validation measures the winners minutes later. On a
shared host the speed drifts over minutes (2026-11-27, the 2-core VM: encoder-classifier's
two-thread step measured 19.3 ms for minutes, then 25.5 ms for minutes), so a validated
plan's error mixes what the simulator gets wrong with how far the host moved since the
search.

`RoundCalibration` tells the two apart: run at the start of each validation round (as rank
fidelity calibrates, `calibrate.rank_fidelity.rank_fidelity`), the same calibration steps
meet the spells the measurements meet; `apply(profile)` is the search's profile with their
op times, which predicts every validated plan again (its ``recalibrated_*`` figures). No
validated plan is a calibration shape but the one-process baselines, whose one-slot
program-order steps are what calibration runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schedlab.calibrate.trace_cal import OneProcessTraces, one_process_traces, with_one_process_traces

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile
    from schedlab.calibrate.rank_fidelity import CalibrationTraces
    from schedlab.graph import Graph
    from schedlab.machine import Machine
    from schedlab.order import OpCostUs

STEPS = 2  # timed steps per one-process calibration run, as a search's (`cli.search_cmd`)
PINNED_STEPS = 3  # and per micro-batch step's


@dataclass
class RoundCalibration:
    """The calibration steps of a search over `graph`, run once per `run()` (a round).

    `graph` and `input_values`: the model's full step; `host`: this machine (its cores are
    the thread counts); `micro_steps(replicas, micro_batches)` and `shapes`: the pipeline
    plans' one-micro-batch steps, run pinned to one core as a rank runs them (none for
    placements alone)."""

    graph: Graph
    input_values: dict[int, Any]
    host: Machine
    micro_steps: Callable[[int, int], Any] | None = None
    shapes: Sequence[tuple[int, int]] = ()
    steps: int = STEPS
    pinned_steps: int = PINNED_STEPS
    one_thread_order: str = "topo"  # as the search's (`search.placement.space.calibration_order`)
    weights: OpCostUs | None = None  # what a critical-path order ranks by, as the validated plans were
    rounds: int = 0
    one_process: OneProcessTraces = field(default_factory=dict)
    pinned: CalibrationTraces = field(default_factory=dict)

    def run(self) -> None:
        """One round of calibration steps; their traces are kept."""
        from schedlab.calibrate.rank_fidelity import calibration_traces

        one_process_traces(self.graph, self.input_values, self.host, self.steps, into=self.one_process,
                           one_thread_order=self.one_thread_order, weights=self.weights)
        if self.shapes and self.micro_steps is not None:
            calibration_traces(self.micro_steps, self.shapes, self.pinned_steps, into=self.pinned)
        self.rounds += 1

    def apply(self, profile: Profile) -> Profile:
        """`profile` with the op times of every round's steps (each signature's median over all)."""
        from schedlab.calibrate.rank_fidelity import with_calibration

        return with_calibration(with_one_process_traces(profile, self.graph, self.one_process), self.pinned)

    def to_json(self) -> dict[str, Any]:
        """What was run, for results.json."""
        return {
            "rounds": self.rounds,
            "steps_per_run": self.steps,
            "pinned_steps_per_run": self.pinned_steps,
            "threads": sorted(self.one_process),
            "one_thread_order": self.one_thread_order,
            "pinned_shapes": [list(s) for s in sorted(set(self.shapes))],
        }
