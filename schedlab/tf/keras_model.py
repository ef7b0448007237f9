"""A Keras 3 model as a TFModel: its weights as the step's variables, its call as pure ops.

Keras 3 builds no TF1 graph of its own, but `Model.stateless_call(trainable, non_trainable,
x, training=True)` runs the model's layers on values it is given instead of its own
variables, and with the TensorFlow backend those layers are plain TensorFlow ops. So the
step's parameters and buffers are the model's trainable and non-trainable weights (their
values at the time the factory returns), the forward is `stateless_call` on the step's
variable reads, and the non-trainable values it returns (batch-norm moving statistics)
are the buffers' updates, as a torch training-mode forward makes them.

The loss: the model's compiled loss (`model.compile(loss=...)`) on the last example input
as targets, averaged over the batch; an uncompiled model must output the scalar loss
itself. Parameters are named by the weight's path with "/" as "." and the model's own
name dropped ("fc1.kernel"), so a layer of the captured graph is the Keras layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.tf.model import TFModel, TFTensorSpec

KERAS_USAGE = ("a Keras model is returned as (model, example_inputs): compiled with a loss, the last input is the "
               "targets; uncompiled, the model's output is the scalar loss")


def is_keras_model(obj: Any) -> bool:
    return type(obj).__module__.startswith(("keras", "tf_keras")) and hasattr(obj, "stateless_call")


def _name(path: str, model_name: str) -> str:
    parts = path.split("/")
    if len(parts) > 1 and parts[0] == model_name:
        parts = parts[1:]
    return ".".join(parts)


def keras_tf_model(spec: str, model: Any, example_inputs: Any, size: str = "default") -> TFModel:
    """The TFModel of `model` on `example_inputs` (see the module docstring)."""
    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: {KERAS_USAGE}; example_inputs must be a non-empty "
                            "tuple or list of arrays")
    arrays = [np.ascontiguousarray(np.asarray(x)) for x in example_inputs]
    if not model.built:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: the Keras model is not built; give it a "
                            "keras.Input or call it once on an example before returning it")
    compiled_loss = getattr(model, "loss", None)
    if compiled_loss is not None and len(arrays) < 2:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: the model is compiled with a loss, so the last "
                            "example input must be the targets; give (inputs..., targets)")
    trainable = [(_name(v.path, model.name), np.asarray(v.numpy())) for v in model.trainable_variables]
    frozen = [(_name(v.path, model.name), np.asarray(v.numpy())) for v in model.non_trainable_variables]
    if not trainable:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: the Keras model has no trainable weights")
    names = [n for n, _ in trainable + frozen]
    if len(set(names)) != len(names):
        raise SchedlabError(f"TensorFlow model factory {spec!r}: Keras weight paths repeat after naming: {names}")
    n_x = len(arrays) - 1 if compiled_loss is not None else len(arrays)

    def loss_fn(params: Mapping[str, Any], buffers: Mapping[str, Any], xs: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
        import keras
        import tensorflow as tf

        x = list(xs[:n_x])
        out, new_frozen = model.stateless_call([params[n] for n, _ in trainable], [buffers[n] for n, _ in frozen],
                                               x[0] if len(x) == 1 else x, training=True)
        if compiled_loss is None:
            if out.shape.rank not in (0, None) and out.shape.num_elements() != 1:
                raise SchedlabError(f"TensorFlow model factory {spec!r}: the uncompiled Keras model outputs shape "
                                    f"{out.shape}, not a scalar loss; {KERAS_USAGE}")
            loss = tf.reshape(out, [])
        else:
            loss = tf.reduce_mean(keras.losses.get(compiled_loss)(xs[n_x], out))
        return loss, {n: v for (n, _), v in zip(frozen, new_frozen)}

    def as_float(name: str, arr: np.ndarray) -> TFTensorSpec:
        if not np.issubdtype(arr.dtype, np.floating):
            raise SchedlabError(f"TensorFlow model factory {spec!r}: Keras weight {name!r} is {arr.dtype}, not float")
        return TFTensorSpec(name, np.ascontiguousarray(arr))

    return TFModel(
        name=spec, size=size,
        params=tuple(as_float(n, a) for n, a in trainable),
        buffers=tuple(as_float(n, a) for n, a in frozen),
        inputs=tuple(TFTensorSpec(f"input{i}", a) for i, a in enumerate(arrays)),
        loss_fn=loss_fn,
    )
