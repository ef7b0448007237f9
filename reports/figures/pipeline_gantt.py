"""Gantt picture of a pipeline schedule (`schedlab schedule --gantt FILE.png|pdf`).

One lane per device, device 0 on top; each action a box from its start to its end under
the one timing model (`schedlab.pipeline.time_schedule`), coloured by kind (F forward,
B full backward, I input-gradient backward, W weight-gradient backward), its micro-batch
number inside where the box is wide enough to hold it. A dashed line marks the makespan.
White between boxes is a bubble: the device waits for work from another.

Unlike the run figures beside it, this one is drawn from a timeline in memory, for one
file whose format its suffix names, written all at once (a temp file renamed onto it).
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.figure import Figure

from schedlab.errors import SchedlabError
from schedlab.io import atomic_file
from schedlab.pipeline import Kind, Timeline
from schedlab.reports import style

FORMATS = (".png", ".pdf")
# F, I and W as the run Gantt colours forward, input and weight gradient; the full
# backward B (I and W together) gets Tol muted's teal, apart from all three.
KIND_COLOURS = {
    Kind.F: style.KIND_COLOURS["F"],
    Kind.B: "#44AA99",
    Kind.I: style.KIND_COLOURS["B"],
    Kind.W: style.KIND_COLOURS["W"],
}
KIND_LABELS = {
    Kind.F: "F (forward)",
    Kind.B: "B (full backward)",
    Kind.I: "I (input grad)",
    Kind.W: "W (weight grad)",
}
LANE_HEIGHT_IN = 0.28
LABEL_FONT_PT = 5.5
_CHAR_WIDTH_EM = 0.6  # a digit's width in a serif font, in ems, to decide whether a label fits


def gantt_format(path: str | Path) -> str:
    """'png' or 'pdf' from the file's suffix; any other suffix is refused up front."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise SchedlabError(f"cannot draw the Gantt picture as {Path(path).name}: give a .png or .pdf file")
    return suffix[1:]


def _text_colour(fill: str) -> str:
    """White on a dark box, ink on a light one (relative luminance of the sRGB fill)."""
    r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else style.INK


def render(timeline: Timeline, fmt: str, title: str = "") -> bytes:
    """The picture as the bytes of a `fmt` ('png' or 'pdf') file."""
    if fmt not in ("png", "pdf"):
        raise SchedlabError(f"the Gantt picture is drawn as png or pdf, not {fmt!r}")
    with style.paper():
        fig = gantt_figure(timeline, title)
        buf = io.BytesIO()
        metadata = {"Creator": "schedlab schedule", "CreationDate": None} if fmt == "pdf" else {"Software": None}
        fig.savefig(buf, format=fmt, dpi=style.PNG_DPI, metadata=metadata)
    return buf.getvalue()


def gantt_figure(timeline: Timeline, title: str = "") -> Figure:
    """The figure itself (call it inside `style.paper()`, as `render` does): per device
    and kind one bar collection holding a box per action, and a text per label drawn."""
    schedule = timeline.schedule
    n_dev = schedule.n_devices
    makespan = timeline.makespan if timeline.makespan > 0 else 1.0
    fig = style.figure(width_in=style.PAGE_IN, height_in=0.75 + LANE_HEIGHT_IN * n_dev)
    ax = fig.add_subplot(1, 1, 1)
    axes_width_in = style.PAGE_IN * (fig.subplotpars.right - fig.subplotpars.left)
    pt_per_unit = axes_width_in * 72 / (makespan * 1.02)
    for d, order in enumerate(schedule.orders):
        boxes: dict[Kind, list[tuple[float, float]]] = {}
        for a in order:
            t0, t1 = timeline.start[a], timeline.end[a]
            boxes.setdefault(a.kind, []).append((t0, t1 - t0))
            label = str(a.mb)
            if (t1 - t0) * pt_per_unit >= (len(label) * _CHAR_WIDTH_EM + 0.4) * LABEL_FONT_PT:
                ax.text(
                    (t0 + t1) / 2, d, label, ha="center", va="center", fontsize=LABEL_FONT_PT,
                    color=_text_colour(KIND_COLOURS[a.kind]),
                )  # fmt: skip
        for kind, ranges in boxes.items():
            ax.broken_barh(ranges, (d - 0.4, 0.8), facecolors=KIND_COLOURS[kind], edgecolors="white", linewidth=0.4)
    ax.axvline(timeline.makespan, color=style.INK, linestyle="--", linewidth=0.7)
    ax.annotate(
        f"makespan {timeline.makespan:g}", (timeline.makespan, -0.55), xytext=(-2, 0), textcoords="offset points",
        ha="right", va="bottom", fontsize=6, color=style.INK,
    )  # fmt: skip
    ax.set_xlim(0, makespan * 1.02)
    ax.set_ylim(n_dev - 0.5, -0.5 - 0.35)  # device 0 on top, room for the makespan label
    ax.set_yticks(range(n_dev), [f"device {d}" for d in range(n_dev)])
    ax.tick_params(axis="y", length=0)
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("time (the schedule's time unit)")
    ax.xaxis.set_major_formatter(style.fmt_tick_formatter())
    if title:
        ax.set_title(title, loc="left")
    drawn = {a.kind for order in schedule.orders for a in order}
    handles = [style.patch(KIND_COLOURS[k], KIND_LABELS[k]) for k in KIND_COLOURS if k in drawn]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), handlelength=1.0)
    return fig


def draw(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """Draw the picture into `path` (.png or .pdf), all or nothing."""
    data = render(timeline, gantt_format(path), title)
    with atomic_file(path, "wb") as f:
        f.write(data)
    return Path(path)
