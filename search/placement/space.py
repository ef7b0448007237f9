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


def base_plan() -> Plan:
    """The rest of a placement-only plan: one slot, every core, critical path first."""
    return Plan(slots=1, threads=None, order=PLACEMENT_ORDER)


def max_slots(device: Device) -> int:
    return max(1, device.streams if device.kind == "cuda" else device.cores)


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
            for d in self.problem.devices:
                params[f"slots.{d.id}"] = trial.suggest_int(f"slots.{d.id}", 1, max_slots(d))
                if d.kind == "cpu" and d.cores > 1:
                    params[f"threads.{d.id}"] = trial.suggest_int(f"threads.{d.id}", 1, d.cores)
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
            ids = [d.id for d in self.problem.devices]
            base = Plan(
                slots=1, threads=None, order=order,
                device_slots={d: int(params[f"slots.{d}"]) for d in ids if f"slots.{d}" in params},
                device_threads={d: int(params[f"threads.{d}"]) for d in ids if f"threads.{d}" in params},
            )
        plan = self.problem.to_plan(self.group_device(params), base)
        used = set(self.problem.op_devices(self.group_device(params)))
        # per-device settings of devices the placement leaves idle would name unused devices
        return replace(plan, device_slots={d: k for d, k in plan.device_slots.items() if d in used},
                       device_threads={d: k for d, k in plan.device_threads.items() if d in used})
