"""Small hand-made Profiles, Ops and Graphs for the calibration tests."""

from __future__ import annotations

from typing import Any

from schedlab.calibrate.corun import CorunFigures
from schedlab.calibrate.dispatch import DispatchFigures
from schedlab.calibrate.fit import ClassFit
from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta

# mm: 10 us per MFLOP on one thread, fully parallel for large work.
MM_MODEL = WorkThreadsModel(a_us=2.0, us_per_gflop=10_000.0, us_per_mb=0.0, us_per_mb_dram=0.0, cache_mb=1.0, p_max=1.0, h_us=1e-6, c_us=0.0)
# fallback: memory-bound, 100 us per MB, no parallelism.
FALLBACK_MODEL = WorkThreadsModel(
    a_us=1.0, us_per_gflop=0.0, us_per_mb=100.0, us_per_mb_dram=0.0, cache_mb=1.0, p_max=0.0, h_us=1.0, c_us=0.0
)
DISPATCH = DispatchFigures(
    op_us=3.0, view_us=2.0, corun_op_us=8.0, corun_event_floor_us=1.6, call_floor_us=1.5, view_call_floor_us=1.0
)


def fit(model: WorkThreadsModel, name: str = "work_threads", heldout: float | None = 10.0) -> ClassFit:
    return ClassFit(
        model_name=name,
        model=model,
        heldout_mape=heldout,
        heldout_wape=heldout,
        train_mape=5.0,
        n_points=20,
        n_signatures=10,
        n_heldout=2,
    )


def make_profile(machine: dict[str, Any] | None = None, signatures: dict[str, dict[int, float]] | None = None) -> Profile:
    return Profile(
        machine=machine or {"cpu_model": "Test CPU", "cores": 2, "torch": "2.13.0"},
        created_unix_s=1.7e9,
        quick=True,
        dispatch=DISPATCH,
        classes={"mm": fit(MM_MODEL)},
        fallback=fit(FALLBACK_MODEL, heldout=None),
        signatures=signatures or {},
        corun=CorunFigures(mem_slowdown=1.5, compute_slowdown=1.1, gil_slowdown=2.0, measured=True),
        meta={"note": "test"},
    )


def make_op(
    target: str = "aten.mm.default",
    flops: float = 2e6,
    nbytes: int = 12_000,
    is_view: bool = False,
    op_id: int = 0,
    args: tuple[Any, ...] = ({"v": 0}, {"v": 1}),
) -> Op:
    return Op(
        id=op_id,
        name=f"op{op_id}",
        target=target,
        kind=OpKind.F,
        args=args,
        kwargs={},
        inputs=tuple(a["v"] for a in args if isinstance(a, dict) and "v" in a),
        outputs=(10 + op_id,),
        flops=flops,
        bytes_moved=0 if is_view else nbytes,
        is_view=is_view,
    )


def make_graph() -> Graph:
    """x[4,8] @ w[8,8] -> y; t(y) -> yt (view); relu(y) -> r."""
    meta = TensorMeta((4, 8), "float32", 128)
    w_meta = TensorMeta((8, 8), "float32", 256)
    mm = Op(0, "mm", "aten.mm.default", OpKind.F, ({"v": 0}, {"v": 1}), {}, (0, 1), (2,), 512.0, 512)
    t = Op(1, "t", "aten.t.default", OpKind.F, ({"v": 2},), {}, (2,), (3,), 0.0, 0, is_view=True)
    relu = Op(2, "relu", "aten.relu.default", OpKind.F, ({"v": 2},), {}, (2,), (4,), 32.0, 256)
    return Graph(
        name="toy",
        inputs=(GraphInput(0, "x", InputRole.USER), GraphInput(1, "w", InputRole.PARAM)),
        outputs=(GraphOutput(4, "loss", OutputRole.LOSS),),
        ops=(mm, t, relu),
        values=(meta, w_meta, meta, TensorMeta((8, 4), "float32", 128, alias_of=2), meta),
    )
