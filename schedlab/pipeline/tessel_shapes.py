"""Tessel's operator placements as pipeline shapes (Lin et al., HPCA 2024, Fig. 2 and the
placements its code ships): which devices each block of one micro-batch runs on, and which
block feeds which.

Two kinds of block make every shape:
- a *V stage*: a slice of layers on one device, forward `f_time`, backward `b_time`,
  holding `f_mem` of activations from its forward until its backward;
- an *all-device block*: a block sharded over every device at once (tensor parallel, as
  an embedding with a large vocabulary is), forward `shard_f_time`, backward
  `shard_b_time` on each device, holding `shard_mem` on each. Both times default to the
  V stage's; the memory defaults to 0, as the paper's placements count it: the block's
  activations are split P ways and small beside a stage's.

Every shape gives each device the same work per micro-batch (the paper's premise that the
placement is balanced, so the repetend's lower bound is one device's work):

    shape     per device, one micro-batch            P
    vshape    F + B                                  any
    mshape    (F + B) + (Fs + Bs)  [+ (Fs + Bs)]     any (the bracket: sharded_head=True)
    xshape    2 (F + B)                              any
    nnshape   (F + B) + 2 (Fs + Bs)                  even
    kshape    (F + B) + (Fs + Bs)                    even

`draw(shape)` prints one micro-batch the way the paper draws its placements: a row per
device, a column per step of the micro-batch's dependency chain, ``f`` / ``b`` where the
device works. The pictures below are its output at 4 devices (tests keep them true).
"""

from __future__ import annotations

from collections.abc import Callable

from schedlab.errors import SchedlabError
from schedlab.pipeline.shape import PipeShape, Stage, backward_times

SHAPES = ("vshape", "mshape", "xshape", "nnshape", "kshape")


class _Costs:
    """The two kinds of block's costs, as `tessel_shape` was given them."""

    def __init__(
        self,
        f_time: float,
        b_time: float,
        f_mem: float,
        shard_f_time: float | None,
        shard_b_time: float | None,
        shard_mem: float,
    ) -> None:
        if min(f_time, b_time) <= 0:
            raise SchedlabError(f"a stage's forward and backward times must be positive (got F={f_time}, B={b_time})")
        self.f_time, self.b_time, self.f_mem = f_time, b_time, f_mem
        self.shard_f_time = f_time if shard_f_time is None else shard_f_time
        self.shard_b_time = b_time if shard_b_time is None else shard_b_time
        self.shard_mem = shard_mem
        if min(self.shard_f_time, self.shard_b_time) <= 0:
            raise SchedlabError("an all-device block's forward and backward times must be positive")

    def stage(self, device: int, next_: tuple[int, ...], name: str) -> Stage:
        b, i, w = backward_times(self.f_time, self.b_time, None, None)
        return Stage((device,), next_, self.f_time, b, i, w, f_mem=self.f_mem, name=name)

    def shard(self, n_devices: int, next_: tuple[int, ...], name: str) -> Stage:
        b, i, w = backward_times(self.shard_f_time, self.shard_b_time, None, None)
        return Stage(tuple(range(n_devices)), next_, self.shard_f_time, b, i, w, f_mem=self.shard_mem, name=name)


def _vshape(p: int, c: _Costs, sharded_head: bool) -> tuple[Stage, ...]:
    """A chain, stage s on device s (1F1B's placement):

        0: f      b
        1:  f    b
        2:   f  b
        3:    fb

    Paper's example: GPT with its layers split into P pipeline stages.
    """
    return tuple(c.stage(d, (d + 1,) if d + 1 < p else (), f"v{d}") for d in range(p))


def _mshape(p: int, c: _Costs, sharded_head: bool) -> tuple[Stage, ...]:
    """A sharded embedding, then a V; its backward closes the V (the paper's M):

        0: ff      bb
        1: f f    b b
        2: f  f  b  b
        3: f   fb   b

    Paper's example: GPT with a very large vocabulary (1M tokens), its embedding split
    over all devices by tensor parallelism, the transformer layers pipelined. With
    `sharded_head=True` a sharded output head follows the V's tip as a second
    all-device block (Tessel's code calls that placement mllm):

        0: ff   fb   bb
        1: f f  fb  b b
        2: f  f fb b  b
        3: f   ffbb   b
    """
    v = [c.stage(d, (d + 2,), f"v{d}") for d in range(p)]
    if sharded_head:
        head = c.shard(p, (), "head")
    else:
        v[-1] = c.stage(p - 1, (), f"v{p - 1}")
    stages = [c.shard(p, (1,), "embed"), *v]
    if sharded_head:
        stages.append(head)
    return tuple(stages)


def _xshape(p: int, c: _Costs, sharded_head: bool) -> tuple[Stage, ...]:
    """Two V's in opposite directions: chain a over devices 0..P-1, chain b over P-1..0.

        0: f  fb  b
        1:  ff  bb
        2:  ff  bb
        3: f  fb  b

    Paper's example: GPT and mT5 with each stage's micro-batch split in two halves that
    run on mirrored devices (bidirectional pipelines, as Chimera runs them). The two
    chains do not join inside a micro-batch: each half's loss starts its own backward,
    and the halves meet only in the weight-gradient all-reduce after the step, which is
    outside the pipeline's schedule. So the shape is two chains and no edge between them.
    """
    a = [c.stage(d, (d + 1,) if d + 1 < p else (), f"a{d}") for d in range(p)]
    b = [c.stage(p - 1 - i, (p + i + 1,) if i + 1 < p else (), f"b{i}") for i in range(p)]
    return tuple(a + b)


