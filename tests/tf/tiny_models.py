"""Small TensorFlow models written for the capture tests (not built-in workloads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlab.tf.model import Layout, TFModel, TFTensorSpec


def mlp(batch: int = 8, width: int = 32, hidden: int = 64, classes: int = 10) -> TFModel:
    """Linear + ReLU, then Linear, cross-entropy: two layers ("body.0", "head")."""
    rng = np.random.default_rng(0)

    def loss_fn(params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
        import tensorflow as tf

        x, t = inputs
        with tf.name_scope("body.0"):
            h = tf.nn.relu(tf.matmul(x, params["body.0.weight"]) + params["body.0.bias"])
        with tf.name_scope("head"):
            logits = tf.matmul(h, params["head.weight"]) + params["head.bias"]
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=logits)
        return tf.reduce_mean(ce), {}

    return TFModel(
        "test-mlp", "tiny",
        params=(
            TFTensorSpec("body.0.weight", rng.standard_normal((width, hidden), dtype=np.float32) * 0.1, Layout.TRANSPOSE),
            TFTensorSpec("body.0.bias", rng.standard_normal(hidden, dtype=np.float32) * 0.1),
            TFTensorSpec("head.weight", rng.standard_normal((hidden, classes), dtype=np.float32) * 0.1, Layout.TRANSPOSE),
            TFTensorSpec("head.bias", np.zeros(classes, np.float32)),
        ),
        buffers=(),
        inputs=(
            TFTensorSpec("input0", rng.standard_normal((batch, width), dtype=np.float32)),
            TFTensorSpec("input1", rng.integers(0, classes, batch)),
        ),
        loss_fn=loss_fn,
    )


def with_running_mean(batch: int = 4, width: int = 8) -> TFModel:
    """One Linear layer whose forward also updates a running mean of its input (a buffer)."""
    rng = np.random.default_rng(1)

    def loss_fn(params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
        import tensorflow as tf

        (x,) = inputs
        with tf.name_scope("norm"):
            mean = tf.reduce_mean(x, axis=0)
            new_running = 0.9 * buffers["norm.running_mean"] + 0.1 * mean
            y = tf.matmul(x - mean, params["norm.weight"])
        return tf.reduce_sum(y * y), {"norm.running_mean": new_running}

    return TFModel(
        "test-buffer", "tiny",
        params=(TFTensorSpec("norm.weight", rng.standard_normal((width, width), dtype=np.float32), Layout.TRANSPOSE),),
        buffers=(TFTensorSpec("norm.running_mean", np.zeros(width, np.float32)),),
        inputs=(TFTensorSpec("input0", rng.standard_normal((batch, width), dtype=np.float32)),),
        loss_fn=loss_fn,
    )
