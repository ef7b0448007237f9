"""A pipeline plan resolved: its schedule, stages and devices checked against the graph
and the machine, its step expanded into one graph, and one op order per device.

A plan with `micro_batches`, `stages`, `stage_map`, `schedule` and `pipeline_devices`
(`schedlab.plan.Plan`) runs as any multi-device plan does (DESIGN.md, "A resolved plan
is a graph per rank"): `resolve_pipeline` builds the pipelined graph
(`pipeline_expand`), adds a send/recv pair for every value that crosses devices
(`distribute.expand`), and orders each device's ops as the schedule says, with each
receive just before the first op that reads it and each send just after the op that
makes its value. The resolved `sequence` is one topological order of the whole graph
that keeps every device's order, which is all the executor's ranks and the simulator's
one-slot devices follow; `priority` is each op's place in its device's order, which
co-run slots follow among ready ops. Neither backend has pipeline-specific code.

The schedule is a generator name (`pipeline.generators`: gpipe, 1f1b, interleaved:V,
looped-bfs, zb-h1, zb-h2, zbv, ooo) built for the plan's devices, stages and
micro-batches, or the actions of each device written out (a schedule file's rows), so a
plan file is self-contained. Row d of the schedule runs on `pipeline_devices[d]`.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from schedlab.distribute import RECV, SEND, expand
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.machine import Machine
from schedlab.pipeline import STAGE_MAPS, Schedule, check_schedule, infer_chain, stage_devices
from schedlab.pipeline.generators import default_shape, generate, parse_name, schedule_names
from schedlab.pipeline.schedule import n_microbatches_of, orders_from_rows
from schedlab.pipeline_expand import NO_ACTION, Pipelined, pipeline_graph
from schedlab.pipeline_replicas import mirrored, replica_rows, replicate_pipeline
from schedlab.pipeline_stages import split_stages
from schedlab.plan import (
    Plan,
    PlanError,
    ResolvedPlan,
    check_captured_replicas,
    check_memory,
    device_settings,
    list_schedule,
    op_threads,
)


def plan_devices(plan: Plan, machine: Machine) -> tuple[str, ...]:
    """The device of each schedule row: `pipeline_devices`, else the plan's default device."""
    if not plan.pipeline_devices:
        try:
            return (machine.device(plan.device).id if plan.device is not None else machine.default_device.id,)
        except SchedlabError as e:
            raise PlanError("device", str(e)) from None
    for dev in plan.pipeline_devices:
        try:
            machine.device(dev)
        except SchedlabError as e:
            raise PlanError("pipeline_devices", str(e)) from None
    if len(set(plan.pipeline_devices)) != len(plan.pipeline_devices):
        raise PlanError("pipeline_devices", f"names a device twice: {list(plan.pipeline_devices)}; give each once")
    return plan.pipeline_devices


def with_named_schedule(
    plan: Plan, devices: tuple[str, ...], schedule: str, micro_batches: int,
    stages: int | tuple[int, ...] | None = None, stage_map: str | None = None,
) -> Plan:
    """`plan` as a pipeline under generator `schedule` (gpipe, 1f1b, interleaved:V, ...) over
    `devices`, one schedule row each: `micro_batches`, and `stages` as a count (equal
    shares of layers) or the first layer of each later stage (then the count is one
    more); by default the stage count the schedule runs on `devices`, and its stage map.
    The plan is checked when it is resolved (`resolve_pipeline`)."""
    from schedlab.pipeline.generators import parse_name, stages_per_device

    try:
        kind, _ = parse_name(schedule)
        n_stages = len(stages) + 1 if isinstance(stages, tuple) else stages
        if n_stages is None:
            n_stages = len(devices) * stages_per_device(schedule, len(devices))
    except SchedlabError as e:
        raise PlanError("schedule", str(e)) from None
    return replace(plan, micro_batches=micro_batches, stages=stages if isinstance(stages, tuple) else n_stages,
                   stage_map=stage_map or kind.stage_map, schedule=schedule,
                   pipeline_devices=devices if len(devices) > 1 else ())


def plan_schedule(plan: Plan, n_devices: int) -> Schedule:
    """The plan's schedule on `n_devices` devices, checked against its stages, stage map
    and micro-batches (`pipeline.check_schedule`)."""
    S, M = plan.n_stages, plan.micro_batches
    if plan.stage_map not in STAGE_MAPS:
        raise PlanError("stage_map", f"unknown stage map {plan.stage_map!r}; choose one of: {', '.join(STAGE_MAPS)}")
    if M < 1:
        raise PlanError("micro_batches", f"must be >= 1, got {M}")
    try:
        stage_devices(S, n_devices, plan.stage_map)
    except SchedlabError as e:
        raise PlanError("stages", f"{e} (the plan has {n_devices} pipeline device(s))") from None
    if plan.schedule is None:
        raise PlanError(
            "schedule",
            f"a pipeline plan needs a schedule: one of {', '.join(schedule_names())}, or each device's "
            "actions (a schedule file's rows)",
        )
    if isinstance(plan.schedule, str):
        schedule = _named(plan, n_devices)
    else:
        schedule = _written(plan, n_devices)
    try:
        check_schedule(schedule)
    except SchedlabError as e:
        raise PlanError("schedule", str(e)) from None
    return schedule


