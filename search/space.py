"""Search spaces: an Optuna trial's parameters -> a Plan.

Three spaces (``--space``):

- ``concurrency``: co-run slots (1..cores), a default intra-op thread count (1..cores)
  and one thread count for each of the heaviest op classes (``threads.<class>``); the
  order is fixed to ``critical-path``.
- ``order``: the op order, with the concurrency fixed to two co-run slots of half the
  cores each (order only changes the step time when ops co-run): a named policy
  (``topo``, ``critical-path``, ``w-last``) or ``mixed``, a parametrised order:

      key(op) = cp_weight * rank_cp(op) + (1 - cp_weight) * position(op)
                + w_defer_dist   if op is one of the first w_defer_frac of the W ops

  where ``rank_cp`` is the op's rank by longest remaining path (costed with the cost
  model at all cores) and ``position`` its place in program order, both in [0, 1). The
  W ops deferred are the first in program order: the weight gradients of the last
  layers, which the backward pass reaches first (out-of-order backprop, Oh et al.,
  EuroSys 2022). Ready ops run by increasing key; the list schedule of the keys becomes
  an explicit order in the Plan.
- ``all``: both together.
- ``placement``: which device runs each group of ops (`search.placement.space`); on a
  machine of several devices, ``all`` searches placement, concurrency and order together,
  or a pipeline schedule with each device's concurrency (`search.composed_space`).
- ``schedule``: a pipeline over the machine's devices: schedule family, micro-batches and
  stage cuts (`search.schedule_space`).

Sampling is separate from building: `SearchSpace.suggest(trial)` samples a flat dict of
parameters and `SearchSpace.plan(params)` builds the Plan, so a stored trial's params
rebuild its plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind
from schedlab.machine import Machine
from schedlab.order import ranks, upward_rank_us
from schedlab.plan import Plan, list_schedule
from schedlab.sim.cost import CostModel, op_cost_us

SPACES = ("concurrency", "order", "all", "placement", "schedule")
ONE_DEVICE_SPACES = ("concurrency", "order", "all")
ORDER_CHOICES = ("topo", "critical-path", "w-last", "mixed")
CONCURRENCY_ORDER = "critical-path"  # the order of the concurrency space
HEAVY_CLASSES = 4  # op classes that get their own thread count


class Space(Protocol):
    """What a search needs of a space: its name, and a Plan from an Optuna trial."""

    name: str

    def suggest(self, trial: Any) -> Plan: ...


@dataclass(frozen=True)
class OrderParams:
    """A parametrised op order (see the module docstring); all fields in [0, 1]."""

    cp_weight: float = 0.0  # 0: program order, 1: longest remaining path first
    w_defer_frac: float = 0.0  # share of the W ops deferred, first in program order first
    w_defer_dist: float = 0.0  # how far they are deferred, as a share of the step


def order_keys(graph: Graph, params: OrderParams, up_us: list[float]) -> list[float]:
    """Per-op sort keys of a parametrised order (lower runs first among ready ops)."""
    n = len(graph.ops)
    if n == 0:
        return []
    cp = [r / n for r in ranks([-u for u in up_us])]  # in [0, 1)
    w_ops = [op.id for op in graph.ops if op.kind is OpKind.W]
    n_defer = math.ceil(params.w_defer_frac * len(w_ops) - 1e-9)
    deferred = set(w_ops[: max(0, n_defer)])
    a = params.cp_weight
    return [
        a * cp[i] + (1.0 - a) * (i / n) + (params.w_defer_dist if i in deferred else 0.0) for i in range(n)
    ]


def parametric_order(graph: Graph, params: OrderParams, up_us: list[float]) -> tuple[int, ...]:
    """The list schedule of `order_keys`: a dependency-respecting explicit op order."""
    return list_schedule(graph, ranks(order_keys(graph, params, up_us)))


def cost_fn(cost: CostModel, threads: int) -> Callable[[Op], float]:
    """An op's time with `threads` threads under `cost`: dispatch plus kernel (µs)."""
    time_us = op_cost_us(cost)
    return lambda op: time_us(op, threads)


def heaviest_classes(graph: Graph, cost: CostModel, k: int = HEAVY_CLASSES) -> tuple[str, ...]:
    """The `k` op classes of most single-thread kernel time in the step (views excluded)."""
    total: dict[str, float] = {}
    for op in graph.ops:
        if not op.is_view:
            total[op.op_class] = total.get(op.op_class, 0.0) + float(cost.kernel_us(op, 1))
    return tuple(sorted(total, key=lambda c: (-total[c], c))[: max(0, k)])


