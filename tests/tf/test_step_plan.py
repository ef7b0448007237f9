"""What of a plan TensorFlow honours, and the worker's request and result files."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import TensorMeta, op_class_of
from schedlab.plan import Plan
from schedlab.tf.opcost import tf_op_class, tf_op_work
from schedlab.tf.plan_map import recommended_threads, tf_threads_for_plan
from schedlab.tf.runtime import TFThreads


def test_slots_and_threads_become_inter_and_intra_op() -> None:
    t = tf_threads_for_plan(Plan(slots=2, threads=1))
    assert (t.intra_op, t.inter_op) == (1, 2)
    assert tf_threads_for_plan(Plan()).intra_op == 0  # all cores: TF's default pool


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (Plan(op_threads={3: 2}), "per-op thread counts"),
        (Plan(class_threads={"mm": 2}), "per-op thread counts"),
        (Plan(order="critical-path", slots=2), "needs slots 1"),
        (Plan(replicas=2), "replicas"),
    ],
)
def test_what_tf_cannot_honour_is_refused_by_name(plan: Plan, says: str) -> None:
    with pytest.raises(SchedlabError, match=says):
        tf_threads_for_plan(plan)


def test_recommended_threading_is_physical_cores_and_sockets() -> None:
    assert recommended_threads(physical_cores=16, sockets=2) == TFThreads(16, 2)


def test_thread_counts_must_not_be_negative() -> None:
    with pytest.raises(SchedlabError, match=">= 0"):
        TFThreads(-1, 1)


def test_tf_kernels_map_to_aten_classes() -> None:
    assert tf_op_class("MatMul") == "mm"
    assert tf_op_class("_MklNativeFusedMatMul") == "addmm"
    assert tf_op_class("_MklNativeConv2DBackpropFilter") == "convolution_backward"
    assert tf_op_class("NoSuchKernel") == "tf.NoSuchKernel"
    assert op_class_of("tf.Conv2D") == "convolution"
    assert op_class_of("aten.mm.default") == "mm"


def test_convolution_flops_count_multiply_adds_per_output() -> None:
    x = TensorMeta((2, 8, 8, 3), "float32", 2 * 8 * 8 * 3 * 4)
    w = TensorMeta((3, 3, 3, 16), "float32", 3 * 3 * 3 * 16 * 4)
    y = TensorMeta((2, 8, 8, 16), "float32", 2 * 8 * 8 * 16 * 4)
    flops, nbytes = tf_op_work("Conv2D", [x, w], [y], {})
    assert flops == 2.0 * (2 * 8 * 8 * 16) * (3 * 3 * 3)
    assert nbytes == x.nbytes + w.nbytes + y.nbytes
    assert tf_op_work("Reshape", [x], [x], {}) == (0.0, 0)  # a view moves nothing


def test_request_round_trips_and_a_corrupt_one_is_named(tmp_path: Path) -> None:
    from schedlab.exec.tf_job import TFRequest, read_request, write_request

    req = TFRequest("mlp", "tiny", TFThreads(1, 2), steps=3, warmup=1)
    write_request(tmp_path, req)
    assert read_request(tmp_path) == req
    (tmp_path / "tf_request.json").write_text('{"workload": "mlp"}')
    with pytest.raises(SchedlabError, match="corrupt TensorFlow request"):
        read_request(tmp_path)
