"""The held-out models: workloads that calibration never sees, to measure the simulator on.

`schedlab calibrate` fits its Profile on the built-in workloads (mlp, cnn, transformer,
nmt), so the simulator's error on those is an error on its training set. These models
are the test set: built only from stock `torch.nn` layers (nothing written the way the
built-ins are), of other kinds and sizes, and never named by calibration
(`tests/test_heldout.py` checks both). `schedlab fidelity --held-out` measures on them.

Load one as ``heldout:NAME`` wherever a MODEL is accepted (`schedlab trace
heldout:gru-tagger --size tiny`); ``heldout:`` is a reserved prefix, never a user
module. Every model is one top-level module that composes `torch.nn` layers (containers
included) and calls functions of torch; it returns a scalar loss.

Stock recurrent layers are captured as eager PyTorch runs them on a CPU: `nn.LSTM` as one
fused oneDNN op per layer each way (`schedlab.recurrent`), `nn.GRU` and `nn.RNN`, which
eager runs as a loop of aten ops, unrolled one cell per time step: a few thousand aten
ops, as a user's model would give. Dropout is 0 in the first ten (they were written when the
numerics check could not compare random draws); `dropout-encoder`, added with `schedlab.rng`
and never used to tune anything, keeps torch's default dropouts on.

Graph sizes (ops of the captured step with SGD; parameters at size default):

    name                 tiny ops  default ops  default parameters
    encoder-classifier        165          299   0.66M
    gru-tagger                451         4675   0.50M
    conv1d-two-branch          90           90   0.05M
    lstm-lm                    50           50   1.17M   (1112 at default when nn.LSTM was unrolled)
    depthwise-cnn             102          138   0.04M
    mixer                     115          289   0.61M
    mha-regressor             170          308   0.27M
    rnn-regressor             173         1546   0.13M
    bilstm-classifier          97           97   0.91M
    grouped-resnet            176          176   0.08M   (added after the sweep's grouped convolutions)
    dropout-encoder           201          369   0.32M   (added with random-op checking; dropouts on)

At size default one step on the executor (SGD) took 19-58 ms with one slot and one thread,
15-38 ms with both cores, on the 2-core development VM (quiet while measured, 2026-11-23;
`traces/fidelity-heldout.json`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.errors import SchedlabError
from schedlab.workloads.sizes import config_at

PREFIX = "heldout:"

Factory = Callable[[str], tuple[nn.Module, tuple[Tensor, ...]]]


# ---- an nn.TransformerEncoder classifier ---------------------------------------------------


@dataclass(frozen=True)
class EncoderConfig:
    batch: int
    seq_len: int
    vocab: int
    d_model: int
    heads: int
    ff: int
    layers: int
    classes: int


ENCODER = {
    "tiny": EncoderConfig(batch=2, seq_len=6, vocab=50, d_model=16, heads=2, ff=32, layers=1, classes=3),
    "default": EncoderConfig(batch=16, seq_len=64, vocab=2000, d_model=128, heads=4, ff=512, layers=2, classes=10),
}


class EncoderClassifier(nn.Module):
    """Token ids -> embedding + learned positions -> nn.TransformerEncoder (post-norm,
    GELU) -> mean over tokens -> class logits; cross-entropy."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.heads, cfg.ff, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.head = nn.Linear(cfg.d_model, cfg.classes)

    def forward(self, tokens: Tensor, labels: Tensor) -> Tensor:
        # tokens: [B, T] int64; labels: [B] int64
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        x = self.embed(tokens) + self.pos(positions)  # [B, T, C]
        x = self.encoder(x)  # [B, T, C]
        return F.cross_entropy(self.head(x.mean(dim=1)), labels)  # []


def _encoder(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(ENCODER, size)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len))
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return EncoderClassifier(cfg), (tokens, labels)


# ---- a 2-layer nn.GRU tagger -----------------------------------------------------------------


@dataclass(frozen=True)
class RecurrentConfig:
    batch: int
    seq_len: int
    vocab: int
    embed: int
    hidden: int
    layers: int
    classes: int  # tags per token (tagger) or the vocabulary again (language model)


