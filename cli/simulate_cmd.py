"""`schedlab simulate`: predict a training step of a model under a plan on a machine."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from schedlab.cli.common import (
    TRACES_DIR,
    add_cache_arg,
    add_machine_arg,
    add_model_args,
    capture_model,
    load_plan_arg,
    load_profile,
    print_json,
    resolve_plan_arg,
    slug,
)
from schedlab.errors import SchedlabError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="predict a training step under a plan in the simulator",
        description="Capture MODEL's training step and predict it under the plan on a machine with the "
        "calibrated cost model (the Profile). Writes a simulated trace in the executor's schema.",
    )
    add_model_args(p)
    add_cache_arg(p)
    add_machine_arg(p)
    p.add_argument("--plan", default=None, metavar="PLAN.json", help="plan to simulate (default: PyTorch's own way)")
    p.add_argument("--profile", default=None, metavar="PROFILE", help="cost-model profile (default: traces/profile.json)")
    p.add_argument("--out", default=None, metavar="PATH", help="simulated trace (default: traces/<model>-<size>-<plan>.sim.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.machine import load_machine
    from schedlab.sim import simulate

    machine = load_machine(args.machine)
    profile = load_profile(args.profile, machine_is_host=args.machine in (None, "host"))
    plan = load_plan_arg(args.plan)
    _, captured = capture_model(args, cache=not args.no_cache)
    graph = captured.graph
    resolved = resolve_plan_arg(graph, plan, machine, args.plan, profile)
    result = simulate(graph, resolved, machine, profile.for_graph(graph).for_slots(plan.slots), record=True)
    coverage = profile.coverage(graph)  # ops whose class calibration never measured
    assert result.trace is not None
    out = Path(args.out) if args.out else TRACES_DIR / f"{slug(args.model)}-{args.size}-{args.optimizer}-{plan.hash[:8]}.sim.json"
    trace = dataclasses.replace(result.trace, meta={**result.trace.meta, "workload": args.model, "plan": plan.to_json()})
    trace.save(out)
    chrome = out.with_name(out.name.removesuffix(".json") + ".chrome.json")
    trace.save_chrome(chrome)
    summary = {
        "model": args.model,
        "size": args.size,
        "optimizer": args.optimizer,
        "machine": machine.name,
        "plan": plan.to_json(),
        "ops": len(graph),
        "predicted_step_time_s": result.step_time_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "oom_devices": list(result.oom_devices),
        "sim_wall_s": result.sim_wall_s,
        "engine": result.engine,
        "fallback_ops": {k: coverage[k] for k in ("fallback_ops", "fallback_classes", "fallback_model")},
        "trace": str(out),
        "chrome_trace": str(chrome),
    }
    if args.json:
        print_json(summary)
    else:
        print(f"{args.model}/{args.size} ({len(graph)} ops) on {machine.name}, plan {plan.describe()}  [simulated]")
        print(f"  predicted step  {result.step_time_s * 1e3:.2f} ms")
        for dev, b in result.peak_memory_bytes.items():
            print(f"  peak memory     {dev}: {b / 2**20:.1f} MiB")
        print(f"  simulation took {result.sim_wall_s * 1e3:.1f} ms ({result.engine} engine)")
        if coverage["fallback_ops"]:
            classes = ", ".join(f"{c} x{n}" for c, n in coverage["fallback_classes"].items())
            print(f"  note            {coverage['fallback_ops']} of {coverage['ops']} ops of classes never calibrated "
                  f"({classes}) are costed by the {coverage['fallback_model']}")
        print(f"  trace           {out}")
    if result.oom_devices:
        raise SchedlabError(
            f"plan does not fit: peak memory exceeds the capacity of {', '.join(result.oom_devices)} "
            f"(peak {', '.join(f'{d}={b / 2**30:.2f} GiB' for d, b in result.peak_memory_bytes.items())})"
        )
    return 0