def _nnshape(p: int, c: _Costs, sharded_head: bool) -> tuple[Stage, ...]:
    """Two all-device blocks, each followed by a V segment over half the devices:

        0: ff f    b bb
        1: f ff    bb b
        2: f  ff  bb  b
        3: f  f fb b  b

    Paper's example: mT5, an encoder and a decoder, each with its own large embedding
    sharded over all devices; the encoder's layers pipeline over the first half of the
    devices and the decoder's over the second (the decoder's cross-attention inputs are
    left out, as Tessel's placement leaves them out).
    """
    h = _half(p, "nnshape")
    enc = [c.stage(d, (d + 2,) if d + 1 < h else (h + 1,), f"enc{d}") for d in range(h)]
    dec = [c.stage(d, (d + 3,) if d + 1 < p else (), f"dec{d - h}") for d in range(h, p)]
    return (c.shard(p, (1,), "embed_enc"), *enc, c.shard(p, (h + 2,), "embed_dec"), *dec)


def _kshape(p: int, c: _Costs, sharded_head: bool) -> tuple[Stage, ...]:
    """Two V branches over halves of the devices, joined by an all-device block:

        0: f fb b
        1:  ffbb
        2: f fb b
        3:  ffbb

    Paper's example: FLAVA, a multi-modal model: an image encoder and a text encoder,
    each pipelined over half of the devices, feed a multi-modal encoder sharded over all.
    """
    h = _half(p, "kshape")
    join = p
    a = [c.stage(d, (d + 1,) if d + 1 < h else (join,), f"img{d}") for d in range(h)]
    b = [c.stage(d, (d + 1,) if d + 1 < p else (join,), f"txt{d - h}") for d in range(h, p)]
    return (*a, *b, c.shard(p, (), "fusion"))


def _half(p: int, name: str) -> int:
    if p < 2 or p % 2:
        raise SchedlabError(
            f"{name} splits its V over two halves of the devices; give an even number of devices, not {p}"
        )
    return p // 2


_BUILDERS: dict[str, Callable[[int, _Costs, bool], tuple[Stage, ...]]] = {
    "vshape": _vshape,
    "mshape": _mshape,
    "xshape": _xshape,
    "nnshape": _nnshape,
    "kshape": _kshape,
}


def tessel_shape(
    name: str,
    n_devices: int,
    *,
    f_time: float = 1.0,
    b_time: float = 2.0,
    f_mem: float = 1.0,
    shard_f_time: float | None = None,
    shard_b_time: float | None = None,
    shard_mem: float = 0.0,
    sharded_head: bool = False,
) -> PipeShape:
    """Tessel's placement `name` (one of SHAPES) over `n_devices` devices; the module's
    docstring says what each shape is and what its blocks cost."""
    if name not in _BUILDERS:
        raise SchedlabError(f"unknown Tessel shape {name!r}; choose one of: {', '.join(SHAPES)}")
    if n_devices < 1:
        raise SchedlabError(f"a shape needs at least one device, not {n_devices}")
    if sharded_head and name != "mshape":
        raise SchedlabError("sharded_head adds a sharded output head to mshape; the other shapes have none")
    costs = _Costs(f_time, b_time, f_mem, shard_f_time, shard_b_time, shard_mem)
    stages = _BUILDERS[name](n_devices, costs, sharded_head)
    label = "mshape+head" if sharded_head else name
    return PipeShape(stages=stages, n_devices=n_devices, name=label)


def draw(shape: PipeShape) -> str:
    """One micro-batch of `shape`, a row per device: column c holds the blocks whose
    longest chain of predecessors has c blocks, ``f`` forwards then ``b`` backwards."""
    # forward levels: longest path from a source; backward mirrors them after the last forward
    level = [0] * shape.n_stages
    for s in _topological(shape):
        for n in shape.stages[s].next:
            level[n] = max(level[n], level[s] + 1)
    depth = max(level) + 1
    grid = [[" "] * (2 * depth) for _ in range(shape.n_devices)]
    # a backward's column: after every backward of the stages it feeds
    b_level = [0] * shape.n_stages
    for s in reversed(_topological(shape)):
        after = [b_level[n] for n in shape.stages[s].next]
        b_level[s] = max(after) + 1 if after else depth
    for s, st in enumerate(shape.stages):
        for d in st.devices:
            grid[d][level[s]] = "f"
            grid[d][b_level[s]] = "b"
    return "\n".join(f"{d}: {''.join(row).rstrip()}" for d, row in enumerate(grid)) + "\n"


def _topological(shape: PipeShape) -> list[int]:
    indeg = [len(p) for p in shape.prev]
    ready = [s for s, k in enumerate(indeg) if k == 0]
    out: list[int] = []
    while ready:
        s = ready.pop(0)
        out.append(s)
        for n in shape.stages[s].next:
            indeg[n] -= 1
            if indeg[n] == 0:
                ready.append(n)
    return out
