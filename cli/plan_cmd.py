"""`schedlab plan`: write a Plan file, validated against the model's graph and the machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schedlab.cli.common import add_machine_arg, add_model_args, capture_for_plan
from schedlab.errors import SchedlabError
from schedlab.order import ORDER_HELP
from schedlab.plan import DEFAULT_BUCKET_MB, Plan, PlanError, resolve

# plan fields this command sets from flags: field -> flag
FLAG_OF = {"slots": "--slots", "threads": "--threads", "order": "--order", "replicas": "--replicas",
           "placement": "--placement", "placement.layers": "--placement", "placement.ops": "--placement"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="write a plan (co-run slots, intra-op threads, op order, placement, replicas) for a model",
        description="Write a Plan JSON file. The plan is checked against the model's captured graph "
        "and the machine before it is written. With --devices N the plan runs on N local ranks of "
        "this host (processes that split its cores); `schedlab trace --plan` starts them.",
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
    p.add_argument("--profile", default=None, metavar="PROFILE",
                   help="cost-model profile that weighs layers for --placement layers (default: traces/profile.json when it exists)")
    p.add_argument("--name", default="", help="a name stored in the plan")
    p.add_argument("-o", "--out", required=True, metavar="PLAN.json", help="where to write the plan")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.machine import load_machine

    machine = load_machine(args.machine, devices=args.devices)
    if args.replicas < 1:
        raise SchedlabError(f"--replicas must be >= 1, got {args.replicas}")
    step = capture_for_plan(args, args.replicas)
    graph = step.graph
    base = Plan(slots=args.slots, threads=args.threads, order=args.order, name=args.name, replicas=args.replicas,
                bucket_mb=args.bucket_mb, split_batch_stats=args.split_batch_stats)
    plan = _with_placement(base, args, graph, machine)
    try:
        resolved = resolve(graph, plan, machine)
    except PlanError as e:  # the plan came from flags: name the flag
        flag = FLAG_OF.get(e.field.split("[")[0])
        if flag is None:
            raise
        raise SchedlabError(f"{flag} {getattr(args, flag[2:].replace('-', '_'))}: {e.detail}") from None
    plan.save(args.out)
    run_graph = resolved.run_graph(graph)
    comm = len(run_graph.ops) - resolved.base_ops * max(1, args.replicas) if resolved.multi_device else 0
    where = f" on {len(resolved.devices)} devices ({', '.join(resolved.devices)}), {comm} communication ops" if (
        resolved.multi_device) else ""
    print(
        f"wrote {args.out}: {plan.describe()} "
        f"({len(graph)} ops of {args.model}/{args.size}{where}, max threads {max(resolved.threads)})",
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


def _cost(args: argparse.Namespace) -> Any:
    """The calibrated per-op time that weighs layers, or None (a FLOP/byte roofline)."""
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.cli.common import load_profile
    from schedlab.sim.cost import op_cost_us

    if args.profile is None and not DEFAULT_PROFILE_PATH.exists():
        return None
    return op_cost_us(load_profile(args.profile))
