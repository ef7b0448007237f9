"""Coverage models: calibration-only models of stock nn layers, and calibration's graph list."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from schedlab.calibrate.coverage import COLD_PROBE, COVERAGE_MODELS, SHAPES, build
from schedlab.calibrate.run import _capture_jobs, full_config, quick_config

CALIBRATE_DIR = Path(__file__).resolve().parents[2] / "calibrate"


@pytest.mark.parametrize("name", COVERAGE_MODELS)
def test_each_coverage_model_trains_to_a_scalar_loss(name: str) -> None:
    torch.manual_seed(0)
    module, inputs = build(name, SHAPES[0])
    loss = module(*inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in module.parameters() if p.requires_grad)


def test_unknown_coverage_model_is_named() -> None:
    with pytest.raises(KeyError, match="unknown coverage model 'resnet'"):
        build("resnet", SHAPES[0])


def test_quick_measures_one_shape_and_full_all_of_them() -> None:
    quick = [s for s, _, _ in _capture_jobs(quick_config()) if s.startswith("coverage:")]
    full = [s for s, _, _ in _capture_jobs(full_config()) if s.startswith("coverage:")]
    # and the cold probe, as the presets measure cold costs
    assert quick == [f"coverage:{m}/small/sgd" for m in (*COVERAGE_MODELS, COLD_PROBE)]
    assert len(full) == (len(COVERAGE_MODELS) + 1) * len(SHAPES)


def test_calibration_never_names_the_held_out_models() -> None:
    """The held-out models are the simulator's test set: no graph calibration replays is
    one of them, and no calibration module but the fidelity protocols refers to them."""
    for cfg in (quick_config(), full_config()):
        for source, _, _ in _capture_jobs(cfg):
            assert not source.startswith(("heldout", "dev:")), source  # nor the dev models
    names = ("workloads.heldout", "import heldout", "\"heldout:", "HELDOUT", "held_out_fidelity", "workloads.devset",
             "DEV_WORKLOADS", "\"dev:")
    for path in CALIBRATE_DIR.glob("*.py"):
        if path.name in ("fidelity.py", "cuda_fidelity.py"):  # the protocols that judge on them
            continue
        text = path.read_text()
        assert not [n for n in names if n in text], path.name


@pytest.mark.slow
def test_coverage_graphs_hold_the_classes_users_models_lower_to() -> None:
    from schedlab.capture import capture
    from schedlab.workloads import Workload

    classes: set[str] = set()
    for name in COVERAGE_MODELS:
        torch.manual_seed(0)
        module, inputs = build(name, SHAPES[0])
        graph = capture(Workload(f"coverage:{name}", "small", module, inputs), "sgd").graph
        classes |= {op.op_class for op in graph.ops}
    assert {
        "convolution",
        "convolution_backward",
        "native_group_norm",
        "native_group_norm_backward",
        "_native_batch_norm_legit_functional",
        "native_batch_norm_backward",
        "native_layer_norm",
        "native_layer_norm_backward",
        "embedding",
        "embedding_dense_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "bmm",
        "_softmax",
        "sigmoid_backward",
        "tanh_backward",
        "max_pool2d_with_indices_backward",
        "avg_pool3d_backward",
        "var",
        "amax",
        "clone",
        "unbind",
        "split",
    } <= classes
