"""A user's own TensorFlow model (`package.module:function`) and the held-out TF set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from schedlab.cli import main
from schedlab.errors import SchedlabError
from schedlab.tf.heldout import SPEC_PREFIX, TF_HELDOUT
from schedlab.tf.user import load_tf_model, require_tf_model
from tests.tf import IN_PROCESS


@pytest.mark.parametrize("name", TF_HELDOUT)
def test_each_held_out_tf_model_runs_and_matches_tf_eager(name: str) -> None:
    from schedlab.exec.tf_run import run_tensorflow

    model = load_tf_model(SPEC_PREFIX + name)
    assert model.params and bool(model.buffers) == (name == "keras_convnet")  # Keras's batch norm statistics
    run = run_tensorflow(model, IN_PROCESS, steps=1, warmup=0)
    assert run.check.numerics_ok and run.torch_check is None
    g = run.graph
    g.validate()
    assert len(g) > 20 and {op.kind.name for op in g.ops} >= {"F", "B", "OPT"}
    assert any(op.layer for op in g.ops)  # name scopes become layers


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        ("not_a_triple", "must return (loss_fn, params, example_inputs)"),
        ("int_params", "must be a named float array"),
        ("keras_model", "returned a Keras model alone"),
        ("keras_alone", "returned a Keras model alone"),
        ("raises", "raised RuntimeError: my factory is broken"),
        ("missing", "has no function 'missing'"),
    ],
)
def test_a_bad_factory_is_one_clear_error(fn: str, says: str) -> None:
    with pytest.raises(SchedlabError) as e:
        load_tf_model(f"tests.tf.user_models:{fn}")
    assert says in str(e.value)


def test_which_models_the_tf_backend_takes() -> None:
    require_tf_model("mlp")
    require_tf_model("mypkg.models:make")
    with pytest.raises(SchedlabError, match="has no TensorFlow version"):
        require_tf_model("heldout:gru-tagger")


def test_trace_a_user_tf_model(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc = main(["trace", "tests.tf.user_models:tiny", "--backend", "tensorflow", "--steps", "2", "--warmup", "0",
               "--out", str(tmp_path / "t.json"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["numerics_ok"] is True
    assert out["torch_check"] is None and out["torch_max_abs_grad_diff"] is None  # no PyTorch twin to compare with
    assert len(out["step_times_s"]) == 2 and Path(out["trace"]).exists()


def test_a_compiled_keras_model_runs_as_a_tf1_step_with_its_batch_norm_statistics() -> None:
    """Keras 3 layers through stateless_call in the step's graph: the loss is the compiled
    loss on the last input, the weights are named by their Keras path, the moving statistics
    are buffers the step updates, and the step matches TF eager."""
    import numpy as np

    from schedlab.exec.tf_run import run_tensorflow
    from schedlab.graph import InputRole, OutputRole

    model = load_tf_model("tests.tf.user_models:keras_classifier")
    assert [p.name for p in model.params] == ["fc1.kernel", "fc1.bias", "bn.gamma", "bn.beta", "out.kernel",
                                              "out.bias"]
    assert [b.name for b in model.buffers] == ["bn.moving_mean", "bn.moving_variance"]
    run = run_tensorflow(model, IN_PROCESS, steps=1, warmup=0)
    assert run.check.numerics_ok, run.check.describe()
    g = run.graph
    assert {i.name for i in g.inputs if i.role is InputRole.BUFFER} == {"bn.moving_mean", "bn.moving_variance"}
    assert {o.name for o in g.outputs if o.role is OutputRole.BUFFER} == {"bn.moving_mean", "bn.moving_variance"}
    assert {op.layer for op in g.ops if op.layer} >= {"fc1", "bn", "out"}
    # the loss is Keras's own on the example, as the Keras model computes it itself
    import keras

    from schedlab.tf.step import eager_loss_and_grads
    from tests.tf.user_models import keras_classifier

    m, (x, y) = keras_classifier()
    want = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, m(x, training=True)))
    got, grads = eager_loss_and_grads(model)
    assert got == pytest.approx(want, rel=1e-5)
    assert all(np.abs(grads[p.name]).max() > 0 for p in model.params)


def test_an_uncompiled_keras_model_must_output_the_loss() -> None:
    from schedlab.exec.tf_run import run_tensorflow

    model = load_tf_model("tests.tf.user_models:keras_uncompiled_not_a_loss")
    with pytest.raises(SchedlabError, match="not a scalar loss"):
        run_tensorflow(model, IN_PROCESS, steps=1, warmup=0)
