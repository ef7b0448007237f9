"""A synthetic sweep of shapes per op class, for the per-class fits.

The workloads give the shapes a real step uses; the sweep spreads each class over a
range of sizes (seeded; case i of a class's n drawn in the i-th of n equal log bands of
work, `_draw_in_band`) so the fitted model holds between and beyond them.
The FLOPs and bytes of every case come from `schedlab.flops.op_cost`, the same formulas
the Graph's ops carry, so a fitted model applies to Graph ops unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import torch
from torch.utils.flop_counter import sdpa_flop_count

from schedlab.calibrate.aten_call import fast_callable, resolve_target
from schedlab.calibrate.cases import Case
from schedlab.calibrate.signature import fit_class, short_row_floats, signature_of
from schedlab.capture import conv_group_channels, dtype_name, reads_strided, softmax_row_len, tensor_meta
from schedlab.flops import op_cost
from schedlab.graph import op_class_of
from schedlab.recurrent import LSTM_MODE, fused_layer_args

Builder = Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
T = TypeVar("T")


SWEEP_SOURCE = "sweep"  # the source of every sweep case (calibrate.cases.Case.source)


@dataclass(frozen=True)
class SweepConfig:
    """How many synthetic shapes per class, and how large they may get."""

    per_class: int = 8  # cases per op class
    max_flops: float = 3e8  # cap for matmul and convolution work (~3-5 ms on one core)
    max_elems: int = 1 << 21  # cap for tensor elements of memory-bound ops
    seed: int = 0
    # matmuls above `max_flops`, up to this cap, on a random stream of their own (`_big_matmul_specs`)
    big_matmul_flops: float = 0.0
    big_matmuls: int = 4  # per class (mm, addmm) when big_matmul_flops > max_flops
    extra_convs: int = 0  # more cases per convolution class, 2-D and 1-D, on random streams of their own
    # more `mm` and `addmm` cases, banded from `EXTRA_MATMUL_MIN_FLOPS` to `max_flops`, on a stream of their own
    extra_matmuls: int = 0
    # convolutions above `max_flops`, up to this cap, on random streams of their own (`_big_conv_specs`)
    big_conv_flops: float = 0.0
    big_convs: int = 3  # per convolution class (2-D and 1-D, forward and backward) when big_conv_flops > max_flops


@dataclass(frozen=True)
class SweepSpec:
    target: str
    build: Builder  # makes fresh tensors: arguments and keyword arguments


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _band(lo: float, hi: float, i: int, n: int) -> tuple[float, float]:
    """The i-th of n equal bands of [lo, hi] in log space, as (log low, log high)."""
    step = (math.log(hi) - math.log(lo)) / max(1, n)
    return math.log(lo) + step * i, math.log(lo) + step * (i + 1)


def _log_int_in_band(rng: random.Random, lo: int, hi: int, i: int, n: int) -> int:
    """Log-uniform in the i-th of n log bands of [lo, hi]: case i of a class's n."""
    a, b = _band(lo, hi, i, n)
    return round(math.exp(rng.uniform(a, b)))


MAX_BAND_TRIES = 20_000


def _draw_in_band(
    rng: random.Random, draw: Callable[[], T | None], work: Callable[[T], float], lo: float, hi: float, i: int, n: int
) -> T:
    """A draw (None: invalid, drawn again) whose work lies in the i-th of n log bands of
    [lo, hi], else after MAX_BAND_TRIES the valid draw nearest to it. The dimensions are
    drawn as before, but case i of a class's n has its own band of work, so a few cases
    span the whole range: 12 convolutions of log-uniform dimensions under the cap reached
    only 2e7 FLOPs (a quick profile), while the convolutions of models run to 5e8."""
    a, b = _band(lo, hi, i, n)
    best: T | None = None
    best_gap = math.inf
    for _ in range(MAX_BAND_TRIES):
        x = draw()
        if x is None:
            continue
        w = math.log(max(work(x), 1e-30))
        gap = max(a - w, w - b, 0.0)
        if gap == 0.0:
            return x
        if gap < best_gap:
            best, best_gap = x, gap
    assert best is not None, "no valid draw"
    return best


MODEL_DIM_SHARE = 0.75  # share of feature and channel sizes drawn as models have them: multiples of 8


def _model_dim(rng: random.Random, lo: int, hi: int) -> int:
    """A feature or channel size as models have them: log-uniform, and three draws in four
    rounded to a multiple of 8 (sizes below 8, such as an image's 3 channels, kept). oneDNN
    and MKL kernels run such sizes faster (a 3x3 convolution 64 to 64 at 116 GFLOP/s, 61 to
    67 at 92, on the 2-core development VM); a sweep of only random sizes times every class
    slow next to the models it predicts."""
    d = _log_int(rng, lo, hi)
    if d >= 8 and rng.random() < MODEL_DIM_SHARE:
        d = min(hi, max(8, 8 * round(d / 8)))
    return d


# ---- builders: fresh tensors for one case --------------------------------------------------

Call = tuple[tuple[Any, ...], dict[str, Any]]


def _mm(m: int, k: int, n: int) -> Call:
    return (torch.randn(m, k), torch.randn(k, n)), {}  # [m, k] @ [k, n]


def _addmm(m: int, k: int, n: int) -> Call:
    return (torch.randn(n), torch.randn(m, k), torch.randn(k, n)), {}  # bias [n] + [m, k] @ [k, n]


