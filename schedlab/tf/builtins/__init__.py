"""The built-in workloads in TensorFlow, with the torch model's weights: `from_torch(workload)`.

`from_torch(load_workload("cnn", "tiny"))` is the TFModel of the same model: parameters
copied from the torch module (names and order of `named_parameters()`, values in TF's
layout), the batch-norm buffers the forward updates, the torch inputs as numpy arrays
(images NHWC), and a loss written in TensorFlow ops (`mlp.py`, `cnn.py`, `transformer.py`,
`nmt.py`). Building one imports no TensorFlow: the loss does when it first runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from schedlab.errors import SchedlabError
from schedlab.tf.builtins import cnn, mlp, nmt, transformer
from schedlab.tf.builtins.layers import BATCH_NORM_BUFFERS
from schedlab.tf.model import Layout, LossFn, TFModel, TFTensorSpec
from schedlab.workloads import Workload
from schedlab.workloads import cnn as torch_cnn
from schedlab.workloads import mlp as torch_mlp
from schedlab.workloads import nmt as torch_nmt
from schedlab.workloads import transformer as torch_transformer

NCHW_TO_NHWC = (0, 2, 3, 1)


@dataclass(frozen=True)
class _Builtin:
    """How one built-in workload maps to TensorFlow."""

    module_type: type[nn.Module]  # the torch model's class
    configs: dict[str, Any]  # size -> the torch builder's config
    make_loss_fn: Callable[[Any], LossFn]
    image_inputs: tuple[int, ...] = ()  # NCHW inputs, given to TF as NHWC


_BUILTINS: dict[str, _Builtin] = {
    "mlp": _Builtin(torch_mlp.MLP, dict(torch_mlp.CONFIGS), mlp.make_loss_fn),
    "cnn": _Builtin(torch_cnn.ResNet, dict(torch_cnn.CONFIGS), cnn.make_loss_fn, image_inputs=(0,)),
    "transformer": _Builtin(torch_transformer.GPT, dict(torch_transformer.CONFIGS), transformer.make_loss_fn),
    "nmt": _Builtin(torch_nmt.Seq2Seq, dict(torch_nmt.CONFIGS), nmt.make_loss_fn),
}
TF_BUILTINS: tuple[str, ...] = tuple(_BUILTINS)


def from_torch(workload: Workload) -> TFModel:
    """The TFModel of a built-in workload, with its torch module's current weights and buffers.

    Raises SchedlabError for any other workload (a user factory, a held-out model): those
    have no TensorFlow version.
    """
    builtin = _BUILTINS.get(workload.name)
    if builtin is None:
        raise SchedlabError(
            f"workload {workload.name!r} has no TensorFlow version; the TensorFlow backend runs the "
            f"built-in workloads {', '.join(TF_BUILTINS)} only (run this one with the torch backend)"
        )
    module = workload.module
    if type(module) is not builtin.module_type or workload.size not in builtin.configs:
        raise SchedlabError(
            f"workload {workload.name!r} (size {workload.size!r}) is not the built-in model that name stands "
            f"for (a {builtin.module_type.__name__} of size {', '.join(builtin.configs)}); "
            f"build it with schedlab.workloads.load_workload({workload.name!r}, size)"
        )
    layouts = _param_layouts(module)
    params = tuple(_spec(name, p.detach(), layouts[name]) for name, p in module.named_parameters())
    buffers = tuple(
        _spec(name, b, Layout.SAME) for name, b in module.named_buffers() if _updated_by_forward(module, name)
    )
    inputs = tuple(
        TFTensorSpec(f"input{i}", _input_array(x.detach().cpu().numpy(), i in builtin.image_inputs))
        for i, x in enumerate(workload.inputs)
    )
    return TFModel(
        name=workload.name,
        size=workload.size,
        params=params,
        buffers=buffers,
        inputs=inputs,
        loss_fn=builtin.make_loss_fn(builtin.configs[workload.size]),
    )


def _param_layouts(module: nn.Module) -> dict[str, Layout]:
    """Every parameter's TF layout: Linear weights transposed, Conv2d weights HWIO, the rest as is."""
    out: dict[str, Layout] = {}
    for path, sub in module.named_modules():
        for pname, _ in sub.named_parameters(recurse=False):
            layout = Layout.SAME
            if pname == "weight" and isinstance(sub, nn.Linear):
                layout = Layout.TRANSPOSE
            elif pname == "weight" and isinstance(sub, nn.Conv2d):
                layout = Layout.CONV2D
            out[f"{path}.{pname}" if path else pname] = layout
    return out


def _updated_by_forward(module: nn.Module, buffer_name: str) -> bool:
    """Whether the training forward writes this buffer: batch norm's running statistics and count."""
    owner_path, _, leaf = buffer_name.rpartition(".")
    owner = module.get_submodule(owner_path)
    return (
        isinstance(owner, nn.modules.batchnorm._BatchNorm) and owner.track_running_stats and leaf in BATCH_NORM_BUFFERS
    )


def _spec(name: str, tensor: Any, layout: Layout) -> TFTensorSpec:
    # A copy: the torch module's later steps must not change the TF model's values.
    value: np.ndarray = tensor.detach().cpu().numpy().copy()
    return TFTensorSpec(name, layout.to_tf(value), layout)


def _input_array(array: np.ndarray, image: bool) -> np.ndarray:
    """A torch input as TF takes it: images NCHW -> NHWC, the rest unchanged (int64 stays int64)."""
    return np.ascontiguousarray(array.transpose(NCHW_TO_NHWC)) if image else array.copy()
