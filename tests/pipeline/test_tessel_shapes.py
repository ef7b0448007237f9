"""Tessel's placements: balanced per-device work, the DAG each draws, and the pictures in
their docstrings kept true."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import tessel_shapes
from schedlab.pipeline.tessel_shapes import SHAPES, draw, tessel_shape

# per device, one micro-batch, with F = 1, B = 2 for both kinds of block
WORK = {"vshape": 3.0, "mshape": 6.0, "xshape": 6.0, "nnshape": 9.0, "kshape": 6.0}


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("n_devices", [2, 4, 8])
def test_every_device_does_the_same_work_per_microbatch(name: str, n_devices: int) -> None:
    shape = tessel_shape(name, n_devices)
    assert shape.work_per_microbatch(split_backward=False) == (WORK[name],) * n_devices
    assert shape.name == name


def test_sharded_blocks_have_their_own_costs() -> None:
    shape = tessel_shape("mshape", 4, shard_f_time=0.5, shard_b_time=0.5, shard_mem=0.25)
    assert shape.work_per_microbatch(split_backward=False) == (4.0,) * 4
    embed = shape.stages[0]
    assert embed.devices == (0, 1, 2, 3) and embed.f_mem == 0.25 and embed.name == "embed"
    assert tessel_shape("mshape", 4, sharded_head=True).work_per_microbatch(split_backward=False) == (9.0,) * 4


def test_the_shapes_dags() -> None:
    x = tessel_shape("xshape", 4)
    sources = [s for s, p in enumerate(x.prev) if not p]
    sinks = [s for s, st in enumerate(x.stages) if not st.next]
    assert sources == [0, 4] and sinks == [3, 7]  # two chains, no edge between them
    assert [x.stages[s].devices for s in range(4, 8)] == [(3,), (2,), (1,), (0,)]
    k = tessel_shape("kshape", 4)
    assert k.prev[4] == (1, 3) and k.stages[4].devices == (0, 1, 2, 3)
    nn = tessel_shape("nnshape", 4)
    assert [st.name for st in nn.stages] == ["embed_enc", "enc0", "enc1", "embed_dec", "dec0", "dec1"]
    assert [len(st.devices) for st in nn.stages] == [4, 1, 1, 4, 1, 1]


@pytest.mark.parametrize(
    ("builder", "shape_args"),
    [
        ("_vshape", ("vshape", {})),
        ("_mshape", ("mshape", {})),
        ("_xshape", ("xshape", {})),
        ("_nnshape", ("nnshape", {})),
        ("_kshape", ("kshape", {})),
        ("_mshape", ("mshape", {"sharded_head": True})),
    ],
)
def test_docstring_pictures_are_what_draw_prints(builder: str, shape_args: tuple[str, dict[str, bool]]) -> None:
    name, kwargs = shape_args
    doc = inspect.getdoc(getattr(tessel_shapes, builder))
    assert doc is not None
    assert textwrap.indent(draw(tessel_shape(name, 4, **kwargs)), "    ") in doc + "\n"


def test_draw_reads_as_the_paper_draws_a_v() -> None:
    assert draw(tessel_shape("vshape", 3)) == "0: f    b\n1:  f  b\n2:   fb\n"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tessel_shape("yshape", 4), "unknown Tessel shape 'yshape'"),
        (lambda: tessel_shape("kshape", 3), "even number of devices, not 3"),
        (lambda: tessel_shape("nnshape", 1), "even number of devices, not 1"),
        (lambda: tessel_shape("vshape", 4, sharded_head=True), "sharded_head adds"),
        (lambda: tessel_shape("vshape", 0), "at least one device"),
        (lambda: tessel_shape("vshape", 4, b_time=0), "must be positive"),
    ],
)
def test_bad_shapes_say_what_to_fix(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match=message):
        call()
