"""`schedlab plan`: write a Plan file, validated against the model's graph and the machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schedlab.cli.common import add_machine_arg, add_model_args, capture_for_plan
from schedlab.errors import SchedlabError
from schedlab.graph import OpKind
from schedlab.order import ORDER_HELP
from schedlab.plan import DEFAULT_BUCKET_MB, Plan, PlanError, resolve

# plan fields this command sets from flags: field -> flag
FLAG_OF = {"slots": "--slots", "threads": "--threads", "order": "--order", "replicas": "--replicas",
           "placement": "--placement", "placement.layers": "--placement", "placement.ops": "--placement",
           "micro_batches": "--micro-batches", "stages": "--stages", "stage_map": "--stage-map",
           "schedule": "--schedule", "pipeline_devices": "--devices"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="write a plan (co-run slots, intra-op threads, op order, placement, replicas, pipeline) for a model",
        description="Write a Plan JSON file. The plan is checked against the model's captured graph "
        "and the machine before it is written. With --devices N the plan runs on N local ranks of "
        "this host (processes that split its cores); `schedlab trace --plan` starts them. With --stages, "
        "--micro-batches or --schedule the plan is a pipeline over those devices.",
    )
    add_model_args(p)
    add_machine_arg(p)
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="run on N local ranks of this host, one CPU device each (cpu0..cpu{N-1})")
    p.add_argument("--slots", type=int, default=1, help="ops that may run at once per device, one worker each (default 1)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per op (default: all cores of its device)")
    p.add_argument("--order", default="topo", help=ORDER_HELP)
    p.add_argument(
        "--placement", default="default", metavar="default|layers|FILE",
        help="which device runs each op: 'default' (all on the first device of each replica), 'layers' "
        "(contiguous layers balanced by calibrated cost, one block per device: the expert split), or a "
        'JSON file {"default": DEV, "layers": {LAYER: DEV}, "ops": {OP_ID: DEV}}',
    )
    p.add_argument("--replicas", type=int, default=1, help="data-parallel degree; must divide the devices and the batch")
    p.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
                   help=f"gradient all-reduce bucket size in MiB, as DDP's bucket_cap_mb (default {DEFAULT_BUCKET_MB:g})")
    p.add_argument("--split-batch-stats", action="store_true",
                   help="allow replicas on a model with batch norm, whose statistics then cover each replica's part only")
    p.add_argument("--micro-batches", type=int, default=None, metavar="M",
                   help="pipeline: split the batch into M micro-batches (must divide it); their gradients are averaged "
                   "before one update per parameter")
    p.add_argument("--stages", type=int, default=None, metavar="S",
                   help="pipeline: cut the layers into S contiguous stages, S a multiple of --devices (default: what the "
                   "schedule runs, one stage per device for 1f1b)")
    p.add_argument("--stage-cuts", default="equal", metavar="equal|balanced|I,J,...",
                   help="pipeline: where stages begin: equal shares of layers (default), layers balanced by calibrated "
                   "cost, or the index of each later stage's first layer")
    p.add_argument("--schedule", default=None, metavar="NAME|tessel|FILE.csv",
                   help="pipeline schedule: gpipe, 1f1b, interleaved:V, looped-bfs, zb-h1, zb-h2, zbv, ooo; tessel "
                   "(Tessel's repetend search on the model's calibrated stage times, one stage per device, under "
                   "1F1B's activation memory); or a schedule file in torch's CSV (one row per device); searched "
                   "and file schedules are written into the plan as actions (default 1f1b)")
    p.add_argument("--stage-map", choices=("loop", "v"), default=None,
                   help="pipeline: stage s on device s mod P (loop) or down and back up (v); default: the schedule's")
    p.add_argument("--profile", default=None, metavar="PROFILE",
                   help="cost-model profile that weighs layers for --placement layers and --stage-cuts balanced "
                   "(default: traces/profile.json when it exists)")
    p.add_argument("--name", default="", help="a name stored in the plan")
    p.add_argument("-o", "--out", required=True, metavar="PLAN.json", help="where to write the plan")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.machine import load_machine

    machine = load_machine(args.machine, devices=args.devices)
    if args.replicas < 1:
        raise SchedlabError(f"--replicas must be >= 1, got {args.replicas}")
    if len(machine.devices) % args.replicas:
        raise SchedlabError(f"--replicas {args.replicas}: does not divide the {len(machine.devices)} devices "
                            f"({', '.join(d.id for d in machine.devices)}); use a divisor, or other --devices")
    pipelined = any(x is not None for x in (args.micro_batches, args.stages, args.schedule, args.stage_map)) or (
        args.stage_cuts != "equal")
    schedule = read_schedule_arg(args.schedule) if pipelined else None
    micro_batches = args.micro_batches if args.micro_batches is not None else (
        schedule.n_microbatches if schedule is not None else 1)
    step = capture_for_plan(args, args.replicas, micro_batches=micro_batches)
    graph = step.graph
    base = Plan(slots=args.slots, threads=args.threads, order=args.order, name=args.name, replicas=args.replicas,
                bucket_mb=args.bucket_mb, split_batch_stats=args.split_batch_stats)
    if pipelined:
        base = _with_pipeline(base, args, graph, machine, schedule, micro_batches)
    plan = _with_placement(base, args, graph, machine)
    try:
        resolved = resolve(graph, plan, machine)
    except PlanError as e:  # the plan came from flags: name the flag
        flag = FLAG_OF.get(e.field.split("[")[0])
        if flag is None:
            raise
        value = getattr(args, flag[2:].replace("-", "_"))
        raise SchedlabError(f"{flag}{'' if value is None else f' {value}'}: {e.detail}") from None
    plan.save(args.out)
    run_graph = resolved.run_graph(graph)
    comm = sum(1 for op in run_graph.ops if op.kind is OpKind.COMM)
    where = f" on {len(resolved.devices)} devices ({', '.join(resolved.devices)}), {comm} communication ops" if (
        resolved.multi_device) else ""
    print(
        f"wrote {args.out}: {plan.describe()} "
        f"({len(run_graph)} ops of {args.model}/{args.size}{where}, max threads {max(resolved.threads)})",
        file=sys.stderr,
    )
    return 0


def _with_placement(plan: Plan, args: argparse.Namespace, graph: Any, machine: Any) -> Plan:
    from dataclasses import replace

    spec = args.placement
    group = [d.id for d in machine.devices][: max(1, len(machine.devices) // max(1, args.replicas))]
    if spec == "default":
        return plan
    if spec == "layers":
        from schedlab.layer_split import layer_split

        if len(group) < 2:
            raise SchedlabError(
                f"--placement layers splits a replica's layers over its devices, and each replica has {len(group)}; "
                "give more --devices (or fewer --replicas)"
            )
        return replace(plan, device=group[0], layer_devices=layer_split(graph, group, _cost(args), threads=1))
    path = Path(spec)
    if not path.exists():
        raise SchedlabError(f"--placement {spec!r} is neither 'default', 'layers' nor an existing JSON file")
    from schedlab.io import read_json

    d = read_json(path, what="placement")
    if not isinstance(d, dict) or set(d) - {"default", "layers", "ops"}:
        raise SchedlabError(
            f'placement file {path}: expected {{"default": DEV, "layers": {{LAYER: DEV}}, "ops": {{OP_ID: DEV}}}}, '
            f"got keys {sorted(d) if isinstance(d, dict) else type(d).__name__}"
        )
    try:
        body = {**plan.to_json(), "placement": {"default": d.get("default"), "layers": d.get("layers", {}),
                                                 "ops": d.get("ops", {})}}
        return Plan.from_json(json.loads(json.dumps(body)))
    except SchedlabError as e:
        raise SchedlabError(f"placement file {path}: {e}") from None


def read_schedule_arg(spec: str | None) -> Any:
    """--schedule as a `pipeline.Schedule` when it names a schedule file (its rows go into
    the plan, so the plan file is self-contained), else None (a generator name, or none:
    1f1b)."""
    if spec is None or not spec.endswith(".csv"):
        return None
    from schedlab.pipeline.torch_io import read_csv

    return read_csv(spec)


def _with_pipeline(
    plan: Plan, args: argparse.Namespace, graph: Any, machine: Any, schedule: Any, micro_batches: int
) -> Plan:
    """`plan` with the pipeline flags: its devices (every device of the machine, one schedule
    row each; with --replicas R, the first of R equal groups, the others running the
    replicas), stages, stage map and schedule."""
    from dataclasses import replace

    from schedlab.pipeline import stage_devices
    from schedlab.pipeline.generators import stages_per_device
    from schedlab.pipeline_plan import with_named_schedule
    from schedlab.search.tessel.model import TESSEL

    every = [d.id for d in machine.devices]
    devices = tuple(every[: len(every) // args.replicas])
    P = len(devices)
    if args.schedule == TESSEL:  # Tessel's search on the model's stage times
        from schedlab.search.tessel.model import with_tessel_schedule

        n_stages = args.stages if args.stages is not None else P
        cuts = _stage_cuts(args, graph, n_stages) if args.stage_cuts != "equal" else None
        if args.stage_map not in (None, "loop"):
            raise SchedlabError(f"--stage-map {args.stage_map}: Tessel's search here runs one stage per device (loop)")
        try:
            planned, result = with_tessel_schedule(plan, devices, graph, micro_batches, cuts or n_stages, _cost(args))
        except PlanError as e:
            raise SchedlabError(f"--schedule tessel: {e.detail}") from None
        print(f"Tessel: repetend at {result.repetend_time / result.lower_bound:.3f}x its lower bound (the busiest "
              f"device's work per micro-batch), found in {result.search_s:.2f} s", file=sys.stderr)
        return planned
    if schedule is None:  # a generator: the library builds the plan
        name = args.schedule or "1f1b"
        try:
            n_stages = args.stages if args.stages is not None else P * stages_per_device(name, P)
        except SchedlabError as e:
            raise SchedlabError(f"--schedule {name}: {e}") from None
        cuts = _stage_cuts(args, graph, n_stages) if args.stage_cuts != "equal" else None
        return with_named_schedule(plan, devices, name, micro_batches, cuts or n_stages, args.stage_map)
    n_stages = schedule.shape.n_stages
    got = tuple(st.devices[0] for st in schedule.shape.stages)
    stage_map = args.stage_map or next(
        (m for m in ("loop", "v") if schedule.n_devices == P and got == stage_devices(n_stages, P, m)), "loop")
    if args.stages is not None and args.stages != n_stages:
        raise SchedlabError(f"--stages {args.stages}: schedule file {args.schedule} runs {n_stages} stages")
    stages: int | tuple[int, ...] = n_stages if args.stage_cuts == "equal" else _stage_cuts(args, graph, n_stages)
    return replace(plan, micro_batches=micro_batches, stages=stages, stage_map=stage_map,
                   schedule=tuple(tuple(row) for row in schedule.to_rows()), pipeline_devices=devices if P > 1 else ())


def _stage_cuts(args: argparse.Namespace, graph: Any, n_stages: int) -> tuple[int, ...]:
    """--stage-cuts balanced (layers balanced by cost into `n_stages` blocks) or I,J,...:
    the index of each later stage's first layer."""
    spec = args.stage_cuts
    if spec == "balanced":
        from schedlab.layer_split import balanced_stage_cuts

        try:
            return balanced_stage_cuts(graph, n_stages, _cost(args))
        except SchedlabError as e:
            raise SchedlabError(f"--stages {n_stages}: {args.model}: {e}; use fewer") from None
    try:
        cuts = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise SchedlabError(f"--stage-cuts {spec!r}: give equal, balanced or layer indices such as 2,5") from None
    if len(cuts) + 1 != n_stages:
        raise SchedlabError(f"--stage-cuts {spec}: {len(cuts)} cut(s) make {len(cuts) + 1} stages, not --stages {n_stages}")
    return cuts


def _cost(args: argparse.Namespace) -> Any:
    """The calibrated per-op time that weighs layers, or None (a FLOP/byte roofline)."""
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.cli.common import load_profile
    from schedlab.sim.cost import op_cost_us

    if args.profile is None and not DEFAULT_PROFILE_PATH.exists():
        return None
    return op_cost_us(load_profile(args.profile))
