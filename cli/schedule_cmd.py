"""`schedlab schedule`: build a pipeline schedule on a placement, check it, time it with
the one timing model, and show it: a summary and an ASCII Gantt chart (or JSON), and on
request torch's CSV of it and a Gantt picture.

    schedlab schedule --placement vshape --devices 4 --micro-batches 8 --schedule 1f1b --f 1 --b 1
    schedlab schedule --placement mshape --devices 4 --micro-batches 16 --schedule tessel --memory 4
    schedlab schedule --schedule torch:Interleaved1F1B --devices 4 --micro-batches 8 --out il.csv
    schedlab schedule --schedule il.csv --gantt il.png

`schedule_build` says what each choice of --placement and --schedule builds, what the
times mean and how the steady state per micro-batch is measured. Every input is checked
before anything is written, and each file is written whole or not at all.
"""

from __future__ import annotations

import argparse
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

from schedlab.cli.ascii_gantt import ascii_gantt
from schedlab.cli.common import print_json
from schedlab.cli.pipeline_placement import FORMAT, VERSION, BlockTimes
from schedlab.cli.schedule_build import TESSEL, BuiltSchedule, ScheduleRequest, build_schedule
from schedlab.errors import SchedlabError
from schedlab.pipeline.tessel_shapes import SHAPES

DEFAULT_WIDTH = 100  # columns of the ASCII Gantt when stdout is not a terminal


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "schedule",
        help="build, check and time a pipeline schedule; print it as a Gantt chart",
        description="Build a pipeline schedule (a generator, Tessel's search, torch's classes or a CSV) on a "
        "placement of stages over devices, check it, time it (makespan, bubble, peak memory per device, steady "
        "state per micro-batch) and draw it.",
    )
    p.add_argument(
        "--placement", default="vshape", metavar="vshape|mshape|xshape|nnshape|kshape|FILE",
        help="a Tessel shape, or a placement JSON file (format "
        f'"{FORMAT}", version {VERSION}: see schedlab/cli/pipeline_placement.py); default vshape, a chain of '
        "stages, on which each generator gets the stage count and map it needs",
    )  # fmt: skip
    p.add_argument("--devices", type=int, default=None, metavar="P", help="devices (a CSV's rows give them)")
    p.add_argument(
        "--micro-batches", type=int, default=None, metavar="M", help="micro-batches (a CSV's actions give them)"
    )
    p.add_argument(
        "--schedule", required=True, metavar="NAME|tessel|torch:CLASS|CSV",
        help="a generator (gpipe, 1f1b, interleaved:V, looped-bfs, zb-h1, zb-h2, zbv, ooo), tessel (Tessel's "
        "search on the placement), torch:CLASS (torch.distributed.pipelining's schedule class, e.g. torch:1F1B, "
        "torch:Interleaved1F1B, torch:ZBVZeroBubble) or a CSV file as torch writes it (one row per rank)",
    )  # fmt: skip
    p.add_argument("--f", type=float, default=1.0, metavar="T", help="forward time of a block (default 1)")
    p.add_argument("--b", type=float, default=None, metavar="T", help="full backward time (default 2F)")
    p.add_argument(
        "--w", type=float, default=None, metavar="T",
        help="weight-gradient part of the backward (default B/2); the input-gradient part is I = B - W",
    )  # fmt: skip
    p.add_argument(
        "--memory", type=float, default=None, metavar="LIMIT",
        help="most activation memory a device may hold, in micro-batches' activations of one device's share "
        "(vshape) or of one V stage (other shapes); checked, and for tessel a constraint of the search",
    )  # fmt: skip
    p.add_argument("--solver", choices=("highs", "z3", "fast"), default="highs", help="Tessel's solver (default highs)")
    p.add_argument(
        "--time-limit-s", type=float, default=60.0, metavar="S", help="Tessel's search time limit (default 60)"
    )
    p.add_argument("--out", default=None, metavar="FILE.csv", help="write the schedule as torch's CSV")
    p.add_argument("--gantt", default=None, metavar="FILE.png|pdf", help="draw the Gantt picture (matplotlib)")
    p.add_argument(
        "--width", type=int, default=None, metavar="COLUMNS",
        help="width of the ASCII Gantt (default: the terminal's, or 100)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary and chart")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from schedlab.io import check_writable
    from schedlab.pipeline.torch_io import require_torch_layout
    from schedlab.reports.figures.pipeline_gantt import gantt_format, render

    gantt_fmt = gantt_format(args.gantt) if args.gantt else None
    for path in (args.out, args.gantt):
        if path:
            check_writable(path)
    req = ScheduleRequest(
        placement=args.placement,
        schedule=args.schedule,
        n_devices=args.devices,
        n_microbatches=args.micro_batches,
        times=BlockTimes.from_flags(args.f, args.b, args.w),
        memory_limit=args.memory,
        solver=args.solver,
        time_limit_s=args.time_limit_s,
    )
    built = build_schedule(req)
    title = describe(built, args.placement)
    picture = None
    if args.out:
        try:
            require_torch_layout(built.schedule)
        except SchedlabError as e:
            raise SchedlabError(f"--out {args.out} writes torch's CSV, which cannot hold this schedule: {e}") from None
    if gantt_fmt is not None:
        picture = render(built.timeline, gantt_fmt, title)
    # everything is computed: now the files, each whole or not at all
    if args.out:
        from schedlab.pipeline.torch_io import write_csv

        write_csv(built.schedule, args.out)
    if picture is not None:
        from schedlab.io import atomic_file

        with atomic_file(args.gantt, "wb") as f:
            f.write(picture)
    summary = summary_json(built, args)
    if args.json:
        print_json(summary)
    else:
        width = args.width or shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        print(summary_text(built, summary, title), end="")
        print(ascii_gantt(built.timeline, width), end="")
    return 0


