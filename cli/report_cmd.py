"""`schedlab report`: paper-style figures of a run directory (or a suite), from stored data only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedlab.cli.common import print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
        help="draw the figures of a run directory (PNG + PDF) and an index page",
        description="Read a run directory (written by `schedlab search` and `schedlab validate`), or a suite "
        "(a directory of run directories), and draw from the stored files only: the speedup of the best "
        "validated plan over each baseline per workload, predicted vs measured step time, a Gantt chart of "
        "the best plan (simulated and measured), op thread-scaling curves (fitted model vs measured), and "
        "the optimisation history. Writes PNG and PDF per figure, index.html and figures.json into "
        "RUN_DIR/report/. A figure whose data is missing is skipped with a note on the index page. "
        "Given a results file of `schedlab fidelity` (traces/fidelity.json, or traces/fidelity-heldout.json from "
        "`schedlab fidelity --held-out`) instead of a run directory, draws the simulator-fidelity figure: "
        "predicted vs measured step time of every plan, coloured by model, one panel per kind of prediction "
        "(profile-only, trace-calibrated), into RESULTS-report/ beside the file. Given the saved JSON of "
        "`schedlab bench MODEL ... --backend tensorflow --json`, draws each workload's step time in TensorFlow, "
        "eager PyTorch and schedlab's executor side by side.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR",
        help="run directory, a suite of run directories, a `schedlab fidelity` results file (.json), or a saved "
        "`schedlab bench --backend tensorflow --json`",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR",
        help="report folder (default: RUN_DIR/report; for a fidelity results file, RESULTS-report beside it)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object describing the report")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.reports import build_report

    report = build_report(Path(args.run_dir), args.out)
    if args.json:
        print_json(
            {
                "index": str(report.index),
                "figures_json": str(report.figures_json),
                "figures": [
                    {"name": r.name, "run": r.run, "files": [str(f) for f in r.files], "basis": r.basis}
                    for r in report.figures
                ],
                "skipped": [{"name": s.name, "run": s.run, "reason": s.reason} for s in report.skipped],
            }
        )
        return 0
    from schedlab.reports.figures.framework_bench import NAME as BENCH_FIGURE

    runs = report.suite.runs
    is_bench = any(r.name == BENCH_FIGURE for r in report.figures) or any(s.name == BENCH_FIGURE for s in report.skipped)
    what = (f"suite of {len(runs)} runs" if report.suite.is_suite else runs[0].workload if runs
            else f"{'TensorFlow bench' if is_bench else 'fidelity results'} {report.suite.root.name}")
    print(f"report of {what}: {len(report.figures)} figure(s), PNG and PDF, in {report.out_dir}")
    for r in report.figures:
        tag = f"{r.run}/{r.name}" if r.run and report.suite.is_suite else r.name
        print(f"  {tag:<32} {r.files[0].name} (+ .pdf), {r.basis}")
    for s in report.skipped:
        tag = f"{s.run}/{s.name}" if s.run and report.suite.is_suite else s.name
        print(f"  skipped {tag}: {s.reason}", file=sys.stderr)
    print(f"  open {report.index}")
    return 0
