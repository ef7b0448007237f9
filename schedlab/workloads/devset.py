"""The dev set: models to choose simulator changes on, so that the held-out set stays a test.

`schedlab calibrate` fits on the built-in workloads (the training set) and `schedlab
fidelity --held-out` judges on the held-out models (the test set). A change to the cost or
co-run model judged by re-scoring held-out runs is tuned on the test set. These models are
the third set, for that choice: built from stock `torch.nn` layers, never replayed by
calibration, never in the held-out set (`tests/test_devset.py` checks both). `schedlab
fidelity --dev` runs the held-out protocol on them (profile-only and trace-calibrated, the
same plans, rounds, results file and `--rescore`); judge a change there, then measure the
held-out set once.

Load one as ``dev:NAME`` wherever a MODEL is accepted; ``dev:`` is a reserved prefix.

- ``gru``, ``gru-big``, ``lstm``, ``dwconv``, ``attn``, ``mixer``: small models of kinds the
  held-out set has too (an unrolled `nn.GRU`, a fused `nn.LSTM`, depthwise and grouped
  convolutions, `nn.MultiheadAttention`, an MLP-Mixer's token mixing by transposes), at shapes the calibration graphs do not replay
  (`calibrate.coverage.SHAPES`); one shape at every size.
- ``conv-bn``, ``ln-mlp``, ``conv1d-instnorm``: megabytes per op at size default, where a
  memory-bound op in a step runs from memory rather than from the caches a benchmark
  keeps warm; smaller at size tiny.
- ``towers``: two independent towers of `nn.Conv2d` over one image, so that two slots co-run
  two big convolutions at once, as held-out conv1d-two-branch and bilstm-classifier do and
  no other dev model did (added 2026-12-06 to judge the fade of the oversubscription factor,
  `calibrate.corun`); smaller at size tiny.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.errors import SchedlabError
from schedlab.workloads.sizes import config_at

PREFIX = "dev:"

Factory = Callable[[str], tuple[nn.Module, tuple[Tensor, ...]]]


class GRUTagger(nn.Module):
    """Token ids -> embedding -> nn.GRU -> per-token tag logits; cross-entropy."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, tags)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x, y: [B, T] int64
        h, _ = self.rnn(self.embed(x))  # [B, T, H]
        return F.cross_entropy(self.out(h).flatten(0, 1), y.flatten())


class LSTMClassifier(nn.Module):
    """Token ids -> embedding -> 2-layer nn.LSTM -> last step -> class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 20)
        self.rnn = nn.LSTM(20, 40, 2, batch_first=True)
        self.out = nn.Linear(40, 5)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, T] int64, y: [B] int64
        h, _ = self.rnn(self.embed(x))  # [B, T, 40]
        return F.cross_entropy(self.out(h[:, -1]), y)


class DepthwiseConv(nn.Module):
    """An image branch (GroupNorm, depthwise conv, BatchNorm2d) and a sequence branch
    (Conv1d, BatchNorm1d, a grouped Conv1d), summed into class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )
        self.seq = nn.Sequential(
            nn.Conv1d(6, 24, 7, padding=3), nn.BatchNorm1d(24), nn.GELU(), nn.Conv1d(24, 24, 5, padding=2, groups=4)
        )
        self.out = nn.Linear(24, 10)

    def forward(self, image: Tensor, seq: Tensor, y: Tensor) -> Tensor:
        # image: [B, 3, H, W], seq: [B, 6, L], y: [B] int64
        return F.cross_entropy(self.image(image) + self.out(self.seq(seq).mean(-1)), y)


