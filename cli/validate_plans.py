"""`schedlab validate MODEL --plan A.json [--plan B.json ...]`: plan files, checked, measured
and predicted beside the two single-process baselines (`schedlab.search.validate_plans`).

Each plan runs where `schedlab trace` runs it: on one device in this process, or on this
host's local ranks (as many as the plan names, or --devices N), and is simulated on those
ranks as `schedlab simulate` does; a reverse-first-k order runs and is predicted in steady
state, its steps back to back, as both do by default. Unless --no-recalibrate, the
trace calibration a search runs also runs at the start of each round, and each plan is
predicted again from the profile with its op times (`calibrate.round_cal`). The exit status is 3 when a plan file's numerics differ
from eager PyTorch or it could not be run, as `schedlab trace` returns 3.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from schedlab.cli.common import load_plan_arg, load_profile, plan_ranks, plan_step_of, print_json, resolve_plan_arg
from schedlab.errors import SchedlabError


def run_plans(args: argparse.Namespace) -> int:
    from schedlab.calibrate.links import apply_link_fit
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.exec import DEFAULT_TIMEOUT_S
    from schedlab.io import write_json_atomic
    from schedlab.machine import detect_host, host_ranks
    from schedlab.plan import steady_steps
    from schedlab.search.baselines import baseline_plans
    from schedlab.search.validate_plans import PlanCase, validate_plans

    if args.devices is not None and args.devices < 1:
        raise SchedlabError(f"--devices must be >= 1, got {args.devices}")
    plans = [(path, load_plan_arg(path)) for path in args.plan]
    notes: list[str] = []
    profile = None
    if args.profile is not None or DEFAULT_PROFILE_PATH.exists():
        profile = load_profile(args.profile)
    else:
        notes.append(f"no predictions: no profile at {DEFAULT_PROFILE_PATH} (run `schedlab calibrate --quick`, "
                     "or give --profile)")
    steps: dict[tuple[int, int], Any] = {}  # (replicas, micro-batches) -> PlanStep, one capture each

    def step_for(replicas: int, micro_batches: int = 1) -> Any:
        if (replicas, micro_batches) not in steps:
            steps[(replicas, micro_batches)] = plan_step_of(
                args.target, args.size, args.optimizer, args.seed, replicas=replicas, cache=not args.no_cache,
                micro_batches=micro_batches,
            )
        return steps[(replicas, micro_batches)]

    host = detect_host()
    cases = []
    for path, plan in plans:
        machine = host_ranks(args.devices if args.devices is not None else plan_ranks(plan), host)
        if profile is not None:
            machine = apply_link_fit(machine, profile)  # the links a steady-state sequence is weighed by
        step = step_for(plan.replicas, plan.micro_batches)
        resolved = resolve_plan_arg(step.graph, plan, machine, path, profile, steady_steps(plan, None))
        cases.append(PlanCase(path, plan, machine, step, resolved))
    for name, plan in baseline_plans(host).items():
        step = step_for(1)
        cases.append(PlanCase(name, plan, host, step, resolve_plan_arg(step.graph, plan, host, None, profile), baseline=name))
    calibration = None
    if profile is not None and not args.no_recalibrate:
        from schedlab.calibrate.round_cal import RoundCalibration

        full = step_for(1).full
        shapes = sorted({(p.replicas, p.micro_batches) for _, p in plans if p.pipelined} - {(1, 1)})
        calibration = RoundCalibration(full.graph, full.input_values, host, micro_steps=step_for, shapes=shapes)
    results = validate_plans(
        cases, profile=profile, repeats=args.repeats, steps=args.steps, warmup=args.warmup,
        timeout_s=DEFAULT_TIMEOUT_S, workload=args.target, progress=not args.no_progress, notes=notes,
        calibration=calibration,
    )
    results = {
        "model": args.target, "size": args.size, "optimizer": args.optimizer, "seed": args.seed,
        "profile": None if profile is None else str(args.profile or DEFAULT_PROFILE_PATH), **results,
    }
    if args.out:
        results["paths"] = {"results": str(write_json_atomic(Path(args.out), results, indent=1))}
    if args.json:
        print_json(results)
    else:
        _print(results)
    return 0 if all(p["usable"] for p in results["plans"]) else 3


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def _print(r: dict[str, Any]) -> None:
    print(f"{r['model']}/{r['size']}: {len(r['plans'])} plan file(s) and {len(r['baselines'])} baselines, "
          f"{r['repeats']} rounds x {r['steps_per_repeat']} steps (ms: median [p25, p75])")
    print(f"  {'plan':32s} {'ranks':>5s} {'predicted':>9s} {'measured':>9s} {'spread':>17s} {'error':>7s} "
          f"{'recalibrated':>12s}  speedup vs baselines")
    for e in [*r["plans"], *r["baselines"].values()]:
        name = f"baseline {e['name']}" if e["baseline"] else e["name"]
        if e["steps_per_run"] > 1:
            name += f" ({e['steps_per_run']} steps/run)"
        spread = "" if not e["spread_s"] else f"[{_ms(e['spread_s'][0])}, {_ms(e['spread_s'][1])}]"
        err = "" if e["error_pct"] is None else f"{e['error_pct']:+.1f}%"
        recal = "" if e["recalibrated_error_pct"] is None else f"{e['recalibrated_error_pct']:+.1f}%"
        sp = ", ".join(f"{n} x{x:.2f}" for n, x in e["speedup"].items() if x is not None and n != e["baseline"])
        print(f"  {name:32s} {e['ranks']:>5d} {_ms(e['predicted_step_time_s']):>9s} {_ms(e['measured_step_time_s']):>9s} "
              f"{spread:>17s} {err:>7s} {recal:>12s}  {sp}")
        if e["error"]:
            print(f"    ! {e['error']}")
    sources: dict[str, list[str]] = {}
    for e in r["plans"]:
        for dev, label in e["cost_sources"].items():
            if dev not in sources.setdefault(label, []):
                sources[label].append(dev)
    for label, devs in sources.items():
        print(f"  costs of {', '.join(sorted(devs))}: {label}")
    if "paths" in r:
        print(f"  results in {r['paths']['results']}")
    for note in r["notes"]:
        print(f"  note: {note}")