def _named(plan: Plan, n_devices: int) -> Schedule:
    name = str(plan.schedule)
    try:
        kind, _ = parse_name(name)
    except SchedlabError as e:
        raise PlanError("schedule", str(e)) from None
    if kind.stage_map != plan.stage_map:
        raise PlanError(
            "stage_map",
            f"schedule {name!r} maps stages onto devices {kind.stage_map!r}, the plan says "
            f"{plan.stage_map!r}; set it to {kind.stage_map!r}",
        )
    try:
        shape = default_shape(name, n_devices, plan.n_stages)
    except SchedlabError as e:
        raise PlanError("stages", str(e)) from None
    try:
        return generate(name, shape, plan.micro_batches)
    except SchedlabError as e:
        raise PlanError("schedule", str(e)) from None


def _written(plan: Plan, n_devices: int) -> Schedule:
    assert plan.schedule is not None and not isinstance(plan.schedule, str)
    S, M = plan.n_stages, plan.micro_batches
    try:
        orders, dropped = orders_from_rows(plan.schedule)
        shape = infer_chain(orders)
        mbs = n_microbatches_of(orders)
    except SchedlabError as e:
        raise PlanError("schedule", str(e)) from None
    if len(orders) != n_devices:
        raise PlanError("schedule", f"lists {len(orders)} device(s); the plan has {n_devices} pipeline device(s)")
    if shape.n_stages != S:
        raise PlanError("schedule", f"runs {shape.n_stages} stage(s); the plan has {S}")
    for s, st in enumerate(shape.stages):
        if len(st.devices) != 1:
            raise PlanError(
                "schedule", f"stage {s} runs on devices {list(st.devices)}; here each stage runs on one device"
            )
    got = tuple(st.devices[0] for st in shape.stages)
    want = stage_devices(S, n_devices, plan.stage_map)
    if got != want:
        raise PlanError(
            "schedule", f"runs stages on devices {list(got)}; stage map {plan.stage_map!r} puts them on {list(want)}"
        )
    if mbs != M:
        raise PlanError("micro_batches", f"the schedule runs {mbs} micro-batch(es); the plan has {M}")
    return Schedule(shape=shape, n_microbatches=M, orders=orders, name="inline", comm_dropped=dropped)


def check_order(pipe: Pipelined, label: str) -> None:
    """Refuse a schedule whose per-device orders cannot all be followed on this graph:
    some device would wait forever for an op that another device runs only later."""
    g = pipe.graph
    n = len(g.ops)
    indeg = [len(p) for p in g.preds]
    after: dict[int, int] = {}
    for order in pipe.orders.values():
        for a, b in pairwise(order):
            after[a] = b
            indeg[b] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    done = [False] * n
    while ready:
        i = ready.pop()
        done[i] = True
        for s in (*g.succs[i], *((after[i],) if i in after else ())):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if all(done):
        return
    waits = []
    for dev, order in pipe.orders.items():
        stuck = next((i for i in order if not done[i]), None)
        if stuck is None:
            continue
        p = next(p for p in g.preds[stuck] if not done[p])
        waits.append(f"{dev} at {_op(pipe, stuck)} waits for {_op(pipe, p)} on {pipe.device[p]}")
    raise PlanError(
        "schedule",
        f"{label} cannot run on these stages: "
        + "; ".join(waits)
        + ". Cut the stages elsewhere (stages as cut points) or choose another schedule",
    )


def _op(pipe: Pipelined, i: int) -> str:
    where = pipe.action[i] or "the update"
    return f"op {i} ({pipe.graph.ops[i].name}, in {where})"


