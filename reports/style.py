"""The paper look, in one place: fonts, sizes, spines, palette, op-kind colours, saving.

Every figure module calls `figure()` to get a styled Figure and `save()` to write the PNG
and the PDF. Colours come from Paul Tol's "bright" and "muted" schemes, which stay apart
for the common kinds of colour blindness and in greyscale print.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
from cycler import cycler
from matplotlib.figure import Figure

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

# Column widths of a two-column paper (inches): one column, the whole page.
COLUMN_IN = 3.5
PAGE_IN = 7.2
PNG_DPI = 200

# Paul Tol "bright": blue, red, green, yellow, cyan, purple, grey.
PALETTE = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB")
GREY = "#777777"
INK = "#222222"

# Op kinds in the Gantt chart, always the same colour (Tol "muted" + greys).
KIND_COLOURS = {
    "F": "#332288",  # forward: indigo
    "B": "#CC6677",  # input gradient: rose
    "W": "#DDCC77",  # weight gradient: sand
    "OPT": "#117733",  # optimizer: green
    "COMM": "#88CCEE",  # transfer: cyan
    "OVERHEAD": "#BBBBBB",  # executor time outside kernels: grey
}
KIND_LABELS = {
    "F": "F (forward)",
    "B": "B (input grad)",
    "W": "W (weight grad)",
    "OPT": "OPT (optimizer)",
    "COMM": "COMM (transfer)",
    "OVERHEAD": "overhead",
}

RC: Any = {
    "font.family": "serif",
    "font.serif": ["STIXGeneral", "DejaVu Serif"],  # both ship with matplotlib
    "mathtext.fontset": "stix",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "figure.titlesize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.minor.width": 0.4,
    "ytick.minor.width": 0.4,
    "lines.linewidth": 1.0,
    "lines.markersize": 4,
    "axes.prop_cycle": cycler(color=list(PALETTE)),
    "axes.edgecolor": INK,
    "text.color": INK,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.03,
    "pdf.fonttype": 42,  # TrueType in the PDF: editable text, accepted by publishers
}


def colour(i: int) -> str:
    """The i-th palette colour (cycling)."""
    return PALETTE[i % len(PALETTE)]


@contextmanager
def paper() -> Iterator[None]:
    """The paper rc settings, for the duration of one figure (global state left as found)."""
    with matplotlib.rc_context(RC):
        yield


def figure(width_in: float = COLUMN_IN, height_in: float = 2.4, **kwargs: Any) -> Figure:
    """A new Figure (not registered with pyplot, so nothing leaks between figures)."""
    return Figure(figsize=(width_in, height_in), **kwargs)


def save(fig: Figure, out_stem: Path, note: str = "") -> tuple[Path, Path]:
    """Write `out_stem.png` and `out_stem.pdf`; returns both paths.

    `note`: a small grey paragraph of conditions (host, versions, "simulated", ...) put
    under everything else drawn, legends below the axes included, so it never overlaps.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out_stem.parent.mkdir(parents=True, exist_ok=True)
    canvas = FigureCanvasAgg(fig)
    if note:
        canvas.draw()  # runs the layout engine, if any, so the box below is final
        box = fig.get_tightbbox(canvas.get_renderer())  # inches
        width_in, height_in = fig.get_size_inches()
        chars = max(40, int(box.width * 26))  # ~26 characters per inch at 6 pt
        fig.text(
            box.x0 / width_in, (box.y0 - 0.06) / height_in, textwrap.fill(note, chars),
            ha="left", va="top", fontsize=6, color=GREY, linespacing=1.25,
        )
    png = out_stem.with_name(out_stem.name + ".png")
    pdf = out_stem.with_name(out_stem.name + ".pdf")
    fig.savefig(png, dpi=PNG_DPI)
    fig.savefig(pdf, metadata={"Creator": "schedlab report", "CreationDate": None})
    return png, pdf


_MANTISSAS = (
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0),
    tuple(1.0 + 0.1 * i for i in range(90)),
)


def log_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values for a log axis from `lo` to `hi`: at least 2 (3 where it fits), at most `most`.

    Matplotlib's log locator gives no labelled tick at all on an axis spanning less than a
    decade (step times of one workload usually do); this picks 1-2-5 style values instead.
    """
    import math

    if not (lo > 0 and hi > lo):
        return [lo] if lo > 0 else []
    best: list[float] = []
    for mantissas in _MANTISSAS:
        ticks = [
            round(m * 10.0**e, 12)
            for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
            for m in mantissas
            if lo <= m * 10.0**e <= hi
        ]
        ticks = sorted(set(ticks))
        if len(ticks) > most:
            step = math.ceil(len(ticks) / most)
            ticks = ticks[::step]
        if len(ticks) > len(best):
            best = ticks
        if len(best) >= 3:
            break
    return best


def fmt_number(x: float) -> str:
    """A tick label without needless digits: 0.5, 2, 15, 1.25."""
    return f"{x:.3g}"


def fmt_tick_formatter() -> Any:
    """A tick formatter writing plain numbers (no 10^k) with `fmt_number`."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: fmt_number(x))


def patch(colour: str, label: str) -> Any:
    """A legend handle: a filled square of `colour`."""
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor="none", label=label)
