"""`schedlab plan`: write a Plan file, validated against the model's graph and the machine."""

from __future__ import annotations

import argparse
import sys

from schedlab.cli.common import add_machine_arg, add_model_args, capture_model
from schedlab.errors import SchedlabError
from schedlab.order import ORDER_HELP
from schedlab.plan import Plan, PlanError, resolve

FLAG_FIELDS = ("slots", "threads", "order")  # plan fields this command sets from flags of the same name


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="write a plan (co-run slots, intra-op threads, op order) for a model",
        description="Write a Plan JSON file. The plan is checked against the model's captured graph "
        "and the machine before it is written.",
    )
    add_model_args(p)
    add_machine_arg(p)
    p.add_argument("--slots", type=int, default=1, help="ops that may run at once, one worker each (default 1)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per op (default: all cores)")
    p.add_argument("--order", default="topo", help=ORDER_HELP)
    p.add_argument("--name", default="", help="a name stored in the plan")
    p.add_argument("-o", "--out", required=True, metavar="PLAN.json", help="where to write the plan")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.machine import load_machine

    plan = Plan(slots=args.slots, threads=args.threads, order=args.order, name=args.name)
    machine = load_machine(args.machine)
    _, captured = capture_model(args)
    try:
        resolved = resolve(captured.graph, plan, machine)
    except PlanError as e:  # the plan came from flags: name the flag
        if e.field not in FLAG_FIELDS:
            raise
        raise SchedlabError(f"--{e.field} {getattr(args, e.field)}: {e.detail}") from None
    plan.save(args.out)
    print(
        f"wrote {args.out}: {plan.describe()} "
        f"({len(captured.graph)} ops of {args.model}/{args.size}, max threads {max(resolved.threads)})",
        file=sys.stderr,
    )
    return 0
