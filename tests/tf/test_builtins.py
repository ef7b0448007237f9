"""The built-in workloads in TensorFlow compute what the torch models compute.

For each workload, the TF loss and every parameter gradient (eager, tf.GradientTape) are
compared element by element with torch's `loss.backward()` on the same weights and inputs,
and the batch-norm buffers after one forward with torch's.

Tolerances, and the worst differences measured (2-core CPU, tensorflow-cpu 2.21, torch 2.13):

- float32, |tf - torch| <= 1e-5 + 1e-4 |torch| over the loss, gradients and buffers.
  Worst absolute difference: tiny mlp 2.4e-7 (the loss), cnn 1.2e-7 (stem.0.weight; buffers
  6.0e-8), transformer 3.0e-8 (head.weight), nmt 1.5e-8 (attn_combine.bias); default mlp
  4.7e-9, transformer 7.5e-9, nmt 9.5e-7 (the loss). At most 1% of the tolerance anywhere.
- float64, |tf - torch| <= 1e-12 + 1e-9 |torch|: the same maths, not merely close numbers.
  Worst absolute difference: 8.9e-16 at size tiny (cnn's loss), 2.5e-15 for cnn default.
- cnn at size default in float32 differs by up to 1.2e-3 (blocks.1.conv1.0.weight), 4.8e-3
  of a gradient's 2-norm at worst: float32 rounding amplified through eight batch norms.
  Torch's own float32 gradients are as far from its float64 ones (up to 4.6e-3 of the
  norm), so that case is checked elementwise in float64, and in float32 per tensor as
  ||tf - torch|| <= 2e-2 ||torch|| (2-norms).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from schedlab.errors import SchedlabError  # noqa: E402
from schedlab.tf.builtins import TF_BUILTINS, from_torch  # noqa: E402
from schedlab.tf.model import Layout, TFModel  # noqa: E402
from schedlab.workloads import BUILTIN_WORKLOADS, Workload, load_workload  # noqa: E402

F32_TOL = {"atol": 1e-5, "rtol": 1e-4}
F64_TOL = {"atol": 1e-12, "rtol": 1e-9}
CNN_DEFAULT_F32_NORM_RTOL = 2e-2

Results = tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]  # loss, grads (torch layout), buffers


def _cast(a: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    return a.astype(dtype) if np.issubdtype(a.dtype, np.floating) else a


def tf_results(model: TFModel, dtype: type = np.float32) -> Results:
    """The TF model's loss, parameter gradients (converted to torch's layout) and updated buffers."""
    params = {p.name: tf.constant(_cast(p.value, np.dtype(dtype))) for p in model.params}
    buffers = {b.name: tf.constant(_cast(b.value, np.dtype(dtype))) for b in model.buffers}
    inputs = [tf.constant(_cast(i.value, np.dtype(dtype))) for i in model.inputs]
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss, new = model.loss_fn(params, buffers, inputs)
    grads = tape.gradient(loss, params)  # embeddings give IndexedSlices: made dense here
    assert set(new) == set(buffers), "the loss must return the updated value of every buffer, and only those"
    return (
        float(loss.numpy()),
        {p.name: p.layout.to_torch(tf.convert_to_tensor(grads[p.name]).numpy()) for p in model.params},
        {name: v.numpy() for name, v in new.items()},
    )


def torch_results(workload: Workload, dtype: type = np.float32) -> Results:
    """Torch's eager loss, `.grad` of every parameter and buffers after one training forward."""
    module, inputs = workload.module, workload.inputs
    if dtype is np.float64:
        module = module.double()  # floating buffers too; num_batches_tracked stays int64
        inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    loss = module(*inputs)
    loss.backward()
    grads = {name: p.grad.numpy() for name, p in module.named_parameters()}
    return float(loss.item()), grads, {name: b.numpy() for name, b in module.named_buffers()}


def compare(name: str, size: str, dtype: type, check: Callable[[str, np.ndarray, np.ndarray], None]) -> TFModel:
    """Build `name` at `size`, run both, and `check(what, tf_value, torch_value)` everything."""
    workload = load_workload(name, size)
    model = from_torch(workload)
    tf_loss, tf_grads, tf_bufs = tf_results(model, dtype)
    t_loss, t_grads, t_bufs = torch_results(workload, dtype)
    check("loss", np.array(tf_loss), np.array(t_loss))
    assert list(tf_grads) == list(t_grads)
    for pname, g in tf_grads.items():
        assert g.shape == t_grads[pname].shape, pname
        check(f"grad of {pname}", g, t_grads[pname])
    for bname, v in tf_bufs.items():
        check(f"buffer {bname}", v, t_bufs[bname])
    return model


def elementwise(tol: dict[str, float]) -> Callable[[str, np.ndarray, np.ndarray], None]:
    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        assert got.dtype == want.dtype, what
        np.testing.assert_allclose(got, want, err_msg=what, **tol)

    return check


def norm_relative(rtol: float) -> Callable[[str, np.ndarray, np.ndarray], None]:
    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        err = float(np.linalg.norm((got - want).astype(np.float64).ravel()))
        assert err <= rtol * float(np.linalg.norm(want.astype(np.float64).ravel())) + 1e-6, what

    return check


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_tiny_matches_torch_in_float32(name: str) -> None:
    model = compare(name, "tiny", np.float32, elementwise(F32_TOL))
    if name == "cnn":  # the one with buffers: every batch norm's three, and the count went 0 -> 1
        assert len(model.buffers) == 3 * sum(isinstance(m, nn.BatchNorm2d) for m in _module(name).modules())
        _, _, bufs = tf_results(model)
        assert all(v == 1 for k, v in bufs.items() if k.endswith("num_batches_tracked"))
    else:
        assert model.buffers == ()


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_tiny_matches_torch_in_float64(name: str) -> None:
    compare(name, "tiny", np.float64, elementwise(F64_TOL))


