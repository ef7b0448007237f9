"""`schedlab trace`: run a model's training step under a plan on the real executor.

A plan on one device runs in this process. A plan that places ops on several devices runs
on this host's local ranks (`schedlab.machine.host_ranks`), one process each, started and
merged by `schedlab.exec.launch`; the numerics check then covers the whole distributed
step (its first step, from the same values as eager PyTorch).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

from schedlab.cli.common import (
    TRACES_DIR,
    add_model_args,
    capture_for_plan,
    load_plan_arg,
    plan_ranks,
    print_json,
    resolve_plan_arg,
    slug,
)
from schedlab.cli.trace_tf import add_tf_args, run_tf_trace
from schedlab.errors import SchedlabError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "trace",
        help="run a training step under a plan on the real executor and record a trace",
        description="Capture MODEL's training step, check one step against eager PyTorch, run timed "
        "steps under the plan, and write a trace (schedlab JSON) and a Chrome trace (open it in "
        "https://ui.perfetto.dev).",
    )
    add_model_args(p)
    p.add_argument("--plan", default=None, metavar="PLAN.json", help="plan to run (default: PyTorch's own way)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default 5); in steady state, the steps of one sequence")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first (default 1; 4 for a plan on several ranks, whose first steps are slow); "
                   "in steady state, untimed sequences")
    p.add_argument(
        "--steady-state", action="store_true",
        help="run the --steps steps back to back as one sequence, so that the next step's forward may overlap this "
        "step's gradient communication, and time the sequence as a whole (step time: its wall time / --steps); "
        "implied by a reverse-first-k order",
    )
    p.add_argument("--runs", type=int, default=3, help="timed sequences in steady state (default 3)")
    p.add_argument(
        "--profile",
        default=None,
        metavar="PROFILE",
        help="cost-model profile that ranks a critical-path order, as simulate, search and validate rank it "
        "(default: traces/profile.json when it exists, else a FLOP/byte estimate)",
    )
    p.add_argument(
        "--devices", type=int, default=None, metavar="N",
        help="local ranks to run a multi-device plan on, one CPU device each (cpu0..cpu{N-1}; default: as many as "
        "the plan names)",
    )
    p.add_argument(
        "--timeout-s", type=float, default=None, metavar="S",
        help="a multi-device run stops with an error when no rank has begun anything new (start-up, a step) for "
        "S seconds (default 60)",
    )
    p.add_argument("--out", default=None, metavar="PATH", help="trace file (default: traces/<model>-<size>-<plan>.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    add_tf_args(p)
    p.set_defaults(handler=run)


def _order_profile(args: argparse.Namespace, plan: Any, steps: int) -> Any:
    """The profile a critical-path order is ranked by and a steady-state sequence weighed by,
    so `trace --plan` runs what `simulate --plan` predicts."""
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.cli.common import load_profile

    if plan.order != "critical-path" and steps == 1:
        return None
    if args.profile is None and not DEFAULT_PROFILE_PATH.exists():
        return None
    return load_profile(args.profile)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schedlab.exec import DEFAULT_TIMEOUT_S, Executor, check_step, run_ranks, run_steps
    from schedlab.machine import host_ranks
    from schedlab.plan import steady_steps
    from schedlab.steps import as_step_outputs

    if args.steps < 1 or (args.warmup is not None and args.warmup < 0):
        raise SchedlabError("--steps must be >= 1 and --warmup >= 0")
    if args.backend == "tensorflow":
        return run_tf_trace(args)
    if args.intra_op is not None or args.inter_op is not None or args.tf_recommended:
        raise SchedlabError("--intra-op, --inter-op and --tf-recommended are TensorFlow's; add --backend tensorflow "
                            "(torch threads come from the plan: schedlab plan MODEL --threads N --slots K)")
    if args.devices is not None and args.devices < 1:
        raise SchedlabError(f"--devices must be >= 1, got {args.devices}")
    timeout_s = DEFAULT_TIMEOUT_S if args.timeout_s is None else args.timeout_s
    if timeout_s <= 0:
        raise SchedlabError(f"--timeout-s must be > 0, got {args.timeout_s}")
    if args.runs < 1:
        raise SchedlabError(f"--runs must be >= 1, got {args.runs}")
    plan = load_plan_arg(args.plan)
    machine = host_ranks(args.devices if args.devices is not None else plan_ranks(plan))
    steady = args.steady_state or steady_steps(plan, None) > 1
    per_run = args.steps if steady else 1  # steps back to back in one run of the executor
    runs = args.runs if steady else args.steps
    profile = _order_profile(args, plan, per_run)
    if profile is not None and per_run > 1:
        from schedlab.calibrate.links import apply_link_fit

        machine = apply_link_fit(machine, profile)  # the links `simulate` weighs the sequence by
    step = capture_for_plan(args, plan.replicas, micro_batches=plan.micro_batches)
    workload, captured = step.workload, step.full
    graph = step.graph  # with replicas: the per-replica step
    resolved = resolve_plan_arg(graph, plan, machine, args.plan, profile, per_run)
    ranks = 1
    if args.warmup is None:
        from schedlab.exec.launch import warmup_for

        args.warmup = warmup_for(resolved.multi_device, None)
    if resolved.multi_device:
        print(f"trace {args.model}: {len(machine.processes)} ranks ...", file=sys.stderr)
        run_graph = resolved.run_graph(graph)
        dist = run_ranks(
            graph, resolved, machine, step.inputs_for(run_graph), steps=runs, warmup=args.warmup,
            timeout_s=timeout_s, want_outputs=True, workload=args.model,
        )
        first = step.as_full(run_graph, dist.outputs or {})
        check = check_step(workload.module, captured.graph, captured.input_values, lambda iv: first, steps=per_run,
                           run_graph=run_graph)
        result: Any = dist
        ranks = dist.ranks
        rank_step_times = [list(t) for t in dist.rank_step_times_s]
        ops = len(resolved.run_graph(graph))
    else:
        run_graph = resolved.run_graph(graph)  # unrolled (steady state) or pipelined, or the graph itself
        inputs = step.inputs_for(run_graph)
        executor = Executor(run_graph, resolved)
        check = check_step(workload.module, captured.graph, captured.input_values,
                           lambda iv: as_step_outputs(captured.graph, run_graph, executor.step(_cloned(inputs))[0]),
                           steps=per_run, run_graph=run_graph)
        unit = "step" if per_run == 1 else f"{per_run}-step run"
        bar = tqdm(total=args.warmup + runs, desc=f"trace {args.model}", unit=unit, file=sys.stderr, disable=None)
        try:
            result = run_steps(
                graph,
                inputs,
                plan,
                machine,
                steps=runs,
                warmup=args.warmup,
                progress=lambda done, total: bar.update(1),
                workload=args.model,
                executor=executor,
            )
        finally:
            bar.close()
        rank_step_times = [list(result.step_times_s)]
        ops = len(run_graph)
    trace = dataclasses.replace(result.trace, meta={**result.trace.meta, "numeric_check": check.to_json()})
    out = Path(args.out) if args.out else TRACES_DIR / f"{slug(args.model)}-{args.size}-{args.optimizer}-{plan.hash[:8]}.json"
    chrome = out.with_name(out.name.removesuffix(".json") + ".chrome.json")
    trace.save(out)
    trace.save_chrome(chrome)
    summary = {
        "model": args.model,
        "size": args.size,
        "optimizer": args.optimizer,
        "plan": plan.to_json(),
        "ops": ops,
        "step_time_s": result.step_time_s,
        "step_times_s": list(result.step_times_s),
        "steps_per_run": per_run,  # > 1: steady state, each time a run's wall time / steps_per_run
        "ranks": ranks,
        "rank_step_times_s": rank_step_times,
        "max_abs_grad_diff": check.max_abs_grad_diff,
        "max_rel_diff": check.max_rel_diff,
        "numerics_ok": check.numerics_ok,
        "worst_tensor": check.worst_tensor,
        "worst_ratio": check.worst_ratio,
        "worst_abs_diff": check.worst_abs_diff,
        "atol": check.atol,
        "rtol": check.rtol,
        "numeric_check": check.to_json(),
        "trace": str(out),
        "chrome_trace": str(chrome),
        "machine": machine.host.get("cpu_model", ""),
    }
    if args.json:
        print_json(summary)
    else:
        status = "matches eager PyTorch" if check.ok() else "DIFFERS from eager PyTorch"
        print(f"{args.model}/{args.size} ({ops} ops), plan {plan.describe()}")
        how = f"median of {runs}" if per_run == 1 else f"median of {runs} runs of {per_run} steps back to back, each / {per_run}"
        print(f"  step time   {result.step_time_s * 1e3:.2f} ms ({how})")
        if ranks > 1:
            per_rank = ", ".join(f"{statistics.median(t) * 1e3:.2f}" for t in rank_step_times)
            print(f"  ranks       {ranks} processes; each one's own step time (ms, median): {per_rank}")
        print(f"  numerics    {status}: {check.describe()}")
        print(f"  trace       {out}")
        print(f"  chrome      {chrome}  (open in https://ui.perfetto.dev)")
    return 0 if check.ok() else 3


def _cloned(values: dict[int, Any]) -> dict[int, Any]:
    """Fresh copies, so the numerics check starts from the same values the timed steps do."""
    return {v: t.clone() for v, t in values.items()}
