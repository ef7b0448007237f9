"""The `nmt` workload in TensorFlow: an LSTM encoder-decoder with Luong dot attention.

Mirrors schedlab.workloads.nmt, whose LSTM layers are written out: the input projection
of all time steps is one matmul (`<layer>.ih`), and only the recurrent matmul
(`<layer>.hh`) and the gate arithmetic (gate order input, forget, cell, output) run per
step. The time steps are unrolled, so sequence lengths must be static.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedlab.tf.builtins.layers import cross_entropy, embedding, linear, scope, shape_of, tf_module
from schedlab.tf.model import LossFn
from schedlab.workloads.nmt import NMTConfig


def _lstm_layer(path: str, x: Any, h: Any, c: Any, params: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """LSTMLayer at `path`: x [B, T, I]; h, c [B, H] -> outputs [B, T, H], final h and c."""
    tf = tf_module()
    with scope(f"{path}.ih"):
        xproj = linear(x, params[f"{path}.ih.weight"], params[f"{path}.ih.bias"])  # [B, T, 4H]
    outs = []
    for t in range(int(x.shape[1])):
        with scope(f"{path}.hh"):
            rec = linear(h, params[f"{path}.hh.weight"])  # [B, 4H]
        with scope(path):
            gates = xproj[:, t] + rec  # [B, 4H]
            i, f, g, o = tf.split(gates, 4, axis=1)  # [B, H] each
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
        outs.append(h)
    with scope(path):
        return tf.stack(outs, axis=1), h, c


def _lstm(
    path: str, x: Any, layers: int, params: Mapping[str, Any], state: list[tuple[Any, Any]] | None = None
) -> tuple[Any, list[tuple[Any, Any]]]:
    """LSTM at `path` (layers `path.layers.k`): outputs [B, T, H] and the final (h, c) per layer."""
    tf = tf_module()
    final: list[tuple[Any, Any]] = []
    for k in range(layers):
        layer = f"{path}.layers.{k}"
        if state is None:
            hidden = int(params[f"{layer}.hh.weight"].shape[0])
            with scope(path):
                h = c = tf.zeros([shape_of(x)[0], hidden], dtype=x.dtype)  # [B, H]
        else:
            h, c = state[k]
        x, h, c = _lstm_layer(layer, x, h, c, params)
        final.append((h, c))
    return x, final


def make_loss_fn(cfg: NMTConfig) -> LossFn:
    """The TF loss of a Seq2Seq of `cfg`: inputs (src [B, S], tgt_in [B, T], tgt_out [B, T]), int64."""

    def loss_fn(
        params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]
    ) -> tuple[Any, dict[str, Any]]:
        tf = tf_module()
        src, tgt_in, tgt_out = inputs
        with scope("src_emb"):
            src_x = embedding(params["src_emb.weight"], src)  # [B, S, E]
        enc, state = _lstm("encoder", src_x, cfg.layers, params)  # enc [B, S, H]
        with scope("tgt_emb"):
            tgt_x = embedding(params["tgt_emb.weight"], tgt_in)  # [B, T, E]
        dec, _ = _lstm("decoder", tgt_x, cfg.layers, params, state)  # [B, T, H]
        scores = tf.matmul(dec, enc, transpose_b=True)  # Luong dot score: [B, T, S]
        align = tf.nn.softmax(scores, axis=-1)  # [B, T, S]
        context = tf.matmul(align, enc)  # [B, T, H]
        both = tf.concat([context, dec], axis=-1)  # [B, T, 2H]
        with scope("attn_combine"):
            combined = linear(both, params["attn_combine.weight"], params["attn_combine.bias"])  # [B, T, H]
        attn_h = tf.tanh(combined)
        with scope("out"):
            logits = linear(attn_h, params["out.weight"], params["out.bias"])  # [B, T, V]
        vocab = int(params["out.weight"].shape[1])
        return cross_entropy(tf.reshape(logits, [-1, vocab]), tf.reshape(tgt_out, [-1])), {}

    return loss_fn