GRU_TAGGER = {
    "tiny": RecurrentConfig(batch=2, seq_len=4, vocab=40, embed=8, hidden=12, layers=2, classes=5),
    "default": RecurrentConfig(batch=32, seq_len=48, vocab=5000, embed=64, hidden=128, layers=2, classes=17),
}


class GRUTagger(nn.Module):
    """Token ids -> embedding -> 2-layer nn.GRU -> per-token tag logits; cross-entropy."""

    def __init__(self, cfg: RecurrentConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        self.gru = nn.GRU(cfg.embed, cfg.hidden, num_layers=cfg.layers, batch_first=True)
        self.tag = nn.Linear(cfg.hidden, cfg.classes)

    def forward(self, tokens: Tensor, tags: Tensor) -> Tensor:
        # tokens, tags: [B, T] int64
        h, _ = self.gru(self.embed(tokens))  # [B, T, H]
        return F.cross_entropy(self.tag(h).flatten(0, 1), tags.flatten())  # []


def _gru_tagger(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(GRU_TAGGER, size)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len))
    tags = torch.randint(cfg.classes, (cfg.batch, cfg.seq_len))
    return GRUTagger(cfg), (tokens, tags)


# ---- an nn.LSTM language model ---------------------------------------------------------------

LSTM_LM = {
    "tiny": RecurrentConfig(batch=2, seq_len=4, vocab=30, embed=8, hidden=8, layers=1, classes=30),
    "default": RecurrentConfig(batch=16, seq_len=24, vocab=2000, embed=128, hidden=256, layers=1, classes=2000),
}


class LSTMLanguageModel(nn.Module):
    """Token ids -> embedding -> nn.LSTM -> LayerNorm -> next-token logits; cross-entropy."""

    def __init__(self, cfg: RecurrentConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        self.lstm = nn.LSTM(cfg.embed, cfg.hidden, num_layers=cfg.layers, batch_first=True)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.classes)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        # tokens, targets: [B, T] int64, targets[:, t] follows tokens[:, t]
        h, _ = self.lstm(self.embed(tokens))  # [B, T, H]
        logits = self.out(self.norm(h))  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # []


def _lstm_lm(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(LSTM_LM, size)
    text = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len + 1))
    return LSTMLanguageModel(cfg), (text[:, :-1].contiguous(), text[:, 1:].contiguous())


# ---- an nn.RNN sequence regressor ------------------------------------------------------------


@dataclass(frozen=True)
class RNNConfig:
    batch: int
    seq_len: int
    features: int
    hidden: int
    layers: int


RNN_REGRESSOR = {
    "tiny": RNNConfig(batch=2, seq_len=5, features=3, hidden=8, layers=1),
    "default": RNNConfig(batch=64, seq_len=32, features=16, hidden=192, layers=2),
}


class RNNRegressor(nn.Module):
    """A multivariate series -> 2-layer tanh nn.RNN -> Linear on the last step; MSE loss."""

    def __init__(self, cfg: RNNConfig) -> None:
        super().__init__()
        self.rnn = nn.RNN(cfg.features, cfg.hidden, num_layers=cfg.layers, nonlinearity="tanh", batch_first=True)
        self.head = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden // 2), nn.SiLU(), nn.Linear(cfg.hidden // 2, 1))

    def forward(self, series: Tensor, target: Tensor) -> Tensor:
        # series: [B, T, F] float32; target: [B, 1]
        h, _ = self.rnn(series)  # [B, T, H]
        return F.mse_loss(self.head(h[:, -1]), target)  # []


