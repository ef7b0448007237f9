"""The figures issue 12 asks of Tessel's search, one row per (shape, devices): repetend
length against its lower bound, makespan against the baseline (1F1B on the V, the
1F1B-like list schedule elsewhere) and each solver's search time.

    python -m schedlab.search.tessel.measure 4 8 > table.md            # memory limit P
    python -m schedlab.search.tessel.measure --no-limit 4 8 > table.md  # no limit
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from schedlab.errors import SchedlabError
from schedlab.pipeline import check_schedule
from schedlab.pipeline.generators import generate
from schedlab.pipeline.tessel_shapes import SHAPES, tessel_shape
from schedlab.search.tessel.baseline import best_1f1b_like
from schedlab.search.tessel.search import SOLVERS, search_tessel


@dataclass(frozen=True)
class SolverFigures:
    repetend_time: float | None  # None: the solver gave none (its error is `error`)
    makespan: float | None
    search_s: float | None
    length_optimal: bool
    error: str = ""


@dataclass(frozen=True)
class Row:
    shape: str
    n_devices: int
    n_microbatches: int
    memory_limit: float | None
    lower_bound: float
    baseline: str
    baseline_makespan: float
    solvers: dict[str, SolverFigures]


def measure(
    name: str,
    n_devices: int,
    n_microbatches: int,
    memory_limit: float | None,
    solvers: tuple[str, ...] = SOLVERS,
    time_limit_s: float = 60,
) -> Row:
    shape = tessel_shape(name, n_devices)
    if name == "vshape":
        base = generate("1f1b", shape, n_microbatches)
        base_name = "1F1B"
    else:
        base = best_1f1b_like(shape, n_microbatches, memory_limit)
        base_name = "1F1B-like"
    base_makespan = check_schedule(base, memory_limit=memory_limit).makespan
    figures: dict[str, SolverFigures] = {}
    for solver in solvers:
        try:
            r = search_tessel(
                shape, n_microbatches, memory_limit=memory_limit, solver=solver, time_limit_s=time_limit_s
            )
        except SchedlabError as e:
            figures[solver] = SolverFigures(None, None, None, False, str(e))
            continue
        figures[solver] = SolverFigures(r.repetend_time, r.makespan, r.search_s, r.length_optimal)
    lb = max(shape.work_per_microbatch(split_backward=False))
    return Row(name, n_devices, n_microbatches, memory_limit, lb, base_name, base_makespan, figures)


def markdown(rows: list[Row], solvers: tuple[str, ...] = SOLVERS) -> str:
    """One table: L (and * where the solver did not prove it shortest), makespan and
    search time per solver."""
    head = ["shape", "P", "M", "mem", "LB (max work/mb)", "baseline makespan"]
    for s in solvers:
        head += [f"{s} L", f"{s} makespan", f"{s} search s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mem = "-" if r.memory_limit is None else f"{r.memory_limit:g}"
        cells = [r.shape, str(r.n_devices), str(r.n_microbatches), mem, f"{r.lower_bound:g}"]
        cells.append(f"{r.baseline_makespan:g} ({r.baseline})")
        for s in solvers:
            f = r.solvers.get(s)
            if f is None or f.repetend_time is None:
                cells += ["none", "-", "-"]
                continue
            star = "" if f.length_optimal else "*"
            assert f.makespan is not None and f.search_s is not None
            cells += [f"{f.repetend_time:g}{star}", f"{f.makespan:g}", f"{f.search_s:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Rows for every shape at each device count in argv, M = 4P micro-batches, memory
    limit P (what 1F1B holds on a V's first device), or none with --no-limit."""
    no_limit = "--no-limit" in argv
    devices = [int(a) for a in argv if a != "--no-limit"] or [4, 8]
    rows = []
    for p in devices:
        for name in SHAPES:
            rows.append(measure(name, p, 4 * p, None if no_limit else float(p)))
            sys.stderr.write(f"{name} {p} done\n")
    sys.stdout.write(markdown(rows))
    for r in rows:
        for s, f in r.solvers.items():
            if f.error:
                sys.stdout.write(f"\n{r.shape} P={r.n_devices} {s}: {f.error}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
