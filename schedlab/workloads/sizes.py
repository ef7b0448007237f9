"""Workload sizes, and the one every model has without a config of its own: ``gpu``.

``tiny`` (tests), ``default`` (a CPU step of tens to hundreds of milliseconds) and, for nmt,
``paper`` are written out per model. ``gpu`` is a model's ``default`` layers at
`GPU_BATCH_SCALE` times its batch: on one GPU the default steps are bound by the host
issuing their ops (measured on an H200, `schedlab fidelity --cuda`), and a 16x batch makes
the device's kernels the larger part, which is where the simulator's GPU kernel costs,
not its host issue costs, decide a prediction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

SIZES: tuple[str, ...] = ("tiny", "default", "paper", "gpu")
PAPER_SIZE = "paper"  # the placement paper's model size: nmt only
GPU_SIZE = "gpu"
GPU_BATCH_SCALE = 16

C = TypeVar("C")


def config_at(configs: Mapping[str, C], size: str) -> C:
    """A model's config at `size`: its own entry, or for ``gpu`` its default at 16x the batch."""
    if size == GPU_SIZE and GPU_SIZE not in configs:
        base: Any = configs["default"]
        return dataclasses.replace(base, batch=base.batch * GPU_BATCH_SCALE)  # type: ignore[no-any-return]
    return configs[size]