class TokenMixer(nn.Module):
    """Patch vectors -> Linear embedding -> blocks of a token-mixing MLP (LayerNorm, across
    the token dimension by a transpose) and a channel-mixing MLP, residual -> mean over
    tokens -> class logits (an MLP-Mixer over a sequence)."""

    def __init__(self, patch: int = 48, tokens: int = 49, width: int = 96, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(patch, width)
        self.token_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.token_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(tokens, 128), nn.GELU(), nn.Linear(128, tokens)) for _ in range(blocks))
        self.channel_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.channel_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, width)) for _ in range(blocks))
        self.out = nn.Linear(width, 10)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, T, P], y: [B] int64
        h = self.embed(x)  # [B, T, C]
        for tn, tm, cn, cm in zip(self.token_norms, self.token_mlps, self.channel_norms, self.channel_mlps,
                                  strict=True):
            h = h + tm(tn(h).transpose(1, 2)).transpose(1, 2)
            h = h + cm(cn(h))
        return F.cross_entropy(self.out(h.mean(1)), y)


class Attention(nn.Module):
    """Embedding -> pre-norm nn.MultiheadAttention and feed-forward, residual -> max over
    tokens -> class logits."""

    def __init__(self, vocab: int = 200, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.mha = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 3 * width), nn.ReLU(), nn.Linear(3 * width, width))
        self.out = nn.Linear(width, 7)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, T] int64, y: [B] int64
        h = self.embed(x)  # [B, T, C]
        a = self.norm(h)
        h = h + self.mha(a, a, a)[0]
        h = h + self.ff(self.norm2(h))
        return F.cross_entropy(self.out(h.max(1).values), y)


@dataclass(frozen=True)
class ConvBNConfig:
    batch: int
    image: int  # height = width
    widths: tuple[int, ...]
    classes: int


CONV_BN = {
    "tiny": ConvBNConfig(batch=2, image=8, widths=(4, 8), classes=3),
    "default": ConvBNConfig(batch=16, image=48, widths=(24, 48, 48), classes=10),
}


class ConvBN(nn.Module):
    """Conv2d + BatchNorm2d + ReLU blocks -> global mean -> class logits."""

    def __init__(self, cfg: ConvBNConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for w in cfg.widths:
            layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, cfg.classes)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, 3, H, W], y: [B] int64
        return F.cross_entropy(self.head(self.body(x).mean(dim=(2, 3))), y)


@dataclass(frozen=True)
class MLPConfig:
    batch: int
    width: int
    hidden: int
    depth: int


LN_MLP = {
    "tiny": MLPConfig(batch=4, width=8, hidden=16, depth=2),
    "default": MLPConfig(batch=384, width=512, hidden=1536, depth=3),
}


