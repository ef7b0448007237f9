"""The `mlp` workload in TensorFlow: Linear+ReLU layers and a cross-entropy loss.

Mirrors schedlab.workloads.mlp: body.0 (Linear), body.1 (ReLU), ..., head (Linear).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedlab.tf.builtins.layers import cross_entropy, linear, scope, tf_module
from schedlab.tf.model import LossFn
from schedlab.workloads.mlp import MLPConfig


def make_loss_fn(cfg: MLPConfig) -> LossFn:
    """The TF loss of an MLP of `cfg`: inputs (x [B, in] float32, target [B] int64)."""

    def loss_fn(
        params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]
    ) -> tuple[Any, dict[str, Any]]:
        tf = tf_module()
        x, target = inputs
        for k in range(cfg.layers):
            with scope(f"body.{2 * k}"):
                x = linear(x, params[f"body.{2 * k}.weight"], params[f"body.{2 * k}.bias"])  # [B, hidden]
            with scope(f"body.{2 * k + 1}"):
                x = tf.nn.relu(x)
        with scope("head"):
            logits = linear(x, params["head.weight"], params["head.bias"])  # [B, classes]
        return cross_entropy(logits, target), {}

    return loss_fn
