"""A Plan: plain, frozen, serialisable data that says how to run a Graph.

A Plan holds co-run slots (how many ops may run at once), intra-op threads (a default,
per-op-class and per-op overrides), op order as a policy or an explicit list, and the
device of each op. It is validated once against the Graph and the Machine by
`resolve()`, which both backends call first; the result, a `ResolvedPlan`, gives every op
its threads, priority and device.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op
from schedlab.machine import Machine

if TYPE_CHECKING:
    from schedlab.order import OpCostUs

PLAN_SCHEMA_VERSION = 1


class PlanError(SchedlabError):
    """A plan that does not fit its graph or machine. `field` names the plan field at fault
    ("threads", "class_threads[mm]"), so the CLI can name the flag or file it came from."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"plan {field}: {detail}")
        self.field = field
        self.detail = detail


@dataclass(frozen=True)
class Plan:
    slots: int = 1  # ops that may run at once (one worker thread each)
    threads: int | None = None  # default intra-op threads; None: all cores of the device
    class_threads: dict[str, int] = field(default_factory=dict)  # op class ("mm") -> threads
    op_threads: dict[int, int] = field(default_factory=dict)  # op id -> threads
    order: str | tuple[int, ...] = "topo"  # policy name or an explicit list of op ids
    device: str | None = None  # device of every op; None: the machine's first device
    name: str = ""

    # ---- serialisation -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "schedlab.plan",
            "version": PLAN_SCHEMA_VERSION,
            "name": self.name,
            "slots": self.slots,
            "threads": self.threads,
            "class_threads": dict(sorted(self.class_threads.items())),
            "op_threads": {str(k): v for k, v in sorted(self.op_threads.items())},
            "order": self.order if isinstance(self.order, str) else list(self.order),
            "device": self.device,
        }

    @property
    def hash(self) -> str:
        body = self.to_json()
        body.pop("name")
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        thr = "all" if self.threads is None else str(self.threads)
        extra = f", {len(self.class_threads) + len(self.op_threads)} thread override(s)" if (
            self.class_threads or self.op_threads
        ) else ""
        order = self.order if isinstance(self.order, str) else f"explicit[{len(self.order)}]"
        return f"slots={self.slots} threads={thr}{extra} order={order}"

    @staticmethod
    def from_json(d: Any) -> Plan:
        if not isinstance(d, dict) or d.get("schema") != "schedlab.plan":
            raise SchedlabError('not a schedlab plan (expected a JSON object with "schema": "schedlab.plan")')
        if d.get("version") != PLAN_SCHEMA_VERSION:
            raise SchedlabError(f"plan version {d.get('version')!r} is not supported (expected {PLAN_SCHEMA_VERSION})")
        known = {"schema", "version", "name", "slots", "threads", "class_threads", "op_threads", "order", "device"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SchedlabError(f"plan has unknown field(s) {unknown}; known fields: {sorted(known)}")
        try:
            order_raw = d.get("order", "topo")
            order: str | tuple[int, ...]
            if isinstance(order_raw, str):
                order = order_raw
            elif isinstance(order_raw, list) and all(isinstance(x, int) for x in order_raw):
                order = tuple(order_raw)
            else:
                raise SchedlabError("plan field 'order' must be a policy name or a list of op ids (integers)")
            threads = d.get("threads")
            for key in ("class_threads", "op_threads"):
                if not isinstance(d.get(key, {}), dict):
                    raise SchedlabError(f"plan field {key} must be an object of name -> threads, got {d[key]!r}")
            if d.get("device") is not None and not isinstance(d["device"], str):
                raise SchedlabError(f"plan field device must be a device id or null, got {d['device']!r}")
            plan = Plan(
                slots=_int(d.get("slots", 1), "slots"),
                threads=None if threads is None else _int(threads, "threads"),
                class_threads={str(k): _int(v, f"class_threads[{k}]") for k, v in dict(d.get("class_threads", {})).items()},
                op_threads={_int(k, "op_threads key"): _int(v, f"op_threads[{k}]") for k, v in dict(d.get("op_threads", {})).items()},
                order=order,
                device=d.get("device"),
                name=str(d.get("name", "")),
            )
        except (TypeError, ValueError) as e:
            raise SchedlabError(f"malformed plan: {e}") from None
        return plan

    def save(self, path: str | Path) -> Path:
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_json(), indent=1)

    @staticmethod
    def load(path: str | Path) -> Plan:
        from schedlab.io import read_json

        d = read_json(path, what="plan")
        try:
            return Plan.from_json(d)
        except SchedlabError as e:
            raise SchedlabError(f"plan file {path}: {e}") from None


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise SchedlabError(f"plan field {what} must be an integer, got {x!r}")
    try:
        return int(x)
    except ValueError:
        raise SchedlabError(f"plan field {what} must be an integer, got {x!r}") from None


