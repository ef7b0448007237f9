"""Random ops that draw the same numbers in the executor as in eager PyTorch, for the numerics check.

A model with ``nn.Dropout`` (or any op PyTorch tags ``nondeterministic_seeded``: bernoulli,
rand, randn, normal, ...) draws from the global generator in the order its ops run. The
executor runs them in another order, on other threads or in other processes, so its masks
differ from an eager step's and every gradient after them does: the numerics check would
refuse every plan of the model, baselines included.

While `seeded_random()` is active, both sides draw the same numbers, eager under
`EagerSeeded` (a dispatch mode) and the executor through `seeded` (which wraps a random
op's callable; off the check it costs a timed step one flag test per random op):

- a dropout keeps every element: ``native_dropout`` draws the mask of all ones (its output
  the input over 1 - p, as a real draw of that mask gives) and a ``bernoulli`` all ones
  (eager PyTorch's CPU dropout is a bernoulli, a scale and a product; the captured graph's
  a ``native_dropout``). The same draw on every part of a split batch is the same draw on
  the whole, so replicas and micro-batches check too, and the check still covers the scale
  and the backward through the mask;
- any other seeded random op, the k-th of a step counted in the order eager PyTorch
  dispatches them (which is the captured graph's op order), runs with the CPU generator
  seeded with ``base + k``, under one lock, the generator's state restored after: the same
  numbers whatever order, thread or rank runs it.

The k of an op is its place among the graph's seeded random ops by op id: in an expanded or
placed graph the communication ops come after the model's and draw nothing; a steady-state
graph's steps follow each other, as eager's steps do. A graph whose batch is split
(replicas, micro-batches) draws over parts of the batch what eager draws over the whole: for
random ops other than dropout `split_batch_draws` says so, and the check cannot compare them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from schedlab.aten import resolve_overload
from schedlab.errors import SchedlabError
from schedlab.graph import Graph

DEFAULT_BASE_SEED = 20_191_126


class _Seeding:
    def __init__(self) -> None:
        self.base: int | None = None  # None: random ops run as they are
        self.lock = threading.Lock()


_STATE = _Seeding()


DROPOUT = "aten.native_dropout.default"


@functools.cache
def _seeded(target: str) -> bool:
    """Whether the aten op `target` ("aten.native_dropout.default") draws from a generator."""
    try:
        return torch.Tag.nondeterministic_seeded in resolve_overload(target).tags
    except SchedlabError:
        return False


def random_op_index(graph: Graph) -> dict[int, int]:
    """op id -> its k: its place among the graph's seeded random ops, by op id."""
    ids = sorted(op.id for op in graph.ops if _seeded(op.target))
    return {i: k for k, i in enumerate(ids)}


def split_batch_draws(graph: Graph) -> list[str]:
    """The random ops other than dropout that `graph` runs over parts of the batch (replicas
    or micro-batches captured apart): no eager step draws the same numbers over the whole."""
    split = int(graph.meta.get("replicas", 1)) > 1 or int(graph.meta.get("micro_batches", 1)) > 1
    if not split:
        return []
    return sorted({op.target for op in graph.ops if _seeded(op.target) and not _kept(op.target)})


def _kept(target: str) -> bool:
    """Whether random op `target` draws the keep-everything draw under the check."""
    return target == DROPOUT or target.startswith(("aten.bernoulli.", "aten.bernoulli_."))


def _kept_call(target: str, args: Any, kwargs: Any) -> Any:
    if target == DROPOUT:
        return _kept_dropout(*args, **kwargs)
    if target.startswith("aten.bernoulli_."):  # in place: every trial succeeds
        return args[0].fill_(1)
    return torch.ones_like(args[0])


def _kept_dropout(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``native_dropout`` drawing the mask that keeps every element."""
    out, mask = torch.ops.aten.native_dropout.default(input, p, False)  # (a copy of input, all True)
    if train is False or p <= 0.0:
        return out, mask
    if p >= 1.0:
        return torch.zeros_like(input), torch.zeros_like(mask)
    return out * (1.0 / (1.0 - p)), mask


@contextlib.contextmanager
def seeded_random(base: int = DEFAULT_BASE_SEED) -> Iterator[None]:
    """Within the block, `seeded` ops and ops under `EagerSeeded` draw from ``base + k``."""
    before = _STATE.base
    _STATE.base = base
    try:
        yield
    finally:
        _STATE.base = before


def _call_seeded(fn: Callable[..., Any], k: int, args: Any, kwargs: Any) -> Any:
    base = _STATE.base
    if base is None:
        return fn(*args, **kwargs)
    gen = torch.default_generator
    with _STATE.lock:  # co-running workers share the generator
        saved = gen.get_state()
        gen.manual_seed(base + k)
        try:
            return fn(*args, **kwargs)
        finally:
            gen.set_state(saved)


def seeded(fn: Callable[..., Any], k: int, target: str = "") -> Callable[..., Any]:
    """`fn` (the callable of random op `target`) drawing what eager draws while
    `seeded_random` is active: a dropout's kept mask, else from ``base + k``."""
    if _kept(target):
        def keep(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if _STATE.base is None else _kept_call(target, args, kwargs)

        return keep

    def call(*args: Any, **kwargs: Any) -> Any:
        return _call_seeded(fn, k, args, kwargs)

    return call


class EagerSeeded(TorchDispatchMode):
    """Eager PyTorch's seeded random ops, each drawing from ``base + k`` (k counts them in
    dispatch order from the mode's start) while `seeded_random` is active."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return func(*args, **kwargs)
        k, self.k = self.k, self.k + 1
        target = str(func)  # "aten.bernoulli_.float"
        if _STATE.base is not None and _kept(target):
            return _kept_call(target, args, kwargs)
        return _call_seeded(func, k, args, kwargs)
