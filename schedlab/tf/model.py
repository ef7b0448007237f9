"""A workload in TensorFlow: its parameters (named as in the torch module), inputs and loss.

A `TFModel` is what the TensorFlow backend runs. Its `loss_fn` is written with plain
TensorFlow ops (`tf.matmul`, `tf.nn.*`), so the same function builds a TF1-style graph
(what the executor runs under a Session, where `RunMetadata.step_stats` times every node)
and runs eagerly under `tf.GradientTape` (the numerics reference). Every layer's ops are
built inside `tf.name_scope(<torch module path>)`, so captured ops carry the layer.

Parameters keep the torch module's names ("body.0.weight") and values, in TensorFlow's
layout; `Layout` says how to convert between the two, so gradients compare element by
element with PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


class Layout(StrEnum):
    """How a parameter's TensorFlow array relates to the torch one."""

    SAME = "same"  # identical shape and element order (biases, norms, embeddings)
    TRANSPOSE = "transpose"  # 2-D, transposed: torch Linear [out, in] <-> TF [in, out]
    CONV2D = "conv2d"  # torch [out, in, kh, kw] <-> TF HWIO [kh, kw, in, out]

    @property
    def to_tf_axes(self) -> tuple[int, ...] | None:
        """The torch array's axes in TF order (None: the same order)."""
        return {Layout.TRANSPOSE: (1, 0), Layout.CONV2D: (2, 3, 1, 0)}.get(self)

    def to_tf(self, torch_array: np.ndarray) -> np.ndarray:
        axes = self.to_tf_axes
        return np.ascontiguousarray(torch_array if axes is None else torch_array.transpose(axes))

    def to_torch(self, tf_array: np.ndarray) -> np.ndarray:
        axes = self.to_tf_axes
        return np.ascontiguousarray(tf_array if axes is None else tf_array.transpose(np.argsort(axes)))


@dataclass(frozen=True, eq=False)
class TFTensorSpec:
    """A named array of the model: a parameter or buffer (torch name), or an input."""

    name: str
    value: np.ndarray  # in TensorFlow's layout
    layout: Layout = Layout.SAME


# loss_fn(params, buffers, inputs) -> (loss, new buffer values by name)
#   params:  torch parameter name -> tf tensor (a variable's value), TF layout
#   buffers: torch buffer name -> tf tensor (e.g. batch-norm running stats)
#   inputs:  the model's inputs, in the order of the torch workload's inputs
LossFn = Callable[[Mapping[str, Any], Mapping[str, Any], Sequence[Any]], tuple[Any, dict[str, Any]]]


@dataclass(frozen=True, eq=False)
class TFModel:
    """One workload's training-step ingredients in TensorFlow (see the module docstring)."""

    name: str  # the workload spec, as for torch ("mlp")
    size: str
    params: tuple[TFTensorSpec, ...]  # trainable, in the torch module's named_parameters() order
    buffers: tuple[TFTensorSpec, ...]  # updated by the forward in training mode (may be empty)
    inputs: tuple[TFTensorSpec, ...]  # names "input0", "input1", ... as torch capture names them
    loss_fn: LossFn

    def param(self, name: str) -> TFTensorSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)