def describe(built: BuiltSchedule, placement: str) -> str:
    s = built.schedule
    where = placement if placement in SHAPES else Path(placement).name
    name = s.name or built.source
    return f"{name} on {where}: {s.n_devices} devices, {s.shape.n_stages} stages, {s.n_microbatches} micro-batches"


def summary_json(built: BuiltSchedule, args: argparse.Namespace) -> dict[str, Any]:
    s, t = built.schedule, built.timeline
    out: dict[str, Any] = {
        "name": s.name,
        "source": built.source,  # generator, tessel, torch or csv
        "placement": args.placement,
        "shape": s.shape.name,
        "devices": s.n_devices,
        "stages": s.shape.n_stages,
        "micro_batches": s.n_microbatches,
        "times": _times(built),
        "makespan": t.makespan,
        "bubble_fraction": t.bubble_fraction,
        "busy": list(t.busy),
        "peak_memory": list(t.peak_memory),
        "memory_limit": args.memory,
        "steady_state_per_microbatch": built.steady_state_per_microbatch,
        "steady_state_method": built.steady_state_method,  # marginal or completion_spacing (schedule_build)
        "steady_state_step": built.steady_state_step,  # k of the marginal: M + k micro-batches against M
        "lower_bound_per_microbatch": max(s.shape.work_per_microbatch(s.split_backward)),
        "comm_dropped": s.comm_dropped,
        "schedule": s.to_text(),
        "out": args.out,
        "gantt": args.gantt,
    }
    r = built.tessel
    if r is not None:
        out.update(
            repetend_time=r.repetend_time,
            lower_bound=r.lower_bound,
            length_optimal=r.length_optimal,
            search_s=r.search_s,
            solver=r.solver,
            n_repetitions=r.n_repetitions,
            repetend=r.repetend.to_text(),
        )
    return out


def _times(built: BuiltSchedule) -> dict[str, float]:
    """The block times the flags (or their defaults) gave: F, B, I = B - W, W."""
    t = built.request.times
    return {"f": t.f, "b": t.b, "i": t.i, "w": t.w}


def _fraction(x: float) -> str:
    """'27.27% (3/11)' where x is a small fraction exactly, else '27.27%'."""
    exact = Fraction(x).limit_denominator(1000)
    tail = f" ({exact.numerator}/{exact.denominator})" if abs(float(exact) - x) < 1e-9 and exact.denominator > 1 else ""
    return f"{100 * x:.2f}%{tail}"


def summary_text(built: BuiltSchedule, d: dict[str, Any], title: str) -> str:
    lines = [title]
    if d["steady_state_method"] == "marginal":
        how = f"marginal: makespan at M+{d['steady_state_step']} less at M, over {d['steady_state_step']}"
    else:
        how = "mean spacing of micro-batch completions, middle half"
    peak = " ".join(f"{x:g}" for x in d["peak_memory"])
    limit = "" if d["memory_limit"] is None else f"  (limit {d['memory_limit']:g})"
    rows = [
        ("makespan", f"{d['makespan']:g}"),
        ("bubble fraction", _fraction(d["bubble_fraction"])),
        ("peak memory per device", peak + limit),
        ("steady state per micro-batch", f"{d['steady_state_per_microbatch']:g}  ({how})"),
        ("lower bound per micro-batch", f"{d['lower_bound_per_microbatch']:g}  (busiest device's work)"),
    ]
    if d["source"] == TESSEL:
        optimal = "proved shortest" if d["length_optimal"] else "not proved shortest"
        rows += [
            ("repetend time", f"{d['repetend_time']:g} vs lower bound {d['lower_bound']:g} ({optimal})"),
            ("search", f"{d['search_s']:.2f} s with {d['solver']}, {d['n_repetitions']} repetitions"),
        ]
    if d["comm_dropped"]:
        rows.append(("communication actions", f"{d['comm_dropped']} dropped (implied by the dependencies)"))
    for path, what in ((d["out"], "torch CSV"), (d["gantt"], "Gantt picture")):
        if path:
            rows.append((what, str(path)))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines) + "\n\n"
