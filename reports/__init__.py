"""Paper-style figures of a run directory, drawn from stored files only (DESIGN.md, invariant 6).

    from schedlab.reports import build_report
    report = build_report("runs/demo")      # runs/demo/report/index.html, figures.json, PNG + PDF
    print(report.index)

`reports.load` reads a run directory (search/RUN_DIR.md) or a suite of them into
dataclasses; `reports.figures.*` draw one figure each (each also runnable alone:
`python -m schedlab.reports.figures.gantt RUN_DIR`); `reports.index` writes the index page and
figures.json; `reports.style` holds the paper look. Only this package imports matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schedlab.reports.build import FIGURE_NAMES, Report, build_report
    from schedlab.reports.figures import FigureRecord, FigureSkipped
    from schedlab.reports.index import Skipped
    from schedlab.reports.load import RunData, Suite, load

# Imported on first use, so that `python -m schedlab.reports.figures.NAME` does not import every
# figure module (itself included) before running it.
_WHERE = {
    "FIGURE_NAMES": "schedlab.reports.build",
    "Report": "schedlab.reports.build",
    "build_report": "schedlab.reports.build",
    "FigureRecord": "schedlab.reports.figures",
    "FigureSkipped": "schedlab.reports.figures",
    "Skipped": "schedlab.reports.index",
    "RunData": "schedlab.reports.load",
    "Suite": "schedlab.reports.load",
    "load": "schedlab.reports.load",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")

__all__ = [
    "FIGURE_NAMES",
    "FigureRecord",
    "FigureSkipped",
    "Report",
    "RunData",
    "Skipped",
    "Suite",
    "build_report",
    "load",
]
