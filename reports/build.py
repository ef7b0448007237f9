"""Assemble a report: load the run (or suite), draw every figure, write the index.

    from schedlab.reports import build_report
    report = build_report("runs/demo")          # -> runs/demo/report/index.html

Reads only the run directory (and the Profile it names); writes only under the report
folder. A figure whose data is missing is skipped with its reason on the index page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schedlab.reports.figures import FigureRecord, FigureSkipped, gantt, history, pred_vs_meas, speedup, thread_scaling
from schedlab.reports.index import Skipped, write_figures_json, write_index
from schedlab.reports.load import RunData, Suite, load

REPORT_DIR = "report"

# The per-run figures, in the order the index shows them.
PER_RUN: tuple[tuple[str, Callable[[RunData, Path], FigureRecord]], ...] = (
    ("pred_vs_meas", pred_vs_meas.draw),
    ("gantt", gantt.draw),
    ("thread_scaling", thread_scaling.draw),
    ("history", history.draw),
)
FIGURE_NAMES = ("speedup", *(name for name, _ in PER_RUN))


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
    suite = load(path)
    out = Path(out_dir) if out_dir is not None else suite.root / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    records: list[FigureRecord] = []
    skipped: list[Skipped] = []

    def attempt(name: str, run: RunData | None, draw: Callable[[Path], FigureRecord]) -> None:
        stem = figure_stem(out, name, run, suite.is_suite)
        try:
            records.append(draw(stem))
        except FigureSkipped as e:
            skipped.append(Skipped(name=name, run=run.name if run else "", reason=str(e)))
            for ext in (".png", ".pdf"):  # never leave an older drawing that looks current
                stem.with_name(stem.name + ext).unlink(missing_ok=True)

    attempt("speedup", None, lambda stem: speedup.draw(suite.runs, stem))
    for run in suite.runs:
        for name, draw in PER_RUN:
            attempt(name, run, lambda stem, draw=draw, run=run: draw(run, stem))  # type: ignore[misc]
    index = write_index(suite, out, records, skipped)
    fig_json = write_figures_json(suite, out, records, skipped)
    return Report(
        suite=suite, out_dir=out, index=index, figures_json=fig_json, figures=tuple(records), skipped=tuple(skipped)
    )
