"""One module per figure. Each has `draw(data, out_stem) -> FigureRecord`, writing
`out_stem.png` and `out_stem.pdf` from loaded run data only, and can be run alone to
redraw its figure from the stored files (LLMCompass style: one script per figure):

    python -m schedlab.reports.figures.gantt RUN_DIR [OUT_DIR]

A figure whose data is missing raises `FigureSkipped` with the reason; the report notes
it on the index page instead of failing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.reports.load import RunData, file_sha256, load

MEASURED = "measured"
SIMULATED = "simulated"
BOTH = "measured and simulated"


class FigureSkipped(Exception):
    """The data a figure needs is not in the run directory; the message says what is missing."""


@dataclass(frozen=True)
class FigureRecord:
    """What was drawn, from which files, under which conditions."""

    name: str  # figure kind: "speedup", "gantt", ...
    title: str
    files: tuple[Path, ...]  # the PNG and the PDF
    sources: tuple[Path, ...]  # the stored data files it was drawn from
    caption: str  # what the figure shows, one or two sentences
    basis: str  # MEASURED, SIMULATED or BOTH
    conditions: dict[str, Any] = field(default_factory=dict)
    conditions_text: str = ""  # the conditions in one line, for the caption (`describe_conditions`)
    run: str = ""  # run directory name ("" for a figure across a suite)

    def to_json(self, relative_to: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "run": self.run,
            "title": self.title,
            "files": [_rel(p, relative_to) for p in self.files],
            "sources": [_rel(p, relative_to) for p in self.sources],
            "source_sha256": {_rel(p, relative_to): file_sha256(p) for p in self.sources if p.is_file()},
            "caption": self.caption,
            "basis": self.basis,
            "conditions_text": self.conditions_text,
            "conditions": self.conditions,
        }


def _rel(p: Path, base: Path) -> str:
    """`p` relative to the folder `base` ("../results.json"), or absolute across drives."""
    try:
        return os.path.relpath(p.resolve(), base.resolve())
    except ValueError:
        return str(p.resolve())


def run_conditions(run: RunData) -> dict[str, Any]:
    """The conditions every figure of a run carries (DESIGN.md, invariant 5)."""
    res = run.results
    return {
        "workload": run.workload,
        "optimizer": run.run.get("optimizer"),
        "host": run.host,
        "versions": run.versions,
        "graph_hash": run.graph_hash,
        "repeats": res.repeats,
        "steps_per_repeat": res.steps_per_repeat,
    }


def versions_text(versions: dict[str, str]) -> str:
    order = ("torch", "python", "schedlab", "optuna", "simpy", "numpy")
    keys = [k for k in order if k in versions] + sorted(set(versions) - set(order))
    return ", ".join(f"{k} {versions[k]}" for k in keys)


def median_spread_text(median_s: float, spread_s: Sequence[float] | None) -> str:
    text = f"median {median_s * 1e3:.3f} ms"
    if spread_s:
        text += f" (IQR {spread_s[0] * 1e3:.3f}–{spread_s[1] * 1e3:.3f} ms)"
    return text


def describe_conditions(
    basis: str,
    *,
    host: str | None = None,
    versions: dict[str, str] | None = None,
    graph_hash: str | None = None,
    plan_hashes: Sequence[str] = (),
    repeats: int | None = None,
    steps_per_repeat: int | None = None,
    stats: Sequence[str] = (),
) -> str:
    """The conditions of a figure in one line, in a fixed order (DESIGN.md, invariant 5)."""
    parts = [basis[:1].upper() + basis[1:]]
    if host:
        parts.append(f"host {host}")
    if versions:
        parts.append(versions_text(versions))
    if graph_hash:
        parts.append(f"graph {graph_hash}")
    if plan_hashes:
        parts.append(("plan " if len(plan_hashes) == 1 else "plans ") + ", ".join(plan_hashes))
    if repeats:
        parts.append(f"{repeats} repeats" + (f" × {steps_per_repeat} steps" if steps_per_repeat else ""))
    parts.extend(stats)
    return " · ".join(parts)


def run_conditions_text(run: RunData, basis: str, plan_hashes: Sequence[str] = (), stats: Sequence[str] = ()) -> str:
    return describe_conditions(
        basis,
        host=run.host,
        versions=run.versions,
        graph_hash=run.graph_hash or None,
        plan_hashes=plan_hashes,
        repeats=run.results.repeats,
        steps_per_repeat=run.results.steps_per_repeat,
        stats=stats,
    )


def main_for(draw_run: Callable[[RunData, Path], FigureRecord], name: str, argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.NAME RUN_DIR [OUT_DIR]`: redraw one figure per run."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print(f"usage: python -m schedlab.reports.figures.{name} RUN_DIR [OUT_DIR]", file=sys.stderr)
        return 2
    suite = load(args[0])
    out_dir = Path(args[1]) if len(args) == 2 else suite.root / "report"
    for run in suite.runs:
        stem = out_dir / (f"{run.name}.{name}" if suite.is_suite else name)
        try:
            rec = draw_run(run, stem)
        except FigureSkipped as e:
            print(f"{run.name}: {name} skipped: {e}", file=sys.stderr)
            continue
        print(*rec.files)
    return 0
