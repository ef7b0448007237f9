"""`schedlab validate`: run plans on the real executor beside the baselines, and predict them.

Two forms:

    schedlab validate RUN_DIR [--top K]           # a search's best plans (search.validate)
    schedlab validate MODEL --plan A.json [--plan B.json ...] [--devices N]   # plan files (search.validate_plans)

    schedlab validate runs/transformer-default-sgd
    schedlab validate runs/mlp-tiny-sgd --top 5 --repeats 3 --json
    schedlab validate mlp --size tiny --plan one.json --plan two-ranks.json --out validation.json

The first argument is a run directory (one with run.json) without --plan, and a model
with --plan; anything else is one error that says which form to use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from schedlab.cli.common import add_cache_arg, add_model_options, print_json
from schedlab.errors import SchedlabError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from schedlab.exec.launch import RANK_WARMUP
    from schedlab.search.validate import DEFAULT_REPEATS, DEFAULT_STEPS, DEFAULT_TOP, DEFAULT_WARMUP

    p = sub.add_parser(
        "validate",
        help="measure a search's best plans, or plan files, and the baselines on the real executor",
        description="With RUN_DIR: re-capture the searched model, check each of the top-K distinct plans of "
        "RUN_DIR's search and both baselines against eager PyTorch, then time them round-robin (--repeats rounds "
        "of --steps steps after --warmup) and record median, [p25, p75] spread, predicted step time and "
        "speedup over each baseline in RUN_DIR/results.json and in the study. The best validated plan is "
        "the fastest measured one, baselines included. With MODEL --plan PLAN.json (repeatable): the same for "
        "each plan file, multi-device and data-parallel plans on local ranks included, with each plan's "
        "simulated step and the prediction's error; results to --out.",
    )
    p.add_argument("target", metavar="RUN_DIR | MODEL",
                   help="a run directory written by `schedlab search`, or (with --plan) a model as `simulate` takes it")
    p.add_argument("--plan", action="append", default=[], metavar="PLAN.json",
                   help="a plan file to validate on MODEL (repeat for several)")
    add_model_options(p)
    add_cache_arg(p)
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="with --plan: run every plan on N local ranks (default: as many as each plan names)")
    p.add_argument("--profile", default=None, metavar="PROFILE",
                   help="with --plan: the Profile that predicts the plans and ranks critical-path orders "
                   "(default: traces/profile.json; without one, no predictions)")
    p.add_argument("--out", default=None, metavar="PATH", help="with --plan: write the results JSON here")
    p.add_argument("--top", type=int, default=None, metavar="K", help=f"with RUN_DIR: searched plans to validate (default {DEFAULT_TOP})")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="R", help=f"rounds (default {DEFAULT_REPEATS})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="S", help=f"timed steps per round (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=None, metavar="W",
                   help=f"untimed steps per round first (default {DEFAULT_WARMUP}; {RANK_WARMUP} for a plan on several "
                   "ranks, whose first steps are slow)")
    p.add_argument("--no-recalibrate", action="store_true",
                   help="placement runs and plan files: do not run the search's calibration steps again at the start "
                   "of each round (by default they run, and every plan is also predicted from their op times: "
                   "recalibrated_error_pct, what the simulator misses once the host's drift since the search is "
                   "taken out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the results as JSON (with RUN_DIR: results.json's content plus its path)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    is_run_dir = (Path(args.target) / "run.json").is_file()
    if args.plan:
        if is_run_dir:
            raise SchedlabError(
                f"{args.target} is a run directory: `schedlab validate {args.target}` validates its search's plans; "
                "to validate plan files give a MODEL, e.g. `schedlab validate mlp --plan PLAN.json`"
            )
        if Path(args.target).is_dir():
            raise SchedlabError(f"{args.target} is a directory, not a MODEL: --plan PLAN.json validates plan files "
                                "on a model, e.g. `schedlab validate mlp --plan PLAN.json`")
        if args.top is not None:
            raise SchedlabError("--top picks a run directory's searched plans; with --plan every plan file is validated")
        from schedlab.cli.validate_plans import run_plans

        return run_plans(args)
    given = [flag for flag, v in (("--devices", args.devices), ("--profile", args.profile), ("--out", args.out)) if v is not None]
    if given:
        raise SchedlabError(f"{', '.join(given)} go with --plan PLAN.json; a run directory's validation takes none")
    if not Path(args.target).is_dir():
        raise SchedlabError(
            f"{args.target!r} is not a run directory; give a directory written by `schedlab search`, or a MODEL "
            f"with plan files: `schedlab validate {args.target} --plan PLAN.json`"
        )
    return _run_dir(args)


def _run_dir(args: argparse.Namespace) -> int:
    from schedlab.exec.launch import warmup_for
    from schedlab.search.run_dir import RunPaths, read_run
    from schedlab.search.validate import DEFAULT_TOP, validate_run

    run_dir = Path(args.target)
    from schedlab.search.placement.validate import is_placement_run

    config = read_run(run_dir)
    if is_placement_run(config) and config.backend != "tensorflow":
        return _placement_run_dir(args, run_dir)
    args.warmup = warmup_for(False, args.warmup)  # one process
    if config.backend == "tensorflow":
        from schedlab.cli.search_tf import run_tf_validate

        return run_tf_validate(args, run_dir, config)
    results = validate_run(
        run_dir, top=DEFAULT_TOP if args.top is None else args.top, repeats=args.repeats, steps=args.steps,
        warmup=args.warmup, progress=not args.no_progress,
    )
    results["paths"] = {"results": str(RunPaths(run_dir).results), **results["traces"]}
    if args.json:
        print_json(results)
    else:
        print_results(results)
    return 0


def _placement_run_dir(args: argparse.Namespace, run_dir: Path) -> int:
    """A placement search's winners, one per strategy, on this host's ranks beside the baselines."""
    from schedlab.exec import DEFAULT_TIMEOUT_S
    from schedlab.search.placement.validate import validate_placement_run
    from schedlab.search.run_dir import RunPaths

    r = validate_placement_run(run_dir, repeats=args.repeats, steps=args.steps, warmup=args.warmup,
                               timeout_s=DEFAULT_TIMEOUT_S, progress=not args.no_progress,
                               top=3 if args.top is None else args.top, recalibrate=not args.no_recalibrate)
    r["paths"] = {"results": str(RunPaths(run_dir).results), **r["traces"]}
    if args.json:
        print_json(r)
        return 0
    what = {"schedule": "pipeline-schedule winners", "all": "placement and schedule winners"}.get(
        r["space"], "placement winners")
    print(f"{r['model']}/{r['size']}: {what} on {len(r['rank_machine']['devices'])} local ranks and the "
          f"one-process baselines, {r['repeats']} rounds x {r['steps_per_repeat']} steps (median [p25, p75], ms)")
    print(f"  {'plan':34s} {'ranks':>5s} {'predicted':>9s} {'measured':>9s} {'spread':>19s} {'error':>7s}"
          f" {'recalibrated':>12s}")
    for i, c in enumerate(r["candidates"]):
        name = f"baseline {c['baseline']}" if c["baseline"] else f"trial {c['trial']} ({', '.join(c['strategies'])})"
        spread = "" if not c["spread_s"] else f"[{c['spread_s'][0] * 1e3:.2f}, {c['spread_s'][1] * 1e3:.2f}]"
        mark = "*" if i == r["best"] else " "
        print(f"{mark} {name:34s} {c['ranks']:>5d} {_ms(c['predicted_step_time_s'])} {_ms(c['measured_step_time_s'])} "
              f"{spread:>19s} {_pct(c['error_pct']):>7s} {_pct(c.get('recalibrated_error_pct')):>12s}")
        if c["error"]:
            print(f"    ! {c['error']}")
    print(f"  results in {r['paths']['results']}")
    return 0


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1f}%"


def _ms(x: Any) -> str:
    return "     n/a" if x is None else f"{x * 1e3:8.2f}"


def print_results(r: dict[str, Any]) -> None:
    """results.json of a run directory, as a table."""
    print(
        f"{r['model']}/{r['size']}: {len(r['candidates'])} plan(s), {r['repeats']} rounds x {r['steps_per_repeat']} steps "
        "(median [p25, p75], ms)"
    )
    print(f"  {'plan':34s} {'predicted':>9s} {'measured':>9s} {'spread':>19s}  speedup vs baselines")
    for i, c in enumerate(r["candidates"]):
        name = f"baseline {c['baseline']}" if c["baseline"] else f"trial {c['trial']} ({c['strategy']})"
        if c.get("tf_threads"):
            t = c["tf_threads"]
            name += f" i{t['intra_op'] or '-'}/e{t['inter_op'] or '-'}"
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
