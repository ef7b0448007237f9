"""A graph captured `portable` runs on a GPU although captured on the CPU: the held-out
models with attention and LSTM layers lose the CPU-only kernels eager would pick here
(`_scaled_dot_product_flash_attention_for_cpu`, oneDNN's fused LSTM layer) and keep
eager's numbers. Checked on the CPU: every op of the portable graph has kernels on
every device, so running it here exercises the same graph a GPU compiles."""

from __future__ import annotations

import pytest

from schedlab.capture import capture, cpu_only_ops
from schedlab.exec.check import check_step
from schedlab.exec.runner import Executor
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from schedlab.workloads import load_workload


@pytest.mark.parametrize(
    ("model", "cpu_kernel"),
    [
        ("heldout:encoder-classifier", "aten._scaled_dot_product_flash_attention_for_cpu.default"),
        ("heldout:lstm-lm", "aten.mkldnn_rnn_layer.default"),
    ],
)
def test_portable_capture_drops_cpu_only_kernels_and_matches_eager(model: str, cpu_kernel: str) -> None:
    as_eager = capture(load_workload(model, "tiny"), "sgd").graph
    assert cpu_kernel in cpu_only_ops(as_eager)  # the premise: here eager's kernels are CPU-only
    w = load_workload(model, "tiny")
    c = capture(w, "sgd", portable=True)
    assert cpu_only_ops(c.graph) == [] and c.graph.meta["portable"] is True
    ex = Executor(c.graph, resolve(c.graph, Plan(), detect_host()))
    check = check_step(w.module, c.graph, c.input_values, lambda iv: ex.step(iv)[0])
    assert check.numerics_ok, check.describe()


def test_a_model_without_device_specific_kernels_captures_the_same_either_way() -> None:
    """The built-ins (and every model that ran on a GPU before) keep their graphs, so the
    saved GPU runs re-score against the same ops."""
    plain = capture(load_workload("transformer", "tiny"), "sgd").graph
    portable = capture(load_workload("transformer", "tiny"), "sgd", portable=True).graph
    assert [(o.target, o.args) for o in plain.ops] == [(o.target, o.args) for o in portable.ops]