def _rnn_regressor(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(RNN_REGRESSOR, size)
    series = torch.randn(cfg.batch, cfg.seq_len, cfg.features)
    target = torch.randn(cfg.batch, 1)
    return RNNRegressor(cfg), (series, target)


# ---- a bidirectional nn.LSTM sequence classifier ------------------------------------------------


@dataclass(frozen=True)
class BiLSTMConfig:
    batch: int
    seq_len: int
    features: int
    hidden: int
    layers: int
    classes: int


BILSTM = {
    "tiny": BiLSTMConfig(batch=2, seq_len=5, features=3, hidden=6, layers=2, classes=3),
    "default": BiLSTMConfig(batch=32, seq_len=40, features=24, hidden=160, layers=2, classes=6),
}


class BiLSTMClassifier(nn.Module):
    """A multivariate series -> LayerNorm -> 2-layer bidirectional nn.LSTM -> mean over
    time -> GELU MLP -> class logits; cross-entropy. (Added after the fused LSTM capture,
    and never used to tune it.)"""

    def __init__(self, cfg: BiLSTMConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.features)
        self.lstm = nn.LSTM(cfg.features, cfg.hidden, num_layers=cfg.layers, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.classes))

    def forward(self, series: Tensor, labels: Tensor) -> Tensor:
        # series: [B, T, F] float32; labels: [B] int64
        h, _ = self.lstm(self.norm(series))  # [B, T, 2H]
        return F.cross_entropy(self.head(h.mean(dim=1)), labels)  # []


