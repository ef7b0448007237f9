"""A Plan: plain, frozen, serialisable data that says how to run a Graph.

A Plan holds co-run slots (how many ops may run at once), intra-op threads (a default,
per-op-class and per-op overrides), op order as a policy or an explicit list, and the
device of each op (a default, per-layer and per-op overrides: the same pattern as
threads), with per-device slots and threads. It is validated once against the Graph and
the Machine by `resolve()`, which both backends call first; the result, a `ResolvedPlan`,
gives every op its threads, priority and device, and, when the plan spans devices, the
expanded graph with its communication ops (`schedlab.distribute`) that both run.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind
from schedlab.machine import Machine

if TYPE_CHECKING:
    from schedlab.order import OpCostUs

PLAN_SCHEMA_VERSION = 3  # written only by pipeline plans; the others are still written as version 2
READABLE_VERSIONS = (1, 2, 3)
DEFAULT_BUCKET_MB = 25.0  # DDP's bucket_cap_mb default


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
    device: str | None = None  # default device of every op; None: the machine's first device
    name: str = ""
    layer_devices: dict[str, str] = field(default_factory=dict)  # layer path (prefix) -> device
    op_devices: dict[int, str] = field(default_factory=dict)  # op id -> device
    device_slots: dict[str, int] = field(default_factory=dict)  # device -> its co-run slots
    device_threads: dict[str, int] = field(default_factory=dict)  # device -> its default threads
    replicas: int = 1  # data-parallel degree
    bucket_mb: float = DEFAULT_BUCKET_MB  # gradient all-reduce bucket size (DDP's bucket_cap_mb)
    split_batch_stats: bool = False  # allow replicas to change results (batch-norm statistics)
    # Pipeline (`schedlab.pipeline_plan`): the batch split into micro-batches, the layers into stages.
    micro_batches: int = 1
    stages: int | tuple[int, ...] = 1  # a count (equal shares of layers) or each later stage's first layer index
    stage_map: str = "loop"  # how stages map onto pipeline_devices: "loop" (s mod P) or "v" (down and back up)
    schedule: str | tuple[tuple[str, ...], ...] | None = None  # a generator name, or per device its actions
    pipeline_devices: tuple[str, ...] = ()  # the device of each schedule row; () = the default device

    @property
    def multi_device(self) -> bool:
        """Whether the plan can place ops on more than one device."""
        return bool(self.layer_devices or self.op_devices) or self.replicas > 1 or len(self.pipeline_devices) > 1

    @property
    def n_stages(self) -> int:
        return self.stages if isinstance(self.stages, int) else len(self.stages) + 1

    @property
    def pipelined(self) -> bool:
        """Whether the plan runs micro-batches or stages under a pipeline schedule."""
        return self.micro_batches != 1 or self.n_stages != 1 or self.schedule is not None or bool(self.pipeline_devices)

    def _v1_expressible(self) -> bool:
        return not (self.multi_device or self.device_slots or self.device_threads or self.split_batch_stats
                    or self.pipelined) and self.bucket_mb == DEFAULT_BUCKET_MB

    # ---- serialisation -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Version 3 for a pipeline plan; otherwise version 2, as before pipelines, so that
        such files and their hashes stay what they were."""
        out = self._v2_json()
        if not self.pipelined:
            return out
        return {
            **out,
            "version": PLAN_SCHEMA_VERSION,
            "micro_batches": self.micro_batches,
            "stages": self.stages if isinstance(self.stages, int) else list(self.stages),
            "stage_map": self.stage_map,
            "schedule": self.schedule if self.schedule is None or isinstance(self.schedule, str)
            else [list(row) for row in self.schedule],
            "pipeline_devices": list(self.pipeline_devices),
        }

    def _v2_json(self) -> dict[str, Any]:
        return {
            "schema": "schedlab.plan",
            "version": 2,
            "name": self.name,
            "slots": self.slots,
            "threads": self.threads,
            "class_threads": dict(sorted(self.class_threads.items())),
            "op_threads": {str(k): v for k, v in sorted(self.op_threads.items())},
            "order": self.order if isinstance(self.order, str) else list(self.order),
            "placement": {
                "default": self.device,
                "layers": dict(sorted(self.layer_devices.items())),
                "ops": {str(k): v for k, v in sorted(self.op_devices.items())},
            },
            "device_slots": dict(sorted(self.device_slots.items())),
            "device_threads": dict(sorted(self.device_threads.items())),
            "replicas": self.replicas,
            "bucket_mb": self.bucket_mb,
            "split_batch_stats": self.split_batch_stats,
        }

    @property
    def hash(self) -> str:
        if self._v1_expressible():  # the hash a one-device plan had before version 2: runs resume
            body = {k: v for k, v in self.to_json().items() if k in _V1_FIELDS}
            body.update(version=1, device=self.device)
        else:
            body = self.to_json()
        body.pop("name")
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        thr = "all" if self.threads is None else str(self.threads)
        extra = f", {len(self.class_threads) + len(self.op_threads)} thread override(s)" if (
            self.class_threads or self.op_threads
        ) else ""
        order = self.order if isinstance(self.order, str) else f"explicit[{len(self.order)}]"
        out = f"slots={self.slots} threads={thr}{extra} order={order}"
        if self.layer_devices or self.op_devices:
            devs = sorted({*self.layer_devices.values(), *self.op_devices.values(), *([self.device] if self.device else [])})
            out += f" placed on {','.join(devs)}"
        if self.replicas > 1:
            out += f" replicas={self.replicas} bucket={self.bucket_mb:g}MB"
        if self.pipelined:
            sched = self.schedule if self.schedule is None or isinstance(self.schedule, str) else "inline"
            on = ",".join(self.pipeline_devices) or "one device"
            out += (f" pipeline: {self.micro_batches} micro-batch(es), {self.n_stages} stage(s) "
                    f"({self.stage_map}) on {on}, schedule {sched}")
        return out

    @staticmethod
    def from_json(d: Any) -> Plan:
        if not isinstance(d, dict) or d.get("schema") != "schedlab.plan":
            raise SchedlabError('not a schedlab plan (expected a JSON object with "schema": "schedlab.plan")')
        version = d.get("version")
        if version not in READABLE_VERSIONS:
            raise SchedlabError(f"plan version {version!r} is not supported (expected one of {list(READABLE_VERSIONS)})")
        known = set(_V1_FIELDS) if version == 1 else set(_V2_FIELDS) if version == 2 else set(_V3_FIELDS)
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
            for key in ("class_threads", "op_threads", "device_slots", "device_threads"):
                if not isinstance(d.get(key, {}), dict):
                    raise SchedlabError(f"plan field {key} must be an object, got {d[key]!r}")
            placement = d.get("placement", {"default": d.get("device")})
            if not isinstance(placement, dict) or set(placement) - {"default", "layers", "ops"}:
                raise SchedlabError(
                    'plan field placement must be an object {"default": DEVICE|null, "layers": {LAYER: DEVICE}, '
                    f'"ops": {{OP_ID: DEVICE}}}}, got {placement!r}'
                )
            default = placement.get("default")
            if default is not None and not isinstance(default, str):
                raise SchedlabError(f"plan field device must be a device id or null, got {default!r}")
            layers, op_devs = placement.get("layers", {}), placement.get("ops", {})
            for key, m in (("placement.layers", layers), ("placement.ops", op_devs)):
                if not isinstance(m, dict) or not all(isinstance(v, str) for v in m.values()):
                    raise SchedlabError(f"plan field {key} must be an object of name -> device id, got {m!r}")
            bucket = d.get("bucket_mb", DEFAULT_BUCKET_MB)
            if isinstance(bucket, bool) or not isinstance(bucket, (int, float)):
                raise SchedlabError(f"plan field bucket_mb must be a number, got {bucket!r}")
            split = d.get("split_batch_stats", False)
            if not isinstance(split, bool):
                raise SchedlabError(f"plan field split_batch_stats must be true or false, got {split!r}")
            plan = Plan(
                slots=_int(d.get("slots", 1), "slots"),
                threads=None if threads is None else _int(threads, "threads"),
                class_threads={str(k): _int(v, f"class_threads[{k}]") for k, v in dict(d.get("class_threads", {})).items()},
                op_threads={_int(k, "op_threads key"): _int(v, f"op_threads[{k}]") for k, v in dict(d.get("op_threads", {})).items()},
                order=order,
                device=default,
                name=str(d.get("name", "")),
                layer_devices={str(k): v for k, v in layers.items()},
                op_devices={_int(k, "placement.ops key"): v for k, v in op_devs.items()},
                device_slots={str(k): _int(v, f"device_slots[{k}]") for k, v in dict(d.get("device_slots", {})).items()},
                device_threads={str(k): _int(v, f"device_threads[{k}]") for k, v in dict(d.get("device_threads", {})).items()},
                replicas=_int(d.get("replicas", 1), "replicas"),
                bucket_mb=float(bucket),
                split_batch_stats=split,
                **_pipeline_fields(d),
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


_V1_FIELDS = ("schema", "version", "name", "slots", "threads", "class_threads", "op_threads", "order", "device")
_V2_FIELDS = (
    "schema", "version", "name", "slots", "threads", "class_threads", "op_threads", "order", "placement",
    "device_slots", "device_threads", "replicas", "bucket_mb", "split_batch_stats",
)


_V3_FIELDS = (*_V2_FIELDS, "micro_batches", "stages", "stage_map", "schedule", "pipeline_devices")


def _pipeline_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The pipeline fields of a plan's JSON (absent before version 3), checked for type."""
    stages_raw = d.get("stages", 1)
    stages: int | tuple[int, ...]
    if isinstance(stages_raw, list):
        stages = tuple(_int(x, "stages[]") for x in stages_raw)
    else:
        stages = _int(stages_raw, "stages")
    stage_map = d.get("stage_map", "loop")
    if not isinstance(stage_map, str):
        raise SchedlabError(f"plan field stage_map must be a string (loop or v), got {stage_map!r}")
    raw = d.get("schedule")
    schedule: str | tuple[tuple[str, ...], ...] | None
    if raw is None or isinstance(raw, str):
        schedule = raw
    elif isinstance(raw, list) and all(isinstance(r, list) and all(isinstance(c, str) for c in r) for r in raw):
        schedule = tuple(tuple(r) for r in raw)
    else:
        raise SchedlabError(
            "plan field schedule must be a schedule name (e.g. \"1f1b\") or one list of actions per device "
            f'(e.g. [["0F0", "0B0"], ["1F0", "1B0"]]), got {raw!r}'
        )
    devices = d.get("pipeline_devices", [])
    if not isinstance(devices, list) or not all(isinstance(x, str) for x in devices):
        raise SchedlabError(f"plan field pipeline_devices must be a list of device ids, got {devices!r}")
    return {
        "micro_batches": _int(d.get("micro_batches", 1), "micro_batches"),
        "stages": stages,
        "stage_map": stage_map,
        "schedule": schedule,
        "pipeline_devices": tuple(devices),
    }


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise SchedlabError(f"plan field {what} must be an integer, got {x!r}")
    try:
        return int(x)
    except ValueError:
        raise SchedlabError(f"plan field {what} must be an integer, got {x!r}") from None


@dataclass(frozen=True)
class ResolvedPlan:
    """A Plan checked against one Graph and Machine: per-op threads, priority, device.

    `graph` is what both backends run: the input graph itself when every op stays on one
    device, else the expanded graph (`schedlab.distribute`) whose ops 0..base_ops-1 are
    the input graph's and the rest its communication ops. Per-op tuples cover `graph`.
    """

    plan: Plan
    slots: int  # co-run slots of the first device (of the only one, in a one-device plan)
    threads: tuple[int, ...]  # per op id
    priority: tuple[int, ...]  # per op id; lower runs first among ready ops
    device: tuple[str, ...]  # per op id
    sequence: tuple[int, ...]  # the order one worker runs ops in (list schedule)
    graph: Graph | None = None  # the graph to run (None: the graph resolve() was given)
    device_slots: dict[str, int] = field(default_factory=dict)  # co-run slots of each device used
    base_ops: int = -1  # ops of the input graph (-1: all)
    steps: int = 1  # steps back to back in `graph` (steady state, `schedlab.steps`)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices ops run on, in first-use order."""
        return tuple(dict.fromkeys(self.device))

    @property
    def multi_device(self) -> bool:
        return len(self.devices) > 1

    def slots_of(self, device: str) -> int:
        return self.device_slots.get(device, self.slots)

    def run_graph(self, graph: Graph) -> Graph:
        """The graph a backend given `graph` and this plan runs (the expanded one, if any)."""
        if self.graph is None or self.graph is graph:
            return graph
        origin = (self.graph.meta.get("expanded_from"), self.graph.meta.get("unrolled_from"), self.graph.hash)
        if graph.hash not in origin:
            raise SchedlabError(f"this plan was resolved against another graph than {graph.name!r}")
        return self.graph


def list_schedule(
    graph: Graph, priority: tuple[int, ...] | list[int], after: dict[int, int] | None = None
) -> tuple[int, ...]:
    """Topological order picking the ready op of lowest priority first (ties: op id).

    `after[b] = a`: op b also waits for op a (an order the values do not impose, such as
    a rank's all-reduce buckets, which every rank must issue in the same order)."""
    indeg = [len(p) for p in graph.preds]
    then: dict[int, list[int]] = {}
    for b, a in (after or {}).items():
        indeg[b] += 1
        then.setdefault(a, []).append(b)
    heap = [(priority[i], i) for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for s in (*graph.succs[i], *then.get(i, ())):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (priority[s], s))
    if len(out) != len(graph.ops):  # pragma: no cover - a captured graph is a DAG
        raise SchedlabError("graph has a cycle: no valid order exists")
    return tuple(out)


DEFAULT_STEADY_STEPS = 5  # steps back to back when a plan's order needs a steady state and none are asked


def steady_steps(plan: Plan, steps: int | None) -> int:
    """How many steps back to back a command runs `plan` for: `steps` if given, else
    `DEFAULT_STEADY_STEPS` for an order that gains only across steps (reverse-first-k),
    else 1 (steps one at a time)."""
    from schedlab.order import REVERSE_FIRST_K

    if steps is not None:
        if steps < 1:
            raise SchedlabError(f"steady-state steps must be >= 1, got {steps}")
        return steps
    return DEFAULT_STEADY_STEPS if isinstance(plan.order, str) and plan.order.startswith(REVERSE_FIRST_K) else 1


def resolve(
    graph: Graph, plan: Plan, machine: Machine, op_cost_us: OpCostUs | None = None, steps: int = 1
) -> ResolvedPlan:
    """Validate `plan` against `graph` and `machine`; one clear PlanError per problem.

    `steps` > 1 resolves the plan for that many steps back to back in steady state
    (`schedlab.steps`): `graph` is then the unrolled sequence both backends run, and a
    backend's step time is its makespan over the sequence divided by `steps`.

    `op_cost_us(op, threads)` weighs ops for the ``critical-path`` order: the calibrated cost
    model's time of each op with the threads this plan gives it (a rough roofline without
    it). The simulator and the executor of one run must resolve with the same weights, or
    they run different orders.
    """
    from schedlab.distribute import expand
    from schedlab.order import priorities, rough_cost_us

    if plan.pipelined:
        from schedlab.pipeline_plan import resolve_pipeline

        return resolve_pipeline(graph, plan, machine, steps)
    n = len(graph.ops)
    op_device = place(graph, plan, machine)
    replica_devices = _replica_devices(graph, plan, machine, op_device)
    used = tuple(dict.fromkeys(op_device))
    slots_of, default_threads = device_settings(plan, machine, used)
    threads = op_threads(graph, plan, machine, op_device, default_threads)

    def weight(op: Op) -> float:
        return rough_cost_us(op) if op_cost_us is None else op_cost_us(op, threads[op.id])

    try:
        prio = priorities(graph, plan.order, weight)
    except SchedlabError as e:
        raise PlanError("order", str(e)) from None
    first = used[0] if used else machine.default_device.id
    if len(used) <= 1 and replica_devices is None:
        one = ResolvedPlan(
            plan=plan, slots=slots_of.get(first, plan.slots), threads=threads, priority=prio,
            device=tuple(op_device), sequence=list_schedule(graph, prio), device_slots=slots_of,
        )
        return one if steps == 1 else _unrolled(one, graph, steps, machine, weight)
    check_memory(graph, op_device, machine)
    if replica_devices is None:
        ex = expand(graph, op_device)
        copies = 1
    else:
        from schedlab.data_parallel import replicate

        step_pos = {op_id: k for k, op_id in enumerate(list_schedule(graph, prio))}
        ex = replicate(graph, replica_devices, int(plan.bucket_mb * 2**20), ready_rank=step_pos.__getitem__)
        copies = len(replica_devices)
        most_threads: dict[str, int] = {}
        for d0, k in zip(op_device, threads, strict=True):
            most_threads[d0] = max(k, most_threads.get(d0, 0))
        for devs in replica_devices[1:]:
            for d0, d in dict(zip(op_device, devs, strict=True)).items():  # replica 0's device -> this replica's
                slots_of.setdefault(d, slots_of[d0])
                _check_threads(most_threads[d0], machine.device(d).cores, d, "threads (of a replica)")
    g = ex.graph
    body = n * copies  # replica r's copy of op i is op r*n + i
    # A send ranks with the op that produced its value; a recv with the first op that
    # waits for it; an all-reduce before everything else ready, so that each bucket is
    # issued as soon as its last gradient is (DDP overlaps buckets with backward alike).
    comm_prio: list[int] = []
    for op in g.ops[body:]:
        if op.target.endswith("all_reduce"):
            comm_prio.append(-1)
        elif op.target.endswith("send"):
            src = g.producer.get(op.inputs[0])
            comm_prio.append(prio[src % n] if src is not None and src < body else -1)
        else:
            comm_prio.append(min((prio[c % n] for c in g.succs[op.id] if c < body), default=len(prio)))
    full_prio = tuple(prio) * copies + tuple(comm_prio)
    resolved = ResolvedPlan(
        plan=plan, slots=slots_of.get(first, plan.slots), threads=threads * copies + (1,) * (len(g.ops) - body),
        priority=full_prio, device=ex.device, sequence=list_schedule(g, full_prio, _bucket_order(g, ex.device)), graph=g,
        device_slots=slots_of, base_ops=n,
    )
    return resolved if steps == 1 else _unrolled(resolved, graph, steps, machine, weight)


def device_settings(plan: Plan, machine: Machine, used: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """(co-run slots, default intra-op threads) of each device in `used`, checked against
    the machine's cores; `device_slots` and `device_threads` must name its devices."""
    for dev_id, what in [(d, "device_slots") for d in plan.device_slots] + [(d, "device_threads") for d in plan.device_threads]:
        try:
            machine.device(dev_id)
        except SchedlabError as e:
            raise PlanError(f"{what}[{dev_id}]", str(e)) from None
    slots_of: dict[str, int] = {}
    default_threads: dict[str, int] = {}
    for dev_id in used:
        device = machine.device(dev_id)
        k_slots = plan.device_slots.get(dev_id, plan.slots)
        field_name = f"device_slots[{dev_id}]" if dev_id in plan.device_slots else "slots"
        if k_slots < 1:
            raise PlanError(field_name, f"must be >= 1, got {k_slots}")
        if k_slots > device.cores and device.kind == "cpu":
            raise PlanError(
                field_name, f"{k_slots} co-run slots need {k_slots} cores, device {device.id} has "
                f"{device.cores}; use {device.cores} or fewer"
            )
        slots_of[dev_id] = k_slots
        t = plan.device_threads.get(dev_id, plan.threads)
        default_threads[dev_id] = device.cores if t is None else t
        _check_threads(default_threads[dev_id], device.cores, dev_id,
                       f"device_threads[{dev_id}]" if dev_id in plan.device_threads else "threads")
    return slots_of, default_threads


def op_threads(
    graph: Graph, plan: Plan, machine: Machine, op_device: tuple[str, ...], default_threads: dict[str, int]
) -> tuple[int, ...]:
    """Each op's intra-op threads: its `op_threads` entry, else its class's, else its device's default."""
    n = len(graph.ops)
    used = tuple(dict.fromkeys(op_device))
    known_classes = {op.op_class for op in graph.ops}
    for cls, k in plan.class_threads.items():
        if cls not in known_classes:
            raise PlanError(
                "class_threads", f"names op class {cls!r}, which this graph does not have "
                f"(it has: {', '.join(sorted(known_classes))})"
            )
        for dev_id in used:
            _check_threads(k, machine.device(dev_id).cores, dev_id, f"class_threads[{cls}]")
    for op_id, k in plan.op_threads.items():
        if not 0 <= op_id < n:
            raise PlanError("op_threads", f"names unknown op id {op_id} (graph has ops 0..{n - 1})")
        _check_threads(k, machine.device(op_device[op_id]).cores, op_device[op_id], f"op_threads[{op_id}]")
    return tuple(
        plan.op_threads.get(op.id, plan.class_threads.get(op.op_class, default_threads[op_device[op.id]]))
        for op in graph.ops
    )


def _unrolled(
    one: ResolvedPlan, graph: Graph, steps: int, machine: Machine, weight: Callable[[Op], float]
) -> ResolvedPlan:
    """`one` (a plan resolved for one step of `graph`) over `steps` steps back to back
    (`schedlab.steps`): each step's ops keep their priorities, shifted so that among ready
    ops an earlier step's come first, and each op its device and threads. The sequence a
    one-slot rank follows knows that communication takes time (`steps.timed_sequence`,
    ops weighed by `weight`, links by `machine`), so the next step's forward fills a
    rank's wait for this step's gradients."""
    from schedlab.steps import comm_time_us, copied_op, timed_sequence, unroll

    g = unroll(one.run_graph(graph), steps)
    span = max(one.priority, default=0) + 2  # one step's priorities lie in -1..max
    prio = tuple(p + s * span for s in range(steps) for p in one.priority)
    device = one.device * steps
    n = len(graph.ops)
    dur_us = [0.0 if op.kind is OpKind.COMM else weight(graph.ops[copied_op(g, op.id, n)]) for op in g.ops]
    sequence = timed_sequence(g, prio, device, dur_us, lambda op: comm_time_us(op, machine, device[op.id]),
                              _bucket_order(g, device))
    return replace(
        one, threads=one.threads * steps, priority=prio, device=device,
        sequence=sequence, graph=g,
        base_ops=one.base_ops if one.base_ops >= 0 else len(graph.ops), steps=steps,
    )


def _bucket_order(graph: Graph, device: tuple[str, ...]) -> dict[int, int]:
    """Each device's all-reduce of bucket b+1 waits for its bucket b: collectives are issued
    in one order on every rank, as DDP issues its buckets."""
    from schedlab.distribute import ALL_REDUCE

    last: dict[str, int] = {}
    after: dict[int, int] = {}
    ops = sorted((op for op in graph.ops if op.target == ALL_REDUCE), key=lambda op: int(op.kwargs["bucket"]))
    for op in ops:
        dev = device[op.id]
        if dev in last:
            after[op.id] = last[dev]
        last[dev] = op.id
    return after


def _replica_devices(
    graph: Graph, plan: Plan, machine: Machine, op_device: tuple[str, ...]
) -> list[tuple[str, ...]] | None:
    """Per replica, the device of each op (replica r runs on the r-th group of devices);
    None when the plan has one replica."""
    R = plan.replicas
    if R == 1:
        return None
    groups = replica_groups(machine, R)
    check_captured_replicas(graph, R, "the per-replica step (schedlab.data_parallel.split_workload, as the CLI does)")
    from schedlab.data_parallel import uses_batch_stats

    if uses_batch_stats(graph) and not plan.split_batch_stats:
        raise PlanError(
            "replicas", "this model normalises over the batch (batch norm in training): each replica would see "
            "statistics of its part of the batch only, which changes results; set split_batch_stats "
            "(`schedlab plan --split-batch-stats`) to accept that"
        )
    group0 = groups[0]
    stray = sorted(set(op_device) - set(group0))
    if stray:
        raise PlanError(
            "placement", f"with {R} replicas, place ops on the first replica's devices ({', '.join(group0)}); "
            f"replica r runs on the r-th group of {len(group0)}. Not: {', '.join(stray)}"
        )
    index = {d: j for j, d in enumerate(group0)}
    return [tuple(groups[r][index[d]] for d in op_device) for r in range(R)]


def check_captured_replicas(graph: Graph, replicas: int, capture_what: str) -> None:
    """One clear PlanError when `graph` was captured for another replica count than the
    plan's; `capture_what` says which step to capture instead."""
    captured = int(graph.meta.get("replicas", 1))
    if captured != replicas:
        raise PlanError(
            "replicas", f"the graph was captured for {captured} replica(s), the plan has {replicas}: capture {capture_what}"
        )


def replica_groups(machine: Machine, replicas: int) -> list[tuple[str, ...]]:
    """The machine's devices cut into `replicas` equal groups, in order: replica r runs on
    the r-th. One clear PlanError when they do not divide."""
    if replicas < 1:
        raise PlanError("replicas", f"must be >= 1, got {replicas}")
    ids = [d.id for d in machine.devices]
    if len(ids) % replicas:
        raise PlanError(
            "replicas", f"{replicas} replicas do not divide the {len(ids)} devices of machine {machine.name!r} "
            f"({', '.join(ids)}); use a divisor of {len(ids)}"
        )
    k = len(ids) // replicas
    return [tuple(ids[r * k : (r + 1) * k]) for r in range(replicas)]


def _check_threads(k: int, cores: int, dev_id: str, field_name: str) -> None:
    if k < 1:
        raise PlanError(field_name, f"must be >= 1, got {k}")
    if k > cores:
        raise PlanError(field_name, f"{k} threads is more than the {cores} cores of device {dev_id}; use {cores} or fewer")


def place(graph: Graph, plan: Plan, machine: Machine) -> tuple[str, ...]:
    """The device of every op: its `op_devices` entry, else the longest `layer_devices`
    prefix of its layer, else (an op with no layer) the device of the op that produced its
    first input, else the plan's default device."""
    try:
        default = machine.device(plan.device).id if plan.device is not None else machine.default_device.id
    except SchedlabError as e:
        raise PlanError("device", str(e)) from None
    for what, mapping in (("placement.layers", plan.layer_devices), ("placement.ops", plan.op_devices)):
        for key, dev_id in mapping.items():
            try:
                machine.device(dev_id)
            except SchedlabError as e:
                raise PlanError(f"{what}[{key}]", str(e)) from None
    n = len(graph.ops)
    for op_id in plan.op_devices:
        if not 0 <= op_id < n:
            raise PlanError("placement.ops", f"names unknown op id {op_id} (graph has ops 0..{n - 1})")
    layers = {op.layer for op in graph.ops if op.layer}
    for prefix in plan.layer_devices:
        if not any(lay == prefix or lay.startswith(prefix + ".") for lay in layers):
            sample = ", ".join(sorted(layers)[:8])
            raise PlanError("placement.layers", f"names layer {prefix!r}, which no op of this graph belongs to (layers: {sample}...)")
    if not plan.multi_device:
        return (default,) * n
    by_prefix = sorted(plan.layer_devices.items(), key=lambda kv: -len(kv[0]))
    out: list[str] = []
    for op in graph.ops:
        dev = plan.op_devices.get(op.id)
        if dev is None and op.layer:
            dev = next((d for pre, d in by_prefix if op.layer == pre or op.layer.startswith(pre + ".")), None)
            dev = dev or default
        if dev is None:
            src = next((graph.producer[v] for v in op.inputs if v in graph.producer), None)
            dev = out[src] if src is not None else default
        out.append(dev)
    return tuple(out)


def check_memory(graph: Graph, op_device: tuple[str, ...], machine: Machine) -> None:
    """Parameters and optimizer state alone must fit each device they are placed on."""
    from schedlab.distribute import input_homes

    homes = input_homes(graph, op_device)
    need: dict[str, int] = {}
    for i in graph.inputs:
        meta = graph.values[i.value]
        if meta is not None:
            need[homes[i.value]] = need.get(homes[i.value], 0) + meta.nbytes
    for dev_id, nbytes in need.items():
        cap = machine.device(dev_id).memory_bytes
        if nbytes > cap:
            raise PlanError(
                "placement", f"device {dev_id} would hold {nbytes / 2**30:.2f} GiB of parameters, buffers and "
                f"optimizer state, more than its {cap / 2**30:.2f} GiB; place fewer layers on it"
            )