class SearchSpace:
    """One space over the Plans of `graph` on the first device of `machine`."""

    def __init__(
        self,
        name: str,
        graph: Graph,
        machine: Machine,
        cost: CostModel,
        *,
        heavy_classes: int = HEAVY_CLASSES,
        order_base: Plan | None = None,
    ) -> None:
        if name not in ONE_DEVICE_SPACES:
            raise SchedlabError(f"unknown search space {name!r} for one device; use one of: {', '.join(ONE_DEVICE_SPACES)}")
        self.name = name
        self.graph = graph
        self.cores = machine.default_device.cores
        self.classes = heaviest_classes(graph, cost, heavy_classes) if name != "order" else ()
        slots = min(2, self.cores)
        self.order_base = order_base or Plan(slots=slots, threads=max(1, self.cores // slots))
        self.up_us = upward_rank_us(graph, cost_fn(cost, self.cores))

    @property
    def searches_concurrency(self) -> bool:
        return self.name in ("concurrency", "all")

    @property
    def searches_order(self) -> bool:
        return self.name in ("order", "all")

    def suggest(self, trial: Any) -> Plan:
        """Sample this space's parameters on an Optuna trial and build the Plan."""
        return self.plan(self.sample(trial))

    def sample(self, trial: Any) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.searches_concurrency:
            params["slots"] = trial.suggest_int("slots", 1, self.cores)
            params["threads"] = trial.suggest_int("threads", 1, self.cores)
            for cls in self.classes:
                params[f"threads.{cls}"] = trial.suggest_int(f"threads.{cls}", 1, self.cores)
        if self.searches_order:
            params["order"] = trial.suggest_categorical("order", ORDER_CHOICES)
            if params["order"] == "mixed":
                params["cp_weight"] = trial.suggest_float("cp_weight", 0.0, 1.0)
                params["w_defer_frac"] = trial.suggest_float("w_defer_frac", 0.0, 1.0)
                params["w_defer_dist"] = trial.suggest_float("w_defer_dist", 0.0, 1.0)
        return params

    def plan(self, params: dict[str, Any]) -> Plan:
        """The Plan of a parameter dict (as `sample` returns, or a trial's `params`)."""
        if self.searches_concurrency:
            slots = int(params["slots"])
            threads = int(params["threads"])
            class_threads = {c: int(params[f"threads.{c}"]) for c in self.classes if f"threads.{c}" in params}
        else:
            slots = self.order_base.slots
            threads = self.order_base.threads or self.cores
            class_threads = dict(self.order_base.class_threads)
        class_threads = {c: k for c, k in class_threads.items() if k != threads}
        order: str | tuple[int, ...] = CONCURRENCY_ORDER
        if self.searches_order:
            choice = str(params["order"])
            if choice == "mixed":
                op = OrderParams(
                    float(params["cp_weight"]), float(params["w_defer_frac"]), float(params["w_defer_dist"])
                )
                order = parametric_order(self.graph, op, self.up_us)
            elif choice in ORDER_CHOICES:
                order = choice
            else:
                raise SchedlabError(f"unknown order choice {choice!r}; use one of: {', '.join(ORDER_CHOICES)}")
        return Plan(slots=slots, threads=threads, class_threads=class_threads, order=order)


def make_space(name: str, graph: Graph, machine: Machine, cost: CostModel, *, split_fbw: bool = False) -> Space:
    """The space `name` on `machine`: `SearchSpace` on one device; on several, ``placement``
    is `search.placement.space.PlacementSpace` and ``all`` `search.composed_space.ComposedSpace`
    (the same interface)."""
    multi = len(machine.devices) > 1
    if name == "schedule":
        from schedlab.search.schedule_space import ScheduleSpace

        return ScheduleSpace(graph, machine, cost)
    if name == "placement" or (name == "all" and multi):
        if not multi:
            raise SchedlabError(
                f"--space placement needs several devices; machine {machine.name!r} has one: give --devices N "
                "(N local ranks of this host) or a --machine with several devices (e.g. dgx-8gpu --devices 4)"
            )
        from schedlab.search.placement.problem import build_problem
        from schedlab.search.placement.space import PlacementSpace

        placed = PlacementSpace(name, build_problem(graph, machine, cost, split_fbw=split_fbw), cost)
        if name == "placement":
            return placed
        from schedlab.search.composed_space import ComposedSpace
        from schedlab.search.schedule_space import optional_schedule_space

        return ComposedSpace(placed, optional_schedule_space(graph, machine, cost), machine)
    if multi:
        raise SchedlabError(f"--space {name} searches one device; on machine {machine.name!r} use --space placement or all")
    return SearchSpace(name, graph, machine, cost)
