"""`schedlab bench`: the executor's step time against plain eager PyTorch, same run; with
`--ddp`, a data-parallel plan's step on its ranks against DistributedDataParallel's on the
same ranks (the same model, batch split, initial values, optimizer, bucket size and
threads), the two alternating step by step; with `--pipelining`, a pipeline plan's step against
torch.distributed.pipelining's on the same ranks (the same stages, micro-batches, schedule,
initial values and optimizer), alternating likewise."""

from __future__ import annotations

import argparse
import sys

from schedlab.cli.bench_tf import DEFAULT_ROUNDS, run_tf_bench
from schedlab.cli.common import capture_model, load_plan_arg, print_json, resolve_plan_arg
from schedlab.cli.trace_tf import add_tf_args
from schedlab.errors import SchedlabError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="executor overhead: step time under a plan vs an eager PyTorch step",
        description="Time the executor under a plan (default: PyTorch's own way) and a plain eager "
        "training step of the same model, interleaved in one run, and print the ratio. With --backend tensorflow, "
        "TensorFlow's step of the same model and weights against PyTorch's (eager and executor) at TF's intra-op "
        "thread count, rounds alternating.",
    )
    p.add_argument("models", nargs="*", default=["transformer", "nmt"], metavar="MODEL", help="workloads (default: transformer nmt)")
    p.add_argument("--size", choices=("tiny", "default"), default="default")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--plan", default=None, metavar="PLAN.json")
    p.add_argument("--repeats", type=int, default=10, help="timed step pairs (default 10)")
    p.add_argument(
        "--steps", type=int, default=None, metavar="S",
        help="with --ddp: each side runs S steps back to back per timed pair (steady state, where the next step's "
        "forward may overlap this step's gradient all-reduce); default 1, or 5 for a reverse-first-k order",
    )
    p.add_argument(
        "--ddp", action="store_true",
        help="compare a data-parallel plan (--plan with replicas > 1) with torch DistributedDataParallel on the "
        "same ranks, steps alternating; prints the median per-step ratio schedlab/DDP (ratio_vs_ddp) and its IQR",
    )
    p.add_argument(
        "--pipelining", action="store_true",
        help="compare a pipeline plan (--plan with stages and a schedule) with torch.distributed.pipelining on the "
        "same ranks, steps alternating; prints the median per-step ratio schedlab/torch (ratio_vs_pipelining) and "
        "its IQR (workloads mlp and transformer; schedules gpipe, 1f1b, interleaved:V, looped-bfs, zbv)",
    )
    add_tf_args(p)
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"with --backend tensorflow: rounds of TF's steps then torch's (default {DEFAULT_ROUNDS})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schedlab.exec.bench import compare_with_eager
    from schedlab.machine import detect_host

    if args.repeats < 1 or args.rounds < 1:
        raise SchedlabError("--repeats and --rounds must be >= 1")
    if args.backend == "tensorflow":
        return run_tf_bench(args)
    if args.intra_op is not None or args.inter_op is not None or args.tf_recommended:
        raise SchedlabError("--intra-op, --inter-op and --tf-recommended are TensorFlow's; add --backend tensorflow")
    if args.ddp and args.pipelining:
        raise SchedlabError("--ddp and --pipelining compare different plans; give one of them")
    if args.ddp:
        return run_ddp(args)
    if args.pipelining:
        return run_pipelining(args)
    machine = detect_host()
    plan = load_plan_arg(args.plan)
    if plan.pipelined:
        raise SchedlabError(
            f"plan file {args.plan} is a pipeline plan: bench times one process's step on the full batch against eager "
            "PyTorch's; time a pipeline with `schedlab trace MODEL --plan PLAN.json` or, beside the baselines, "
            "`schedlab validate MODEL --plan PLAN.json`; compare it with torch's pipeline with --pipelining"
        )
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