def _bilstm(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(BILSTM, size)
    series = torch.randn(cfg.batch, cfg.seq_len, cfg.features)
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return BiLSTMClassifier(cfg), (series, labels)


# ---- a two-branch Conv1d + BatchNorm1d classifier ---------------------------------------------


@dataclass(frozen=True)
class Conv1dConfig:
    batch: int
    channels: int  # input channels
    length: int  # samples per sequence
    width: int  # channels of each branch
    classes: int


CONV1D = {
    "tiny": Conv1dConfig(batch=2, channels=3, length=16, width=4, classes=3),
    "default": Conv1dConfig(batch=32, channels=12, length=512, width=64, classes=8),
}


def _conv1d_branch(cin: int, width: int, kernel: int, dilation: int) -> nn.Sequential:
    pad = dilation * (kernel // 2)
    return nn.Sequential(
        nn.Conv1d(cin, width, kernel, padding=pad, dilation=dilation, bias=False),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Conv1d(width, width, kernel, padding=pad, dilation=dilation, stride=2, bias=False),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.MaxPool1d(2),
    )


class TwoBranchConv1d(nn.Module):
    """A signal through two Conv1d + BatchNorm1d branches (short kernels; wide, dilated
    kernels) side by side; their pooled features concatenated -> Linear; cross-entropy."""

    def __init__(self, cfg: Conv1dConfig) -> None:
        super().__init__()
        self.short = _conv1d_branch(cfg.channels, cfg.width, kernel=3, dilation=1)
        self.wide = _conv1d_branch(cfg.channels, cfg.width, kernel=7, dilation=2)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(2 * cfg.width, cfg.classes)

    def forward(self, signal: Tensor, labels: Tensor) -> Tensor:
        # signal: [B, C, L] float32; labels: [B] int64
        a = self.pool(self.short(signal)).flatten(1)  # [B, W]
        b = self.pool(self.wide(signal)).flatten(1)  # [B, W]
        return F.cross_entropy(self.head(torch.cat([a, b], dim=1)), labels)  # []


def _conv1d(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(CONV1D, size)
    signal = torch.randn(cfg.batch, cfg.channels, cfg.length)
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return TwoBranchConv1d(cfg), (signal, labels)


# ---- a depthwise-separable Conv2d net with GroupNorm and LayerNorm ----------------------------


@dataclass(frozen=True)
class DepthwiseConfig:
    batch: int
    image: int
    widths: tuple[int, ...]  # channels per stage; each stage after the first halves H and W
    groups: int  # GroupNorm groups
    classes: int


DEPTHWISE = {
    "tiny": DepthwiseConfig(batch=2, image=8, widths=(4, 8), groups=2, classes=3),
    "default": DepthwiseConfig(batch=16, image=32, widths=(32, 64, 128), groups=8, classes=10),
}


def _separable(cin: int, cout: int, stride: int, groups: int) -> nn.Sequential:
    """Depthwise 3x3 (groups = channels) -> GroupNorm -> GELU -> pointwise 1x1 -> GroupNorm -> GELU."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
        nn.GroupNorm(min(groups, cin), cin),
        nn.GELU(),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.GroupNorm(groups, cout),
        nn.GELU(),
    )


class DepthwiseNet(nn.Module):
    """A MobileNet-like stack of depthwise-separable convs (GroupNorm), pooled, LayerNorm,
    Linear; cross-entropy."""

    def __init__(self, cfg: DepthwiseConfig) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, cfg.widths[0], 3, padding=1)
        stages: list[nn.Module] = []
        cin = cfg.widths[0]
        for i, width in enumerate(cfg.widths):
            stages.append(_separable(cin, width, 2 if i > 0 else 1, cfg.groups))
            stages.append(_separable(width, width, 1, cfg.groups))
            cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = nn.LayerNorm(cin)
        self.head = nn.Linear(cin, cfg.classes)

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        # images: [B, 3, H, W] float32; labels: [B] int64
        x = self.stages(self.stem(images))  # [B, C, H', W']
        x = self.norm(self.pool(x).flatten(1))  # [B, C]
        return F.cross_entropy(self.head(x), labels)  # []


def _depthwise(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(DEPTHWISE, size)
    images = torch.randn(cfg.batch, 3, cfg.image, cfg.image)
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return DepthwiseNet(cfg), (images, labels)


# ---- a ResNeXt-like Conv2d net: grouped 3x3 bottlenecks with BatchNorm2d ----------------------


@dataclass(frozen=True)
class GroupedConfig:
    batch: int
    image: int
    stem: int  # stem channels
    widths: tuple[int, ...]  # bottleneck output channels per stage; stages after the first halve H, W
    bottleneck: int  # channels inside a bottleneck
    cardinality: int  # groups of its 3x3 conv
    classes: int


GROUPED = {
    "tiny": GroupedConfig(batch=2, image=8, stem=4, widths=(8, 8), bottleneck=4, cardinality=2, classes=3),
    "default": GroupedConfig(batch=8, image=32, stem=32, widths=(64, 128), bottleneck=64, cardinality=8, classes=10),
}


def _grouped_bottleneck(cin: int, cout: int, mid: int, cardinality: int, stride: int) -> tuple[nn.Module, nn.Module]:
    """(body, skip): 1x1 -> BatchNorm2d -> ReLU -> grouped 3x3 (stride) -> BatchNorm2d -> ReLU
    -> 1x1 -> BatchNorm2d; the input, through a strided 1x1 + BatchNorm2d where shapes differ."""
    body = nn.Sequential(
        nn.Conv2d(cin, mid, 1, bias=False),
        nn.BatchNorm2d(mid),
        nn.ReLU(),
        nn.Conv2d(mid, mid, 3, stride=stride, padding=1, groups=cardinality, bias=False),
        nn.BatchNorm2d(mid),
        nn.ReLU(),
        nn.Conv2d(mid, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
    )
    skip: nn.Module = nn.Identity()
    if stride != 1 or cin != cout:
        skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
    return body, skip


class GroupedResNet(nn.Module):
    """A 3x3 stem (BatchNorm2d, ReLU), two grouped bottlenecks per stage, global average
    pool, Linear; cross-entropy. (Added after the calibration sweep got grouped
    convolutions, and never used to tune anything.)"""

    def __init__(self, cfg: GroupedConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cfg.stem, 3, padding=1, bias=False), nn.BatchNorm2d(cfg.stem), nn.ReLU())
        blocks: list[tuple[nn.Module, nn.Module]] = []
        cin = cfg.stem
        for i, width in enumerate(cfg.widths):
            blocks.append(_grouped_bottleneck(cin, width, cfg.bottleneck, cfg.cardinality, 2 if i > 0 else 1))
            blocks.append(_grouped_bottleneck(width, width, cfg.bottleneck, cfg.cardinality, 1))
            cin = width
        self.bodies = nn.ModuleList(body for body, _ in blocks)
        self.skips = nn.ModuleList(skip for _, skip in blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, cfg.classes)

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        # images: [B, 3, H, W] float32; labels: [B] int64
        x = self.stem(images)  # [B, C0, H, W]
        for body, skip in zip(self.bodies, self.skips, strict=True):
            x = F.relu(body(x) + skip(x))  # [B, C, H', W']
        return F.cross_entropy(self.head(self.pool(x).flatten(1)), labels)  # []


def _grouped(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(GROUPED, size)
    images = torch.randn(cfg.batch, 3, cfg.image, cfg.image)
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return GroupedResNet(cfg), (images, labels)


# ---- an MLP-Mixer over embedded tokens ---------------------------------------------------------


@dataclass(frozen=True)
class MixerConfig:
    batch: int
    tokens: int
    vocab: int
    channels: int
    token_hidden: int
    channel_hidden: int
    layers: int
    classes: int


MIXER = {
    "tiny": MixerConfig(batch=2, tokens=4, vocab=30, channels=8, token_hidden=6, channel_hidden=16, layers=1, classes=3),
    "default": MixerConfig(
        batch=32, tokens=64, vocab=3000, channels=128, token_hidden=64, channel_hidden=256, layers=3, classes=10
    ),
}


class TokenMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al., 2021) over token embeddings: per layer, an MLP across
    tokens (on the transposed activations) and an MLP across channels, each pre-LayerNorm
    with a residual; mean over tokens -> Linear; cross-entropy. Every layer is a stock
    nn module; the transposes are in this forward."""

    def __init__(self, cfg: MixerConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.channels)
        self.token_norms = nn.ModuleList(nn.LayerNorm(cfg.channels) for _ in range(cfg.layers))
        self.token_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(cfg.tokens, cfg.token_hidden), nn.GELU(), nn.Linear(cfg.token_hidden, cfg.tokens))
            for _ in range(cfg.layers)
        )
        self.channel_norms = nn.ModuleList(nn.LayerNorm(cfg.channels) for _ in range(cfg.layers))
        self.channel_mlps = nn.ModuleList(
            nn.Sequential(
                nn.Linear(cfg.channels, cfg.channel_hidden), nn.GELU(), nn.Linear(cfg.channel_hidden, cfg.channels)
            )
            for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.channels)
        self.head = nn.Linear(cfg.channels, cfg.classes)

    def forward(self, tokens: Tensor, labels: Tensor) -> Tensor:
        # tokens: [B, T] int64; labels: [B] int64
        x = self.embed(tokens)  # [B, T, C]
        for tn, tm, cn, cm in zip(self.token_norms, self.token_mlps, self.channel_norms, self.channel_mlps):
            x = x + tm(tn(x).transpose(1, 2)).transpose(1, 2)  # mix across tokens: [B, T, C]
            x = x + cm(cn(x))  # mix across channels: [B, T, C]
        return F.cross_entropy(self.head(self.norm(x).mean(dim=1)), labels)  # []


def _mixer(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(MIXER, size)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.tokens))
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return TokenMixer(cfg), (tokens, labels)


