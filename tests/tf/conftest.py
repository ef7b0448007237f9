"""The test process's TensorFlow threading, fixed before any TF test builds a graph."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _tensorflow_in_process() -> None:
    from schedlab.tf.runtime import tensorflow_available

    if tensorflow_available():
        from schedlab.tf.runtime import import_tensorflow
        from tests.tf import IN_PROCESS

        import_tensorflow(IN_PROCESS)
