"""A plan changes speed, never results: compare one executed step against eager PyTorch.

The eager step is the plain loop a PyTorch user writes (forward, `loss.backward()`,
`optimizer.step()`) on a copy of the model holding the same initial values; `eager_step`
is that loop, the one the check compares against and the benchmark times.

The check compares the loss, every parameter gradient, every updated parameter (see
`output_diffs` for against what) and every updated buffer element by element, with
`torch.testing.assert_close`'s rule: an element
passes when |actual - expected| <= atol + rtol * |expected|, with the tolerances of the
expected tensor's dtype (`TOLERANCES`). A plan may reorder ops and change intra-op thread
counts, which reorders floating-point sums, so results differ by rounding. A relative
figure alone mistakes rounding noise for an error where the true value is zero (the bias
gradient of a convolution followed by batch norm); an absolute figure alone misses errors
in small values. The sum of both is what assert_close uses and what this check uses.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from schedlab.data_parallel import uses_batch_stats
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, InputRole, OutputRole
from schedlab.optim import OPTIMIZERS
from schedlab.rng import EagerSeeded, seeded_random, split_batch_draws


@dataclass(frozen=True)
class Tolerance:
    """An element passes when |actual - expected| <= atol + rtol * |expected|."""

    atol: float
    rtol: float

    def allowed(self, expected: torch.Tensor) -> torch.Tensor:
        return self.atol + self.rtol * expected.abs()


# The one table of tolerances (README, "Numerics guard" has the measurements). Reordering
# ops changes no result bit; changing an op's intra-op thread count splits its sums
# differently. float32 is torch.testing.assert_close's: the worst such difference measured
# on the built-in workloads (cnn default, eager at 2 to 32 threads against the executor's
# 1) is a quarter of it. float64 is float32's scaled by the ratio of machine epsilons
# (1.9e-9), rounded up. float16 and bfloat16 keep float32's rtol of about ten units in the
# last place (10 eps) and its atol: CPU kernels accumulate them in float32.
# Integer and bool tensors (step counters, batch norm's num_batches_tracked) must match exactly.
TOLERANCES: Mapping[torch.dtype, Tolerance] = MappingProxyType(
    {
        torch.float64: Tolerance(atol=2e-14, rtol=3e-15),
        torch.float32: Tolerance(atol=1e-5, rtol=1.3e-6),
        torch.float16: Tolerance(atol=1e-5, rtol=1e-2),
        torch.bfloat16: Tolerance(atol=1e-5, rtol=8e-2),
    }
)
EXACT = Tolerance(atol=0.0, rtol=0.0)


def tolerance_for(dtype: torch.dtype, tolerances: Mapping[torch.dtype, Tolerance] = TOLERANCES) -> Tolerance:
    """The tolerance for tensors of `dtype`; exact for integers and bools."""
    if dtype in tolerances:
        return tolerances[dtype]
    if dtype.is_floating_point or dtype.is_complex:
        raise SchedlabError(
            f"the numerics guard has no tolerance for {dtype}; it knows "
            + ", ".join(str(d) for d in tolerances)
        )
    return EXACT


@dataclass(frozen=True)
class TensorDiff:
    """How far one executor output is from its eager value."""

    name: str  # "grad c.bias", "loss loss", ...
    max_abs_diff: float
    max_rel_diff: float  # max |diff| / max |expected|: the figure reported before the guard
    ratio: float  # max over elements of |diff| / (atol + rtol * |expected|); passes when <= 1
    tolerance: Tolerance

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0


def compare(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    tolerances: Mapping[torch.dtype, Tolerance] = TOLERANCES,
) -> TensorDiff:
    """One output against its eager value, element by element, in float64.

    A different shape or dtype fails outright. Equal non-finite values (inf and inf, NaN
    and NaN) count as equal: the plan did not change them; any other non-finite
    difference fails.
    """
    tol = tolerance_for(expected.dtype, tolerances)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return TensorDiff(name, float("inf"), float("inf"), float("inf"), tol)
    if expected.numel() == 0:
        return TensorDiff(name, 0.0, 0.0, 0.0, tol)
    a = actual.detach().to(torch.float64)
    b = expected.detach().to(torch.float64)
    same = (a == b) | (a.isnan() & b.isnan())
    diff = torch.where(same, 0.0, (a - b).abs().nan_to_num(nan=float("inf")))
    max_abs = float(diff.max())
    scale = float(b.abs().nan_to_num(nan=0.0, posinf=0.0).max())
    allowed = tol.allowed(b).nan_to_num(nan=0.0, posinf=0.0)
    ratio = float(torch.where(diff == 0, 0.0, diff / allowed).max())  # x / 0 = inf for x > 0
    return TensorDiff(name, max_abs, max_abs / max(scale, 1e-12), ratio, tol)


@dataclass(frozen=True)
class NumericCheck:
    """The verdict of one step against eager PyTorch.

    The verdict and the worst tensor (the one whose worst element is furthest beyond, or
    closest to, its allowed difference) come from the per-dtype tolerances. The `max_*`
    figures are kept for the JSON that scripts already read; `max_rel_diff` is max |diff|
    over max |expected| per tensor, which is large, and harmless, for a value that is zero
    in exact arithmetic. `max_abs_param_diff` is measured as `output_diffs` compares
    parameters.
    """

    max_abs_loss_diff: float
    max_abs_grad_diff: float
    max_rel_grad_diff: float
    max_abs_param_diff: float
    max_rel_diff: float  # over loss, grads, params and buffers
    worst_tensor: str
    worst_ratio: float  # the worst tensor's largest |diff| / (atol + rtol * |expected|) over its elements
    worst_abs_diff: float  # the worst tensor's max |diff|
    atol: float  # the worst tensor's tolerances
    rtol: float
    note: str = ""  # what the verdict cannot tell (a split batch's random draws), or ""

    @property
    def numerics_ok(self) -> bool:
        return self.worst_ratio <= 1.0

    @property
    def worst(self) -> str:
        """The worst tensor (the JSON key before the guard; it then meant by relative difference)."""
        return self.worst_tensor

    def ok(self) -> bool:
        return self.numerics_ok

    def describe(self) -> str:
        """One line naming the worst tensor, its difference and its tolerances."""
        return (
            f"worst {self.worst_tensor}: max abs diff {self.worst_abs_diff:.2e}, "
            f"{self.worst_ratio:.2g}x its tolerance (atol {self.atol:g}, rtol {self.rtol:g})"
            + (f"; {self.note}" if self.note else "")
        )

    def to_json(self) -> dict[str, float | str | bool]:
        return {**self.__dict__, "numerics_ok": self.numerics_ok, "worst": self.worst}

    @staticmethod
    def of(diffs: list[tuple[OutputRole, TensorDiff]]) -> NumericCheck:
        def most(role: OutputRole, key: Callable[[TensorDiff], float]) -> float:
            return max((key(d) for r, d in diffs if r is role), default=0.0)

        worst = max((d for _, d in diffs), key=lambda d: d.ratio)  # the first of equals
        return NumericCheck(
            max_abs_loss_diff=most(OutputRole.LOSS, lambda d: d.max_abs_diff),
            max_abs_grad_diff=most(OutputRole.GRAD, lambda d: d.max_abs_diff),
            max_rel_grad_diff=most(OutputRole.GRAD, lambda d: d.max_rel_diff),
            max_abs_param_diff=most(OutputRole.PARAM, lambda d: d.max_abs_diff),
            max_rel_diff=max(d.max_rel_diff for _, d in diffs),
            worst_tensor=worst.name,
            worst_ratio=worst.ratio,
            worst_abs_diff=worst.max_abs_diff,
            atol=worst.tolerance.atol,
            rtol=worst.tolerance.rtol,
        )


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
    """The plain eager training step: the one the check compares against and the benchmark times.

    Each parameter's gradient stays in `.grad` afterwards (`optimizer.step()` reads
    gradients and never writes them), which is where the check reads them from.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = module(*inputs)
    loss.backward()
    optimizer.step()
    return loss


