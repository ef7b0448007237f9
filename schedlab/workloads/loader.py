"""Resolve a workload spec (a built-in name, ``heldout:NAME``, ``dev:NAME`` or ``package.module:function``)
to a Workload.

Every way a spec can go wrong raises `SchedlabError` with one message saying what to fix.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from schedlab.errors import SchedlabError
from schedlab.workloads import cnn, devset, heldout, mlp, nmt, transformer
from schedlab.workloads.sizes import PAPER_SIZE, SIZES

Builder = Callable[[str], tuple[nn.Module, tuple[Tensor, ...]]]

_BUILDERS: dict[str, Builder] = {
    "mlp": mlp.build,
    "cnn": cnn.build,
    "transformer": transformer.build,
    "nmt": nmt.build,
}
BUILTIN_WORKLOADS: tuple[str, ...] = tuple(_BUILDERS)


@dataclass(frozen=True, eq=False)  # eq=False: tensors do not compare to a bool
class Workload:
    """A model in training mode whose ``module(*inputs)`` is a scalar loss tensor."""

    name: str  # "transformer" or "mypkg.models:make"
    size: str  # as requested; user factories ignore it
    module: nn.Module
    inputs: tuple[Tensor, ...]


def short_name(spec: str) -> str:
    """A held-out (``heldout:NAME``) or dev (``dev:NAME``) workload's NAME, for tables and
    figures; any other spec as it is."""
    for prefix in (heldout.PREFIX, devset.PREFIX):
        if spec.startswith(prefix):
            return spec.removeprefix(prefix)
    return spec


def load_workload(spec: str, size: str = "default", seed: int = 0) -> Workload:
    """Build the workload `spec` at `size` with parameters and inputs seeded by `seed`."""
    if size not in SIZES:
        raise SchedlabError(f"unknown workload size {size!r}; choose one of: {', '.join(SIZES)}")
    if size == PAPER_SIZE and spec != "nmt":
        raise SchedlabError(f"size {PAPER_SIZE!r} (the placement paper's model size) exists for nmt only; "
                            f"{spec} has sizes tiny, default and gpu")
    if heldout.is_heldout(spec):  # reserved prefixes, checked before user factories
        torch.manual_seed(seed)
        module, inputs = heldout.build(spec, size)
    elif devset.is_dev(spec):
        torch.manual_seed(seed)
        module, inputs = devset.build(spec, size)
    elif ":" in spec:
        factory = resolve_factory(spec)
        torch.manual_seed(seed)
        module, inputs = _call_factory(spec, factory)
    elif spec in _BUILDERS:
        torch.manual_seed(seed)
        module, inputs = _BUILDERS[spec](size)
    else:
        raise SchedlabError(
            f"unknown workload {spec!r}; built-in workloads are {', '.join(BUILTIN_WORKLOADS)}, "
            f"held-out ones {', '.join(heldout.HELDOUT_WORKLOADS)}, dev ones {', '.join(devset.DEV_WORKLOADS)}, or give your own model factory as 'package.module:function'"
        )
    module.train()
    _check_loss(spec, module, inputs)
    return Workload(name=spec, size=size, module=module, inputs=inputs)


def resolve_factory(spec: str) -> Callable[[], Any]:
    """Import ``package.module`` and return its attribute ``function`` (dotted names allowed)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SchedlabError(f"bad workload spec {spec!r}; expected 'package.module:function'")
    # User models in the current folder are importable, but never shadow an installed
    # package (a `torch.py` or `optuna.py` beside the user must not break schedlab).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        mod = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure is the user's to fix
        raise SchedlabError(f"cannot import module {module_name!r} for workload {spec!r}: {_describe(e)}") from None
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SchedlabError(f"module {module_name!r} has no function {attr!r} (workload {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SchedlabError(
            f"workload {spec!r} is not callable (it is a {type(obj).__name__}); "
            "it must be a function returning (module, inputs)"
        )
    factory: Callable[[], Any] = obj
    return factory


def _call_factory(spec: str, factory: Callable[[], Any]) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Call a user factory and check it returned ``(nn.Module, tuple of tensors)``."""
    try:
        result = factory()
    except Exception as e:  # the user's factory failing is the user's to fix
        raise SchedlabError(f"workload factory {spec!r} raised {_describe(e)}") from None
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = (
            f"a {type(result).__name__} of length {len(result)}"
            if isinstance(result, (tuple, list))
            else f"a {type(result).__name__}"
        )
        raise SchedlabError(f"workload factory {spec!r} must return a 2-tuple (module, inputs), got {got}")
    module, inputs = result
    if not isinstance(module, nn.Module):
        raise SchedlabError(
            f"workload factory {spec!r} must return (module, inputs) with module a "
            f"torch.nn.Module, got {type(module).__name__}"
        )
    if not isinstance(inputs, (tuple, list)):
        raise SchedlabError(
            f"workload factory {spec!r} must return (module, inputs) with inputs a tuple or "
            f"list of tensors, got {type(inputs).__name__}"
        )
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise SchedlabError(
                f"workload factory {spec!r} must return inputs as a tuple or list of tensors, "
                f"but inputs[{i}] is a {type(x).__name__}"
            )
    return module, tuple(inputs)


def _check_loss(spec: str, module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
    """Run the module once; its output must be a scalar loss that requires grad.

    Buffers (e.g. batch-norm running stats) are restored afterwards, and no backward runs,
    so the returned workload is exactly as built.
    """
    if not any(p.requires_grad for p in module.parameters()):
        raise SchedlabError(f"the module of workload {spec!r} has no trainable parameters")
    saved = {name: b.detach().clone() for name, b in module.named_buffers()}
    try:
        out = module(*inputs)
    except Exception as e:  # the user's model failing is the user's to fix
        raise SchedlabError(f"running the module of workload {spec!r} on its inputs raised {_describe(e)}") from None
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                if name in saved:
                    b.copy_(saved[name])
    if not isinstance(out, Tensor):
        raise SchedlabError(
            f"the module of workload {spec!r} must return a scalar loss tensor, got {type(out).__name__}"
        )
    if out.dim() != 0:
        raise SchedlabError(
            f"the module of workload {spec!r} must return a scalar loss tensor, "
            f"got a tensor of shape {tuple(out.shape)}"
        )
    if not out.requires_grad:
        raise SchedlabError(
            f"the loss of workload {spec!r} does not require grad; "
            "it must be computed from the module's trainable parameters"
        )
    module.zero_grad(set_to_none=True)


def _describe(e: BaseException) -> str:
    """``TypeName: first line of the message``: keeps our error to one line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
