"""Assemble a report: load the run (or suite), draw every figure, write the index.

    from schedlab.reports import build_report
    report = build_report("runs/demo")          # -> runs/demo/report/index.html

`build_report("traces/fidelity-heldout.json")`: the report of a `schedlab fidelity` results
file, its fidelity figure (folder: beside the file, `fidelity-heldout-report/`).

Reads only the run directory (and the Profile it names); writes only the report folder,
which it replaces as a whole (built beside it, then swapped in). A figure whose data is
missing is skipped with its reason on the index page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from schedlab.io import read_json, staging_dir, swap_dir
from schedlab.reports.figures import (
    FigureRecord,
    FigureSkipped,
    fidelity,
    framework_bench,
    gantt,
    history,
    placement_compare,
    placement_map,
    pred_vs_meas,
    rl_curve,
    speedup,
    thread_scaling,
)
from schedlab.reports.index import FIGURES_JSON, INDEX_HTML, Skipped, write_figures_json, write_index
from schedlab.reports.load import RunData, Suite, load
from schedlab.reports.load_placement import is_placement_run

REPORT_DIR = "report"

# The per-run figures, in the order the index shows them.
PER_RUN: tuple[tuple[str, Callable[[RunData, Path], FigureRecord]], ...] = (
    ("pred_vs_meas", pred_vs_meas.draw),
    ("gantt", gantt.draw),
    ("thread_scaling", thread_scaling.draw),
    ("history", history.draw),
)
FIGURE_NAMES = ("speedup", *(name for name, _ in PER_RUN))  # drawn, or noted as not drawn, for every run
# The figures of a placement search (run.json "space": "placement"), after PER_RUN. They are
# drawn, or noted as not drawn, for placement runs only: on a run of another space they do
# not apply, and the index does not list them as missing.
PER_PLACEMENT_RUN: tuple[tuple[str, Callable[[RunData, Path], FigureRecord]], ...] = (
    (placement_compare.NAME, placement_compare.draw),
    (rl_curve.NAME, rl_curve.draw),
    (placement_map.NAME, placement_map.draw),
)
PLACEMENT_FIGURE_NAMES = tuple(name for name, _ in PER_PLACEMENT_RUN)
ALL_FIGURE_NAMES = (*FIGURE_NAMES, *PLACEMENT_FIGURE_NAMES)


@dataclass(frozen=True)
class Report:
    suite: Suite
    out_dir: Path
    index: Path
    figures_json: Path
    figures: tuple[FigureRecord, ...]
    skipped: tuple[Skipped, ...]


def figure_stem(out_dir: Path, name: str, run: RunData | None, is_suite: bool) -> Path:
    """Where a figure goes: `report/NAME` for one run, `report/RUN.NAME` per run of a suite."""
    return out_dir / (f"{run.name}.{name}" if run is not None and is_suite else name)


def build_report(path: str | Path, out_dir: str | Path | None = None) -> Report:
    """Draw every figure and the index of the run (or suite) at `path` into `out_dir`
    (default RUN_DIR/report). The report is built in a temp folder beside `out_dir` and
    swapped in at the end: its figures, index page and figures.json are replaced together,
    and a report that fails or is interrupted leaves the previous one as it was."""
    source = Path(path)
    results: fidelity.FidelityData | framework_bench.BenchData | None = None
    if source.is_file():  # a `schedlab fidelity` results file, or a saved `schedlab bench --backend tensorflow --json`
        d = read_json(source, what="fidelity results")
        results = (framework_bench.bench_from_json(d, source) if framework_bench.is_tf_bench(d)
                   else fidelity.fidelity_from_json(d, source))
    suite = Suite(root=source, runs=(), is_suite=False) if results is not None else load(source)
    default_out = source.with_name(source.stem + "-report") if results is not None else suite.root / REPORT_DIR
    out = Path(out_dir) if out_dir is not None else default_out
    with staging_dir(out) as staged:
        records, skipped = _draw_all(suite, staged, results)
        # A sibling of `out`: the relative links in the index and figures.json hold after the swap.
        write_index(suite, staged, records, skipped)
        write_figures_json(suite, staged, records, skipped)
        swap_dir(staged, out)
    moved = tuple(replace(r, files=tuple(out / f.relative_to(staged) for f in r.files)) for r in records)
    return Report(
        suite=suite, out_dir=out, index=out / INDEX_HTML, figures_json=out / FIGURES_JSON, figures=moved,
        skipped=tuple(skipped),
    )


def _draw_all(
    suite: Suite, out: Path, results: fidelity.FidelityData | framework_bench.BenchData | None = None
) -> tuple[list[FigureRecord], list[Skipped]]:
    records: list[FigureRecord] = []
    skipped: list[Skipped] = []

    def attempt(name: str, run: RunData | None, draw: Callable[[Path], FigureRecord]) -> None:
        try:
            records.append(draw(figure_stem(out, name, run, suite.is_suite)))
        except FigureSkipped as e:
            skipped.append(Skipped(name=name, run=run.name if run else "", reason=str(e)))

    if isinstance(results, framework_bench.BenchData):  # a saved TF bench: its one figure
        bench = results
        attempt(framework_bench.NAME, None, lambda stem: framework_bench.draw(bench, stem))
        return records, skipped
    if results is not None:  # a fidelity results file: its one figure
        fid = results
        attempt(fidelity.NAME, None, lambda stem: fidelity.draw(fid, stem))
        return records, skipped
    attempt("speedup", None, lambda stem: speedup.draw(suite.runs, stem))
    for run in suite.runs:
        for name, draw in PER_RUN + (PER_PLACEMENT_RUN if is_placement_run(run) else ()):
            attempt(name, run, lambda stem, draw=draw, run=run: draw(run, stem))  # type: ignore[misc]
    return records, skipped