def eager_split_step(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], optimizer: torch.optim.Optimizer, parts: int
) -> torch.Tensor:
    """`eager_step` as a plan that splits the batch into `parts` (replicas x micro-batches)
    and keeps each part's batch statistics runs it: each part's forward and backward on its
    slice of the inputs along dim 0 (contiguous, in order), the gradients the mean of the
    parts' (each loss scaled by 1 / parts), one optimizer step, and the loss the mean of the
    parts'. The running statistics are the first part's, updated from the step's starting
    values: replica 0's in a data-parallel plan, micro-batch 0's in a pipeline (every
    micro-batch reads the shared buffers and micro-batch 0 keeps the buffers' names,
    `schedlab.pipeline_expand`)."""
    slices = [x.tensor_split(parts) if x.dim() else (x,) * parts for x in inputs]
    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    first: dict[str, torch.Tensor] = {}
    for p in range(parts):
        loss = module(*(s[p] for s in slices))
        (loss / parts).backward()
        losses.append(loss.detach())
        if p == 0:
            first = {n: b.detach().clone() for n, b in module.named_buffers()}
    with torch.no_grad():
        for n, b in module.named_buffers():
            b.copy_(first[n])
    optimizer.step()
    return torch.stack(losses).mean()


def batch_parts(graph: Graph, run_graph: Graph | None) -> int:
    """How many parts of the batch keep their own batch statistics when `run_graph` runs the
    step `graph`: its replicas x micro-batches where `graph` computes batch statistics (a
    plan may split them only with `split_batch_stats`), else 1 (the full batch's step)."""
    if run_graph is None or not uses_batch_stats(graph):
        return 1
    return int(run_graph.meta.get("replicas", 1)) * int(run_graph.meta.get("micro_batches", 1))


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


