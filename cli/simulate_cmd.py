"""`schedlab simulate`: predict a training step of a model under a plan on a machine.

A plan that places ops on several devices, or has replicas, is simulated as the executor
runs it: its expanded graph, one process per rank (`schedlab.sim.model`). Without
--machine, such a plan runs on this host's local ranks (`host_ranks(N)`), N from the
cpu0..cpu{K-1} it names times its replicas (or --devices N), with the Profile's fitted
links when it has them.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from schedlab.cli.common import (
    TRACES_DIR,
    add_cache_arg,
    add_machine_arg,
    add_model_args,
    capture_for_plan,
    load_plan_arg,
    load_profile,
    plan_ranks,
    print_json,
    resolve_plan_arg,
    slug,
)
from schedlab.cli.trace_tf import add_tf_args
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
    p.add_argument(
        "--devices", type=int, default=None, metavar="N",
        help="simulate this host as N local ranks, one CPU device each (cpu0..cpu{N-1}); default: as many as the "
        "plan needs (the cpuK it names, times its replicas)",
    )
    p.add_argument("--profile", default=None, metavar="PROFILE", help="cost-model profile (default: traces/profile.json)")
    p.add_argument(
        "--steps", type=int, default=None, metavar="S",
        help="simulate S steps back to back in steady state (the next step's forward may overlap this step's "
        "gradient communication) and predict their mean; default 1, or 5 for a reverse-first-k order (as `trace` runs it)",
    )
    p.add_argument("--out", default=None, metavar="PATH", help="simulated trace (default: traces/<model>-<size>-<plan>.sim.json)")
    add_tf_args(p)
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="with --backend tensorflow: the TF search whose graph and cost model predict the setting "
                   "(default runs/MODEL-SIZE-OPTIMIZER-tf)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    p.set_defaults(handler=run)


def simulated_machine(args: argparse.Namespace, plan: Any) -> Any:
    """--machine as given; else this host, as the local ranks the plan needs (or --devices)."""
    from schedlab.machine import load_machine

    if args.devices is not None and args.devices < 1:
        raise SchedlabError(f"--devices must be >= 1, got {args.devices}")
    if args.machine not in (None, "host"):
        return load_machine(args.machine, args.devices)
    n = args.devices if args.devices is not None else plan_ranks(plan)
    return load_machine(None, devices=n if n > 1 else None)


def run(args: argparse.Namespace) -> int:
    if args.backend == "tensorflow":
        from schedlab.cli.search_tf import run_tf_simulate

        return run_tf_simulate(args)
    if args.intra_op is not None or args.inter_op is not None or args.tf_recommended or args.run_dir:
        raise SchedlabError("--intra-op, --inter-op, --tf-recommended and --run-dir are for --backend tensorflow")
    from schedlab.calibrate.links import apply_link_fit
    from schedlab.graph import OpKind
    from schedlab.plan import steady_steps
    from schedlab.sim import simulate

    plan = load_plan_arg(args.plan)
    steps = steady_steps(plan, args.steps)
    machine = simulated_machine(args, plan)
    profile = load_profile(args.profile, machine_is_host=args.machine in (None, "host"))
    if args.machine in (None, "host"):
        machine = apply_link_fit(machine, profile)  # measured loopback links between local ranks
    step = capture_for_plan(args, plan.replicas, cache=not args.no_cache, micro_batches=plan.micro_batches)
    graph = step.graph
    resolved = resolve_plan_arg(graph, plan, machine, args.plan, profile, steps)
    run_graph = resolved.run_graph(graph)
    result = simulate(graph, resolved, machine, profile.for_graph(graph).for_slots(plan.slots), record=True)
    coverage = profile.coverage(graph)  # ops whose class calibration never measured
    assert result.trace is not None
    out = Path(args.out) if args.out else TRACES_DIR / f"{slug(args.model)}-{args.size}-{args.optimizer}-{plan.hash[:8]}.sim.json"
    trace = dataclasses.replace(result.trace, meta={**result.trace.meta, "workload": args.model, "plan": plan.to_json()})
    trace.save(out)
    chrome = out.with_name(out.name.removesuffix(".json") + ".chrome.json")
    trace.save_chrome(chrome)
    links = "fit" if getattr(profile, "links", None) is not None else "machine"
    per_rank: list[dict[str, Any]] = [
        {"rank": p, "devices": list(r.devices), "ops": r.ops, "end_s": r.end_s, "lock_busy_s": r.lock_busy_s,
         "busy_core_s": r.busy_core_s, "sent_bytes": r.sent_bytes}
        for p, r in sorted(result.ranks.items())
    ]
    summary = {
        "model": args.model,
        "size": args.size,
        "optimizer": args.optimizer,
        "machine": machine.name,
        "plan": plan.to_json(),
        "ops": len(run_graph),
        "predicted_step_time_s": result.step_time_s,
        "steps": steps,  # back to back in steady state; the prediction is their mean
        "peak_memory_bytes": result.peak_memory_bytes,
        "oom_devices": list(result.oom_devices),
        "sim_wall_s": result.sim_wall_s,
        "engine": result.engine,
        "ranks": len(result.ranks),
        "per_rank": per_rank,
        "transfers": {"count": result.transfer_count, "bytes": result.transfer_bytes},
        "collectives": result.collective_count,
        "link_model": links,  # "fit": the Profile's measured links; "machine": the machine description's
        "cost_sources": result.cost_sources,  # device -> which model costed its kernels (sim.device_cost)
        "fallback_ops": {k: coverage[k] for k in ("fallback_ops", "fallback_classes", "fallback_model")},
        "trace": str(out),
        "chrome_trace": str(chrome),
    }
    if args.json:
        print_json(summary)
    else:
        comm_ops = sum(1 for op in run_graph.ops if op.kind is OpKind.COMM)
        comm = f", {comm_ops} communication ops" if comm_ops else ""
        seq = f", {steps} steps back to back" if steps > 1 else ""
        pools = "".join(f" ({sum(d.core_pool == name for d in machine.devices)} ranks sharing {cores} cores)"
                        for name, cores in machine.core_pools.items())
        print(f"{args.model}/{args.size} ({len(run_graph)} ops{comm}{seq}) on {machine.name}{pools}, plan {plan.describe()}"
              "  [simulated]")
        print(f"  predicted step  {result.step_time_s * 1e3:.2f} ms{' (mean over the steady-state sequence)' if steps > 1 else ''}")
        if len(result.ranks) > 1:
            for r in per_rank:
                print(f"  {'rank ' + str(r['rank']):<16}{','.join(r['devices'])}: {r['ops']} ops, ends {r['end_s'] * 1e3:.2f} ms, "
                      f"lock busy {r['lock_busy_s'] * 1e3:.2f} ms, kernels {r['busy_core_s'] * 1e3:.2f} core-ms, "
                      f"sent {_size(r['sent_bytes'])}")
            print(f"  transfers       {result.transfer_count} ({_size(result.transfer_bytes)}), "
                  f"{result.collective_count} all-reduce(s); links: "
                  f"{'fitted by calibration' if links == 'fit' else 'as the machine describes them'}")
        for dev, b in result.peak_memory_bytes.items():
            print(f"  peak memory     {dev}: {b / 2**20:.1f} MiB")
        print(f"  simulation took {result.sim_wall_s * 1e3:.1f} ms ({result.engine} engine)")
        for dev, source in result.cost_sources.items():
            print(f"  costs of {dev:<7} {source}")
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


def _size(nbytes: int) -> str:
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.1f} KiB"
    return f"{nbytes / 2**20:.2f} MiB"
