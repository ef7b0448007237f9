"""Start TensorFlow's runtime once per process, with the settings it fixes at start-up.

TensorFlow sizes its intra-op pool (per CPU device) and its inter-op pool when the first
session starts, and splits one host into several logical CPU devices with separate pools
only when `TF_OVERRIDE_GLOBAL_THREADPOOL=1` is set before import (DESIGN.md, facts). So a
process runs one threading setting: the executor starts a fresh one per setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from schedlab.errors import SchedlabError

INSTALL_HINT = "install it with: pip install 'schedlab[tf]' (make venv does)"


@dataclass(frozen=True)
class TFThreads:
    """TensorFlow's threading for one process: 0 means TensorFlow's own default."""

    intra_op: int  # threads per op kernel (Eigen/oneDNN pool of each CPU device)
    inter_op: int  # ops run side by side (the executor's pool)
    cpu_devices: int = 1  # logical CPU devices, /device:CPU:0 .. N-1

    def __post_init__(self) -> None:
        if self.intra_op < 0 or self.inter_op < 0:
            raise SchedlabError(f"TensorFlow thread counts must be >= 0 (0: TF's default), got intra-op "
                                f"{self.intra_op}, inter-op {self.inter_op}")
        if self.cpu_devices < 1:
            raise SchedlabError(f"TensorFlow needs at least one CPU device, got {self.cpu_devices}")

    def describe(self) -> str:
        def n(k: int) -> str:
            return "TF default" if k == 0 else str(k)

        devs = f", {self.cpu_devices} CPU devices" if self.cpu_devices > 1 else ""
        return f"intra-op {n(self.intra_op)}, inter-op {n(self.inter_op)}{devs}"


_started: TFThreads | None = None


def tensorflow_available() -> bool:
    """Whether TensorFlow can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def import_tensorflow(threads: TFThreads | None = None) -> Any:
    """The `tensorflow` module, imported with this process's threading fixed to `threads`
    (None: as already started, else TensorFlow's defaults).

    A second call with other threads raises: TensorFlow cannot change them once started.
    """
    global _started
    threads = threads or _started or TFThreads(0, 0)
    if _started is not None and _started != threads:
        raise SchedlabError(f"TensorFlow already started in this process with {_started.describe()}; "
                            f"{threads.describe()} needs a fresh process")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's start-up banner off the user's terminal
    if threads.cpu_devices > 1:
        os.environ["TF_OVERRIDE_GLOBAL_THREADPOOL"] = "1"
    try:
        import tensorflow as tf
    except ImportError as e:
        raise SchedlabError(f"the TensorFlow backend needs tensorflow ({e}); {INSTALL_HINT}") from None
    _started = threads
    return tf


def session_config(threads: TFThreads) -> Any:
    """The ConfigProto of a Session with `threads` (TF must be imported with the same)."""
    tf = import_tensorflow(threads)
    return tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads.intra_op,
        inter_op_parallelism_threads=threads.inter_op,
        device_count={"CPU": threads.cpu_devices},
        allow_soft_placement=False,  # a plan's placement is honoured or refused, never moved
    )