def _updated_by_eager_optimizer(
    ref: nn.Module, opt: torch.optim.Optimizer, grads: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Each parameter of `ref` after `opt`'s step with `grads` (both are used up)."""
    for n, p in ref.named_parameters():
        g = grads.get(n)
        p.grad = None if g is None else g.detach().clone()
    opt.step()
    return {n: p.detach() for n, p in ref.named_parameters()}


def output_diffs(
    module: nn.Module,
    graph: Graph,
    input_values: dict[int, torch.Tensor],
    outputs: dict[int, torch.Tensor],
    tolerances: Mapping[torch.dtype, Tolerance] = TOLERANCES,
    steps: int = 1,
    parts: int = 1,
) -> list[tuple[OutputRole, TensorDiff]]:
    """Every checked output of one executor step against eager PyTorch from the same values.

    `parts` > 1: the step splits the batch into that many parts, each with its own batch
    statistics (`batch_parts`), and eager PyTorch runs it so (`eager_split_step`).

    `steps` > 1: `outputs` are the last of that many steps run back to back from
    `input_values` (an unrolled graph, `schedlab.steps`), compared with eager PyTorch's
    last of as many steps.

    The loss, the gradients and the buffers are compared with one eager step
    (`eager_step`). The updated parameters are compared with eager PyTorch's optimizer
    applied to the executor's own gradients: Adam divides a gradient by its own
    magnitude, so where the true gradient is zero (that conv bias again) rounding noise of
    1e-8 becomes an update of +-lr whose sign is the noise's. The gradient comparison
    bounds that noise; the update comparison asks whether the plan ran the optimizer right
    on the gradients it computed. Together they still cover the whole step.
    """
    if steps < 1:
        raise SchedlabError(f"steps must be >= 1, got {steps}")
    ref, user, opt = eager_reference(module, graph, input_values)

    def step() -> torch.Tensor:
        return eager_step(ref, user, opt) if parts == 1 else eager_split_step(ref, user, opt, parts)

    with seeded_random(), EagerSeeded():  # random ops draw what the executor's check step drew
        for _ in range(steps - 1):
            step()
        before_last = copy.deepcopy((ref, opt))  # one deepcopy: the optimizer keeps pointing at the copy's params
        loss = step().detach()
    grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    buffers = dict(ref.named_buffers())
    out: list[tuple[OutputRole, TensorDiff]] = []
    own_grads = dict(grads)  # the executor's gradients where they match eager's shape and dtype
    for o in graph.outputs:
        if o.role is OutputRole.LOSS:
            want = loss
        elif o.role is OutputRole.GRAD:
            if o.name not in grads:
                raise SchedlabError(f"eager PyTorch computed no gradient for {o.name}, the graph did")
            want = grads[o.name]
            got = outputs[o.value]
            if got.shape == want.shape and got.dtype == want.dtype:
                own_grads[o.name] = got
        elif o.role is OutputRole.BUFFER:
            want = buffers[o.name]
        else:
            continue  # updated parameters: below; optimizer state: covered through them
        out.append((o.role, compare(f"{o.role.value} {o.name}", outputs[o.value], want, tolerances)))
    updated = _updated_by_eager_optimizer(*before_last, own_grads)
    for o in graph.outputs:
        if o.role is OutputRole.PARAM:
            out.append((o.role, compare(f"{o.role.value} {o.name}", outputs[o.value], updated[o.name], tolerances)))
    return out


def check_step(
    module: nn.Module,
    graph: Graph,
    input_values: dict[int, torch.Tensor],
    run_one_step: Callable[[dict[int, torch.Tensor]], dict[int, torch.Tensor]],
    tolerances: Mapping[torch.dtype, Tolerance] = TOLERANCES,
    steps: int = 1,
    run_graph: Graph | None = None,
) -> NumericCheck:
    """Run one executor step (a sequence of `steps` steps back to back, for an unrolled
    graph) and as many eager steps from the same values, and compare the last ones. Random
    ops draw the same numbers on both sides (`schedlab.rng`; a rank's run does that itself),
    except random ops other than dropout over a split batch: `run_graph` (what the plan
    ran, with its replicas or micro-batches) given, a failed verdict then says so. A plan
    whose parts of the batch keep their own batch statistics is compared with eager PyTorch
    run on the same parts (`batch_parts`, `eager_split_step`)."""
    with seeded_random():
        outputs = run_one_step({v: t.clone() for v, t in input_values.items()})
    parts = batch_parts(graph, run_graph)
    check = NumericCheck.of(output_diffs(module, graph, input_values, outputs, tolerances, steps, parts))
    draws = split_batch_draws(run_graph) if run_graph is not None and not check.ok() else []
    if draws:
        return dataclasses.replace(check, note=(
            f"the model draws random numbers ({', '.join(draws)}) and this plan splits the batch: no eager step "
            "draws the same numbers over the whole batch, so the difference may be the draws' (the check compares "
            "a split batch's dropout only); check the plan on the model without them"))
    return check
