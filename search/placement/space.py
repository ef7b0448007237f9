"""The Optuna space over placements: one device per co-location group.

``--space placement`` samples, per group of the `PlacementProblem` (a layer with its F, B,
W and OPT work, or with ``--split-fbw`` each kind of a layer apart), a categorical
``device.<group key>`` over the devices. The rest of the plan is fixed: one co-run slot
and every core of each device, the longest remaining path first among ready ops.

``--space all`` on a machine of several devices adds what the one-device ``all`` space
searches, per device: ``slots.<device>`` (1..cores on a CPU, 1..streams on a GPU),
``threads.<device>`` (1..cores, CPUs of more than one core) and the op order of
`search.space` (a named policy or a parametrised ``mixed`` one). So concurrency, order and
placement are searched together, and a placed plan keeps its per-device slots, threads
and order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.machine import Device
from schedlab.order import upward_rank_us
from schedlab.plan import Plan
from schedlab.search.placement.problem import PlacementProblem
from schedlab.search.space import ORDER_CHOICES, OrderParams, cost_fn, parametric_order
from schedlab.sim.cost import CostModel

PLACEMENT_ORDER = "critical-path"  # the order of a placement-only plan
PLACEMENT_SPACES = ("placement", "all")


def calibration_order(space: str, devices: int) -> str:
    """The order of a search's one-thread calibration steps (`calibrate.trace_cal`): a
    placement-only search on several devices scores plans that all run `PLACEMENT_ORDER`
    with one thread per one-core rank, and the order decides which data an op still finds
    in the caches (gru-tagger on the 2-core VM, 2026-11-27: one thread in critical-path
    order 33.5 ms, in program order 30.6, the weight-gradient ops 1.1-2.1x slower, run long
    after the gradients they read; the cost table has one time per op signature), so its
    one-thread steps run that order; any other search's run program order (``topo``)."""
    return PLACEMENT_ORDER if space == "placement" and devices > 1 else "topo"


def base_plan() -> Plan:
    """The rest of a placement-only plan: one slot, every core, critical path first."""
    return Plan(slots=1, threads=None, order=PLACEMENT_ORDER)


def max_slots(device: Device) -> int:
    return max(1, device.streams if device.kind == "cuda" else device.cores)


def sample_concurrency(trial: Any, devices: Sequence[Device]) -> dict[str, int]:
    """Each device's co-run slots (``slots.<device>``) and, on a CPU of several cores, its
    intra-op threads (``threads.<device>``)."""
    params: dict[str, int] = {}
    for d in devices:
        params[f"slots.{d.id}"] = trial.suggest_int(f"slots.{d.id}", 1, max_slots(d))
        if d.kind == "cpu" and d.cores > 1:
            params[f"threads.{d.id}"] = trial.suggest_int(f"threads.{d.id}", 1, d.cores)
    return params


def with_concurrency(plan: Plan, params: dict[str, Any], used: Collection[str]) -> Plan:
    """`plan` with the sampled slots and threads (`sample_concurrency`) of the devices it
    uses: settings of a device it leaves idle would name an unused device."""
    return replace(
        plan,
        device_slots={d: int(params[f"slots.{d}"]) for d in used if f"slots.{d}" in params},
        device_threads={d: int(params[f"threads.{d}"]) for d in used if f"threads.{d}" in params},
    )


class PlacementSpace:
    """An Optuna space over `problem`'s placements (and, for ``all``, per-device concurrency
    and the op order); the interface of `search.space.SearchSpace`."""

    def __init__(self, name: str, problem: PlacementProblem, cost: CostModel) -> None:
        if name not in PLACEMENT_SPACES:
            raise SchedlabError(f"unknown placement space {name!r}; use one of: {', '.join(PLACEMENT_SPACES)}")
        self.name = name
        self.problem = problem
        self.graph = problem.graph
        self.up_us: list[float] = []
        if name == "all":
            cores = max(d.cores for d in problem.devices)
            self.up_us = upward_rank_us(self.graph, cost_fn(cost, cores))

    def suggest(self, trial: Any) -> Plan:
        return self.plan(self.sample(trial))

    def sample(self, trial: Any) -> dict[str, Any]:
        devices = list(range(self.problem.n_devices))
        params: dict[str, Any] = {
            f"device.{g.key}": trial.suggest_categorical(f"device.{g.key}", devices) for g in self.problem.groups
        }
        if self.name == "all":
            params.update(sample_concurrency(trial, self.problem.devices))
            params["order"] = trial.suggest_categorical("order", ORDER_CHOICES)
            if params["order"] == "mixed":
                for key in ("cp_weight", "w_defer_frac", "w_defer_dist"):
                    params[key] = trial.suggest_float(key, 0.0, 1.0)
        return params

    def group_device(self, params: dict[str, Any]) -> list[int]:
        try:
            return [int(params[f"device.{g.key}"]) for g in self.problem.groups]
        except KeyError as e:
            raise SchedlabError(f"placement parameters lack {e}: the trial was sampled on another graph") from None

    def plan(self, params: dict[str, Any]) -> Plan:
        base = base_plan()
        if self.name == "all":
            order: str | tuple[int, ...] = str(params["order"])
            if order == "mixed":
                op = OrderParams(float(params["cp_weight"]), float(params["w_defer_frac"]), float(params["w_defer_dist"]))
                order = parametric_order(self.graph, op, self.up_us)
            elif order not in ORDER_CHOICES:
                raise SchedlabError(f"unknown order choice {order!r}; use one of: {', '.join(ORDER_CHOICES)}")
            base = Plan(slots=1, threads=None, order=order)
        plan = self.problem.to_plan(self.group_device(params), base)
        return with_concurrency(plan, params, set(self.problem.op_devices(self.group_device(params))))
