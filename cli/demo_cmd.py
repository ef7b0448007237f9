"""`schedlab demo`: the whole loop on a built-in default workload (what `make demo` runs).

Quick calibration if no Profile exists yet, search in simulation, validation of the best
candidates and the baselines on this machine, and the report. Each stage is the same
command a user would type, so the demo shows the real interface.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="the whole loop on a built-in default: calibrate (if needed), search, validate, report",
        description="Run the whole loop on one workload: quick calibration if no profile exists, a search "
        "in simulation, validation of the top candidates and the baselines on this machine, and the report.",
    )
    p.add_argument("--model", default="transformer", help="workload (default transformer)")
    p.add_argument("--size", default="default", choices=("tiny", "default"))
    p.add_argument("--trials", type=int, default=150, help="search trials (default 150)")
    p.add_argument("--top", type=int, default=3, help="candidates to validate (default 3)")
    p.add_argument("--profile", default=None, help="profile (default traces/profile.json; made quickly if missing)")
    p.add_argument("--run-dir", default="runs/demo", help="run directory (default runs/demo)")
    p.set_defaults(handler=run)


def _stage(title: str) -> None:
    print(f"\n== {title} ==", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.cli import main

    t0 = time.perf_counter()
    profile = Path(args.profile) if args.profile else DEFAULT_PROFILE_PATH
    if not profile.exists():
        _stage(f"calibrate --quick (no profile at {profile})")
        if rc := main(["calibrate", "--quick", "--out", str(profile)]):
            return rc
    _stage(f"search {args.model}/{args.size} in simulation")
    run_dir = str(args.run_dir)
    if rc := main(["search", args.model, "--size", args.size, "--trials", str(args.trials), "--profile", str(profile), "--run-dir", run_dir]):
        return rc
    _stage("validate the best candidates and the baselines on this machine")
    if rc := main(["validate", run_dir, "--top", str(args.top)]):
        return rc
    _stage("report")
    if rc := main(["report", run_dir]):
        return rc
    index = Path(run_dir) / "report" / "index.html"
    print(f"\nschedlab demo: done in {time.perf_counter() - t0:.0f} s; report: {index.resolve()}")
    return 0
