"""A plan changes speed, never results: compare one executed step against eager PyTorch.

The eager step is the plain loop a PyTorch user writes (forward, `loss.backward()`,
`optimizer.step()`) on a copy of the model holding the same initial values. The check
compares the loss, every parameter gradient, every updated parameter and every updated
buffer, and reports the largest absolute and relative differences.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from schedlab.graph import Graph, InputRole, OutputRole
from schedlab.optim import OPTIMIZERS


@dataclass(frozen=True)
class NumericCheck:
    max_abs_loss_diff: float
    max_abs_grad_diff: float
    max_rel_grad_diff: float
    max_abs_param_diff: float
    max_rel_diff: float  # over loss, grads, params and buffers
    worst: str  # which tensor had the largest relative difference

    def ok(self, rel_tol: float = 1e-5) -> bool:
        return self.max_rel_diff <= rel_tol

    def to_json(self) -> dict[str, float | str]:
        return dict(self.__dict__)


def _rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a-b|, max |a-b| / max(max |b|, tiny)): relative to the reference's scale."""
    a = a.detach().double()
    b = b.detach().double()
    if a.shape != b.shape:
        return float("inf"), float("inf")
    if a.numel() == 0:
        return 0.0, 0.0
    d = float((a - b).abs().max())
    scale = max(float(b.abs().max()), 1e-12)
    return d, d / scale


def load_graph_inputs(module: nn.Module, graph: Graph, input_values: dict[int, torch.Tensor]) -> None:
    """Set a module's parameters and buffers to the graph's input values (by name)."""
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for i in graph.inputs:
            if i.role is InputRole.PARAM:
                params[i.name].copy_(input_values[i.value])
            elif i.role is InputRole.BUFFER:
                buffers[i.name].copy_(input_values[i.value])


def eager_step(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], optimizer: torch.optim.Optimizer
) -> torch.Tensor:
    """The plain eager training step that the executor is measured against."""
    optimizer.zero_grad(set_to_none=True)
    loss = module(*inputs)
    loss.backward()
    optimizer.step()
    return loss


def eager_reference(
    module: nn.Module, graph: Graph, input_values: dict[int, torch.Tensor]
) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.optim.Optimizer]:
    """A copy of `module` at the graph's initial values, its inputs and its optimizer."""
    ref = copy.deepcopy(module)
    load_graph_inputs(ref, graph, input_values)
    user = tuple(input_values[i.value] for i in graph.inputs if i.role is InputRole.USER)
    spec = OPTIMIZERS[str(graph.meta["optimizer"])]
    opt = spec.make_torch(list(ref.parameters()), float(graph.meta["lr"]))
    return ref, user, opt


def check_step(
    module: nn.Module,
    graph: Graph,
    input_values: dict[int, torch.Tensor],
    run_one_step: Callable[[dict[int, torch.Tensor]], dict[int, torch.Tensor]],
) -> NumericCheck:
    """Run one executor step and one eager step from the same values and compare them."""
    outputs = run_one_step({v: t.clone() for v, t in input_values.items()})
    ref, user, opt = eager_reference(module, graph, input_values)
    opt.zero_grad(set_to_none=True)
    loss = ref(*user)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
    opt.step()
    params = dict(ref.named_parameters())
    buffers = dict(ref.named_buffers())

    worst, max_rel = "", 0.0
    max_abs_loss = max_abs_grad = max_rel_grad = max_abs_param = 0.0
    for o in graph.outputs:
        got = outputs[o.value]
        if o.role is OutputRole.LOSS:
            want = loss.detach()
        elif o.role is OutputRole.GRAD:
            want = grads[o.name]
        elif o.role is OutputRole.PARAM:
            want = params[o.name].detach()
        elif o.role is OutputRole.BUFFER:
            want = buffers[o.name]
        else:
            continue  # optimizer state: covered through the updated parameters
        d, r = _rel(got, want)
        if o.role is OutputRole.LOSS:
            max_abs_loss = d
        elif o.role is OutputRole.GRAD:
            max_abs_grad, max_rel_grad = max(max_abs_grad, d), max(max_rel_grad, r)
        elif o.role is OutputRole.PARAM:
            max_abs_param = max(max_abs_param, d)
        if r > max_rel or not worst:
            max_rel, worst = max(r, max_rel), f"{o.role.value} {o.name}"
    return NumericCheck(
        max_abs_loss_diff=max_abs_loss,
        max_abs_grad_diff=max_abs_grad,
        max_rel_grad_diff=max_rel_grad,
        max_abs_param_diff=max_abs_param,
        max_rel_diff=max_rel,
        worst=worst,
    )
