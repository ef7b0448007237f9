"""The `cnn` workload in TensorFlow: a small ResNet (basic blocks, BatchNorm) in NHWC.

Mirrors schedlab.workloads.cnn. Images are NHWC (the TFModel's input is the torch NCHW
array transposed once) and conv weights HWIO. BatchNorm runs in training mode, so the
loss also returns every batch-norm layer's updated running statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schedlab.tf.builtins.layers import (
    BATCH_NORM_BUFFERS,
    batch_norm_train,
    conv2d,
    cross_entropy,
    linear,
    scope,
    tf_module,
)
from schedlab.tf.model import LossFn
from schedlab.workloads.cnn import CNNConfig


def _conv_bn(
    path: str, x: Any, stride: int, params: Mapping[str, Any], buffers: Mapping[str, Any], new: dict[str, Any]
) -> Any:
    """conv_bn at `path`: conv `path.0` (no bias) then BatchNorm2d `path.1`; adds its buffers to `new`."""
    with scope(f"{path}.0"):
        x = conv2d(x, params[f"{path}.0.weight"], stride)
    bn = f"{path}.1"
    with scope(bn):
        x, updated = batch_norm_train(
            x,
            {p: params[f"{bn}.{p}"] for p in ("weight", "bias")},
            {b: buffers[f"{bn}.{b}"] for b in BATCH_NORM_BUFFERS},
        )
    new.update({f"{bn}.{b}": v for b, v in updated.items()})
    return x


def block_plan(cfg: CNNConfig) -> list[tuple[int, bool]]:
    """(stride, has a conv-bn shortcut) of every basic block, in order, as torch builds them.

    Stride 2 where a stage after the first begins; a 1x1 conv-bn shortcut where the block
    changes the shape (stride 2 or a new width), else the identity.
    """
    plan: list[tuple[int, bool]] = []
    cin = cfg.widths[0]
    for stage, width in enumerate(cfg.widths):
        for i in range(cfg.blocks_per_stage):
            stride = 2 if stage > 0 and i == 0 else 1
            plan.append((stride, stride != 1 or cin != width))
            cin = width
    return plan


def make_loss_fn(cfg: CNNConfig) -> LossFn:
    """The TF loss of a ResNet of `cfg`: inputs (images [B, H, W, 3] float32, target [B] int64)."""
    plan = block_plan(cfg)

    def loss_fn(
        params: Mapping[str, Any], buffers: Mapping[str, Any], inputs: Sequence[Any]
    ) -> tuple[Any, dict[str, Any]]:
        tf = tf_module()
        images, target = inputs
        new: dict[str, Any] = {}
        x = tf.nn.relu(_conv_bn("stem", images, 1, params, buffers, new))  # [B, H, W, widths[0]]
        for i, (stride, has_shortcut) in enumerate(plan):
            path = f"blocks.{i}"
            out = _conv_bn(f"{path}.conv1", x, stride, params, buffers, new)
            with scope(path):
                out = tf.nn.relu(out)
            out = _conv_bn(f"{path}.conv2", out, 1, params, buffers, new)
            short = _conv_bn(f"{path}.shortcut", x, stride, params, buffers, new) if has_shortcut else x
            with scope(path):
                x = tf.nn.relu(out + short)  # [B, H / stride, W / stride, width]
        pooled = tf.reduce_mean(x, axis=[1, 2])  # global average pool: [B, widths[-1]]
        with scope("head"):
            logits = linear(pooled, params["head.weight"], params["head.bias"])  # [B, classes]
        return cross_entropy(logits, target), new

    return loss_fn