@dataclass(frozen=True)
class ResolvedPlan:
    """A Plan checked against one Graph and Machine: per-op threads, priority, device."""

    plan: Plan
    slots: int
    threads: tuple[int, ...]  # per op id
    priority: tuple[int, ...]  # per op id; lower runs first among ready ops
    device: tuple[str, ...]  # per op id
    sequence: tuple[int, ...]  # the order one worker runs ops in (list schedule)


def list_schedule(graph: Graph, priority: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Topological order picking the ready op of lowest priority first (ties: op id)."""
    indeg = [len(p) for p in graph.preds]
    heap = [(priority[i], i) for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for s in graph.succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (priority[s], s))
    if len(out) != len(graph.ops):  # pragma: no cover - a captured graph is a DAG
        raise SchedlabError("graph has a cycle: no valid order exists")
    return tuple(out)


def resolve(graph: Graph, plan: Plan, machine: Machine, op_cost_us: OpCostUs | None = None) -> ResolvedPlan:
    """Validate `plan` against `graph` and `machine`; one clear PlanError per problem.

    `op_cost_us(op, threads)` weighs ops for the ``critical-path`` order: the calibrated cost
    model's time of each op with the threads this plan gives it (a rough roofline without
    it). The simulator and the executor of one run must resolve with the same weights, or
    they run different orders.
    """
    from schedlab.order import priorities, rough_cost_us

    try:
        device = machine.device(plan.device) if plan.device is not None else machine.default_device
    except SchedlabError as e:
        raise PlanError("device", str(e)) from None
    n = len(graph.ops)
    if plan.slots < 1:
        raise PlanError("slots", f"must be >= 1, got {plan.slots}")
    if plan.slots > device.cores and device.kind == "cpu":
        raise PlanError(
            "slots", f"{plan.slots} co-run slots need {plan.slots} cores, device {device.id} has "
            f"{device.cores}; use {device.cores} or fewer"
        )
    default_threads = device.cores if plan.threads is None else plan.threads

    def check_threads(k: int, field: str) -> None:
        if k < 1:
            raise PlanError(field, f"must be >= 1, got {k}")
        if k > device.cores:
            raise PlanError(
                field, f"{k} threads is more than the {device.cores} cores of device {device.id}; "
                f"use {device.cores} or fewer"
            )

    check_threads(default_threads, "threads")
    known_classes = {op.op_class for op in graph.ops}
    for cls, k in plan.class_threads.items():
        if cls not in known_classes:
            raise PlanError(
                "class_threads", f"names op class {cls!r}, which this graph does not have "
                f"(it has: {', '.join(sorted(known_classes))})"
            )
        check_threads(k, f"class_threads[{cls}]")
    for op_id, k in plan.op_threads.items():
        if not 0 <= op_id < n:
            raise PlanError("op_threads", f"names unknown op id {op_id} (graph has ops 0..{n - 1})")
        check_threads(k, f"op_threads[{op_id}]")

    threads = tuple(
        plan.op_threads.get(op.id, plan.class_threads.get(op.op_class, default_threads)) for op in graph.ops
    )

    def weight(op: Op) -> float:
        return rough_cost_us(op) if op_cost_us is None else op_cost_us(op, threads[op.id])

    try:
        prio = priorities(graph, plan.order, weight)
    except SchedlabError as e:
        raise PlanError("order", str(e)) from None
    return ResolvedPlan(
        plan=plan,
        slots=plan.slots,
        threads=threads,
        priority=prio,
        device=tuple(device.id for _ in graph.ops),
        sequence=list_schedule(graph, prio),
    )