def _bmm(b: int, m: int, k: int, n: int) -> Call:
    return (torch.randn(b, m, k), torch.randn(b, k, n)), {}


def _conv_args(s: int, k: int, groups: int) -> list[Any]:
    return [[s, s], [k // 2, k // 2], [1, 1], False, [0, 0], groups]  # stride, padding, dilation, ...


def _conv(n: int, c: int, o: int, hw: int, k: int, s: int, groups: int = 1) -> Call:
    x, w = torch.randn(n, c, hw, hw), torch.randn(o, c // groups, k, k)  # [N, C, H, W], [O, C/g, k, k]
    return (x, w, None, *_conv_args(s, k, groups)), {}


def _conv_backward(
    n: int, c: int, o: int, hw: int, k: int, s: int, groups: int, mask: tuple[bool, bool, bool]
) -> Call:
    x, w = torch.randn(n, c, hw, hw), torch.randn(o, c // groups, k, k)
    g = torch.randn_like(torch.ops.aten.convolution.default(x, w, None, *_conv_args(s, k, groups)))
    return (g, x, w, [o], *_conv_args(s, k, groups), list(mask)), {}


def _conv1d_args(s: int, k: int, dilation: int) -> list[Any]:
    return [[s], [dilation * (k // 2)], [dilation], False, [0], 1]  # stride, padding, dilation, ...


def _conv1d(n: int, c: int, o: int, length: int, k: int, s: int, dilation: int) -> Call:
    x, w = torch.randn(n, c, length), torch.randn(o, c, k)  # [N, C, L], [O, C, k]
    return (x, w, None, *_conv1d_args(s, k, dilation)), {}


def _conv1d_backward(
    n: int, c: int, o: int, length: int, k: int, s: int, dilation: int, mask: tuple[bool, bool, bool]
) -> Call:
    x, w = torch.randn(n, c, length), torch.randn(o, c, k)
    g = torch.randn_like(torch.ops.aten.convolution.default(x, w, None, *_conv1d_args(s, k, dilation)))
    return (g, x, w, [o], *_conv1d_args(s, k, dilation), list(mask)), {}


def _unary(e: int) -> Call:
    return (torch.randn(e),), {}


def _binary(e: int) -> Call:
    return (torch.randn(e), torch.randn(e)), {}


def _transposed(batch: int, rows: int, cols: int) -> torch.Tensor:
    """A (batch, rows, cols) view of a (batch, cols, rows) tensor: what a transpose of the
    last two dimensions in a model hands on (token mixing, attention's heads)."""
    return torch.randn(batch, cols, rows).transpose(1, 2)


def _strided_unary(batch: int, rows: int, cols: int) -> Call:
    return (_transposed(batch, rows, cols),), {}


def _strided_binary(batch: int, rows: int, cols: int) -> Call:
    return (_transposed(batch, rows, cols), torch.randn(batch, rows, cols)), {}


def _contiguous_copy(batch: int, rows: int, cols: int) -> Call:
    """`.contiguous()` of a transposed view: a clone into the contiguous layout, the
    transposing copy (a plain clone keeps the view's strides and copies straight)."""
    return (_transposed(batch, rows, cols),), {"memory_format": torch.contiguous_format}


def _heads_copy(batch: int, rows: int, cols: int) -> Call:
    """`.contiguous()` of attention's head permute: (B, T, H, D) read as (B, H, T, D), rows
    of D elements in order, gathered across the heads (H: the largest of 1, 2, 4, 8, 16
    dividing `cols`)."""
    heads = max(h for h in (1, 2, 4, 8, 16) if cols % h == 0)
    x = torch.randn(batch, rows, heads, cols // heads).permute(0, 2, 1, 3)
    return (x,), {"memory_format": torch.contiguous_format}


def _threshold_backward(e: int) -> Call:
    return (torch.randn(e), torch.randn(e), 0), {}


def _sum(r: int, c: int, dim: int) -> Call:
    return (torch.randn(r, c), [dim], True), {}


def _softmax(r: int, c: int) -> Call:
    return (torch.randn(r, c), -1, False), {}


def _gelu_backward(e: int) -> Call:
    return (torch.randn(e), torch.randn(e)), {}  # grad, input


def _dropout(e: int, p: float) -> Call:
    return (torch.randn(e), p, True), {}  # training: draws a mask of e elements


def _dropout_backward(e: int, p: float) -> Call:
    return (torch.randn(e), torch.rand(e) >= p, 1.0 / (1.0 - p)), {}  # grad, mask, scale


def _safe_softmax(r: int, c: int) -> Call:
    return (torch.randn(r, c), -1), {}


def _softmax_backward(r: int, c: int) -> Call:
    y = torch.softmax(torch.randn(r, c), -1)
    return (torch.randn(r, c), y, -1, torch.float32), {}


def _layer_norm_backward(r: int, c: int) -> Call:
    x, w, b = torch.randn(r, c), torch.randn(c), torch.randn(c)
    _, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [c], w, b, 1e-5)
    return (torch.randn(r, c), x, [c], mean, rstd, w, b, [True, True, True]), {}


def _layer_norm(r: int, c: int) -> Call:
    return (torch.randn(r, c), [c], torch.randn(c), torch.randn(c), 1e-5), {}


def _nchw(e: int, c: int) -> torch.Tensor:
    """A feature map of about `e` elements with `c` channels: [N, C, H, W], square H = W."""
    hw = max(1, round(math.sqrt(max(1, e // c) / 2)))
    return torch.randn(max(1, e // (c * hw * hw)), c, hw, hw)


def _batch_norm(e: int, c: int) -> Call:
    """Batch norm in training, as a captured `nn.BatchNorm2d` calls it (functional: running
    statistics are outputs)."""
    return (_nchw(e, c), torch.randn(c), torch.randn(c), torch.zeros(c), torch.ones(c), True, 0.1, 1e-5), {}


def _instance_norm(e: int, c: int) -> Call:
    """Instance norm, as a captured `nn.InstanceNorm1d` / `2d` calls it: batch norm without
    running statistics over the batch's channels folded into one image, (1, N x C, L)."""
    return (torch.randn(1, c, max(1, e // c)), torch.randn(c), torch.randn(c), True, 0.1, 1e-5), {}


def _instance_norm_backward(e: int, c: int) -> Call:
    x, w = torch.randn(1, c, max(1, e // c)), torch.randn(c)
    _, mean, invstd = torch.ops.aten._native_batch_norm_legit.no_stats(x, w, None, True, 0.1, 1e-5)
    return (torch.randn_like(x), x, w, None, None, mean, invstd, True, 1e-5, [True, True, True]), {}


def _batch_norm_backward(e: int, c: int) -> Call:
    x = _nchw(e, c)
    w, rm, rv = torch.randn(c), torch.zeros(c), torch.ones(c)
    _, mean, invstd, _, _ = torch.ops.aten._native_batch_norm_legit_functional.default(x, w, None, rm, rv, True, 0.1, 1e-5)
    return (torch.randn_like(x), x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True]), {}


def _group_norm(e: int, c: int) -> Call:
    x = _nchw(e, c)
    n, _, h, w = x.shape
    return (x, torch.randn(c), torch.randn(c), n, c, h * w, _groups_of(c), 1e-5), {}


def _group_norm_backward(e: int, c: int) -> Call:
    x = _nchw(e, c)
    n, _, h, w = x.shape
    wt = torch.randn(c)
    _, mean, rstd = torch.ops.aten.native_group_norm.default(x, wt, None, n, c, h * w, _groups_of(c), 1e-5)
    return (torch.randn_like(x), x, mean, rstd, wt, n, c, h * w, _groups_of(c), [True, True, True]), {}


# Pooling windows as models use them, (kernel, stride, padding): 2x2 halving, the ResNet
# stem's 3x3 stride 2, and nn.MaxPool1d/AvgPool1d's windows on the (N, C, 1, L) map ATen
# pools a 1-D signal as.
POOL_WINDOWS = (
    ((2, 2), (2, 2), (0, 0)),
    ((3, 3), (2, 2), (1, 1)),
    ((1, 2), (1, 2), (0, 0)),
    ((1, 3), (1, 2), (0, 1)),
)
PoolDims = tuple[int, int, int, int]  # N, C, H, W of the pooled map
PoolWindow = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


def _pool_window_args(window: PoolWindow) -> list[list[int]]:
    return [list(part) for part in window]  # kernel, stride, padding


def _max_pool(dims: PoolDims, window: PoolWindow) -> Call:
    return (torch.randn(*dims), *_pool_window_args(window), [1, 1], False), {}


def _max_pool_backward(dims: PoolDims, window: PoolWindow) -> Call:
    x = torch.randn(*dims)
    out, idx = torch.ops.aten.max_pool2d_with_indices.default(x, *_pool_window_args(window), [1, 1], False)
    return (torch.randn_like(out), x, *_pool_window_args(window), [1, 1], False, idx), {}


def _avg_pool(dims: PoolDims, window: PoolWindow) -> Call:
    return (torch.randn(*dims), *_pool_window_args(window), False, True, None), {}


def _avg_pool_backward(dims: PoolDims, window: PoolWindow) -> Call:
    x = torch.randn(*dims)
    out = torch.ops.aten.avg_pool2d.default(x, *_pool_window_args(window), False, True, None)
    return (torch.randn_like(out), x, *_pool_window_args(window), False, True, None), {}


def _groups_of(c: int) -> int:
    """A group count as GroupNorm layers have them: 8 where the channels divide, else 1."""
    return 8 if c % 8 == 0 else 1


def _embedding(vocab: int, dim: int, n_idx: int) -> Call:
    return (torch.randn(vocab, dim), torch.randint(vocab, (n_idx,))), {}


def _cat(r: int, c: int, parts: int) -> Call:
    return ([torch.randn(r, c) for _ in range(parts)], 1), {}


def _lstm_layer(t: int, b: int, i: int, h: int) -> Call:
    """oneDNN's fused LSTM layer as a captured `nn.LSTM` calls it (`schedlab.recurrent`)."""
    x, w_ih, w_hh = torch.randn(t, b, i), torch.randn(4 * h, i) * 0.1, torch.randn(4 * h, h) * 0.1
    b_ih, b_hh, hx, cx = torch.randn(4 * h), torch.randn(4 * h), torch.zeros(1, b, h), torch.zeros(1, b, h)
    return fused_layer_args(x, w_ih, w_hh, b_ih, b_hh, hx, cx, False), {}


def _lstm_layer_backward(t: int, b: int, i: int, h: int) -> Call:
    """Its backward, from a forward's outputs and workspace, the final states' gradients
    unused (None) as when the model reads only the layer's output."""
    args, _ = _lstm_layer(t, b, i, h)
    x, w_ih, w_hh, b_ih, b_hh, hx, cx = args[:7]
    y, hy, cy, workspace = torch.ops.aten.mkldnn_rnn_layer.default(*args)
    return (x, w_ih, w_hh, b_ih, b_hh, hx, cx, y, hy, cy, torch.randn_like(y), None, None, False, LSTM_MODE, h, 1,
            True, True, False, [], False, workspace), {}


def _attention(b: int, h: int, s: int, d: int) -> Call:
    """The CPU flash attention as `nn.MultiheadAttention` calls it: query, key and value of
    [batch, heads, tokens, head width], no dropout, no mask."""
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    return (q, k, v), {}


def _attention_backward(b: int, h: int, s: int, d: int) -> Call:
    """Its backward, from a forward's output and log-sum-exp."""
    (q, k, v), _ = _attention(b, h, s, d)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)
    return (torch.randn_like(out), q, k, v, out, lse, 0.0, False), {}


# ---- shapes ----------------------------------------------------------------------------------


MIN_MATMUL_FLOPS = 1e3  # the bands of work the sweep spreads matmuls and convolutions over
EXTRA_MATMUL_MIN_FLOPS = 1e6  # where `extra_matmuls` start: below it a matmul costs a few microseconds
MIN_CONV_FLOPS = 1e4


def _matmul_specs(
    cfg: SweepConfig, rng: random.Random, count: int | None = None, lo_flops: float = MIN_MATMUL_FLOPS,
    batched: bool = True,
) -> list[SweepSpec]:
    """`count` (default `per_class`) cases each of `mm`, `addmm` and (`batched`) `bmm`, their
    work banded from `lo_flops` to `max_flops`."""
    count = cfg.per_class if count is None else count

    def dims(batch: int = 1) -> tuple[int, int, int] | None:
        d = _log_int(rng, 4, 2048), _model_dim(rng, 4, 2048), _model_dim(rng, 4, 2048)  # rows: any
        return d if 2.0 * batch * math.prod(d) <= cfg.max_flops else None

    def banded(i: int, batch: int = 1) -> tuple[int, int, int]:
        return _draw_in_band(rng, lambda: dims(batch), lambda d: 2.0 * batch * math.prod(d),
                             lo_flops, cfg.max_flops, i, count)

    specs = [SweepSpec("aten.mm.default", partial(_mm, *banded(i))) for i in range(count)]
    specs += [SweepSpec("aten.addmm.default", partial(_addmm, *banded(i))) for i in range(count)]
    for i in range(count if batched else 0):
        b = _log_int(rng, 2, 64)
        specs.append(SweepSpec("aten.bmm.default", partial(_bmm, b, *banded(i, b))))
    return specs


def _big_matmul_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """`mm` and `addmm` with work between `max_flops` and `big_matmul_flops`, banded, drawn
    from a stream of their own so every other case is drawn as without them. A quick
    profile's matmul model otherwise extrapolates past its cap: held-out lstm-lm's output
    projection (`addmm`) and its two backward `mm`s, about 0.4 GFLOP each, were predicted
    11% and 20% fast at one thread. (Raising `max_flops` for
    all classes instead made the convolution fits worse: depthwise-cnn 21.6% to 33.3%.)"""
    if cfg.big_matmul_flops <= cfg.max_flops or cfg.big_matmuls <= 0:
        return []

    def dims() -> tuple[int, int, int] | None:
        d = _log_int(rng, 64, 4096), _model_dim(rng, 64, 4096), _model_dim(rng, 64, 4096)
        return d if cfg.max_flops < 2.0 * math.prod(d) <= cfg.big_matmul_flops else None

    def banded(i: int) -> tuple[int, int, int]:
        return _draw_in_band(rng, dims, lambda d: 2.0 * math.prod(d), cfg.max_flops, cfg.big_matmul_flops, i,
                             cfg.big_matmuls)

    return [SweepSpec(target, partial(make, *banded(i)))
            for target, make in (("aten.mm.default", _mm), ("aten.addmm.default", _addmm))
            for i in range(cfg.big_matmuls)]


def _big_conv_specs(cfg: SweepConfig) -> list[SweepSpec]:
    """Convolutions (2-D and 1-D, forward and backward) with work between `max_flops` and
    `big_conv_flops`, banded, drawn from streams of their own so every other case is drawn
    as without them (as `_big_matmul_specs`). Without them a quick profile's convolution
    fits extrapolate past the cap: on one dev run re-scored, `dev:conv-bn` (1-20 ms
    convolutions) was predicted 14.5% off over its 16 plans by one quick profile of four
    calibrated without them (1.9-2.0% by the other three), 1.9% and 3.0% by the two
    calibrated with them (session 47)."""
    band = (cfg.max_flops, cfg.big_conv_flops)
    return (_conv_specs(cfg, random.Random(cfg.seed + 11), cfg.big_convs, band)
            + _conv1d_specs(cfg, random.Random(cfg.seed + 12), cfg.big_convs, band))


def _conv_specs(
    cfg: SweepConfig, rng: random.Random, count: int | None = None, band: tuple[float, float] | None = None,
) -> list[SweepSpec]:
    """`count` (default `per_class`) cases per convolution class: dense convolutions (1x1,
    3x3, 5x5), and one draw in four grouped: depthwise (a group per channel) or a few
    groups, as MobileNet- and ResNeXt-like blocks have them. Their work is banded over
    `band` (default: `MIN_CONV_FLOPS` to `max_flops`)."""
    count = cfg.per_class if count is None else count
    lo, hi = band or (MIN_CONV_FLOPS, cfg.max_flops)
    Dims = tuple[int, int, int, int, int, int, int]

    def draw() -> Dims | None:
        n, c, o = _log_int(rng, 1, 32), _model_dim(rng, 3, 256), _model_dim(rng, 8, 256)
        hw, k, s = _log_int(rng, 4, 64), rng.choice((1, 3, 3, 5)), rng.choice((1, 1, 2))
        groups = 1
        kind = rng.choice(("dense", "dense", "dense", "grouped"))
        if kind == "grouped" and k > 1:
            groups = rng.choice((c, 2, 4, 8))
            c = o = max(groups, c - c % groups)  # channels a multiple of the groups, out = in
        d = (n, c, o, hw, k, s, groups)
        return d if 0 < _conv_flops(d) <= hi else None

    def banded(i: int) -> Dims:
        return _draw_in_band(rng, draw, _conv_flops, lo, hi, i, count)

    return _convolution_pair(_conv, _conv_backward, banded, count, rng)


BLOCKED_GROUPS = (2, 4, 8, 16, 32)
BLOCKED_GROUP_CHANNELS = (8, 16, 32)  # multiples of `calibrate.signature.CHANNEL_BLOCK`


def _blocked_grouped_conv_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """`per_class` grouped 2-D convolutions per class whose channels per group are multiples
    of oneDNN's block (`calibrate.signature.is_unblocked_groups`), as ResNeXt-like blocks
    have them: the grouped draws of `_conv_specs` take channels per group at random, and of
    the 11 grouped backward cases a quick calibration drew (2026-12-07) one had blocked groups
    and three were depthwise, so the class that such models' convolutions take was fitted on
    the slow path's cases (`is_unblocked_groups`): its wake fit charged held-out
    grouped-resnet's convolution backward 1.3-7.8 ms, where the call paid 208-284 us timed
    the same way. Work banded as `_conv_specs`."""
    lo, hi = MIN_CONV_FLOPS, cfg.max_flops
    Dims = tuple[int, int, int, int, int, int, int]

    def draw() -> Dims | None:
        groups, per_group = rng.choice(BLOCKED_GROUPS), rng.choice(BLOCKED_GROUP_CHANNELS)
        c = groups * per_group
        n, hw, k, s = _log_int(rng, 1, 32), _log_int(rng, 4, 64), rng.choice((3, 3, 5)), rng.choice((1, 1, 2))
        d = (n, c, c, hw, k, s, groups)
        return d if c <= 512 and 0 < _conv_flops(d) <= hi else None

    def banded(i: int) -> Dims:
        return _draw_in_band(rng, draw, _conv_flops, lo, hi, i, cfg.per_class)

    return _convolution_pair(_conv, _conv_backward, banded, cfg.per_class, rng)


CONV_BACKWARD_MASKS = ((True, True, False), (False, True, False), (True, True, True))  # input, weight, bias grads


def _convolution_pair(
    forward: Callable[..., Call], backward: Callable[..., Call], banded: Callable[[int], tuple[int, ...]], count: int,
    rng: random.Random,
) -> list[SweepSpec]:
    """`count` forward convolutions and `count` backward ones (each computing a drawn subset
    of its gradients), case i of each drawn in band i by `banded`."""
    specs = [SweepSpec("aten.convolution.default", partial(forward, *banded(i))) for i in range(count)]
    specs += [
        SweepSpec("aten.convolution_backward.default", partial(backward, *banded(i), rng.choice(CONV_BACKWARD_MASKS)))
        for i in range(count)
    ]
    return specs


def _conv1d_specs(
    cfg: SweepConfig, rng: random.Random, count: int | None = None, band: tuple[float, float] | None = None,
) -> list[SweepSpec]:
    """`count` (default `per_class`) convolutions over one spatial dimension per class
    (`nn.Conv1d`: kernels 3-7, dilated or strided at times), fitted as classes of their own
    (`calibrate.signature.is_conv1d`): oneDNN runs them at another rate per FLOP than 2-D
    convolutions of the same work. Drawn from a random stream of their own, so the other
    cases stay as they were. Work banded over `band` as `_conv_specs`."""
    count = cfg.per_class if count is None else count
    lo, hi = band or (MIN_CONV_FLOPS, cfg.max_flops)
    Dims1d = tuple[int, int, int, int, int, int, int]  # N, C, O, L, k, stride, dilation

    def draw() -> Dims1d | None:
        n, c, o = _log_int(rng, 1, 64), _model_dim(rng, 1, 512), _model_dim(rng, 8, 512)
        length, k = _log_int(rng, 8, 4096), rng.choice((3, 3, 5, 7))
        d = (n, c, o, length, k, rng.choice((1, 1, 2)), rng.choice((1, 1, 2)))
        return d if 0 < _conv1d_flops(d) <= hi else None

    def banded(i: int) -> Dims1d:
        return _draw_in_band(rng, draw, _conv1d_flops, lo, hi, i, count)

    return _convolution_pair(_conv1d, _conv1d_backward, banded, count, rng)


def _conv1d_flops(d: tuple[int, int, int, int, int, int, int]) -> float:
    """A 1-D convolution's FLOPs (0 where its output would be empty)."""
    n, c, o, length, k, s, dilation = d
    out_len = max(0, (length + 2 * dilation * (k // 2) - dilation * (k - 1) - 1) // s + 1)
    return 2.0 * n * o * out_len * c * k


def _conv_flops(d: tuple[int, int, int, int, int, int, int]) -> float:
    """The convolution's FLOPs (0 where its output would be empty)."""
    n, c, o, hw, k, s, groups = d
    out_hw = max(0, (hw + 2 * (k // 2) - k) // s + 1)
    return 2.0 * n * o * out_hw * out_hw * (c // groups) * k * k


MIN_LSTM_FLOPS = 1e5


def _lstm_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    def draw() -> tuple[int, int, int, int] | None:  # sequence models' sizes: hidden 32-1024
        t, b = _log_int(rng, 4, 64), _log_int(rng, 2, 64)
        i, h = _log_int(rng, 16, 512), _log_int(rng, 32, 1024)
        return (t, b, i, h) if _lstm_flops((t, b, i, h)) <= cfg.max_flops else None

    def banded(i: int) -> tuple[int, int, int, int]:
        return _draw_in_band(rng, draw, _lstm_flops, MIN_LSTM_FLOPS, cfg.max_flops, i, cfg.per_class)

    specs = [SweepSpec("aten.mkldnn_rnn_layer.default", partial(_lstm_layer, *banded(i))) for i in range(cfg.per_class)]
    specs += [
        SweepSpec("aten.mkldnn_rnn_layer_backward.default", partial(_lstm_layer_backward, *banded(i)))
        for i in range(cfg.per_class)
    ]
    return specs


MIN_ATTENTION_FLOPS = 1e4


def _attention_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """The CPU flash attention, forward and backward, over the bands of work: the
    calibration graphs call it at one size only (a 672-FLOP forward), from which no fit can
    say what a model's attention of 10-100 MFLOP costs."""

    def draw() -> tuple[int, int, int, int] | None:  # sequence models' sizes: 8-512 tokens, heads 16-128 wide
        b, h = _log_int(rng, 1, 32), _log_int(rng, 1, 16)
        s, d = _log_int(rng, 8, 512), rng.choice((16, 32, 64, 128))
        return (b, h, s, d) if _attention_flops((b, h, s, d)) <= cfg.max_flops else None

    def banded(i: int) -> tuple[int, int, int, int]:
        return _draw_in_band(rng, draw, _attention_flops, MIN_ATTENTION_FLOPS, cfg.max_flops, i, cfg.per_class)

    target = "aten._scaled_dot_product_flash_attention_for_cpu"
    specs = [SweepSpec(f"{target}.default", partial(_attention, *banded(i))) for i in range(cfg.per_class)]
    specs += [SweepSpec(f"{target}_backward.default", partial(_attention_backward, *banded(i)))
              for i in range(cfg.per_class)]
    return specs


def _attention_flops(dims: tuple[int, int, int, int]) -> float:
    """A forward's FLOPs on query, key and value of shape `dims`, as `schedlab.flops`
    counts them (torch's `sdpa_flop_count`)."""
    return float(sdpa_flop_count(dims, dims, dims))


def _lstm_flops(d: tuple[int, int, int, int]) -> float:
    t, b, i, h = d
    return 2.0 * t * b * 4 * h * (i + h)


def _memory_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    per = max(2, cfg.per_class)

    def numel(i: int) -> int:  # case i of a class's `per`: its own band of sizes
        return _log_int_in_band(rng, 16, cfg.max_elems, i, per)

    def rows_cols(i: int) -> tuple[int, int]:
        total = max(16, numel(i))  # last dims as models have them: 16 (heads) .. 4096 (hidden, vocab)
        cols = _log_int(rng, 16, min(4096, total))
        return max(1, total // cols), cols

    unary = ("aten.relu.default", "aten.sigmoid.default", "aten.tanh.default", "aten.gelu.default", "aten.clone.default")
    binary = ("aten.add.Tensor", "aten.mul.Tensor", "aten.div.Tensor")
    specs: list[SweepSpec] = []
    for target in unary:
        specs += [SweepSpec(target, partial(_unary, numel(i))) for i in range(per)]
    for target in binary:
        specs += [SweepSpec(target, partial(_binary, numel(i))) for i in range(per)]
    specs += [SweepSpec("aten.threshold_backward.default", partial(_threshold_backward, numel(i))) for i in range(per)]
    specs += [SweepSpec("aten.sum.dim_IntList", partial(_sum, *rows_cols(i), rng.choice((0, 1)))) for i in range(per)]
    specs += [SweepSpec("aten._softmax.default", partial(_softmax, *rows_cols(i))) for i in range(per)]
    specs += [SweepSpec("aten._log_softmax.default", partial(_softmax, *rows_cols(i))) for i in range(per)]
    specs += [SweepSpec("aten.native_layer_norm.default", partial(_layer_norm, *rows_cols(i))) for i in range(per)]
    # the backward of the two most common activations' and norms' forwards above
    specs += [SweepSpec("aten.gelu_backward.default", partial(_gelu_backward, numel(i))) for i in range(per)]
    specs += [
        SweepSpec("aten.native_layer_norm_backward.default", partial(_layer_norm_backward, *rows_cols(i)))
        for i in range(per)
    ]
    # dropout in training draws a random mask (measured 2026-11-26 on heldout:dropout-encoder:
    # its 10 dropouts, of 1.5 K to 295 K elements, took 13.4 ms a step, which the profile,
    # never having timed one, predicted at 0.35); attention's masked softmax
    # (nn.MultiheadAttention) and softmax's backward
    specs += [SweepSpec("aten.native_dropout.default", partial(_dropout, numel(i), rng.choice((0.1, 0.2, 0.5))))
              for i in range(per)]
    specs += [
        SweepSpec("aten.native_dropout_backward.default", partial(_dropout_backward, numel(i), rng.choice((0.1, 0.5))))
        for i in range(per)
    ]
    specs += [SweepSpec("aten._safe_softmax.default", partial(_safe_softmax, *rows_cols(i))) for i in range(per)]
    specs += [SweepSpec("aten._softmax_backward_data.default", partial(_softmax_backward, *rows_cols(i)))
              for i in range(per)]
    specs += [
        SweepSpec(
            "aten.embedding.default",
            partial(_embedding, _log_int(rng, 16, 32768), _log_int(rng, 8, 512), _log_int(rng, 1, 4096)),
        )
        for i in range(per)
    ]
    specs += [SweepSpec("aten.cat.default", partial(_cat, *rows_cols(i), rng.choice((2, 3, 4)))) for i in range(per)]
    # the norms of convolutional models, over feature maps of every size (captured models
    # alone gave a quick profile four batch norms of at most 25 KB; models' run to 8 MB)
    for target, build in (
        ("aten._native_batch_norm_legit_functional.default", _batch_norm),
        ("aten.native_batch_norm_backward.default", _batch_norm_backward),
        ("aten.native_group_norm.default", _group_norm),
        ("aten.native_group_norm_backward.default", _group_norm_backward),
    ):
        specs += [SweepSpec(target, partial(build, numel(i), _model_dim(rng, 8, 512))) for i in range(per)]
    return specs


def _strided_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """Memory-bound ops on a transposed input (an MLP-Mixer's token mixing): as many bytes
    as their contiguous cases, read with strides, several times the time. Each class's cases
    fit its strided model (`calibrate.signature.fit_class`); drawn from their own random
    stream, so the other cases stay as they were."""
    per = max(2, cfg.per_class)

    def shape(i: int) -> tuple[int, int, int]:  # case i in its band of sizes; each side 16..1024
        total = _log_int_in_band(rng, 256, cfg.max_elems, i, per)
        rows = _log_int(rng, 16, min(1024, total // 16))
        cols = _log_int(rng, 16, max(16, min(1024, total // rows)))
        return max(1, total // (rows * cols)), rows, cols

    specs: list[SweepSpec] = []
    # half the copies transpose the last two dimensions, half permute heads
    specs += [SweepSpec("aten.clone.default", partial(_heads_copy if i % 2 else _contiguous_copy, *shape(i)))
              for i in range(per)]
    specs += [SweepSpec("aten.gelu.default", partial(_strided_unary, *shape(i))) for i in range(per)]
    for target in ("aten.add.Tensor", "aten.mul.Tensor"):
        specs += [SweepSpec(target, partial(_strided_binary, *shape(i))) for i in range(per)]
    return specs


SHORT_ROW_TARGETS: tuple[tuple[str, Callable[[int, int], Call]], ...] = (
    ("aten._softmax.default", _softmax),
    ("aten._log_softmax.default", _softmax),
    ("aten._safe_softmax.default", _safe_softmax),
    ("aten._softmax_backward_data.default", _softmax_backward),
    ("aten._log_softmax_backward_data.default", _softmax_backward),
)


def _short_row_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """Softmax, forward and backward, over rows shorter than the host's vector
    (`calibrate.signature.short_row_floats`): attention over a dozen tokens, a loss over ten
    classes. ATen runs those about ten times slower per element than rows of 16 at equal
    bytes, so each class gets a model of its own (``_softmax[short]``, `fit_class`); the
    memory sweep's rows are 16 and longer. At most an eighth of `max_elems` (about 14 ns an
    element at one thread). Drawn from their own random stream, so the other cases stay as
    they were."""
    per = max(2, cfg.per_class)
    short = short_row_floats()
    specs: list[SweepSpec] = []
    for target, build in SHORT_ROW_TARGETS:
        for i in range(per):
            total = _log_int_in_band(rng, 64, max(128, cfg.max_elems // 8), i, per)
            cols = rng.randint(2, short - 1)
            specs.append(SweepSpec(target, partial(build, max(1, total // cols), cols)))
    return specs


def _instance_norm_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """Instance norm, forward and backward, over feature maps of every size: a batch of 1-32
    of 8-512 channels (`_instance_norm`). Its forward is a class no other case times (measured
    2026-12-03 on the dev set's conv1d-instnorm: 1.2 ms a call of (1, 2,048, 1,024) where the
    roofline charged 0.19). Drawn from their own random stream, so the other cases stay as
    they were."""
    per = max(2, cfg.per_class)
    specs: list[SweepSpec] = []
    for target, build in (("aten._native_batch_norm_legit.no_stats", _instance_norm),
                          ("aten.native_batch_norm_backward.default", _instance_norm_backward)):
        for i in range(per):
            total = _log_int_in_band(rng, 256, cfg.max_elems, i, per)
            channels = min(total // 4, _model_dim(rng, 8, 512) * _log_int(rng, 1, 32))
            specs.append(SweepSpec(target, partial(build, total, max(1, channels))))
    return specs


def _pooling_specs(cfg: SweepConfig, rng: random.Random) -> list[SweepSpec]:
    """Max and average pooling, forward and backward, over feature maps of every size and the
    windows of `POOL_WINDOWS`. ATen's NCHW pooling costs about 4-5 ns per input element on
    one core of the 2-core VM (measured 2026-11-27: a [1, 2] max pool of a (32, 64, 1, 512)
    map 4.9 ms at one thread, a 2x2 one of a (32, 64, 16, 16) map 2.3 ms); the memory
    roofline gave held-out conv1d-two-branch's max pool 109 us where it took 2.3 ms. Until
    this sweep only the coverage models' few max pools were timed (one shape in a quick
    profile, three in a full one), too few for a fit of the class's own. Drawn from their
    own random stream, so the other cases stay as they were."""
    per = max(2, cfg.per_class)

    def dims(i: int, window: PoolWindow) -> PoolDims:  # case i in its band of map sizes
        total = _log_int_in_band(rng, 256, cfg.max_elems, i, per)
        c = _model_dim(rng, 8, 512)
        if window[0][0] == 1:  # a 1-D signal: (N, C, 1, L)
            length = _log_int(rng, 8, max(8, min(4096, total // c)))
            return max(1, total // (c * length)), c, 1, length
        hw = max(4, round(math.sqrt(max(1, total // c) / 2)))
        return max(1, total // (c * hw * hw)), c, hw, hw

    specs: list[SweepSpec] = []
    for target, build in (
        ("aten.max_pool2d_with_indices.default", _max_pool),
        ("aten.max_pool2d_with_indices_backward.default", _max_pool_backward),
        ("aten.avg_pool2d.default", _avg_pool),
        ("aten.avg_pool2d_backward.default", _avg_pool_backward),
    ):
        for i in range(per):
            window = POOL_WINDOWS[i % len(POOL_WINDOWS)]
            specs.append(SweepSpec(target, partial(build, dims(i, window), window)))
    return specs


def sweep_specs(cfg: SweepConfig) -> list[SweepSpec]:
    """Every synthetic case of the sweep (tensors are made only when a case is iterated)."""
    rng = random.Random(cfg.seed)
    if cfg.per_class <= 0:
        return []
    specs = _matmul_specs(cfg, rng) + _conv_specs(cfg, rng) + _memory_specs(cfg, rng)
    if torch.backends.mkldnn.is_available():  # the fused LSTM layer a captured nn.LSTM runs
        specs += _lstm_specs(cfg, random.Random(cfg.seed + 1))
    # each later group on a random stream of its own, so that adding one leaves every other case as drawn
    specs += _strided_specs(cfg, random.Random(cfg.seed + 2)) + _pooling_specs(cfg, random.Random(cfg.seed + 4))
    specs += _conv1d_specs(cfg, random.Random(cfg.seed + 6)) + _attention_specs(cfg, random.Random(cfg.seed + 8))
    specs += _short_row_specs(cfg, random.Random(cfg.seed + 9)) + _instance_norm_specs(cfg, random.Random(cfg.seed + 10))
    specs += _blocked_grouped_conv_specs(cfg, random.Random(cfg.seed + 13))
    specs += _big_matmul_specs(cfg, random.Random(cfg.seed + 3))
    if cfg.big_conv_flops > cfg.max_flops and cfg.big_convs > 0:  # past the cap (`_big_conv_specs`)
        specs += _big_conv_specs(cfg)
    if cfg.extra_convs > 0:  # more of both convolution kinds
        specs += _conv_specs(cfg, random.Random(cfg.seed + 5), cfg.extra_convs)
        specs += _conv1d_specs(cfg, random.Random(cfg.seed + 7), cfg.extra_convs)
    if cfg.extra_matmuls > 0:  # more `mm` and `addmm` where models spend their matmul time
        specs += _matmul_specs(cfg, random.Random(cfg.seed + 11), cfg.extra_matmuls, EXTRA_MATMUL_MIN_FLOPS, False)
    return specs


def _encode(a: Any) -> Any:
    """Tensors -> "T"-like placeholders for the signature; the rest as in a Graph."""
    if isinstance(a, torch.Tensor):
        return {"v": 0}
    if isinstance(a, dict):
        return {k: _encode(v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [_encode(x) for x in a]
    if isinstance(a, torch.dtype):  # as `schedlab.capture` encodes one
        return {"dtype": dtype_name(a)}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    return a


def sweep_cases(specs: list[SweepSpec], seen: set[str]) -> Iterator[Case]:
    """Cases for `specs`, skipping signatures already in `seen` (which is updated)."""
    for spec in specs:
        overload = resolve_target(spec.target)
        if not isinstance(overload, torch._ops.OpOverload):
            continue
        fn = fast_callable(overload)
        args, kwargs = spec.build()
        out = fn(*args, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        tensors_in = [a for a in _flatten(args) if isinstance(a, torch.Tensor)]
        flops, nbytes = op_cost(
            overload,
            args,
            kwargs,
            outs,
            [tensor_meta(t) for t in tensors_in],
            [tensor_meta(o) for o in outs],
            False,
        )
        del out, outs
        op_class = op_class_of(spec.target)
        strided = reads_strided(op_class, tensors_in)
        row_len = softmax_row_len(op_class, args)
        sig = signature_of(spec.target, flops, nbytes, _encode(args), _encode(kwargs), strided, row_len)
        if sig in seen:
            continue
        seen.add(sig)
        fit_key = fit_class(op_class, strided, args, row_len, conv_group_channels(op_class, args))
        yield Case(sig, fit_key, spec.target, flops, nbytes, fn, args, kwargs, SWEEP_SOURCE)


def _flatten(a: Any) -> Iterator[Any]:
    if isinstance(a, (list, tuple)):
        for x in a:
            yield from _flatten(x)
    else:
        yield a
