"""`schedlab demo`: the main job on a built-in default workload."""

from __future__ import annotations

import argparse
import sys

from schedlab.cli.common import TRACES_DIR


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="the main job on a built-in default (what `make demo` runs)",
        description="Trace the default workload on the real executor and print where the trace is.",
    )
    p.add_argument("--model", default="transformer", help="workload (default transformer)")
    p.add_argument("--size", default="default", choices=("tiny", "default"))
    p.add_argument("--run-dir", default="runs/demo", help="run directory (default runs/demo)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.cli import trace_cmd

    ns = argparse.Namespace(
        model=args.model, size=args.size, optimizer="sgd", seed=0, plan=None, steps=5, warmup=1,
        out=str(TRACES_DIR / f"demo-{args.model}-{args.size}.json"), json=False, command="trace",
    )
    print(f"schedlab demo: tracing {args.model}/{args.size} on this machine", file=sys.stderr)
    return trace_cmd.run(ns)
