"""`schedlab validate`: run a search's best plans and the baselines on the real executor.

    schedlab validate runs/transformer-default-sgd
    schedlab validate runs/mlp-tiny-sgd --top 5 --repeats 3 --json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from schedlab.cli.common import print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from schedlab.search.validate import DEFAULT_REPEATS, DEFAULT_STEPS, DEFAULT_TOP, DEFAULT_WARMUP

    p = sub.add_parser(
        "validate",
        help="measure a search's best plans and the baselines on the real executor",
        description="Re-capture the searched model, check each of the top-K distinct plans of RUN_DIR's "
        "search and both baselines against eager PyTorch, then time them round-robin (--repeats rounds "
        "of --steps steps after --warmup) and record median, [p25, p75] spread, predicted step time and "
        "speedup over each baseline in RUN_DIR/results.json and in the study. The best validated plan is "
        "the fastest measured one, baselines included.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a run directory written by `schedlab search`")
    p.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="K", help=f"searched plans to validate (default {DEFAULT_TOP})")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="R", help=f"rounds (default {DEFAULT_REPEATS})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="S", help=f"timed steps per round (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="W", help=f"untimed steps per round first (default {DEFAULT_WARMUP})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print results.json's content (plus its path)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.search.run_dir import RunPaths
    from schedlab.search.validate import validate_run

    results = validate_run(
        args.run_dir, top=args.top, repeats=args.repeats, steps=args.steps, warmup=args.warmup,
        progress=not args.no_progress,
    )
    results["paths"] = {"results": str(RunPaths(args.run_dir).results), **results["traces"]}
    if args.json:
        print_json(results)
    else:
        _print(results)
    return 0


def _ms(x: Any) -> str:
    return "     n/a" if x is None else f"{x * 1e3:8.2f}"


def _print(r: dict[str, Any]) -> None:
    print(
        f"{r['model']}/{r['size']}: {len(r['candidates'])} plan(s), {r['repeats']} rounds x {r['steps_per_repeat']} steps "
        "(median [p25, p75], ms)"
    )
    print(f"  {'plan':34s} {'predicted':>9s} {'measured':>9s} {'spread':>19s}  speedup vs baselines")
    for i, c in enumerate(r["candidates"]):
        name = f"baseline {c['baseline']}" if c["baseline"] else f"trial {c['trial']} ({c['strategy']})"
        spread = "" if not c["spread_s"] else f"[{c['spread_s'][0] * 1e3:.2f}, {c['spread_s'][1] * 1e3:.2f}]"
        sp = ", ".join(f"{n} x{x:.2f}" for n, x in c["speedup"].items() if x is not None)
        mark = "*" if i == r["best"] else " "
        print(f"{mark} {name:34s} {_ms(c['predicted_step_time_s'])} {_ms(c['measured_step_time_s'])} {spread:>19s}  {sp}")
        if c["error"]:
            print(f"    ! {c['error']}")
    if r["best"] is None:
        print("  no plan could be measured")
    else:
        if not r["searched_plan_won"]:
            won = "a baseline (no searched plan was faster when measured)"
        elif r.get("beyond_noise"):
            won = "a searched plan, faster than the better baseline beyond the spread of both"
        else:
            won = "a searched plan, but within the spread of the better baseline (not a measurable win)"
        print(f"  best (*): {won}; results in {r['paths']['results']}")
    for note in r["notes"]:
        print(f"  note: {note}")

