"""Coverage models: small calibration-only models made of the stock `torch.nn` layers users
build their models from, so the Profile has measured the op classes those lower to.

The built-in workloads (mlp, cnn, transformer, nmt) are written out by hand; a user's
model is made of `nn.GRU`, `nn.Conv1d`, `nn.MultiheadAttention`, `nn.GroupNorm`... whose
joint aten graphs hold ops the built-ins never produce (`convolution_backward` of a
depthwise 1-d convolution, `native_group_norm_backward`, the flash-attention kernels,
`embedding_dense_backward` of a padded embedding, an `nn.GRU` unrolled one cell per time
step). Each coverage model is captured and replayed like a workload (`cases.py`): its
distinct ops are benchmarked on the real tensors of a step, at several shapes (`SHAPES`),
so the per-class fits see every class at more than one size.

These models exist for calibration only; they are not workloads and the simulator's
error is never judged on them (the held-out models of `schedlab.workloads` are a separate,
unseen set that calibration must never name).

    recurrent   nn.GRU (2 layers), bidirectional nn.LSTM, nn.RNN (tanh), over an embedding
    conv        Conv1d + BatchNorm1d; Conv2d, grouped and depthwise, GroupNorm, BatchNorm2d,
                max and adaptive pooling; Conv3d + average pooling
    attention   nn.MultiheadAttention with and without weights, F.scaled_dot_product_attention
                (causal), LayerNorm, GELU, SiLU, residuals, mean pooling
    reduce      reductions (mean, amax, var, logsumexp, norm), copies of permuted views,
                cumsum, where/masking, mse and smooth-L1 losses

`COLD_PROBE` ("stream": memory-bound layers on tensors of megabytes at every shape, Linear,
BatchNorm1d, LayerNorm, ReLU, GELU, Tanh, Dropout, a residual add, a 1x1 Conv2d,
BatchNorm2d, Hardswish) is replayed only by a calibration that measures cold costs
(`calibrate.cold`, `schedlab calibrate --cold`): what a step pays for data that is not in
the caches shows only on such ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

COVERAGE_MODELS: tuple[str, ...] = ("recurrent", "conv", "attention", "reduce")
COLD_PROBE = "stream"  # replayed when cold costs are measured (calibrate.cold)


@dataclass(frozen=True)
class Shape:
    """One size of every coverage model: batch, sequence or spatial extent, width."""

    name: str
    batch: int
    length: int  # tokens (attention), samples / 8 (conv1d), rows / 4 (reduce)
    width: int  # hidden size / channels / embedding width
    spatial: int  # H = W of the 2-d convolutions (3-d: half of it)


RECURRENT_STEPS = 3  # nn.GRU & co. unroll one cell per step in the joint graph

# quick calibration measures the first shape; full calibration measures them all.
SHAPES: tuple[Shape, ...] = (
    Shape("small", batch=4, length=6, width=24, spatial=8),
    Shape("medium", batch=8, length=10, width=96, spatial=16),
    Shape("large", batch=16, length=8, width=256, spatial=24),
)


class _Recurrent(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.gru = nn.GRU(width, width, num_layers=2, batch_first=True)
        self.lstm = nn.LSTM(width, width // 2, batch_first=True, bidirectional=True)
        self.rnn = nn.RNN(width, width, batch_first=True, nonlinearity="tanh")
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        x = self.embed(tokens)  # [B, T, W]
        x, _ = self.gru(x)
        x, _ = self.lstm(x)  # [B, T, 2 * W/2]
        x, _ = self.rnn(x)
        logits = self.head(x)  # [B, T, V]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class _Conv(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        c = max(8, width // 2 // 4 * 4)  # divisible by the groups below
        self.c1 = nn.Sequential(nn.Conv1d(4, c, 5, padding=2), nn.BatchNorm1d(c), nn.ReLU(), nn.Conv1d(c, c, 3, groups=c, padding=1))
        self.c2 = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, groups=4),
            nn.GroupNorm(4, c),
            nn.SiLU(),
            nn.Conv2d(c, c, 3, padding=1, groups=c, stride=2),  # depthwise
            nn.Conv2d(c, 2 * c, 1),  # pointwise
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1),
        )
        self.c3 = nn.Sequential(nn.Conv3d(2, c, 3, padding=1), nn.LeakyReLU(0.1), nn.AvgPool3d(2))
        self.head = nn.Linear(c + 2 * c + c, classes)

    def forward(self, seq: Tensor, image: Tensor, volume: Tensor, targets: Tensor) -> Tensor:
        a = self.c1(seq).amax(dim=-1)  # [B, c]
        b = self.c2(image).flatten(1)  # [B, 2c]
        v = self.c3(volume).mean(dim=(2, 3, 4))  # [B, c]
        return F.cross_entropy(self.head(torch.cat([a, b, v], dim=1)), targets)


class _Attention(nn.Module):
    def __init__(self, vocab: int, width: int, length: int) -> None:
        super().__init__()
        heads = 4 if width % 4 == 0 else 1
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(length, width) * 0.02)
        self.norm1 = nn.LayerNorm(width)
        self.mha_w = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mha = nn.MultiheadAttention(width, heads, batch_first=True)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ff = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        x = self.embed(tokens) + self.pos  # [B, T, W]
        h = self.norm1(x)
        x = x + self.mha_w(h, h, h)[0]  # with attention weights: explicit bmm + softmax
        h = self.norm2(x)
        x = x + self.mha(h, h, h, need_weights=False)[0]  # fused attention
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, heads, T, W/heads]
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        x = x + self.ff(x)
        return F.cross_entropy(self.head(x.mean(dim=1)), targets)


class _Reduce(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        h = torch.tanh(self.lin(x))  # [B, R, W]
        t = h.permute(0, 2, 1).contiguous()  # a copy of a permuted view
        s = t.var(dim=-1) + t.amax(dim=-1) + torch.logsumexp(h, dim=1)  # [B, W]
        s = s + h.norm(dim=1) + h.cumsum(dim=1)[:, -1]
        s = torch.where(s > 0, s, 0.5 * s)
        pred = self.out(s).squeeze(-1)  # [B]
        return F.mse_loss(pred, target) + F.smooth_l1_loss(pred, target)


class _Stream(nn.Module):
    def __init__(self, width: int, channels: int) -> None:
        super().__init__()
        self.rows = nn.Sequential(
            nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width), nn.LayerNorm(width),
            nn.GELU(), nn.Dropout(0.1),
        )
        self.mix = nn.Linear(width, width)
        self.maps = nn.Sequential(nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels), nn.Hardswish())

    def forward(self, rows: Tensor, maps: Tensor) -> Tensor:
        h = self.rows(rows)
        h = h + torch.tanh(self.mix(h))  # [R, W]
        m = self.maps(maps)  # [B, C, S, S]
        return h.pow(2).mean() + m.pow(2).mean()


def build(name: str, shape: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Coverage model `name` at `shape`, in training mode, with its inputs (global RNG)."""
    builders: dict[str, Callable[[Shape], tuple[nn.Module, tuple[Tensor, ...]]]] = {
        "recurrent": _build_recurrent,
        "conv": _build_conv,
        "attention": _build_attention,
        "reduce": _build_reduce,
        "stream": _build_stream,
    }
    if name not in builders:
        raise KeyError(f"unknown coverage model {name!r}; known: {', '.join(builders)}")
    module, inputs = builders[name](shape)
    return module.train(), inputs