# ---- an nn.MultiheadAttention block, regression -------------------------------------------------


@dataclass(frozen=True)
class AttentionConfig:
    batch: int
    seq_len: int
    features: int
    d_model: int
    heads: int
    blocks: int


ATTENTION = {
    "tiny": AttentionConfig(batch=2, seq_len=5, features=3, d_model=8, heads=2, blocks=1),
    "default": AttentionConfig(batch=16, seq_len=64, features=24, d_model=128, heads=4, blocks=2),
}


class AttentionRegressor(nn.Module):
    """Features -> Linear -> blocks of pre-LayerNorm nn.MultiheadAttention and a SiLU MLP,
    each residual -> per-step Linear to one value; Smooth L1 loss."""

    def __init__(self, cfg: AttentionConfig) -> None:
        super().__init__()
        self.inp = nn.Linear(cfg.features, cfg.d_model)
        self.norms1 = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(cfg.blocks))
        self.attns = nn.ModuleList(
            nn.MultiheadAttention(cfg.d_model, cfg.heads, dropout=0.0, batch_first=True) for _ in range(cfg.blocks)
        )
        self.norms2 = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(cfg.blocks))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(cfg.d_model, 2 * cfg.d_model), nn.SiLU(), nn.Linear(2 * cfg.d_model, cfg.d_model))
            for _ in range(cfg.blocks)
        )
        self.out = nn.Linear(cfg.d_model, 1)

    def forward(self, series: Tensor, target: Tensor) -> Tensor:
        # series: [B, T, F] float32; target: [B, T, 1]
        x = self.inp(series)  # [B, T, D]
        for n1, attn, n2, mlp in zip(self.norms1, self.attns, self.norms2, self.mlps):
            h = n1(x)
            x = x + attn(h, h, h, need_weights=False)[0]  # [B, T, D]
            x = x + mlp(n2(x))  # [B, T, D]
        return F.smooth_l1_loss(self.out(x), target)  # []