class LayerNormMLP(nn.Module):
    """Residual blocks of LayerNorm, Linear, GELU, Dropout (on), Linear -> a regression."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(cfg.width), nn.Linear(cfg.width, cfg.hidden), nn.GELU(), nn.Dropout(0.1),
                          nn.Linear(cfg.hidden, cfg.width))
            for _ in range(cfg.depth)
        )
        self.out = nn.Linear(cfg.width, 1)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, W], y: [B]
        for block in self.blocks:
            x = x + block(x)
        return F.mse_loss(self.out(x).squeeze(-1), y)


@dataclass(frozen=True)
class SeqConfig:
    batch: int
    length: int
    channels: int
    blocks: int


CONV1D_INSTNORM = {
    "tiny": SeqConfig(batch=2, length=16, channels=4, blocks=2),
    "default": SeqConfig(batch=32, length=1024, channels=64, blocks=3),
}


class Conv1dInstanceNorm(nn.Module):
    """Conv1d -> residual blocks of Conv1d, InstanceNorm1d, SiLU -> max over time -> logits."""

    def __init__(self, cfg: SeqConfig) -> None:
        super().__init__()
        self.inp = nn.Conv1d(8, cfg.channels, 5, padding=2)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(cfg.channels, cfg.channels, 3, padding=1),
                          nn.InstanceNorm1d(cfg.channels, affine=True), nn.SiLU())
            for _ in range(cfg.blocks)
        )
        self.out = nn.Linear(cfg.channels, 4)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, 8, L], y: [B] int64
        h = self.inp(x)  # [B, C, L]
        for block in self.blocks:
            h = h + block(h)
        return F.cross_entropy(self.out(h.amax(dim=2)), y)


@dataclass(frozen=True)
class TowersConfig:
    batch: int
    image: int
    width: int
    classes: int = 10


TOWERS = {
    "tiny": TowersConfig(batch=2, image=8, width=4),
    "default": TowersConfig(batch=8, image=32, width=32),
}


class TwoTowers(nn.Module):
    """Two independent towers of Conv2d + ReLU (3x3 and 5x5 kernels) over one image, their
    pooled features summed into class logits."""

    def __init__(self, cfg: TowersConfig) -> None:
        super().__init__()

        def tower(k: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(3, cfg.width, k, padding=k // 2), nn.ReLU(),
                                 nn.Conv2d(cfg.width, cfg.width, k, padding=k // 2), nn.ReLU())

        self.small, self.large = tower(3), tower(5)
        self.head = nn.Linear(cfg.width, cfg.classes)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        # x: [B, 3, H, W], y: [B] int64
        h = self.small(x).mean(dim=(2, 3)) + self.large(x).mean(dim=(2, 3))
        return F.cross_entropy(self.head(h), y)


def _towers(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(TOWERS, size)
    return TwoTowers(cfg), (torch.randn(cfg.batch, 3, cfg.image, cfg.image), torch.randint(cfg.classes, (cfg.batch,)))


def _conv_bn(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(CONV_BN, size)
    return ConvBN(cfg), (torch.randn(cfg.batch, 3, cfg.image, cfg.image), torch.randint(cfg.classes, (cfg.batch,)))


def _ln_mlp(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(LN_MLP, size)
    return LayerNormMLP(cfg), (torch.randn(cfg.batch, cfg.width), torch.randn(cfg.batch))


def _conv1d_instnorm(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(CONV1D_INSTNORM, size)
    return Conv1dInstanceNorm(cfg), (torch.randn(cfg.batch, 8, cfg.length), torch.randint(4, (cfg.batch,)))


DEV: dict[str, Factory] = {
    "gru": lambda size: (GRUTagger(300, 48, 80, 2, 12), (torch.randint(300, (6, 20)), torch.randint(12, (6, 20)))),
    "gru-big": lambda size: (GRUTagger(1000, 128, 256, 1, 12),
                             (torch.randint(1000, (16, 16)), torch.randint(12, (16, 16)))),
    "lstm": lambda size: (LSTMClassifier(), (torch.randint(100, (5, 9)), torch.randint(5, (5,)))),
    "dwconv": lambda size: (DepthwiseConv(),
                            (torch.randn(6, 3, 20, 20), torch.randn(6, 6, 50), torch.randint(10, (6,)))),
    "attn": lambda size: (Attention(), (torch.randint(200, (8, 12)), torch.randint(7, (8,)))),
    "mixer": lambda size: (TokenMixer(), (torch.randn(16, 49, 48), torch.randint(10, (16,)))),
    "conv-bn": _conv_bn,
    "ln-mlp": _ln_mlp,
    "conv1d-instnorm": _conv1d_instnorm,
    "towers": _towers,
}
# Their MODEL specs, in the order `schedlab fidelity --dev` runs them.
DEV_WORKLOADS: tuple[str, ...] = tuple(PREFIX + name for name in DEV)


def is_dev(spec: str) -> bool:
    return spec.startswith(PREFIX)


def build(spec: str, size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The dev model ``dev:NAME`` at `size` and its inputs, from torch's global RNG."""
    factory = DEV.get(spec.removeprefix(PREFIX))
    if factory is None:
        raise SchedlabError(f"unknown dev workload {spec!r}; dev workloads are {', '.join(DEV_WORKLOADS)}")
    return factory(size)
