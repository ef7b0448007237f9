"""`schedlab fidelity`: simulator vs executor over the built-in workloads and a spread of plans."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from schedlab.cli.common import TRACES_DIR, print_json
from schedlab.workloads import BUILTIN_WORKLOADS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fidelity",
        help="how well the simulator predicts the executor (MAPE, worst error, Kendall tau, sim speed)",
        description="For each workload and each plan of a spread (slots 1 and 2, threads 1 and 2, every order "
        "policy), measure the step on the executor and predict it in the simulator; report per-plan errors, "
        "per-workload MAPE, worst error, Kendall rank correlation, and the simulator's speed.",
    )
    p.add_argument("models", nargs="*", default=list(BUILTIN_WORKLOADS), metavar="MODEL", help="workloads (default: all built-in)")
    p.add_argument("--size", choices=("tiny", "default"), default="default")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--profile", default=None, metavar="PROFILE", help="profile (default: traces/profile.json)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per plan (default 5)")
    p.add_argument(
        "--no-trace-calibration",
        action="store_true",
        help="predict from the profile alone, without first learning op times from calibration traces",
    )
    p.add_argument("--out", default=str(TRACES_DIR / "fidelity.json"), help="results file (default traces/fidelity.json)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schedlab.calibrate.fidelity import measure_and_predict, plan_spread, summarise
    from schedlab.calibrate.trace_cal import calibrate_with_traces
    from schedlab.capture import capture
    from schedlab.cli.simulate_cmd import load_profile
    from schedlab.io import write_json_atomic
    from schedlab.machine import detect_host
    from schedlab.trace import library_versions
    from schedlab.workloads import load_workload

    t0 = time.perf_counter()
    machine = detect_host()
    base_profile = load_profile(args.profile)
    plans = plan_spread(machine.default_device.cores)
    cal_threads = () if args.no_trace_calibration else tuple(sorted({1, machine.default_device.cores}))
    rows = []
    with tqdm(total=len(args.models) * len(plans), desc="fidelity", unit="plan", file=sys.stderr, disable=None) as bar:
        for model in args.models:
            bar.set_postfix_str(model)
            w = load_workload(model, args.size)
            c = capture(w, args.optimizer)
            profile = base_profile
            if cal_threads:
                profile = calibrate_with_traces(profile, c.graph, c.input_values, machine, steps=args.steps)
            rows += measure_and_predict(
                model, c.graph, c.input_values, plans, profile, machine, steps=args.steps,
                calibration_threads=cal_threads, progress=lambda: bar.update(1),
            )
    summary = summarise(rows)
    errs = [abs(r.error) for r in rows]
    unseen = [abs(r.error) for r in rows if not r.in_calibration]
    result = {
        "machine": machine.host,
        "versions": library_versions(),
        "size": args.size,
        "optimizer": args.optimizer,
        "steps_per_plan": args.steps,
        "trace_calibration": bool(cal_threads),
        "mape": sum(errs) / len(errs),
        "mape_unseen_plans": sum(unseen) / len(unseen) if unseen else None,
        "worst_error": max((r.error for r in rows), key=abs),
        "workloads": [s.__dict__ for s in summary],
        "plans": [{**r.__dict__, "error": r.error} for r in rows],
        "wall_s": time.perf_counter() - t0,
    }
    write_json_atomic(Path(args.out), result, indent=1)
    if args.json:
        print_json(result)
        return 0
    print(f"fidelity on {machine.host.get('cpu_model')} ({machine.default_device.cores} cores), size {args.size}, "
          f"{args.steps} steps/plan, trace calibration {'on' if cal_threads else 'off'}")
    print(f"{'workload':<12}{'plan':<24}{'measured ms':>12}{'predicted ms':>13}{'error':>8}")
    for r in rows:
        mark = "*" if r.in_calibration else " "
        print(f"{r.workload:<12}{r.plan:<24}{r.measured_s * 1e3:>12.2f}{r.predicted_s * 1e3:>13.2f}{r.error * 100:>7.1f}%{mark}")
    print()
    print(f"{'workload':<12}{'MAPE':>8}{'worst':>8}{'tau':>7}{'sim ops/s':>12}{'exec/sim':>10}{'(cold)':>9}")
    for s in summary:
        print(
            f"{s.workload:<12}{s.mape * 100:>7.1f}%{s.worst_error * 100:>7.1f}%{s.kendall_tau:>7.2f}"
            f"{s.sim_ops_per_s:>12.0f}{s.exec_over_sim:>9.1f}x{s.exec_over_sim_cold:>8.1f}x"
        )
    print(f"overall MAPE {result['mape'] * 100:.1f}% (unseen plans {float(result['mape_unseen_plans'] or 0) * 100:.1f}%), "
          f"worst {float(result['worst_error']) * 100:.1f}%   (* = plan shape used in trace calibration)")
    print("exec/sim: measured step time over simulation time, with the Simulator a search reuses; "
          "(cold): a simulate() call that builds the graph structure anew")
    print(f"results: {args.out}")
    return 0
