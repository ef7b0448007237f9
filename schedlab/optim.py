"""Functional optimizer updates, traced into the Graph's OPT ops.

Each update is written to match `torch.optim`'s single-tensor (for-loop) implementation,
which is what eager PyTorch uses for CPU tensors, so the executor's updated parameters
can be compared against eager ones. Work shared by all parameters (Adam's step count and
bias corrections) is traced once; the per-parameter update is traced per parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def _trace(fn: Callable[..., tuple[torch.Tensor, ...]], *example: torch.Tensor) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*example)


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    default_lr: float

    def shared_state(self) -> dict[str, torch.Tensor]:
        """Optimizer state shared by every parameter (e.g. Adam's step count)."""
        return {}

    def trace_shared(self, lr: float) -> fx.GraphModule:
        """fn(*shared_state) -> (*new_shared_state, *scalars passed to every update)."""
        return _trace(lambda: ())

    def param_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    def trace_update(self, p: torch.Tensor, state: dict[str, torch.Tensor], lr: float) -> fx.GraphModule:
        """fn(param, grad, *state, *scalars) -> (new_param, *new_state)."""
        raise NotImplementedError

    def make_torch(self, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        raise NotImplementedError


class _SGD(OptimizerSpec):
    def trace_update(self, p: torch.Tensor, state: dict[str, torch.Tensor], lr: float) -> fx.GraphModule:
        def update(param: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor]:
            return (torch.add(param, grad, alpha=-lr),)  # param.add_(grad, alpha=-lr)

        return _trace(update, p, torch.empty_like(p))

    def make_torch(self, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, foreach=False)


class _Adam(OptimizerSpec):
    def shared_state(self) -> dict[str, torch.Tensor]:
        # float64, like the Python floats eager Adam computes its bias corrections in.
        return {"step": torch.zeros((), dtype=torch.float64)}

    def trace_shared(self, lr: float) -> fx.GraphModule:
        b1, b2 = ADAM_BETAS

        def shared(step: torch.Tensor) -> tuple[torch.Tensor, ...]:
            step1 = step + 1
            neg_step_size = -lr / (1 - torch.pow(b1, step1))  # -lr / bias_correction1
            bc2_sqrt = torch.sqrt(1 - torch.pow(b2, step1))  # sqrt(bias_correction2)
            return step1, neg_step_size, bc2_sqrt

        return _trace(shared, torch.zeros((), dtype=torch.float64))

    def param_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def trace_update(self, p: torch.Tensor, state: dict[str, torch.Tensor], lr: float) -> fx.GraphModule:
        b1, b2 = ADAM_BETAS

        def update(
            param: torch.Tensor,
            grad: torch.Tensor,
            exp_avg: torch.Tensor,
            exp_avg_sq: torch.Tensor,
            neg_step_size: torch.Tensor,
            bc2_sqrt: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            m = torch.lerp(exp_avg, grad, 1 - b1)
            v = torch.addcmul(exp_avg_sq * b2, grad, grad, value=1 - b2)
            denom = torch.sqrt(v) / bc2_sqrt + ADAM_EPS
            return param + (m / denom) * neg_step_size, m, v

        s64 = torch.zeros((), dtype=torch.float64)
        return _trace(update, p, torch.empty_like(p), state["exp_avg"], state["exp_avg_sq"], s64, s64.clone())

    def make_torch(self, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=False)


OPTIMIZERS: dict[str, OptimizerSpec] = {"sgd": _SGD("sgd", 0.01), "adam": _Adam("adam", 1e-3)}
