"""Your own TensorFlow model for `--backend tensorflow`: MODEL as ``package.module:function``.

The function takes no arguments and returns ``(loss_fn, params, example_inputs)``:

- ``params``: a dict of name -> numpy float array, the trainable weights' initial values;
- ``example_inputs``: a tuple or list of numpy arrays, one batch;
- ``loss_fn(params, inputs)``: a scalar float loss tensor, written with TensorFlow ops that
  run both while building a TF1 graph and eagerly (``tf.matmul``, ``tf.nn.*``,
  ``tf.reduce_mean``...); ``params`` maps each name to a tensor, ``inputs`` is the list of
  input tensors in order. ``tf.name_scope("encoder.0/")`` around a layer's ops names the
  layer of every captured op.

Or it returns ``(keras_model, example_inputs)``: a built Keras 3 model, compiled with a
loss (the last example input is then the targets) or outputting the scalar loss itself
(`schedlab.tf.keras_model`: its layers run as plain TF ops in the step's TF1 graph through
`stateless_call`). It may also return a `schedlab.tf.model.TFModel`. The step has no
PyTorch counterpart, so it is checked against TF eager only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.tf.keras_model import KERAS_USAGE, is_keras_model, keras_tf_model
from schedlab.tf.model import TFModel, TFTensorSpec

USAGE = ("must return (loss_fn, params, example_inputs): params a dict of numpy float arrays, example_inputs numpy "
         "arrays; or (keras_model, example_inputs)")


def is_tf_user_spec(spec: str) -> bool:
    return ":" in spec and not spec.startswith("heldout:")


def load_tf_model(spec: str, size: str = "default") -> TFModel:
    """The TFModel the factory `spec` ("package.module:function") describes; one clear
    SchedlabError for anything it got wrong. `size` is recorded, not used: a factory has one."""
    from schedlab.workloads.loader import resolve_factory

    factory = resolve_factory(spec)
    try:
        out = factory()
    except Exception as e:  # the user's factory failing is the user's to fix
        raise SchedlabError(f"TensorFlow model factory {spec!r} raised {type(e).__name__}: {e}") from None
    if isinstance(out, TFModel):
        return out
    if is_keras_model(out) or hasattr(out, "trainable_weights"):
        raise SchedlabError(f"TensorFlow model factory {spec!r} returned a Keras model alone; {KERAS_USAGE}")
    if isinstance(out, (tuple, list)) and len(out) == 2 and is_keras_model(out[0]):
        return keras_tf_model(spec, out[0], out[1], size)
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise SchedlabError(f"TensorFlow model factory {spec!r} {USAGE}; got a {type(out).__name__}")
    loss_fn, params, inputs = out
    if not callable(loss_fn):
        raise SchedlabError(f"TensorFlow model factory {spec!r}: loss_fn is a {type(loss_fn).__name__}, not callable")
    if not isinstance(params, Mapping) or not params:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: params must be a non-empty dict of name -> array")
    specs = []
    for name, value in params.items():
        arr = np.asarray(value)
        if not isinstance(name, str) or not np.issubdtype(arr.dtype, np.floating):
            raise SchedlabError(f"TensorFlow model factory {spec!r}: parameter {name!r} must be a named float array, "
                                f"got dtype {arr.dtype}")
        specs.append(TFTensorSpec(name, np.ascontiguousarray(arr)))
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise SchedlabError(f"TensorFlow model factory {spec!r}: example_inputs must be a non-empty tuple or list")
    input_specs = tuple(TFTensorSpec(f"input{i}", np.ascontiguousarray(np.asarray(x))) for i, x in enumerate(inputs))

    def wrapped(p: Mapping[str, Any], buffers: Mapping[str, Any], xs: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
        return loss_fn(p, list(xs)), {}

    return TFModel(name=spec, size=size, params=tuple(specs), buffers=(), inputs=input_specs, loss_fn=wrapped)


def require_tf_model(spec: str, optimizer: str = "sgd") -> None:
    """Refuse, with one message, what `--backend tensorflow` cannot run: an optimizer its step
    does not build (`schedlab.tf.step.TF_OPTIMIZERS`), or a MODEL that is neither a built-in
    with a TF version nor a TF factory (a held-out torch model is torch-only)."""
    from schedlab.tf.builtins import TF_BUILTINS
    from schedlab.tf.step import TF_OPTIMIZERS

    if optimizer not in TF_OPTIMIZERS:
        raise SchedlabError(f"--backend tensorflow builds its step with optimizer {' or '.join(TF_OPTIMIZERS)}, "
                            f"not {optimizer!r}")
    if spec in TF_BUILTINS or is_tf_user_spec(spec):
        return
    raise SchedlabError(f"{spec!r} has no TensorFlow version; --backend tensorflow runs the built-in workloads "
                        f"{', '.join(TF_BUILTINS)} or your TF model as 'package.module:function' (see schedlab.tf.user; "
                        "held-out ones: schedlab.tf.heldout:NAME)")
