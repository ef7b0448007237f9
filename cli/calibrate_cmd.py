"""`schedlab calibrate`: measure this machine and write the Profile `simulate` reads.

    schedlab calibrate                 # full calibration (what `make calibrate` runs)
    schedlab calibrate --quick         # short version for tests and CI (~1 minute on 2 cores)
    schedlab calibrate --quick --out /tmp/p.json --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BUSY_MACHINE_FRAC = 0.10  # other processes' CPU share above which timings are suspect


def add_arguments(p: argparse.ArgumentParser) -> None:
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH

    p.add_argument("--quick", action="store_true", help="short calibration (tiny workloads, small sweep)")
    p.add_argument(
        "--out",
        metavar="PROFILE",
        type=Path,
        default=DEFAULT_PROFILE_PATH,
        help=f"where to write the Profile (default: {DEFAULT_PROFILE_PATH}, where simulate looks)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "calibrate",
        help="microbenchmark this machine and write a Profile",
        description="Microbenchmark the op classes the workloads use over shapes and thread counts, "
        "measure the executor's dispatch cost and co-run slowdowns, fit a cost model per op class "
        "and write a Profile (versioned JSON) with held-out errors.",
    )
    add_arguments(p)
    p.set_defaults(handler=run)


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def summary(profile: Any, path: Path, wall_s: float) -> dict[str, Any]:
    """What `--json` prints: where the Profile went, held-out errors (percent), figures."""
    classes = {
        cls: {
            "heldout_mape": _r1(fit.heldout_mape),
            "heldout_wape": _r1(fit.heldout_wape),
            "model": fit.model_name,
            "n_signatures": fit.n_signatures,
        }
        for cls, fit in sorted(profile.classes.items())
    }
    return {
        "path": str(path),
        "quick": profile.quick,
        "classes": classes,
        "fallback_heldout_mape": _r1(profile.fallback.heldout_mape),
        "dispatch_us": profile.dispatch.to_json(),
        "corun": profile.corun.to_json(),
        "roofline": None if profile.roofline is None else profile.roofline.to_json(),
        "context_us": {
            "warm_median": round(profile.context.warm_fallback_us, 2),
            "first_use_median": round(profile.context.first_use_fallback_us, 2),
        },
        "coverage_models": profile.meta.get("coverage", []),
        "signatures": len(profile.signatures),
        "view_signatures": len(profile.views.signatures),
        "foreign_cpu_frac": profile.meta.get("foreign_cpu_frac"),
        "failures": len(profile.meta.get("failures", [])),
        "contended_points": profile.meta.get("contended_points", 0),
        "wall_s": round(wall_s, 1),
    }


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.1f}"


def _print_table(s: dict[str, Any]) -> None:
    print(f"profile written to {s['path']} ({'quick' if s['quick'] else 'full'}, {s['wall_s']} s)")
    print(f"{'op class':34s} {'model':20s} {'sigs':>5s} {'MAPE%':>6s} {'WAPE%':>6s}  (held out)")
    for cls, c in s["classes"].items():
        print(f"{cls:34s} {c['model']:20s} {c['n_signatures']:5d} {_fmt(c['heldout_mape'])} {_fmt(c['heldout_wape'])}")
    print(f"{'(fallback, memory-bound pool)':34s} {'':20s} {'':5s} {_fmt(s['fallback_heldout_mape'])}")
    d, c = s["dispatch_us"], s["corun"]
    print(
        f"dispatch: {d['op_us']:.2f} us/op, {d['view_us']:.2f} us/view with one slot; {d['corun_op_us']:.2f} us/op "
        f"with two slots on one chain of tiny ops, {d['corun_contended_op_us']:.2f} on two (bare call floor "
        f"{d['call_floor_us']:.2f} us)"
    )
    print(
        f"co-run slowdown: memory-bound x{c['mem_slowdown']:.2f}, compute-bound x{c['compute_slowdown']:.2f}, "
        f"tiny ops (interpreter lock) x{c['gil_slowdown']:.2f}; kernels up to {c['serial_window_us']:.1f} us run in turn; "
        f"co-run wait per op {', '.join(f'{v:.1f} us ({k} thr)' for k, v in c['latency_us'].items()) or 'not fitted'}"
    )
    if s["roofline"]:
        r = s["roofline"]
        print(
            "roofline (classes never measured): "
            + ", ".join(f"{k} thr {r['gflops'][k]:.0f} GFLOP/s {r['gbps'][k]:.1f} GB/s" for k in r["gflops"])
            + f", +{r['a_us']:.2f} us per call"
        )
    x = s["context_us"]
    print(f"in a step, beyond a benchmark: +{x['warm_median']:.2f} us per op (median), +{x['first_use_median']:.2f} us "
          f"more for the first op of its kind; {s['view_signatures']} view signatures measured")


def run(args: argparse.Namespace) -> int:
    """Run the calibration and write the Profile; print a summary."""
    from schedlab.calibrate.run import run_calibration
    from schedlab.io import check_writable

    check_writable(args.out)  # before the measuring, not after
    t0 = time.perf_counter()
    profile = run_calibration(quick=args.quick, out=args.out, progress=not getattr(args, "no_progress", False))
    s = summary(profile, args.out, time.perf_counter() - t0)
    busy = s["foreign_cpu_frac"]
    if busy is not None and busy > BUSY_MACHINE_FRAC:
        print(
            f"warning: other processes used {busy:.0%} of the CPU while calibrating; timings (two-thread "
            "and co-run ones above all) are unreliable: re-run on an idle machine",
            file=sys.stderr,
        )
    if s["contended_points"]:
        print(
            f"note: {s['contended_points']} multi-thread point(s) stayed slow while another process held a core "
            "and were left out (their thread scaling comes from the class model)",
            file=sys.stderr,
        )
    if s["failures"]:
        print(f"warning: {s['failures']} op(s) could not be benchmarked; see meta.failures in the profile", file=sys.stderr)
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        _print_table(s)
    return 0
