"""The `nmt` workload: an LSTM encoder-decoder with Luong dot attention (GNMT-like).

Source tokens -> embedding -> multi-layer LSTM encoder. Target tokens (teacher forcing)
-> embedding -> multi-layer LSTM decoder started from the encoder's final state. Every
decoder output attends over all encoder outputs (batched matmul + softmax); the context
and the decoder output go through a concat+tanh attention layer, then the output
projection and cross-entropy against the next target tokens.

The LSTM layers are written out (`LSTMLayer`) the way fused RNN kernels compute them:
the input projection of all time steps is one matmul, and only the recurrent matmul
and the gate arithmetic run per step. Not `nn.LSTM`: eager CPU runs that as one fused
oneDNN op per layer, which schedlab captures as such (`schedlab.recurrent`), one op
each way whose backward makes the weight and input gradients together. Written out, the
weight-gradient matmuls are ops of their own that out-of-order backprop can defer.

Measured on a 2-core CPU, torch 2.13 (eager step = forward + loss.backward() + SGD step,
torch's default threads; ops = captured graph with SGD):
    tiny:    ~1 ms/step, 323 ops (1 layer, 3 + 3 steps)
    default: ~215 ms/step, 1339 ops (2 layers, 8 + 8 steps, 21.2M parameters)
    paper:   4 layers, 16 + 16 steps, 1024 wide, 32k vocabulary (simulated placement; see CONFIGS)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.workloads.sizes import config_at


@dataclass(frozen=True)
class NMTConfig:
    batch: int
    src_len: int
    tgt_len: int
    vocab: int  # source and target vocabularies have this size
    embed: int
    hidden: int
    layers: int  # LSTM layers in the encoder and in the decoder


CONFIGS: dict[str, NMTConfig] = {
    "tiny": NMTConfig(batch=2, src_len=3, tgt_len=3, vocab=32, embed=16, hidden=16, layers=1),
    "default": NMTConfig(batch=64, src_len=8, tgt_len=8, vocab=8000, embed=512, hidden=512, layers=2),
    # A model of the placement paper's kind (HP3C 2019 placed a WMT14 German-English NMT, an
    # LSTM encoder-decoder with attention in the style of GNMT): several 1024-wide LSTM
    # layers and a 32k vocabulary. For simulated placement only: one step is ~1.3 GB of
    # parameters, gradients and activations in fp32, too much to run on a 2-core machine.
    "paper": NMTConfig(batch=64, src_len=16, tgt_len=16, vocab=32000, embed=1024, hidden=1024, layers=4),
}


class LSTMLayer(nn.Module):
    """One LSTM layer, batch first, with PyTorch's gate order (input, forget, cell, output)."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.ih = nn.Linear(input_size, 4 * hidden)  # all steps at once
        self.hh = nn.Linear(hidden, 4 * hidden, bias=False)  # one step at a time

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [B, T, I]; h, c: [B, H] -> outputs [B, T, H], final h and c [B, H]
        xproj = self.ih(x)  # [B, T, 4H]
        outs = []
        for t in range(x.shape[1]):
            gates = xproj[:, t] + self.hh(h)  # [B, 4H]
            i, f, g, o = gates.chunk(4, dim=1)  # [B, H] each
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1), h, c


class LSTM(nn.Module):
    """A stack of LSTM layers; returns outputs [B, T, H] and the final (h, c) per layer."""

    def __init__(self, input_size: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LSTMLayer(input_size if k == 0 else hidden, hidden) for k in range(layers))

    def forward(
        self, x: Tensor, state: list[tuple[Tensor, Tensor]] | None = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        final: list[tuple[Tensor, Tensor]] = []
        for k, layer in enumerate(self.layers):
            if state is None:
                h = c = x.new_zeros(x.shape[0], int(layer.hidden))  # type: ignore[arg-type]
            else:
                h, c = state[k]
            x, h, c = layer(x, h, c)
            final.append((h, c))
        return x, final


class Seq2Seq(nn.Module):
    def __init__(self, cfg: NMTConfig) -> None:
        super().__init__()
        self.src_emb = nn.Embedding(cfg.vocab, cfg.embed)
        self.encoder = LSTM(cfg.embed, cfg.hidden, cfg.layers)
        self.tgt_emb = nn.Embedding(cfg.vocab, cfg.embed)
        self.decoder = LSTM(cfg.embed, cfg.hidden, cfg.layers)
        # [context; h] -> attentional hidden state
        self.attn_combine = nn.Linear(2 * cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        # src: [B, S] int64; tgt_in, tgt_out: [B, T] int64, tgt_out[:, i] follows tgt_in[:, i]
        enc, state = self.encoder(self.src_emb(src))  # enc [B, S, H]; (h, c) [B, H] per layer
        dec, _ = self.decoder(self.tgt_emb(tgt_in), state)  # [B, T, H]
        scores = torch.bmm(dec, enc.transpose(1, 2))  # Luong dot score: [B, T, S]
        align = torch.softmax(scores, dim=-1)  # [B, T, S]
        context = torch.bmm(align, enc)  # [B, T, H]
        both = torch.cat([context, dec], dim=-1)  # [B, T, 2H]
        attn_h = torch.tanh(self.attn_combine(both))  # [B, T, H]
        logits = self.out(attn_h)  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())  # []


def build(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The model (training mode) and its inputs (src, tgt_in, tgt_out), from torch's global RNG."""
    cfg = config_at(CONFIGS, size)
    model = Seq2Seq(cfg).train()
    src = torch.randint(cfg.vocab, (cfg.batch, cfg.src_len))  # [B, S]
    tgt = torch.randint(cfg.vocab, (cfg.batch, cfg.tgt_len + 1))  # [B, T + 1]
    tgt_in = tgt[:, :-1].contiguous()  # [B, T]
    tgt_out = tgt[:, 1:].contiguous()  # [B, T]
    return model, (src, tgt_in, tgt_out)