def _build_recurrent(s: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    vocab = 4 * s.width
    steps = RECURRENT_STEPS  # every step repeats the same cell ops: more steps add ops, not shapes
    tokens = torch.randint(vocab, (s.batch, steps))
    return _Recurrent(vocab, s.width), (tokens, torch.randint(vocab, (s.batch, steps)))


def _build_conv(s: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    seq = torch.randn(s.batch, 4, 8 * s.length)
    image = torch.randn(s.batch, 3, s.spatial, s.spatial)
    volume = torch.randn(s.batch, 2, max(4, s.spatial // 2), max(4, s.spatial // 2), 4)
    classes = 10
    return _Conv(s.width, classes), (seq, image, volume, torch.randint(classes, (s.batch,)))


def _build_attention(s: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    vocab = 2 * s.width
    tokens = torch.randint(vocab, (s.batch, s.length))
    return _Attention(vocab, s.width, s.length), (tokens, torch.randint(vocab, (s.batch,)))


def _build_reduce(s: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    x = torch.randn(s.batch, 4 * s.length, s.width)
    return _Reduce(s.width), (x, torch.randn(s.batch))


STREAM_MIB = 4  # the stream model's activations at the small shape; doubling with the batch


def _build_stream(s: Shape) -> tuple[nn.Module, tuple[Tensor, ...]]:
    width, channels, side = 512, 32, 32
    scale = max(1, s.batch // SHAPES[0].batch)  # megabytes at every shape: 4 MiB small, 8 medium, 16 large
    rows = STREAM_MIB * (1 << 20) // 4 // width * scale
    maps = torch.randn(STREAM_MIB * (1 << 20) // 4 // (channels * side * side) * scale, channels, side, side)
    return _Stream(width, channels), (torch.randn(rows, width), maps)