def device_chains(graph: Graph, device: tuple[str, ...], orders: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """Each device's ops of the expanded `graph` in run order: its compute ops in `orders`,
    each receive just before the first op reading it, each send just after the op making
    its value (a graph input's send first)."""
    chains: dict[str, list[int]] = {dev: [] for dev in orders}
    for op in graph.ops:
        if op.target == SEND and op.inputs[0] not in graph.producer:
            chains.setdefault(device[op.id], []).append(op.id)
    received: set[int] = set()
    for dev, order in orders.items():
        chain = chains[dev]
        for i in order:
            for p in graph.preds[i]:
                if graph.ops[p].target == RECV and p not in received:
                    received.add(p)
                    chain.append(p)
            chain.append(i)
            chain.extend(s for s in graph.succs[i] if graph.ops[s].target == SEND)
    placed = sum(len(c) for c in chains.values())
    if placed != len(graph.ops):  # pragma: no cover - every COMM op has a producer or a consumer
        raise SchedlabError(f"pipeline order places {placed} of {len(graph.ops)} ops; this is a schedlab bug")
    return chains


def resolve_pipeline(graph: Graph, plan: Plan, machine: Machine, steps: int = 1) -> ResolvedPlan:
    """`schedlab.plan.resolve` of a pipeline plan; `graph` is one micro-batch's step
    (`microbatch.pipeline_step`). With `steps` > 1, that many steps back to back
    (`schedlab.steps.unroll`): each device runs its schedule row for step 1, then for step
    2, ..., a step's forward waiting only for the updates of the parameters it reads, so a
    device whose row ends early starts the next step while the others finish this one
    (under 1F1B and GPipe the first stage ends last: nothing overlaps there).
    One clear PlanError per problem."""
    from schedlab.data_parallel import uses_batch_stats

    if plan.layer_devices or plan.op_devices:
        raise PlanError(
            "placement",
            "a pipeline plan places ops by its stages (pipeline_devices, stage_map); "
            "drop placement.layers and placement.ops",
        )
    if plan.order != "topo":
        raise PlanError(
            "order", f"a pipeline plan runs its ops in its schedule's order, not {plan.order!r}; leave order as topo"
        )
    M = plan.micro_batches
    captured_for = int(graph.meta.get("micro_batches", 1))
    if M >= 1 and captured_for != M:
        raise PlanError(
            "micro_batches",
            f"the graph was captured for {captured_for} micro-batch(es), the plan has {M}: "
            "capture one micro-batch's step (schedlab.microbatch.pipeline_step, as the CLI does)",
        )
    devices = plan_devices(plan, machine)
    R = plan.replicas
    rows = replica_rows(machine, devices, R)
    check_captured_replicas(
        graph, R, "one replica's micro-batch step (schedlab.microbatch.pipeline_step with replicas, as the CLI does)"
    )
    if (M > 1 or R > 1) and uses_batch_stats(graph) and not plan.split_batch_stats:
        part = "micro-batch" if M > 1 else "replica"
        raise PlanError(
            "micro_batches" if M > 1 else "replicas",
            f"this model normalises over the batch (batch norm in training): each {part} would "
            "see statistics of its part only, which changes results; set split_batch_stats to accept that",
        )
    schedule = plan_schedule(plan, len(devices))
    pipe = pipeline_graph(graph, split_stages(graph, plan.stages), schedule, devices)
    if R > 1:
        pipe = replicate_pipeline(pipe, rows, int(plan.bucket_mb * (1 << 20)))
    label = f"schedule {plan.schedule!r}" if isinstance(plan.schedule, str) else "the plan's schedule"
    check_order(pipe, label)
    n = pipe.base_ops
    alike = replace(plan, device_slots=mirrored(plan.device_slots, rows),
                    device_threads=mirrored(plan.device_threads, rows))  # every replica runs as the first
    slots_of, default_threads = device_settings(alike, machine, tuple(d for row in rows for d in row))
    base = op_threads(graph, plan, machine, pipe.device[:n], default_threads)
    threads = tuple(
        1 if pipe.graph.ops[i].kind is OpKind.COMM else base[c] if c >= 0 else default_threads[pipe.device[i]]
        for i, c in enumerate(pipe.copy_of)
    )
    check_memory(pipe.graph, pipe.device, machine)
    ex = expand(pipe.graph, pipe.device, expanded_from=graph.hash)
    comm = len(ex.graph.ops) - len(pipe.graph.ops)
    g = replace(
        ex.graph,
        meta={
            **pipe.graph.meta,
            "expanded_from": graph.hash,
            "base_ops": n,
            "pipeline_actions": [*pipe.action, *[NO_ACTION] * comm],
        },
    )
    chains = device_chains(g, ex.device, pipe.orders)
    all_threads = threads + (1,) * comm
    device = ex.device
    if steps > 1:  # steady state: each device runs its row step after step (`schedlab.steps`)
        from schedlab.steps import unroll

        m = len(g.ops)
        g = unroll(g, steps)
        chains = {dev: [s * m + i for s in range(steps) for i in chain] for dev, chain in chains.items()}
        all_threads, device = all_threads * steps, device * steps
    priority = [0] * len(g.ops)
    after: dict[int, int] = {}
    for chain in chains.values():
        for k, i in enumerate(chain):
            priority[i] = k
        after.update({b: a for a, b in pairwise(chain)})
    return ResolvedPlan(
        plan=plan,
        slots=slots_of[devices[0]],
        threads=all_threads,
        priority=tuple(priority),
        device=device,
        sequence=list_schedule(g, priority, after),
        graph=g,
        device_slots=slots_of,
        base_ops=n,
        steps=steps,
    )
