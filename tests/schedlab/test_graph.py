from __future__ import annotations

import json

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind, OutputRole
from tests.conftest import captured_workload


def test_capture_tags_every_kind_and_splits_weight_and_input_gradients() -> None:
    _, c = captured_workload("mlp")
    g = c.graph
    kinds = g.kinds()
    assert {OpKind.F, OpKind.B, OpKind.W, OpKind.OPT} <= set(kinds)
    mms = [op for op in g.ops if op.op_class == "mm"]
    # Backward of a linear layer: a weight-gradient mm and (except for the first layer) an input-gradient mm.
    assert any(op.kind is OpKind.W for op in mms)
    assert any(op.kind is OpKind.B for op in mms)
    # Every parameter has a gradient output and an updated-parameter output.
    grads = {o.name for o in g.outputs if o.role is OutputRole.GRAD}
    params = {o.name for o in g.outputs if o.role is OutputRole.PARAM}
    assert grads == params and len(grads) == g.meta["params"]


def test_op_metadata_shapes_flops_and_layers() -> None:
    _, c = captured_workload("transformer")
    g = c.graph
    addmm = next(op for op in g.ops if op.op_class == "addmm" and op.kind is OpKind.F)
    out = g.values[addmm.outputs[0]]
    assert out is not None and out.nbytes == 4 * out.shape[0] * out.shape[1]
    assert addmm.flops > 2 * out.shape[0] * out.shape[1]  # 2*M*N*K for K > 1
    assert addmm.layer is not None
    views = [op for op in g.ops if op.is_view]
    assert views and all(op.bytes_moved == 0 for op in views)
    assert all(g.values[v].alias_of is not None for op in views for v in op.outputs if g.values[v] is not None)


def test_batchnorm_running_stats_are_outputs() -> None:
    _, c = captured_workload("cnn")
    bufs = [o.name for o in c.graph.outputs if o.role is OutputRole.BUFFER]
    assert any(b.endswith("running_mean") for b in bufs) and any(b.endswith("running_var") for b in bufs)


def test_adam_adds_state_and_per_parameter_updates() -> None:
    _, c = captured_workload("mlp", "adam")
    g = c.graph
    states = [o.name for o in g.outputs if o.role is OutputRole.OPT_STATE]
    assert "adam.step" in states and any(s.endswith("exp_avg_sq") for s in states)
    opt_layers = {op.layer for op in g.ops if op.kind is OpKind.OPT and op.layer}
    assert len(opt_layers) >= 2


def test_graph_json_round_trip_keeps_everything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, c = captured_workload("nmt")
    g = c.graph
    path = g.save(tmp_path / "g.json")
    g2 = Graph.load(path)
    assert g2.hash == g.hash
    assert g2.ops == g.ops and g2.outputs == g.outputs and g2.values == g.values


def test_loaded_graph_runs_without_the_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from schedlab.exec import Executor
    from schedlab.machine import detect_host
    from schedlab.plan import Plan, resolve

    _, c = captured_workload("cnn")
    g2 = Graph.load(c.graph.save(tmp_path / "g.json"))
    out, _ = Executor(g2, resolve(g2, Plan(), detect_host())).step(dict(c.input_values))
    loss = out[g2.output(OutputRole.LOSS).value]
    assert loss.ndim == 0 and float(loss) > 0


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda d: d.update(schema="nope"), "not a schedlab graph"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d["ops"][3].pop("target"), "corrupt graph"),
        (lambda d: d["ops"][3].update(inputs=[10**6]), "unknown value"),
    ],
)
def test_corrupt_graph_gives_one_clear_error(mutate, msg) -> None:  # type: ignore[no-untyped-def]
    _, c = captured_workload("mlp")
    d = json.loads(json.dumps(c.graph.to_json()))
    mutate(d)
    with pytest.raises(SchedlabError, match=msg):
        Graph.from_json(d)


def test_storage_root_follows_view_chains_and_names_a_cycle() -> None:
    from schedlab.graph import TensorMeta, alias_roots, storage_root

    def meta(alias_of: int | None) -> TensorMeta:
        return TensorMeta((2,), "float32", 8, alias_of=alias_of)

    values = [meta(None), meta(0), meta(1), None, meta(99)]  # 2 -> 1 -> 0; 99 is out of range
    assert [storage_root(values, v) for v in range(5)] == [0, 0, 0, 3, 4]
    with pytest.raises(SchedlabError, match="cycle"):
        storage_root([meta(1), meta(0)], 0)
    # A captured graph: capture's roots and the finished graph's roots agree on every value.
    _, c = captured_workload("transformer")
    g = c.graph
    assert alias_roots(g) == [storage_root(g.values, v) for v in range(len(g.values))]
    assert any(r != v for v, r in enumerate(alias_roots(g)))  # it has views


def _two_output_producer(read: int, target: str = "aten.add.Tensor") -> Graph:
    """op0 writes two equal values (as mkldnn_rnn_layer_backward's two bias gradients);
    op1 reads the one at `read` (0 or 1)."""
    import dataclasses

    from schedlab.graph import GraphOutput, TensorMeta
    from schedlab.sim.testing import GraphBuilder

    b = GraphBuilder("two-outputs")
    x = b.input("x", 64)
    y = b.op("producer", [x], nbytes=64, target="aten.mul.Tensor")
    b.output(y, "y", OutputRole.GRAD)
    g = b.build()
    twin = len(g.values)
    producer = dataclasses.replace(g.ops[0], outputs=(y, twin))
    v = (y, twin)[read]
    reader = dataclasses.replace(g.ops[0], id=1, name="reader", target=target, inputs=(v,), args=({"v": v},),
                                 outputs=(twin + 1,))
    meta = TensorMeta(shape=(16,), dtype="float32", nbytes=64)
    return dataclasses.replace(g, ops=(producer, reader), values=(*g.values, meta, meta),
                               outputs=(*g.outputs, GraphOutput(twin + 1, "loss", OutputRole.LOSS)))


def test_the_schedule_hash_ignores_which_equal_output_of_a_producer_an_op_reads() -> None:
    a, b = _two_output_producer(0), _two_output_producer(1)
    a.validate()
    b.validate()
    assert a.hash != b.hash  # the graphs differ in a value id ...
    assert a.schedule_hash == b.schedule_hash  # ... not in what the schedule reads
    assert _two_output_producer(0, target="aten.sub.Tensor").schedule_hash != a.schedule_hash
    assert a.schedule_hash == _two_output_producer(0).schedule_hash
