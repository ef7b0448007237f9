"""The dev set: stock torch.nn models to judge simulator changes on, apart from both the
calibration graphs and the held-out test set."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from schedlab.calibrate import coverage
from schedlab.calibrate.fidelity import PROTOCOL_SETS
from schedlab.cli.fidelity_cmd import MODEL_SETS
from schedlab.errors import SchedlabError
from schedlab.workloads import BUILTIN_WORKLOADS, load_workload
from schedlab.workloads import devset as devset_mod
from schedlab.workloads.devset import DEV, DEV_WORKLOADS, PREFIX
from schedlab.workloads.heldout import HELDOUT_WORKLOADS


def test_the_dev_set_is_apart_from_the_builtins_and_the_held_out_set() -> None:
    names = {spec.removeprefix(PREFIX) for spec in DEV_WORKLOADS}
    assert len(DEV_WORKLOADS) >= 6 and all(spec.startswith(PREFIX) for spec in DEV_WORKLOADS)
    assert not names & set(BUILTIN_WORKLOADS)
    held_out_classes = {type(load_workload(spec, "tiny").module) for spec in HELDOUT_WORKLOADS}
    coverage_classes = {type(coverage.build(name, coverage.SHAPES[0])[0]) for name in coverage.COVERAGE_MODELS}
    for spec in DEV_WORKLOADS:
        cls = type(load_workload(spec, "tiny").module)
        assert cls.__module__ == devset_mod.__name__
        assert cls not in held_out_classes and cls not in coverage_classes, spec


@pytest.mark.parametrize("spec", DEV_WORKLOADS)
def test_each_dev_model_loads_by_name_trains_and_is_stock_layers_only(spec: str) -> None:
    w = load_workload(spec, size="tiny", seed=1)
    assert w.name == spec and w.module.training
    loss = w.module(*w.inputs)
    assert isinstance(loss, Tensor) and loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in w.module.parameters())
    assert not list(w.module.named_parameters(recurse=False))
    foreign = {type(m).__qualname__ for m in w.module.modules()
               if m is not w.module and not type(m).__module__.startswith("torch.nn")}
    assert not foreign, f"{spec} uses layers outside torch.nn: {foreign}"
    again = load_workload(spec, size="tiny", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(w.inputs, again.inputs, strict=True))


def test_the_megabyte_models_are_larger_at_size_default() -> None:
    for name in ("conv-bn", "ln-mlp", "conv1d-instnorm"):
        torch.manual_seed(0)
        _, tiny = DEV[name]("tiny")
        _, default = DEV[name]("default")
        assert default[0].numel() > 100 * tiny[0].numel(), name


def test_unknown_dev_name_is_one_clear_error() -> None:
    with pytest.raises(SchedlabError) as info:
        load_workload(PREFIX + "resnet-9000", "tiny")
    assert "unknown dev workload" in str(info.value) and DEV_WORKLOADS[0] in str(info.value)


def test_the_command_knows_every_set_of_the_protocol() -> None:
    assert {s.label for s in MODEL_SETS} == set(PROTOCOL_SETS)
