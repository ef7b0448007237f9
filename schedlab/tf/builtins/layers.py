"""The torch layers the built-in workloads use, written in plain TensorFlow ops, maths for maths.

Each function computes what the torch layer computes in training mode (same formula, same
epsilon, same reductions), so gradients compare element by element with PyTorch's. Ops
that use a parameter are named after it ("weight", "bias"; "weight_1" in a graph where
the variable itself holds the name), and a layer's ops are built inside
`scope(<torch module path>)`, so a captured TF graph names the layer of every op.

TensorFlow is imported on first use (`tf_module`), never at import time: the TF runtime
fixes its threading when it starts (schedlab.tf.runtime), and building a TFModel must not
start it. Tensors are typed `Any`: the same code runs eagerly and while building a graph.
"""

from __future__ import annotations

import math
import os
from typing import Any

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default
BATCH_NORM_EPS = 1e-5  # torch.nn.BatchNorm2d's default
BATCH_NORM_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")  # what its training forward updates
BATCH_NORM_MOMENTUM = 0.1  # torch.nn.BatchNorm2d's default: running = (1 - m) * running + m * batch


def tf_module() -> Any:
    """The `tensorflow` module, imported quietly on first use."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ info logs stay off the user's terminal
    import tensorflow as tf

    return tf


def scope(module_path: str) -> Any:
    """A name scope for the ops of the torch module at `module_path` ("blocks.0.conv1.0").

    Absolute (the trailing "/"), so it neither nests inside the caller's scope nor gets a
    "_1" suffix when entered again (an LSTM layer's recurrent matmul, once per time step).
    """
    return tf_module().name_scope(module_path + "/")


def shape_of(x: Any) -> list[Any]:
    """x's shape, each dimension a Python int where the graph knows it statically, else a scalar tensor.

    Static sizes keep shape arithmetic (Shape, StridedSlice, Pack ops) out of the graph.
    """
    tf = tf_module()
    static = x.shape.as_list()
    return [d if d is not None else tf.shape(x)[i] for i, d in enumerate(static)]


def linear(x: Any, weight: Any, bias: Any | None = None) -> Any:
    """torch.nn.Linear: x [..., in] @ weight [in, out] (+ bias [out]) -> [..., out].

    Leading dimensions are folded into one, as torch's linear does, so the forward and both
    gradients are single 2-D matmuls (not a batched matmul with a broadcast weight).
    """
    tf = tf_module()
    fan_in, fan_out = int(weight.shape[0]), int(weight.shape[1])
    lead = shape_of(x)[:-1]
    x2 = x if len(lead) == 1 else tf.reshape(x, [-1, fan_in])  # [N, in]
    y = tf.matmul(x2, weight, name="weight")  # [N, out]
    if bias is not None:
        y = tf.nn.bias_add(y, bias, name="bias")
    return y if len(lead) == 1 else tf.reshape(y, [*lead, fan_out])  # [..., out]


def conv2d(x: Any, weight: Any, stride: int) -> Any:
    """torch.nn.Conv2d without bias, padding kernel // 2 on every side; NHWC x, HWIO weight.

    The padding is explicit: TF's 'SAME' pads asymmetrically (more at the end) at stride 2,
    which samples other pixels than torch.
    """
    tf = tf_module()
    kh, kw = int(weight.shape[0]), int(weight.shape[1])
    pad = [[0, 0], [kh // 2, kh // 2], [kw // 2, kw // 2], [0, 0]]
    return tf.nn.conv2d(x, weight, strides=[1, stride, stride, 1], padding=pad, name="weight")


def batch_norm_train(x: Any, params: dict[str, Any], buffers: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """torch.nn.BatchNorm2d in training mode on NHWC x: normalised x and the updated buffers.

    params: "weight", "bias" [C]; buffers: "running_mean", "running_var" [C] and
    "num_batches_tracked" (int64 scalar). Normalisation uses the batch's biased variance;
    running_var takes the unbiased one (n / (n - 1)), as torch does.
    """
    tf = tf_module()
    m = BATCH_NORM_MOMENTUM
    mean = tf.reduce_mean(x, axis=[0, 1, 2], name="mean")  # [C]
    centered = x - mean  # [B, H, W, C]
    var = tf.reduce_mean(tf.square(centered), axis=[0, 1, 2], name="variance")  # [C], biased
    normed = centered * tf.math.rsqrt(var + BATCH_NORM_EPS)
    y = tf.add(tf.multiply(normed, params["weight"], name="weight"), params["bias"], name="bias")
    b, h, w, _ = shape_of(x)
    count = tf.cast(b * h * w, x.dtype)  # values per channel
    unbiased = var * (count / (count - 1.0))
    new = {
        "running_mean": tf.add((1.0 - m) * buffers["running_mean"], m * mean, name="running_mean"),
        "running_var": tf.add((1.0 - m) * buffers["running_var"], m * unbiased, name="running_var"),
        "num_batches_tracked": tf.add(
            buffers["num_batches_tracked"], tf.constant(1, dtype=tf.int64), name="num_batches_tracked"
        ),
    }
    return y, new


def layer_norm(x: Any, weight: Any, bias: Any) -> Any:
    """torch.nn.LayerNorm over the last dimension: biased variance, eps 1e-5, then scale and shift."""
    tf = tf_module()
    mean = tf.reduce_mean(x, axis=-1, keepdims=True, name="mean")  # [..., 1]
    centered = x - mean
    var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True, name="variance")  # [..., 1]
    normed = centered * tf.math.rsqrt(var + LAYER_NORM_EPS)
    return tf.add(tf.multiply(normed, weight, name="weight"), bias, name="bias")


def embedding(weight: Any, ids: Any) -> Any:
    """torch.nn.Embedding: rows of weight [V, C] at int64 ids [...] -> [..., C]."""
    return tf_module().gather(weight, ids, name="weight")


def gelu(x: Any) -> Any:
    """torch.nn.GELU's default: the exact form x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    # Not tf.nn.gelu: its exact form is 0.5 x erfc(-x / sqrt 2), which TF evaluates less
    # accurately (5e-9 off in float64, where torch's erf form is within 4e-16).
    return x * 0.5 * (1.0 + tf_module().math.erf(x * (1.0 / math.sqrt(2.0))))


def cross_entropy(logits: Any, target: Any) -> Any:
    """F.cross_entropy with mean reduction: logits [N, K], int64 class ids [N] -> scalar."""
    tf = tf_module()
    per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=logits)  # [N]
    return tf.reduce_mean(per_row, name="cross_entropy")