def test_mlp_default_matches_torch() -> None:
    compare("mlp", "default", np.float32, elementwise(F32_TOL))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer", "nmt"])
def test_default_matches_torch(name: str) -> None:
    compare(name, "default", np.float32, elementwise(F32_TOL))


@pytest.mark.slow
def test_cnn_default_matches_torch() -> None:
    compare("cnn", "default", np.float64, elementwise(F64_TOL))
    compare("cnn", "default", np.float32, norm_relative(CNN_DEFAULT_F32_NORM_RTOL))


def _module(name: str) -> nn.Module:
    return load_workload(name, "tiny").module


def test_from_torch_names_layouts_and_inputs() -> None:
    cnn = load_workload("cnn", "tiny")
    model = from_torch(cnn)
    assert [p.name for p in model.params] == [n for n, _ in cnn.module.named_parameters()]
    assert model.param("stem.0.weight").layout is Layout.CONV2D
    assert model.param("stem.0.weight").value.shape == (3, 3, 3, 8)  # HWIO
    assert model.param("head.weight").layout is Layout.TRANSPOSE
    assert model.param("stem.1.weight").layout is Layout.SAME
    assert model.buffers[2].name == "stem.1.num_batches_tracked"
    assert model.buffers[2].value.dtype == np.int64
    images, target = model.inputs
    assert (images.name, target.name) == ("input0", "input1")
    np.testing.assert_array_equal(images.value, cnn.inputs[0].numpy().transpose(0, 2, 3, 1))  # NHWC
    assert target.value.dtype == np.int64
    # The TF model holds copies: a torch optimizer step does not reach it.
    before = model.param("head.bias").value.copy()
    with torch.no_grad():
        cnn.module.head.bias.add_(1.0)
    np.testing.assert_array_equal(model.param("head.bias").value, before)
    # The causal mask is a non-persistent constant: not a buffer of the TF model.
    gpt = from_torch(load_workload("transformer", "tiny"))
    assert gpt.buffers == ()
    assert gpt.param("tok_emb.weight").layout is Layout.SAME


def test_from_torch_imports_no_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a TFModel must not start TensorFlow (its runtime fixes threading at start-up):
    with tensorflow unimportable, from_torch still works; only running the loss imports it."""
    import ast

    import schedlab.tf.builtins as builtins

    assert builtins.TF_BUILTINS == BUILTIN_WORKLOADS
    for path in Path(builtins.__file__).parent.glob("*.py"):  # no module imports it at import time
        tree = ast.parse(path.read_text())
        top_level = [a.name for node in tree.body if isinstance(node, ast.Import) for a in node.names]
        top_level += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert not [m for m in top_level if m.startswith("tensorflow")], path
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # any `import tensorflow` now raises
    for name in BUILTIN_WORKLOADS:
        assert from_torch(load_workload(name, "tiny")).name == name
    model = from_torch(load_workload("mlp", "tiny"))
    with pytest.raises(ImportError):
        model.loss_fn({}, {}, [])


@pytest.mark.parametrize("spec", ["heldout:mixer", "tests.fixtures.user_model:make"])
def test_from_torch_refuses_workloads_without_a_tf_version(spec: str) -> None:
    with pytest.raises(SchedlabError, match="has no TensorFlow version") as err:
        from_torch(load_workload(spec, "tiny"))
    assert spec in str(err.value)
    assert all(name in str(err.value) for name in TF_BUILTINS)


def test_from_torch_refuses_another_module_under_a_builtin_name() -> None:
    other = load_workload("tests.fixtures.user_model:make", "tiny")
    impostor = Workload(name="mlp", size="tiny", module=other.module, inputs=other.inputs)
    with pytest.raises(SchedlabError, match="not the built-in model"):
        from_torch(impostor)


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builds_a_graph_whose_ops_name_their_layer(name: str) -> None:
    """In a TF1 graph over variables, the loss equals the eager one, gradients build, and
    every op that reads a parameter sits in the scope of the layer that owns it."""
    model = from_torch(load_workload(name, "tiny"))
    eager_loss, _, _ = tf_results(model)
    graph = tf.Graph()
    with graph.as_default():
        params = {p.name: tf.Variable(p.value, name=f"param{i}").read_value() for i, p in enumerate(model.params)}
        buffers = {b.name: tf.Variable(b.value, name=f"buffer{i}").read_value() for i, b in enumerate(model.buffers)}
        inputs = [tf.constant(i.value, name=i.name) for i in model.inputs]
        loss, new = model.loss_fn(params, buffers, inputs)
        grads = tf.compat.v1.gradients(loss, list(params.values()))
        init = tf.compat.v1.global_variables_initializer()
    assert all(g is not None for g in grads)
    for pname, read in params.items():
        owner, _, leaf = pname.rpartition(".")
        users = [op.name for op in read.consumers() if not op.name.startswith("gradients/")]
        assert users, pname
        prefix = f"{owner}/" if owner else leaf
        assert all(u.startswith(prefix) for u in users), (pname, users)
        assert f"{owner}/{leaf}" in users if owner else leaf in users, (pname, users)
    for bname, value in new.items():
        owner, _, leaf = bname.rpartition(".")
        assert value.op.name == f"{owner}/{leaf}", bname
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        graph_loss = sess.run(loss)
    np.testing.assert_allclose(graph_loss, eager_loss, **F32_TOL)
