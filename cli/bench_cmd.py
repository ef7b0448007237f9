"""`schedlab bench`: the executor's step time against plain eager PyTorch, same run."""

from __future__ import annotations

import argparse
import sys

from schedlab.cli.common import capture_model, load_plan_arg, print_json, resolve_plan_arg
from schedlab.errors import SchedlabError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="executor overhead: step time under a plan vs an eager PyTorch step",
        description="Time the executor under a plan (default: PyTorch's own way) and a plain eager "
        "training step of the same model, interleaved in one run, and print the ratio.",
    )
    p.add_argument("models", nargs="*", default=["transformer", "nmt"], metavar="MODEL", help="workloads (default: transformer nmt)")
    p.add_argument("--size", choices=("tiny", "default"), default="default")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--plan", default=None, metavar="PLAN.json")
    p.add_argument("--repeats", type=int, default=10, help="timed step pairs (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schedlab.exec.bench import compare_with_eager
    from schedlab.machine import detect_host

    if args.repeats < 1:
        raise SchedlabError("--repeats must be >= 1")
    machine = detect_host()
    plan = load_plan_arg(args.plan)
    rows: dict[str, dict[str, object]] = {}
    results = {}
    for model in args.models:
        ns = argparse.Namespace(model=model, size=args.size, optimizer=args.optimizer, seed=0)
        workload, captured = capture_model(ns)
        resolve_plan_arg(captured.graph, plan, machine, args.plan)  # a plan that does not fit names its file
        with tqdm(total=args.repeats + 2, desc=f"bench {model}", unit="pair", file=sys.stderr, disable=None) as bar:
            res = compare_with_eager(
                workload.module, captured.graph, captured.input_values, plan, machine, repeats=args.repeats,
                progress=lambda: bar.update(1),
            )
        rows[model] = res.to_json()
        results[model] = res
    if args.json:
        print_json({"machine": machine.host, "plan": plan.to_json(), "size": args.size, "results": rows})
        return 0
    print(f"machine: {machine.host.get('cpu_model')} ({machine.default_device.cores} cores), plan {plan.describe()}")
    print(f"{'model':<14}{'ops':>6}{'eager ms':>10}{'exec ms':>10}{'ratio':>8}  {'IQR':<14}{'overhead/op':>12}")
    for model, r in results.items():
        lo, hi = r.ratio_spread
        print(
            f"{model:<14}{r.ops:>6}{r.eager_step_s * 1e3:>10.2f}{r.exec_step_s * 1e3:>10.2f}"
            f"{r.ratio:>8.3f}  {lo:.3f}-{hi:.3f}  {r.per_op_overhead_us:>9.1f} us"
        )
    return 0