def _attention(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(ATTENTION, size)
    series = torch.randn(cfg.batch, cfg.seq_len, cfg.features)
    target = torch.randn(cfg.batch, cfg.seq_len, 1)
    return AttentionRegressor(cfg), (series, target)


# ---- a pre-norm transformer with its dropouts on ------------------------------------------------


DROPOUT_ENCODER = {
    "tiny": EncoderConfig(batch=2, seq_len=5, vocab=40, d_model=16, heads=2, ff=32, layers=1, classes=3),
    "default": EncoderConfig(batch=16, seq_len=48, vocab=1000, d_model=96, heads=4, ff=384, layers=2, classes=6),
}


class DropoutEncoder(nn.Module):
    """Token ids -> embedding + learned positions, nn.Dropout(0.1) -> pre-norm
    nn.TransformerEncoder (ReLU, its default dropout of 0.1 in attention and MLP) -> first
    token -> nn.Dropout(0.2) -> class logits; cross-entropy. The one held-out model whose
    step draws random numbers, as most users' transformers do in training."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop_in = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.heads, cfg.ff, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.drop_out = nn.Dropout(0.2)
        self.head = nn.Linear(cfg.d_model, cfg.classes)

    def forward(self, tokens: Tensor, labels: Tensor) -> Tensor:
        # tokens: [B, T] int64; labels: [B] int64
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        x = self.drop_in(self.embed(tokens) + self.pos(positions))  # [B, T, C]
        x = self.encoder(x)  # [B, T, C]
        return F.cross_entropy(self.head(self.drop_out(x[:, 0])), labels)  # []


def _dropout_encoder(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    cfg = config_at(DROPOUT_ENCODER, size)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len))
    labels = torch.randint(cfg.classes, (cfg.batch,))
    return DropoutEncoder(cfg), (tokens, labels)


# ---- the registry ------------------------------------------------------------------------------

HELDOUT: dict[str, Factory] = {
    "encoder-classifier": _encoder,
    "gru-tagger": _gru_tagger,
    "conv1d-two-branch": _conv1d,
    "lstm-lm": _lstm_lm,
    "depthwise-cnn": _depthwise,
    "mixer": _mixer,
    "mha-regressor": _attention,
    "rnn-regressor": _rnn_regressor,
    "bilstm-classifier": _bilstm,
    "grouped-resnet": _grouped,
    "dropout-encoder": _dropout_encoder,
}
# Their MODEL specs, in the order `schedlab fidelity --held-out` runs them.
HELDOUT_WORKLOADS: tuple[str, ...] = tuple(PREFIX + name for name in HELDOUT)


def is_heldout(spec: str) -> bool:
    return spec.startswith(PREFIX)


def build(spec: str, size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The held-out model ``heldout:NAME`` at `size` and its inputs, from torch's global RNG."""
    name = spec.removeprefix(PREFIX)
    factory = HELDOUT.get(name)
    if factory is None:
        raise SchedlabError(f"unknown held-out workload {spec!r}; held-out workloads are {', '.join(HELDOUT_WORKLOADS)}")
    return factory(size)
