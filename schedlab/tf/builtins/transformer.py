"""The `transformer` workload in TensorFlow: a GPT-style decoder with a next-token loss.

Mirrors schedlab.workloads.transformer: pre-norm blocks of causal self-attention (written
out with matmuls and softmax, as the torch model does) and a GELU MLP. The causal mask,
a non-persistent buffer in torch, is a constant built here from the sequence length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlab.tf.builtins.layers import cross_entropy, embedding, gelu, layer_norm, linear, scope, shape_of, tf_module
from schedlab.tf.model import LossFn
from schedlab.workloads.transformer import GPTConfig


def causal_mask(seq_len: int) -> np.ndarray:
    """The additive mask [T, T]: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((seq_len, seq_len), -np.inf), 1)


def _attention(path: str, x: Any, mask: Any, heads: int, params: Mapping[str, Any]) -> Any:
    """CausalSelfAttention at `path`: x [B, T, C] -> [B, T, C]."""
    tf = tf_module()
    c = int(params[f"{path}.proj.weight"].shape[0])
    dh = c // heads
    with scope(f"{path}.qkv"):
        qkv = linear(x, params[f"{path}.qkv.weight"], params[f"{path}.qkv.bias"])  # [B, T, 3C]
    with scope(path):
        b, t, _ = shape_of(x)

        def split_heads(z: Any) -> Any:
            return tf.transpose(tf.reshape(z, [b, t, heads, dh]), [0, 2, 1, 3])  # [B, H, T, dh]

        q, k, v = (split_heads(z) for z in tf.split(qkv, 3, axis=2))  # each [B, T, C] before
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(dh))  # [B, H, T, T]
        probs = tf.nn.softmax(scores + mask, axis=-1)  # [B, H, T, T]
        y = tf.matmul(probs, v)  # [B, H, T, dh]
        y = tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [b, t, c])  # [B, T, C]
    with scope(f"{path}.proj"):
        return linear(y, params[f"{path}.proj.weight"], params[f"{path}.proj.bias"])  # [B, T, C]


def _block(path: str, x: Any, mask: Any, heads: int, params: Mapping[str, Any]) -> Any:
    """Block at `path`: x + attn(ln1(x)), then x + mlp(ln2(x)); [B, T, C] -> [B, T, C]."""
    with scope(f"{path}.ln1"):
        h = layer_norm(x, params[f"{path}.ln1.weight"], params[f"{path}.ln1.bias"])
    attn = _attention(f"{path}.attn", h, mask, heads, params)
    with scope(path):
        x = x + attn
    with scope(f"{path}.ln2"):
        h = layer_norm(x, params[f"{path}.ln2.weight"], params[f"{path}.ln2.bias"])
    with scope(f"{path}.mlp.0"):
        h = linear(h, params[f"{path}.mlp.0.weight"], params[f"{path}.mlp.0.bias"])  # [B, T, 4C]
    with scope(f"{path}.mlp.1"):
        h = gelu(h)
    with scope(f"{path}.mlp.2"):
        h = linear(h, params[f"{path}.mlp.2.weight"], params[f"{path}.mlp.2.bias"])  # [B, T, C]
    with scope(path):
        return x + h


def make_loss_fn(cfg: GPTConfig) -> LossFn:
    """The TF loss of a GPT of `cfg`: inputs (tokens [B, T] int64, targets [B, T] int64)."""

    def loss_fn(
        params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]
    ) -> tuple[Any, dict[str, Any]]:
        tf = tf_module()
        tokens, targets = inputs
        pos_emb = params["pos_emb"]  # [T, C]
        mask = tf.constant(causal_mask(int(pos_emb.shape[0])), dtype=pos_emb.dtype, name="causal_mask")  # [T, T]
        with scope("tok_emb"):
            x = embedding(params["tok_emb.weight"], tokens)  # [B, T, C]
        x = tf.add(x, pos_emb, name="pos_emb")
        for k in range(cfg.layers):
            x = _block(f"blocks.{k}", x, mask, cfg.heads, params)
        with scope("ln_f"):
            x = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
        with scope("head"):
            logits = linear(x, params["head.weight"])  # [B, T, V]
        vocab = int(params["head.weight"].shape[1])
        return cross_entropy(tf.reshape(logits, [-1, vocab]), tf.reshape(targets, [-1])), {}

    return loss_fn
