"""`schedlab fidelity --devices N`: the simulator against the multi-process executor on N
local ranks, over a spread of placed, data-parallel and reverse-first-k plans
(`schedlab.calibrate.rank_fidelity`).

Built-in workloads: trace-calibrated predictions (unless --no-trace-calibration). With
--held-out: profile-only and trace-calibrated side by side, from one set of measurements.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from schedlab.cli.common import plan_steps_of, print_json
from schedlab.cli.fidelity_cmd import (
    DEFAULT_HELDOUT_RANKS_OUT,
    DEFAULT_RANKS_OUT,
    RESUMED_KEYS,
    TAU_RESOLVED_NOTE,
    checkpointed,
    conditions,
    pct,
    resumed,
    say_resuming,
    tau,
)
from schedlab.errors import SchedlabError
from schedlab.workloads import short_name


def run_ranks(args: argparse.Namespace, models: list[str]) -> int:
    from tqdm import tqdm

    from schedlab.calibrate.fidelity import BUSY_FRAC, PROFILE_ONLY, TRACE_CALIBRATED, summarise
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.calibrate.rank_fidelity import (
        rank_fidelity,
        rank_plan_spread,
        rank_results_from_json,
        rank_summary,
    )
    from schedlab.cli.common import load_profile
    from schedlab.exec.launch import RANK_WARMUP
    from schedlab.io import check_writable
    from schedlab.machine import detect_host, host_ranks
    from schedlab.workloads import load_workload

    if args.devices < 2:
        raise SchedlabError(f"--devices must be >= 2 for multi-rank fidelity, got {args.devices}")
    t0 = time.perf_counter()
    out = Path(args.out) if args.out else (DEFAULT_HELDOUT_RANKS_OUT if args.held_out else DEFAULT_RANKS_OUT)
    check_writable(out)  # before minutes of measuring, not after
    names = [n.strip() for item in args.plan_list for n in item.split(",") if n.strip()]
    specs = rank_plan_spread(args.devices, names=names)
    profile = load_profile(args.profile)
    if profile.links is None:
        print("schedlab: warning: the profile has no link fits (run `schedlab calibrate --links`); the simulator "
              "uses the machine's loopback defaults and charges communication ops a compute op's dispatch",
              file=sys.stderr)
    methods = (PROFILE_ONLY, TRACE_CALIBRATED) if args.held_out else (
        (PROFILE_ONLY,) if args.no_trace_calibration else (TRACE_CALIBRATED,))
    machine = detect_host()
    ranks = host_ranks(args.devices, machine)
    links = profile.links
    fresh = {
        **conditions("held-out" if args.held_out else "built-in", args, machine),
        "devices": args.devices,
        "rank_cores": [d.cores for d in ranks.devices],
        "profile": str(args.profile or DEFAULT_PROFILE_PATH),
        "profile_created_unix_s": profile.created_unix_s,
        "link_model": "machine" if links is None else "fit",
        "host_costs": links is not None and links.host_costs is not None,
        "methods": list(methods),
        "trace_calibration": TRACE_CALIBRATED in methods,
        "plans_per_model": len(specs),
        "warmup_per_plan": RANK_WARMUP,
        "plan_specs": [{"name": s.name, "kind": s.kind, "placement": s.placement, "replicas": s.n_replicas(args.devices),
                        "bucket_mb": s.bucket_mb, "order": s.order, "threads": s.threads, "steps": s.steps,
                        "schedule": s.schedule, "micro_batches": s.micro_batches}
                       for s in specs],
        "note": "errors are fractions (predicted / measured - 1); trace-calibrated: the profile plus the op times "
        "of one-process one-thread program-order runs of the model's full and per-replica steps (no scored plan; "
        "with rounds, one run per round); "
        "profile-only: the profile alone",
    }
    before = resumed(out, fresh, args, (*RESUMED_KEYS, "devices", "methods", "plan_specs")) or {}
    results = [r for r in (rank_results_from_json(before) if before else []) if r.workload in models]
    done = [r.workload for r in results]
    skipped: dict[str, list[str]] = {k: v for k, v in before.get("skipped_plans", {}).items() if k in done}
    todo = [m for m in models if m not in done]
    main = methods[-1]

    def checkpoint() -> dict[str, Any]:
        rows = [r for res in results for r in res.rows[main]]
        errs = [r.error for r in rows]
        summary = rank_summary(results, methods)
        workloads = []
        for s, res in zip(summarise(rows), results, strict=True):
            entry = next(m for m in summary["models"] if m["workload"] == res.workload)
            workloads.append({**s.__dict__, "kinds": entry[main.replace("-", "_")]["kinds"]})
        body = {
            **fresh,
            "skipped_plans": skipped,
            "mape": statistics.fmean(abs(e) for e in errs),
            "mape_unseen_plans": statistics.fmean(abs(e) for e in errs),
            "worst_error": max(errs, key=abs),
            "workloads": workloads,
            **summary,
            "busy_frac": BUSY_FRAC,
            "busy_plans": [f"{r.workload}/{r.plan}" for r in rows if (r.foreign_cpu_frac or 0.0) > BUSY_FRAC],
        }
        return checkpointed(out, body, before, t0, done, models)

    say_resuming(out, done, todo)
    result: dict[str, Any] | None = None
    with tqdm(total=len(todo) * len(specs) * args.rounds, desc=f"fidelity on {args.devices} ranks", unit="plan",
              file=sys.stderr, disable=None) as bar:
        for model in todo:
            bar.set_postfix_str(model)
            step_of = plan_steps_of(model, args.size, args.optimizer)

            batches = [t.shape[0] for t in load_workload(model, args.size, seed=0).inputs if t.dim()]  # no capture
            fitting = [sp for sp in specs if all(b % (sp.n_replicas(args.devices) * sp.micro_batches) == 0
                                                 for b in batches)]
            left_out = [sp.name for sp in specs if sp not in fitting]
            if left_out:
                skipped[model] = left_out
                bar.update(len(left_out) * args.rounds)
                print(f"schedlab fidelity: {model}: left out {', '.join(left_out)}: its batch does not split into "
                      "their replicas x micro-batches", file=sys.stderr)
            if not fitting:
                continue
            results.append(rank_fidelity(
                model, step_of, fitting, profile, args.devices, methods=methods, steps=args.steps,
                progress=lambda: bar.update(1), rounds=args.rounds,
            ))
            done.append(model)
            result = checkpoint()
    if not results:
        raise SchedlabError("no plan of the spread fits any of these models' batches; give other --plans or --size")
    if result is None:  # every model came from the resumed file
        result = checkpoint()
    if args.json:
        print_json(result)
        return 0
    print_ranks(result, machine.host.get("cpu_model"), out)
    return 0


def print_ranks(result: dict[str, Any], cpu: Any, out: Path) -> None:
    methods = result["methods"]
    keys = [m.replace("-", "_") for m in methods]
    print(f"fidelity on {result['devices']} local ranks of {cpu} ({result['cores']} cores; rank cores "
          f"{result['rank_cores']}), size {result['size']}, {result['steps_per_plan']} steps/plan after "
          f"{result.get('warmup_per_plan', 1)} untimed"
          f"{', in ' + str(result['rounds']) + ' rounds' if result.get('rounds', 1) > 1 else ''}, links: "
          f"{'fitted' if result['link_model'] == 'fit' else 'machine defaults'}"
          f"{', host costs measured' if result['host_costs'] else ''}")
    head = "".join(f"{m + ' ms':>20}{'error':>8}" for m in methods)
    print(f"{'workload':<26}{'plan':<22}{'kind':<17}{'measured ms':>12}{head}{'others':>8}")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for r in result["plans"]:
        by_key.setdefault((r["workload"], r["plan"]), {})[r["method"]] = r
    for (workload, plan), per in by_key.items():
        first = per[methods[0]]
        cells = "".join(f"{per[m]['predicted_s'] * 1e3:>20.2f}{pct(per[m]['error'], 8)}" for m in methods)
        print(f"{short_name(workload):<26}{plan:<22}{first['plan_kind']:<17}{first['measured_s'] * 1e3:>12.2f}"
              f"{cells}{pct(first.get('foreign_cpu_frac'), 8)}")
    print()
    print(f"{'workload':<26}{'kind':<17}" + "".join(f"{m + ': MAPE':>24}{'worst':>8}{'tau':>7}{'tau*':>7}" for m in methods))
    for m in result["models"]:
        kinds = ["all", *m[keys[0]]["kinds"]]
        for k in kinds:
            cells = ""
            for key in keys:
                e = m[key] if k == "all" else m[key]["kinds"][k]
                cells += (f"{pct(e['mape'], 24)}{pct(e['worst_error'], 8)}{tau(e['kendall_tau'], 7)}"
                          f"{tau(e.get('kendall_tau_resolved'), 7)}")
            print(f"{short_name(m['workload']) if k == 'all' else '':<26}{k:<17}{cells}")
    for key, method in zip(keys, methods, strict=True):
        o = result["overall"][key]
        per_kind = ", ".join(f"{k} {pct(v['mape'], 6).strip()} (tau {tau(v['median_kendall_tau'], 4).strip()})"
                             for k, v in o["kinds"].items())
        print(f"{method}: all plans MAPE {pct(o['mape'], 6).strip()}, median tau {tau(o['median_kendall_tau'], 4).strip()} "
              f"(tau* {tau(o.get('median_kendall_tau_resolved'), 4).strip()}); {per_kind}")
    print(TAU_RESOLVED_NOTE)
    print("others: share of the CPU other processes used while the plan was measured")
    busy = result["busy_plans"]
    if busy:
        print(f"warning: {len(busy)} plans measured while other processes used over {result['busy_frac']:.0%} of the "
              f"CPU; their times are unreliable: {', '.join(busy[:5])}{' ...' if len(busy) > 5 else ''}")
    print(f"results: {out}   (draw them: schedlab report {out})")
