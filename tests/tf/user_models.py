"""TensorFlow model factories as a user writes them (`schedlab.tf.user`), good and bad."""

from __future__ import annotations

from typing import Any

import numpy as np


def tiny() -> tuple[Any, dict[str, np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    params = {"fc.w": rng.standard_normal((8, 4)).astype(np.float32), "fc.b": np.zeros(4, np.float32)}
    x = rng.standard_normal((6, 8)).astype(np.float32)

    def loss_fn(p: Any, xs: Any) -> Any:
        import tensorflow as tf

        with tf.name_scope("fc/"):
            y = tf.nn.relu(tf.matmul(xs[0], p["fc.w"]) + p["fc.b"])
        return tf.reduce_mean(tf.square(y))

    return loss_fn, params, [x]


def not_a_triple() -> Any:
    return (1, 2)


def int_params() -> Any:
    return (lambda p, xs: 0.0), {"w": np.zeros(3, np.int64)}, [np.zeros(3, np.float32)]


class FakeKeras:
    """Looks like a Keras model to the loader (it has trainable weights)."""

    def __init__(self) -> None:
        self.trainable_weights: list[Any] = []


def keras_model() -> Any:
    return FakeKeras()


def raises() -> Any:
    raise RuntimeError("my factory is broken")


def keras_classifier() -> Any:
    """A compiled Keras 3 model with a batch norm (its moving statistics are buffers)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="fc1"),
                              keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(4, name="out")],
                             name="clf")
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    return model, (rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32))


def keras_uncompiled_not_a_loss() -> Any:
    import keras

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
    return model, (np.zeros((8, 16), np.float32),)


def keras_alone() -> Any:
    import keras

    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
