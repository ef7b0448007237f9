"""Workloads: the built-in models at size tiny, and loading user models by spec."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch._functorch.aot_autograd import aot_export_module

from schedlab import workloads
from schedlab.errors import SchedlabError
from schedlab.workloads import BUILTIN_WORKLOADS, SIZES, Workload, load_workload

USER = "tests.fixtures.user_model"


class LossAsTuple(nn.Module):
    """What the exporter traces: forward returns (loss,)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: Tensor) -> tuple[Tensor]:
        return (self.module(*inputs),)


def test_facade() -> None:
    assert set(workloads.__all__) == {
        "Workload",
        "BUILTIN_WORKLOADS",
        "SIZES",
        "load_workload",
        "short_name",
    }
    assert workloads.short_name("heldout:mixer") == "mixer" and workloads.short_name("dev:gru") == "gru"
    assert workloads.short_name("mlp") == "mlp" and workloads.short_name("pkg.mod:fn") == "pkg.mod:fn"
    assert BUILTIN_WORKLOADS == ("mlp", "cnn", "transformer", "nmt")
    assert SIZES == ("tiny", "default", "paper", "gpu")


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_tiny_gives_scalar_loss(name: str) -> None:
    w = load_workload(name, size="tiny")
    assert isinstance(w, Workload)
    assert (w.name, w.size) == (name, "tiny")
    assert w.module.training
    assert all(isinstance(x, Tensor) for x in w.inputs)
    loss = w.module(*w.inputs)
    assert isinstance(loss, Tensor) and loss.dim() == 0 and loss.requires_grad
    assert torch.isfinite(loss)
    torch.autograd.backward(loss)
    assert all(p.grad is not None for p in w.module.parameters())


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_is_deterministic_under_seed(name: str) -> None:
    a, b = load_workload(name, "tiny", seed=3), load_workload(name, "tiny", seed=3)
    state_a, state_b = a.module.state_dict(), b.module.state_dict()
    assert list(state_a) == list(state_b)
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    assert torch.equal(a.module(*a.inputs), b.module(*b.inputs))
    c = load_workload(name, "tiny", seed=4)
    assert not all(torch.equal(x, y) for x, y in zip(a.inputs, c.inputs))


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_tiny_exports_joint_graph(name: str) -> None:
    w = load_workload(name, "tiny")
    gm, sig = aot_export_module(LossAsTuple(w.module), w.inputs, trace_joint=True, output_loss_index=0)
    assert isinstance(gm, torch.fx.GraphModule)
    assert sig.backward_signature is not None
    assert len(sig.backward_signature.gradients_to_parameters) == len(sig.parameters)
    assert len(gm.graph.nodes) < 500  # tiny stays tiny: tests export it often


def test_cnn_updates_batchnorm_running_stats() -> None:
    w = load_workload("cnn", "tiny")
    bn = next(m for m in w.module.modules() if isinstance(m, nn.BatchNorm2d))
    assert bn.running_mean is not None
    # load_workload ran the model once to check it, but restored the buffers
    assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
    before = bn.running_mean.clone()
    w.module(*w.inputs)
    assert not torch.equal(bn.running_mean, before)


def test_user_model_loads() -> None:
    w = load_workload(f"{USER}:make", size="tiny", seed=1)
    assert w.name == f"{USER}:make"
    assert w.module.training
    assert isinstance(w.inputs, tuple) and len(w.inputs) == 2
    loss = w.module(*w.inputs)
    assert loss.dim() == 0 and loss.requires_grad
    # the loader's check ran no backward
    assert all(p.grad is None for p in w.module.parameters())
    again = load_workload(f"{USER}:make", seed=1)
    assert torch.equal(w.inputs[0], again.inputs[0])


@pytest.mark.parametrize(
    ("spec", "size", "expected"),
    [
        (
            "resnet",
            "tiny",
            ["unknown workload 'resnet'", "mlp, cnn, transformer, nmt", ":function"],
        ),
        ("mlp", "huge", ["unknown workload size 'huge'", "tiny, default"]),
        (f"{USER}:", "tiny", ["expected 'package.module:function'"]),
        (
            "tests.fixtures.nope:make",
            "tiny",
            ["cannot import module 'tests.fixtures.nope'", "No module"],
        ),
        (f"{USER}:missing", "tiny", [f"module '{USER}' has no function 'missing'"]),
        (f"{USER}:NOT_CALLABLE", "tiny", ["is not callable", "int"]),
        (
            f"{USER}:make_raises",
            "tiny",
            ["make_raises", "raised RuntimeError: out of bananas"],
        ),
        (f"{USER}:make_raises_multiline", "tiny", ["raised ValueError: first line"]),
        (
            f"{USER}:make_one_thing",
            "tiny",
            ["must return a 2-tuple (module, inputs)", "TwoLayerMLP"],
        ),
        (f"{USER}:make_not_module", "tiny", ["torch.nn.Module, got str"]),
        (
            f"{USER}:make_bad_inputs",
            "tiny",
            ["tuple or list of tensors", "inputs[1] is a str"],
        ),
        (
            f"{USER}:make_tuple_output",
            "tiny",
            ["must return a scalar loss tensor, got tuple"],
        ),
        (
            f"{USER}:make_nonscalar",
            "tiny",
            ["must return a scalar loss tensor", "shape (4,)"],
        ),
        (f"{USER}:make_detached_loss", "tiny", ["does not require grad"]),
        (f"{USER}:make_frozen", "tiny", ["no trainable parameters"]),
    ],
)
def test_bad_specs_give_one_clear_error(spec: str, size: str, expected: list[str]) -> None:
    with pytest.raises(SchedlabError) as info:
        load_workload(spec, size=size)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message
    assert info.value.__cause__ is None  # no chained traceback to leak


@pytest.mark.parametrize("spec", ["mlp", "nmt", "heldout:mixer", "heldout:conv1d-two-branch"])
def test_the_gpu_size_is_the_default_model_at_16x_its_batch(spec: str) -> None:
    from schedlab.workloads.sizes import GPU_BATCH_SCALE

    default, gpu = load_workload(spec, "default"), load_workload(spec, "gpu")
    assert gpu.inputs[0].shape[0] == GPU_BATCH_SCALE * default.inputs[0].shape[0]
    assert gpu.inputs[0].shape[1:] == default.inputs[0].shape[1:]
    assert [p.shape for p in gpu.module.parameters()] == [p.shape for p in default.module.parameters()]
