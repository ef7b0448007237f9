"""The held-out models: stock torch.nn layers only, loadable by name, never seen by calibration."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from schedlab.errors import SchedlabError
from schedlab.workloads import BUILTIN_WORKLOADS, load_workload
from schedlab.workloads import heldout as heldout_mod
from schedlab.workloads.heldout import HELDOUT, HELDOUT_WORKLOADS, PREFIX

# The kinds the held-out set must cover (issue 9): the layer class each model is built around.
REQUIRED_LAYERS = (nn.TransformerEncoder, nn.GRU, nn.Conv1d, nn.BatchNorm1d)


def test_registry_is_separate_from_the_builtins() -> None:
    assert len(HELDOUT_WORKLOADS) >= 6
    assert all(spec.startswith(PREFIX) for spec in HELDOUT_WORKLOADS)
    assert not set(HELDOUT_WORKLOADS) & set(BUILTIN_WORKLOADS)
    assert not {spec.removeprefix(PREFIX) for spec in HELDOUT_WORKLOADS} & set(BUILTIN_WORKLOADS)


@pytest.mark.parametrize("spec", HELDOUT_WORKLOADS)
def test_tiny_loads_by_name_and_trains(spec: str) -> None:
    w = load_workload(spec, size="tiny", seed=1)
    assert (w.name, w.size) == (spec, "tiny") and w.module.training
    loss = w.module(*w.inputs)
    assert isinstance(loss, Tensor) and loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in w.module.parameters())
    again = load_workload(spec, size="tiny", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(w.inputs, again.inputs, strict=True))


@pytest.mark.parametrize("spec", HELDOUT_WORKLOADS)
def test_built_only_from_torch_nn_layers(spec: str) -> None:
    module = load_workload(spec, size="tiny").module
    top = type(module)
    assert top.__module__ == heldout_mod.__name__  # the one container written here
    # It only composes: every parameter and buffer belongs to a stock torch.nn layer.
    assert not list(module.named_parameters(recurse=False))
    assert not list(module.named_buffers(recurse=False))
    foreign = {type(m).__qualname__ for m in module.modules() if m is not module and not type(m).__module__.startswith("torch.nn")}
    assert not foreign, f"{spec} uses layers outside torch.nn: {foreign}"
    assert sum(1 for m in module.modules() if m is not module) >= 3


def test_the_set_covers_the_required_kinds() -> None:
    layers = {type(m) for spec in HELDOUT_WORKLOADS for m in load_workload(spec, "tiny").module.modules()}
    for kind in REQUIRED_LAYERS:
        assert kind in layers, kind.__name__
    recurrent = [s for s in HELDOUT_WORKLOADS if any(isinstance(m, nn.GRU) for m in load_workload(s, "tiny").module.modules())]
    gru = next(m for m in load_workload(recurrent[0], "tiny").module.modules() if isinstance(m, nn.GRU))
    assert gru.num_layers == 2
    # one model per top-level class: the set has at least six different models
    assert len({type(load_workload(s, "tiny").module) for s in HELDOUT_WORKLOADS}) == len(HELDOUT_WORKLOADS)


def test_unknown_held_out_name_is_one_clear_error() -> None:
    with pytest.raises(SchedlabError) as info:
        load_workload(PREFIX + "resnet-9000", "tiny")
    assert "unknown held-out workload" in str(info.value) and HELDOUT_WORKLOADS[0] in str(info.value)
    with pytest.raises(SchedlabError) as info:
        load_workload("gru-tagger", "tiny")  # without the prefix it is not a built-in
    assert PREFIX in str(info.value)


def test_default_sizes_are_larger_than_tiny() -> None:
    # Building a default model is cheap (no step runs); its parameter count must grow.
    for name, factory in HELDOUT.items():
        torch.manual_seed(0)
        tiny, _ = factory("tiny")
        default, _ = factory("default")
        n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        assert n(default) > 10 * n(tiny), name


# ---- calibration never sees a held-out model -------------------------------------------------


@pytest.fixture
def held_out_forbidden(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Building any held-out model fails the test; workloads loaded are recorded, not built."""
    loaded: list[str] = []

    def forbidden(spec: str, size: str) -> Any:
        raise AssertionError(f"calibration built the held-out model {spec}")

    def record(spec: str, size: str = "default", seed: int = 0) -> str:
        loaded.append(spec)
        return spec

    monkeypatch.setattr(heldout_mod, "build", forbidden)
    monkeypatch.setattr("schedlab.workloads.load_workload", record)
    monkeypatch.setattr("schedlab.capture.capture", lambda workload, optimizer: None)
    return loaded


def test_calibration_workloads_and_sweep_exclude_held_out(held_out_forbidden: list[str]) -> None:
    from schedlab.calibrate import run as cal_run
    from schedlab.calibrate.sweep import sweep_specs

    for cfg in (cal_run.quick_config(), cal_run.full_config(), cal_run.CalibrationConfig(quick=True)):
        assert set(cfg.workloads) <= set(BUILTIN_WORKLOADS)
        assert not set(cfg.workloads) & set(HELDOUT_WORKLOADS)
        sources = [source for source, _, _ in cal_run._capture_jobs(cfg)]
        assert all(src.split("/")[0] in BUILTIN_WORKLOADS or src.startswith("coverage:") for src in sources)
        assert not any(PREFIX in src for src in sources)
        failures: list[str] = []
        captured = cal_run._capture_all(cfg, cal_run._Progress(False), failures)  # builds every graph
        assert not failures and len(captured) == len(sources)
        specs = sweep_specs(cfg.sweep)  # synthetic shapes per op class, no model involved
        assert specs and all(s.target.startswith("aten.") for s in specs)
    assert held_out_forbidden and set(held_out_forbidden) <= set(BUILTIN_WORKLOADS)


def test_calibration_coverage_models_are_not_the_held_out_models() -> None:
    """Calibration's own stock-layer models (calibrate/coverage.py) are other models."""
    from schedlab.calibrate import coverage

    held_out_classes = {type(load_workload(spec, "tiny").module) for spec in HELDOUT_WORKLOADS}
    for name in coverage.COVERAGE_MODELS:
        module, _ = coverage.build(name, coverage.SHAPES[0])
        assert type(module) not in held_out_classes and type(module).__module__ != heldout_mod.__name__
