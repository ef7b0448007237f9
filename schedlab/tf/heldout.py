"""Held-out TensorFlow models: written directly in TF ops, never used to develop or tune
the TensorFlow cost model (`calibrate.tf_costs`) or the simulator's rules for TF.

Each is a user-style factory (`schedlab.tf.user`), so they run as any user's TF model does:
``schedlab fidelity --backend tensorflow --models schedlab.tf.heldout:gru_tagger,...``. They
vary in kind and size from the built-ins: a recurrent tagger (GRU cell, unrolled), a
depthwise-separable CNN, a bidirectional-attention encoder with mean pooling, a wide
tanh regressor with a mean-squared loss, and a Keras 3 convnet (`schedlab.tf.keras_model`:
Keras layers, batch norm with its moving statistics, the compiled loss).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlab.tf.builtins.layers import scope, tf_module

Factory = tuple[Any, dict[str, np.ndarray], list[np.ndarray]]
TF_HELDOUT = ("gru_tagger", "depthwise_cnn", "attention_encoder", "wide_regressor", "keras_convnet")
SPEC_PREFIX = "schedlab.tf.heldout:"


def _init(rng: np.random.Generator, *shape: int) -> np.ndarray:
    fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[:-1]))
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _xent(logits: Any, target: Any) -> Any:
    tf = tf_module()
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=logits))


def gru_tagger() -> Factory:
    """Embedding, a GRU cell unrolled over 24 steps, a tag per step: batch 32, hidden 128."""
    batch, steps, vocab, emb, hidden, tags = 32, 24, 2000, 64, 128, 16
    rng = np.random.default_rng(11)
    params = {
        "embed": _init(rng, vocab, emb),
        "gru.w_x": _init(rng, emb, 3 * hidden), "gru.w_h": _init(rng, hidden, 3 * hidden),
        "gru.b": np.zeros(3 * hidden, np.float32),
        "tag.w": _init(rng, hidden, tags), "tag.b": np.zeros(tags, np.float32),
    }
    tokens = rng.integers(0, vocab, (batch, steps)).astype(np.int64)
    target = rng.integers(0, tags, (batch, steps)).astype(np.int64)

    def loss_fn(p: Mapping[str, Any], xs: Sequence[Any]) -> Any:
        tf = tf_module()
        tok, tgt = xs
        with scope("embed"):
            x = tf.gather(p["embed"], tok)  # [B, T, E]
        with scope("gru"):
            xw = tf.reshape(tf.matmul(tf.reshape(x, [-1, emb]), p["gru.w_x"]) + p["gru.b"], [batch, steps, 3 * hidden])
            h = tf.zeros([batch, hidden])
            outs = []
            for t in range(steps):
                hw = tf.matmul(h, p["gru.w_h"])
                r = tf.sigmoid(xw[:, t, :hidden] + hw[:, :hidden])
                z = tf.sigmoid(xw[:, t, hidden:2 * hidden] + hw[:, hidden:2 * hidden])
                n = tf.tanh(xw[:, t, 2 * hidden:] + r * hw[:, 2 * hidden:])
                h = (1.0 - z) * n + z * h
                outs.append(h)
            seq = tf.reshape(tf.stack(outs, axis=1), [-1, hidden])
        with scope("tag"):
            logits = tf.matmul(seq, p["tag.w"]) + p["tag.b"]
        return _xent(logits, tf.reshape(tgt, [-1]))

    return loss_fn, params, [tokens, target]


def depthwise_cnn() -> Factory:
    """Three depthwise-separable blocks (3x3 depthwise, 1x1 pointwise, ReLU; stride 2 twice)
    on 16 images of 32x32x16, global average pooling, 10 classes."""
    batch, size, chans, classes = 16, 32, (16, 32, 64, 96), 10
    rng = np.random.default_rng(12)
    params: dict[str, np.ndarray] = {}
    for k in range(3):
        params[f"block{k}.dw"] = _init(rng, 3, 3, chans[k], 1)
        params[f"block{k}.pw"] = _init(rng, 1, 1, chans[k], chans[k + 1])
        params[f"block{k}.b"] = np.zeros(chans[k + 1], np.float32)
    params["head.w"] = _init(rng, chans[-1], classes)
    params["head.b"] = np.zeros(classes, np.float32)
    images = rng.standard_normal((batch, size, size, chans[0])).astype(np.float32)
    target = rng.integers(0, classes, batch).astype(np.int64)

    def loss_fn(p: Mapping[str, Any], xs: Sequence[Any]) -> Any:
        tf = tf_module()
        x, tgt = xs
        for k in range(3):
            stride = 1 if k == 0 else 2
            with scope(f"block{k}"):
                x = tf.nn.depthwise_conv2d(x, p[f"block{k}.dw"], strides=[1, stride, stride, 1], padding="SAME")
                x = tf.nn.relu(tf.nn.conv2d(x, p[f"block{k}.pw"], strides=1, padding="SAME") + p[f"block{k}.b"])
        with scope("head"):
            logits = tf.matmul(tf.reduce_mean(x, axis=[1, 2]), p["head.w"]) + p["head.b"]
        return _xent(logits, tgt)

    return loss_fn, params, [images, target]


def attention_encoder() -> Factory:
    """Two encoder layers (4-head self-attention without a mask, LayerNorm after, ReLU FFN of
    384) over 16 sequences of 40 tokens, width 96, mean-pooled into 6 classes."""
    batch, seq, vocab, width, heads, ffn, classes, layers = 16, 40, 500, 96, 4, 384, 6, 2
    rng = np.random.default_rng(13)
    params: dict[str, np.ndarray] = {"embed": _init(rng, vocab, width), "pos": _init(rng, seq, width)}
    for k in range(layers):
        params[f"layer{k}.qkv"] = _init(rng, width, 3 * width)
        params[f"layer{k}.out"] = _init(rng, width, width)
        params[f"layer{k}.ff1"] = _init(rng, width, ffn)
        params[f"layer{k}.ff2"] = _init(rng, ffn, width)
        for n in ("ln1", "ln2"):
            params[f"layer{k}.{n}.g"] = np.ones(width, np.float32)
            params[f"layer{k}.{n}.b"] = np.zeros(width, np.float32)
    params["head.w"] = _init(rng, width, classes)
    tokens = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    target = rng.integers(0, classes, batch).astype(np.int64)
    dh = width // heads

    def norm(x: Any, g: Any, b: Any) -> Any:
        tf = tf_module()
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b

    def loss_fn(p: Mapping[str, Any], xs: Sequence[Any]) -> Any:
        tf = tf_module()
        tok, tgt = xs
        with scope("embed"):
            x = tf.gather(p["embed"], tok) + p["pos"]  # [B, S, W]
        for k in range(layers):
            with scope(f"layer{k}.attn"):
                qkv = tf.reshape(tf.matmul(tf.reshape(x, [-1, width]), p[f"layer{k}.qkv"]), [batch, seq, 3, heads, dh])
                q, kk, v = (tf.transpose(qkv[:, :, i], [0, 2, 1, 3]) for i in range(3))  # [B, H, S, dh]
                att = tf.nn.softmax(tf.matmul(q, kk, transpose_b=True) / float(np.sqrt(dh)))
                ctx = tf.reshape(tf.transpose(tf.matmul(att, v), [0, 2, 1, 3]), [-1, width])
                x = norm(x + tf.reshape(tf.matmul(ctx, p[f"layer{k}.out"]), [batch, seq, width]),
                         p[f"layer{k}.ln1.g"], p[f"layer{k}.ln1.b"])
            with scope(f"layer{k}.ffn"):
                h = tf.nn.relu(tf.matmul(tf.reshape(x, [-1, width]), p[f"layer{k}.ff1"]))
                x = norm(x + tf.reshape(tf.matmul(h, p[f"layer{k}.ff2"]), [batch, seq, width]),
                         p[f"layer{k}.ln2.g"], p[f"layer{k}.ln2.b"])
        with scope("head"):
            logits = tf.matmul(tf.reduce_mean(x, axis=1), p["head.w"])
        return _xent(logits, tgt)

    return loss_fn, params, [tokens, target]


def wide_regressor() -> Factory:
    """Three tanh layers of 1024 on 128 rows of 384 features, one output, mean-squared loss."""
    batch, features, width = 128, 384, 1024
    rng = np.random.default_rng(14)
    dims = (features, width, width, width)
    params = {f"fc{k}.w": _init(rng, dims[k], dims[k + 1]) for k in range(3)}
    params.update({f"fc{k}.b": np.zeros(dims[k + 1], np.float32) for k in range(3)})
    params["out.w"] = _init(rng, width, 1)
    x_in = rng.standard_normal((batch, features)).astype(np.float32)
    y_in = rng.standard_normal((batch, 1)).astype(np.float32)

    def loss_fn(p: Mapping[str, Any], xs: Sequence[Any]) -> Any:
        tf = tf_module()
        x, y = xs
        for k in range(3):
            with scope(f"fc{k}"):
                x = tf.tanh(tf.matmul(x, p[f"fc{k}.w"]) + p[f"fc{k}.b"])
        with scope("out"):
            pred = tf.matmul(x, p["out.w"])
        return tf.reduce_mean(tf.square(pred - y))

    return loss_fn, params, [x_in, y_in]


def keras_convnet() -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
    """A Keras 3 model: conv 3x3 (32) + batch norm + ReLU, max pool, separable conv (64) +
    ReLU, global average pool, dense 10; 32 RGB images of 32x32, compiled sparse
    cross-entropy on logits. Returned as a Keras user returns one: (model, (x, labels))."""
    import keras

    keras.utils.set_random_seed(15)
    layers = keras.layers
    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(32, 3, padding="same", use_bias=False, name="conv1")(inputs)
    x = layers.ReLU(name="relu1")(layers.BatchNormalization(name="bn1")(x))
    x = layers.MaxPooling2D(2, name="pool")(x)
    x = layers.SeparableConv2D(64, 3, padding="same", activation="relu", name="sep2")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, layers.Dense(10, name="head")(x), name="keras_convnet")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(15)
    return model, (rng.standard_normal((32, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, 32).astype(np.int32))
