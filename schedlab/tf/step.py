"""A TFModel's training step as a TF1-style graph: forward, `tf.gradients`, optimizer update.

Parameters, buffers and the model's inputs are resource variables, initialised from
placeholders (so a 100 MB model does not become a 100 MB GraphDef). The update is
TensorFlow's own optimizer, one fused kernel per parameter: SGD
(`tf.compat.v1.train.GradientDescentOptimizer`, `ResourceApplyGradientDescent`) or Adam
(`tf.compat.v1.train.AdamOptimizer`, `ResourceApplyAdam`, with torch's betas and eps),
in the name scope `OPTIMIZER_SCOPE` so capture can tag it OPT. TF's Adam adds its eps
to sqrt(v) before the bias correction, torch's after: the same step wherever |grad| is
far above eps (`expected_update` is TF's formula, the numerics reference). Batch-norm
running statistics are assigned in the same step, as torch's training-mode forward
updates them.

`tf.gradients` makes separate nodes for the weight gradient and the input gradient of a
MatMul (DESIGN.md, facts), which is what out-of-order backprop schedules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.tf.model import TFModel, TFTensorSpec
from schedlab.tf.runtime import import_tensorflow

OPTIMIZER_SCOPE = "optimizer"
INPUTS_SCOPE = "inputs"
TF_OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3}  # as schedlab.optim's torch defaults: both frameworks take the same step


@dataclass(frozen=True, eq=False)
class TFStep:
    """The graph of one training step and the handles a Session runs it by."""

    model: TFModel
    graph: Any  # tf.Graph
    loss: Any  # scalar tensor
    grads: dict[str, Any]  # parameter name -> gradient tensor (TF layout)
    train_op: Any  # runs the updates (parameters and buffers); fetch with `loss`
    variables: dict[str, Any]  # every parameter, buffer and input by name -> tf.Variable
    reads: dict[str, Any]  # every parameter by name -> its value (fetch it to read the weights)
    initial_values: dict[str, np.ndarray]  # the same names -> arrays they start from
    lr: float
    optimizer: str
    state_init: Any = None  # the optimizer's own state (Adam's moments and beta powers) to zeros
    state: Mapping[str, Any] | None = None  # TF op name -> the optimizer's own variables (none for SGD)

    def initialize(self, session: Any) -> None:
        """Set every variable to its initial value (the model's own weights and inputs), and
        the optimizer's state to its start."""
        feeds = {}
        ops = []
        for name, var in self.variables.items():
            ops.append(var.initializer)
            feeds[var.initializer.inputs[1]] = self.initial_values[name]
        if self.state_init is not None:
            ops.append(self.state_init)
        session.run(ops, feed_dict=feeds)

    def variable_names(self) -> dict[str, str]:
        """TF variable op name ("body.0/weight") -> the model's name ("body.0.weight")."""
        return {var.op.name: name for name, var in self.variables.items()}


def _scope_of(name: str) -> str:
    """"blocks.0.attn.qkv.weight" -> "blocks.0.attn.qkv": the TF name scope of a layer."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def _variable(tf: Any, spec: TFTensorSpec, trainable: bool) -> Any:
    """A resource variable named after the torch tensor, initialised from a placeholder."""
    scope, _, leaf = spec.name.rpartition(".")
    with tf.name_scope(f"{scope}/") if scope else contextlib.nullcontext():
        init = tf.compat.v1.placeholder(tf.as_dtype(spec.value.dtype), shape=spec.value.shape, name=f"{leaf}_init")
        return tf.Variable(init, name=leaf, trainable=trainable)


def build_step(model: TFModel, optimizer: str = "sgd", lr: float | None = None) -> TFStep:
    """The training step of `model` as a TF1 graph (see the module docstring)."""
    if optimizer not in TF_OPTIMIZERS:
        raise SchedlabError(f"the TensorFlow backend runs optimizer(s) {', '.join(TF_OPTIMIZERS)}, not {optimizer!r}")
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    tf = import_tensorflow()
    graph = tf.Graph()
    variables: dict[str, Any] = {}
    initial: dict[str, np.ndarray] = {}
    with graph.as_default():
        for spec in model.params:
            variables[spec.name] = _variable(tf, spec, trainable=True)
        for spec in model.buffers:
            variables[spec.name] = _variable(tf, spec, trainable=False)
        with tf.name_scope(f"{INPUTS_SCOPE}/"):
            inputs = []
            for spec in model.inputs:
                init = tf.compat.v1.placeholder(tf.as_dtype(spec.value.dtype), spec.value.shape, name=f"{spec.name}_init")
                var = tf.Variable(init, name=spec.name, trainable=False)
                variables[spec.name] = var
                inputs.append(var.read_value())
        for spec in (*model.params, *model.buffers, *model.inputs):
            initial[spec.name] = spec.value
        params = {p.name: variables[p.name].read_value() for p in model.params}
        buffers = {b.name: variables[b.name].read_value() for b in model.buffers}
        loss, new_buffers = model.loss_fn(params, buffers, inputs)
        unknown = set(new_buffers) - set(buffers)
        if unknown:
            raise SchedlabError(f"TF model {model.name!r} updates buffers it does not declare: {sorted(unknown)}")
        names = [p.name for p in model.params]
        grad_list = tf.gradients(loss, [params[n] for n in names])
        missing = [n for n, g in zip(names, grad_list) if g is None]
        if missing:
            raise SchedlabError(f"TF model {model.name!r}: the loss does not depend on parameter(s) {missing}")
        # An embedding's gradient comes as IndexedSlices (rows touched); made dense, as
        # torch's is, so both frameworks take the same dense SGD step.
        grads = {n: tf.convert_to_tensor(g) for n, g in zip(names, grad_list)}
        opt = _optimizer(tf, optimizer, lr)
        apply = opt.apply_gradients([(grads[n], variables[n]) for n in names])
        assigns = [variables[n].assign(v, read_value=False) for n, v in new_buffers.items()]
        train_op = tf.group(apply, *assigns, name="train")
        state = opt.variables()
        state_init = tf.compat.v1.variables_initializer(state, name="optimizer_init") if state else None
    return TFStep(model=model, graph=graph, loss=loss, grads=grads, train_op=train_op, variables=variables, reads=params,
                  initial_values=initial, lr=lr, optimizer=optimizer, state_init=state_init,
                  state={v.op.name: v for v in state})


def _optimizer(tf: Any, optimizer: str, lr: float) -> Any:
    from schedlab.optim import ADAM_BETAS, ADAM_EPS

    if optimizer == "adam":
        b1, b2 = ADAM_BETAS
        return tf.compat.v1.train.AdamOptimizer(lr, beta1=b1, beta2=b2, epsilon=ADAM_EPS, name=OPTIMIZER_SCOPE)
    return tf.compat.v1.train.GradientDescentOptimizer(lr, name=OPTIMIZER_SCOPE)


def expected_update(optimizer: str, lr: float, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """A parameter after the first step of `optimizer` from `grad`, as TensorFlow computes it
    (float32): SGD p - lr g; Adam from zero moments, lr_t = lr sqrt(1 - b2) / (1 - b1),
    p - lr_t m / (sqrt(v) + eps) with m = (1 - b1) g, v = (1 - b2) g^2."""
    from schedlab.optim import ADAM_BETAS, ADAM_EPS

    f = np.float32
    if optimizer == "sgd":
        return param - f(lr) * grad
    if optimizer != "adam":
        raise SchedlabError(f"no TF update rule for optimizer {optimizer!r}")
    b1, b2 = ADAM_BETAS
    m, v = f(1 - b1) * grad, f(1 - b2) * grad * grad
    lr_t = f(lr * np.sqrt(1 - b2) / (1 - b1))
    return param - lr_t * m / (np.sqrt(v) + f(ADAM_EPS))


def eager_loss_and_grads(model: TFModel) -> tuple[float, dict[str, np.ndarray]]:
    """The numerics reference: `model.loss_fn` run eagerly under `tf.GradientTape` on the
    model's initial weights and inputs."""
    tf = import_tensorflow()
    params = {p.name: tf.Variable(p.value) for p in model.params}
    buffers = {b.name: tf.constant(b.value) for b in model.buffers}
    inputs = [tf.constant(x.value) for x in model.inputs]
    with tf.GradientTape() as tape:
        loss, _ = model.loss_fn({n: v.read_value() for n, v in params.items()}, buffers, inputs)
    grads = tape.gradient(loss, list(params.values()))
    return float(loss.numpy()), {n: tf.convert_to_tensor(g).numpy() for n, g in zip(params, grads)}


def max_abs_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> tuple[float, str]:
    """The largest element-wise |a - b| over tensors both hold, and whose it is."""
    worst, who = 0.0, ""
    for name in a:
        if name not in b:
            raise SchedlabError(f"numerics check: no reference for tensor {name!r}")
        if a[name].shape != b[name].shape:
            raise SchedlabError(f"numerics check: {name} has shape {a[name].shape}, reference {b[name].shape}")
        d = float(np.max(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)))) if a[name].size else 0.0
        if d > worst or not who:
            worst, who = d, name
    return worst, who
