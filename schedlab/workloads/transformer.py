"""The `transformer` workload: a small GPT-style decoder with a next-token cross-entropy loss.

Attention is written out with matmuls and softmax (no fused attention kernels), so every
step of it is a separate op in the exported graph.

Measured on a 2-core CPU, torch 2.13 (eager step = forward + loss.backward() + SGD step,
torch's default threads; nodes = aot-exported joint graph):
    tiny:    ~1 ms/step, 201 nodes
    default: ~290 ms/step, 663 nodes (16.9M parameters)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.workloads.sizes import config_at


@dataclass(frozen=True)
class GPTConfig:
    batch: int
    seq_len: int
    vocab: int
    d_model: int
    heads: int
    layers: int


CONFIGS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(batch=2, seq_len=8, vocab=64, d_model=32, heads=2, layers=1),
    "default": GPTConfig(batch=6, seq_len=128, vocab=4096, d_model=512, heads=8, layers=4),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        assert d_model % heads == 0
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        # x: [B, T, C]; mask: [T, T] additive, 0 on and below the diagonal, -inf above
        b, t, c = x.shape
        dh = c // self.heads
        q, k, v = self.qkv(x).split(c, dim=2)  # each [B, T, C]
        q = q.view(b, t, self.heads, dh).transpose(1, 2)  # [B, H, T, dh]
        k = k.view(b, t, self.heads, dh).transpose(1, 2)  # [B, H, T, dh]
        v = v.view(b, t, self.heads, dh).transpose(1, 2)  # [B, H, T, dh]
        scale = 1.0 / math.sqrt(dh)
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # [B, H, T, T]
        probs = torch.softmax(scores + mask, dim=-1)  # [B, H, T, T]
        y = torch.matmul(probs, v)  # [B, H, T, dh]
        y = y.transpose(1, 2).reshape(b, t, c)  # [B, T, C]
        out: Tensor = self.proj(y)  # [B, T, C]
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        # x: [B, T, C] -> [B, T, C]
        x = x + self.attn(self.ln1(x), mask)
        out: Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        pos = torch.randn(cfg.seq_len, cfg.d_model) * 0.02  # [T, C]
        self.pos_emb = nn.Parameter(pos)
        blocks = (Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        # Constant additive causal mask [T, T]; a buffer so it is a graph input, not recomputed.
        causal = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        # tokens, targets: [B, T] int64; targets[:, i] is the token after tokens[:, i]
        x = self.tok_emb(tokens) + self.pos_emb  # [B, T, C]
        for block in self.blocks:
            x = block(x, self.causal_mask)
        logits = self.head(self.ln_f(x))  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # []


def build(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The model (training mode) and its inputs (tokens, targets), from torch's global RNG."""
    cfg = config_at(CONFIGS, size)
    model = GPT(cfg).train()
    seq = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len + 1))  # [B, T + 1]
    tokens = seq[:, :-1].contiguous()  # [B, T]
    targets = seq[:, 1:].contiguous()  # [B, T], the next tokens
    return model, (tokens, targets)
