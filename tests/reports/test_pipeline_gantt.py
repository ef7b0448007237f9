"""The pipeline Gantt picture: a box per action and device, labels where they fit, the
makespan marked, PNG and PDF bytes, and a file written whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import Kind, Schedule, check_schedule, parse_text, time_schedule
from schedlab.pipeline.generators import default_shape, generate
from schedlab.pipeline.tessel_shapes import tessel_shape
from schedlab.reports import style
from schedlab.reports.figures import pipeline_gantt
from schedlab.reports.figures.pipeline_gantt import KIND_COLOURS, draw, gantt_figure, gantt_format, render


def _boxes(fig) -> int:  # type: ignore[no-untyped-def]
    return sum(len(c.get_paths()) for c in fig.axes[0].collections)


def test_one_box_per_action_and_device_and_a_label_in_each_wide_box() -> None:
    s = generate("zb-h1", default_shape("zb-h1", 4), 8)
    t = time_schedule(s)
    with style.paper():
        fig = gantt_figure(t, "zb-h1")
    assert _boxes(fig) == s.n_actions()
    labels = [x.get_text() for x in fig.axes[0].texts if x.get_text().isdigit()]
    assert len(labels) == s.n_actions()  # every unit-long box holds its micro-batch number at 8 micro-batches
    assert sorted(set(labels)) == [str(m) for m in range(8)]
    colours = {tuple(c.get_facecolor()[0][:3]) for c in fig.axes[0].collections}
    assert len(colours) == 3  # F, I, W
    assert any(f"makespan {t.makespan:g}" == x.get_text() for x in fig.axes[0].texts)


def test_a_sharded_block_is_drawn_on_every_device_it_spans() -> None:
    shape = tessel_shape("mshape", 2)  # embedding over devices 0 and 1, then stage 1 on 0, stage 2 on 1
    orders = parse_text("0: 0F0 1F0 1B0 0B0\n1: 0F0 2F0 2B0 0B0\n")[0]
    t = check_schedule(Schedule(shape=shape, n_microbatches=1, orders=orders))
    with style.paper():
        fig = gantt_figure(t)
    assert _boxes(fig) == 8  # the embedding's F and B twice each
    lanes = sorted(round(c.get_paths()[0].vertices[:, 1].mean()) for c in fig.axes[0].collections)
    assert lanes == [0, 0, 1, 1]  # F and B collections on each device's lane


def test_narrow_boxes_hold_no_label() -> None:
    s = generate("1f1b", default_shape("1f1b", 2), 200)  # 404 time units across one page
    with style.paper():
        fig = gantt_figure(time_schedule(s))
    assert not any(x.get_text().isdigit() for x in fig.axes[0].texts)


def test_render_png_and_pdf() -> None:
    t = time_schedule(generate("1f1b", default_shape("1f1b", 2), 4))
    assert render(t, "png").startswith(b"\x89PNG\r\n\x1a\n")
    assert render(t, "pdf").startswith(b"%PDF")
    assert render(t, "pdf") == render(t, "pdf")  # no creation date: the same bytes each time
    with pytest.raises(SchedlabError, match="png or pdf"):
        render(t, "svg")


def test_format_comes_from_the_suffix() -> None:
    assert gantt_format("a/b.PNG") == "png" and gantt_format("x.pdf") == "pdf"
    with pytest.raises(SchedlabError, match=r"give a \.png or \.pdf file"):
        gantt_format("x.jpg")


def test_draw_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = time_schedule(generate("gpipe", default_shape("gpipe", 2), 2))
    out = tmp_path / "g.png"
    assert draw(t, out) == out and out.read_bytes()[:4] == b"\x89PNG"
    before = out.read_bytes()

    def fail(*_: object) -> bytes:
        raise SchedlabError("boom")

    monkeypatch.setattr(pipeline_gantt, "render", fail)
    with pytest.raises(SchedlabError, match="boom"):
        draw(t, out)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["g.png"]


def test_kind_colours_are_apart() -> None:
    assert len(set(KIND_COLOURS.values())) == len(KIND_COLOURS) == 4
    assert set(KIND_COLOURS) == {Kind.F, Kind.B, Kind.I, Kind.W}