def run_ddp(args: argparse.Namespace) -> int:
    from schedlab.cli.common import capture_for_plan, plan_ranks
    from schedlab.exec.bench import compare_with_ddp
    from schedlab.machine import host_ranks
    from schedlab.plan import steady_steps

    plan = load_plan_arg(args.plan)
    if args.plan is None or plan.replicas < 2:
        raise SchedlabError(
            "--ddp compares a data-parallel plan with DistributedDataParallel: give --plan PLAN.json with replicas > 1 "
            "(e.g. `schedlab plan MODEL --devices 2 --replicas 2 --threads 1 -o dp.json`)"
        )
    machine = host_ranks(plan_ranks(plan))
    steps = steady_steps(plan, args.steps)
    results = {}
    for model in args.models:
        ns = argparse.Namespace(model=model, size=args.size, optimizer=args.optimizer, seed=0)
        step = capture_for_plan(ns, plan.replicas)
        resolved = resolve_plan_arg(step.graph, plan, machine, args.plan, steps=steps)
        pairs = f"{args.repeats} pairs of {steps} steps back to back" if steps > 1 else f"{args.repeats} step pairs"
        print(f"bench {model}: {len(machine.processes)} ranks, {pairs} ...", file=sys.stderr)
        res, _ = compare_with_ddp(step, resolved, machine, spec=model, size=args.size, seed=0, repeats=args.repeats)
        results[model] = res
    if args.json:
        print_json({"plan": plan.to_json(), "size": args.size, "steps": steps,
                    "results": {m: r.to_json() for m, r in results.items()}})
        return 0
    seq = f"; {steps} steps back to back per run, each / {steps}" if steps > 1 else ""
    print(f"plan {plan.describe()}; {len(machine.processes)} ranks; step time: first rank's start to last rank's end{seq}")
    print(f"{'model':<14}{'schedlab ms':>12}{'DDP ms':>10}{'ratio':>8}  {'IQR':<14}")
    for model, r in results.items():
        lo, hi = r.ratio_spread
        print(
            f"{model:<14}{r.schedlab_step_s * 1e3:>12.2f}{r.ddp_step_s * 1e3:>10.2f}"
            f"{r.ratio_vs_ddp:>8.3f}  {lo:.3f}-{hi:.3f}"
        )
    return 0


def run_pipelining(args: argparse.Namespace) -> int:
    from schedlab.cli.common import capture_for_plan, plan_ranks
    from schedlab.exec.bench import compare_with_pipelining
    from schedlab.exec.pipelining import torch_schedule_name
    from schedlab.machine import host_ranks

    plan = load_plan_arg(args.plan)
    if args.plan is None or not plan.pipelined:
        raise SchedlabError(
            "--pipelining compares a pipeline plan with torch.distributed.pipelining: give --plan PLAN.json with "
            "stages and a schedule (e.g. `schedlab plan MODEL --devices 2 --stages 2 --micro-batches 2 "
            "--schedule 1f1b -o pipe.json`)"
        )
    if args.steps is not None:
        raise SchedlabError("--pipelining times one step at a time; drop --steps")
    torch_schedule_name(plan.schedule)  # refuse an unsupported schedule before capturing anything
    machine = host_ranks(plan_ranks(plan))
    results = {}
    for model in args.models:
        ns = argparse.Namespace(model=model, size=args.size, optimizer=args.optimizer, seed=0)
        step = capture_for_plan(ns, plan.replicas, micro_batches=plan.micro_batches)
        resolved = resolve_plan_arg(step.graph, plan, machine, args.plan)
        print(f"bench {model}: {len(machine.processes)} ranks, {args.repeats} step pairs ...", file=sys.stderr)
        try:
            res, _ = compare_with_pipelining(step, resolved, machine, spec=model, size=args.size, seed=0,
                                             repeats=args.repeats)
        except SchedlabError as e:
            raise SchedlabError(f"{model}: {e}") from None
        results[model] = res
    if args.json:
        print_json({"plan": plan.to_json(), "size": args.size, "results": {m: r.to_json() for m, r in results.items()}})
        return 0
    print(f"plan {plan.describe()}; {len(machine.processes)} ranks; step time: first rank's start to last rank's end")
    w = max(14, *(len(m) + 2 for m in results))
    print(f"{'model':<{w}}{'torch schedule':<26}{'schedlab ms':>12}{'torch ms':>10}{'ratio':>8}  {'IQR':<14}")
    for model, r in results.items():
        lo, hi = r.ratio_spread
        print(
            f"{model:<{w}}{r.torch_schedule:<26}{r.schedlab_step_s * 1e3:>12.2f}{r.pipelining_step_s * 1e3:>10.2f}"
            f"{r.ratio_vs_pipelining:>8.3f}  {lo:.3f}-{hi:.3f}"
        )
    return 0
