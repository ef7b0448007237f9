"""A plan's placement on TensorFlow's logical CPU devices: resolved, applied, run, captured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schedlab.errors import SchedlabError
from schedlab.plan import Plan
from schedlab.tf.placement import device_index, plan_devices
from schedlab.tf.plan_map import tf_threads_for_plan
from schedlab.tf.runtime import TFThreads


def test_a_placement_asks_for_as_many_cpu_devices_as_it_names() -> None:
    assert plan_devices(Plan()) == 1
    assert plan_devices(Plan(layer_devices={"body.0": "cpu1"})) == 2
    assert plan_devices(Plan(device="cpu0", op_devices={3: "cpu2"})) == 3
    t = tf_threads_for_plan(Plan(slots=2, threads=1, layer_devices={"body.0": "cpu1"}))
    assert t == TFThreads(intra_op=1, inter_op=2, cpu_devices=2)


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (Plan(layer_devices={"body.0": "gpu0"}), "places ops on 'gpu0'"),
        (Plan(layer_devices={"body.0": "cpu1"}, device_threads={"cpu1": 1}), "per-device slots or threads"),
        (Plan(layer_devices={"body.0": "cpu1"}, device_slots={"cpu0": 2}), "per-device slots or threads"),
    ],
)
def test_what_tf_placement_cannot_honour_is_refused_by_name(plan: Plan, says: str) -> None:
    with pytest.raises(SchedlabError, match=says):
        tf_threads_for_plan(plan)


def test_tf_device_names_map_to_schedlab_cpus() -> None:
    assert device_index("/job:localhost/replica:0/task:0/device:CPU:1") == 1
    assert device_index("") == 0
    with pytest.raises(SchedlabError, match="CPU devices only"):
        device_index("/job:localhost/replica:0/task:0/device:GPU:0")


def test_a_receive_without_its_send_is_a_clear_capture_error() -> None:
    from schedlab.tf.capture import _inputs_with_transfers

    def node(name: str, op: str, key: bytes, inputs: tuple[str, ...] = ()) -> SimpleNamespace:
        return SimpleNamespace(name=name, op=op, input=list(inputs), attr={"tensor_name": SimpleNamespace(s=key)})

    send = node("x/_1", "_Send", b"edge_3_x", ("x",))
    recv = node("x/_2", "_Recv", b"edge_3_x")
    assert _inputs_with_transfers([send, recv])["x/_2"] == ["^x/_1"]  # the receive waits on its send
    with pytest.raises(SchedlabError, match="receives 'edge_9_y', which no partition sends"):
        _inputs_with_transfers([send, node("y/_2", "_Recv", b"edge_9_y")])


def test_a_simulated_placement_gets_a_send_and_receive_per_value_and_device() -> None:
    """Values read on another device go through one _Send (producer's device) and one _Recv
    (reader's device), shared by every reader there; constants are copied, not sent."""
    from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
    from schedlab.tf.placement import with_transfers

    m = TensorMeta((4,), "float32", 16)

    def op(i: int, name: str, target: str, ins: tuple[int, ...], outs: tuple[int, ...]) -> Op:
        return Op(id=i, name=name, target=target, kind=OpKind.F, args=(), kwargs={}, inputs=ins, outputs=outs,
                  flops=4.0, bytes_moved=32)

    g = Graph(name="g", inputs=(GraphInput(0, "x", InputRole.USER),), outputs=(GraphOutput(5, "loss", OutputRole.LOSS),),
              ops=(op(0, "a", "tf.Relu", (0,), (1,)), op(1, "c", "tf.Const", (), (2,)),
                   op(2, "b", "tf.Mul", (1, 2), (3,)), op(3, "b2", "tf.Neg", (1,), (4,)),
                   op(4, "out", "tf.AddV2", (3, 4), (5,))),
              values=(m,) * 6)
    placed = with_transfers(g, ("cpu0", "cpu0", "cpu1", "cpu1", "cpu0"))
    placed.validate()
    names = [o.name for o in placed.ops]
    assert names == ["a", "c", "a/_to_cpu1/send", "a/_to_cpu1/recv", "b", "b2",
                     "b/_to_cpu0/send", "b/_to_cpu0/recv", "b2/_to_cpu0/send", "b2/_to_cpu0/recv", "out"]
    dev = placed.meta["tf_devices"]
    assert [dev[n] for n in names] == ["cpu0", "cpu0", "cpu0", "cpu1", "cpu1", "cpu1", "cpu1", "cpu0", "cpu1", "cpu0",
                                       "cpu0"]
    comm = [o for o in placed.ops if o.target in ("tf._Send", "tf._Recv")]
    assert len(comm) == 6 and all(o.flops == 0 and o.bytes_moved == 0 and o.kind is OpKind.F for o in comm)
    b, b2 = placed.ops[4], placed.ops[5]
    assert b.inputs[0] == b2.inputs[0] == placed.ops[3].outputs[0]  # one receive serves both readers
    assert b.inputs[1] == 2  # the constant, read where it is
    with pytest.raises(SchedlabError, match="placement covers 2 ops"):
        with_transfers(g, ("cpu0", "cpu1"))


pytest.importorskip("tensorflow")


def test_a_placed_step_runs_on_its_devices_with_transfers_between_them() -> None:
    """Layer body.0 on cpu1, the rest on cpu0, in a fresh TF process: every planned node
    runs where the plan put it, each cross-device edge is a _Send/_Recv pair of ops
    (the receive after its send, on the other device), events carry their device, and the
    step's numerics still match TF eager and PyTorch."""
    from schedlab.exec.tf_job import TFRequest
    from schedlab.exec.tf_launch import run_tf_worker
    from schedlab.graph import OpKind

    plan = Plan(slots=2, threads=1, layer_devices={"body.0": "cpu1"})
    res = run_tf_worker(TFRequest("mlp", "tiny", tf_threads_for_plan(plan), steps=2, warmup=1,
                                  plan=plan.to_json()), timeout_s=120)
    assert res.check["numerics_ok"] and res.torch_check is not None and res.torch_check["numerics_ok"]
    g = res.graph
    g.validate()
    assert g.meta["placement_honoured"] == 1.0
    dev = g.meta["tf_devices"]
    transfer = {"tf._Send", "tf._Recv"}
    compute = [op for op in g.ops if op.target not in transfer and "CrossDevice" not in op.name]
    assert {dev[op.name] for op in compute if op.layer == "body.0"} == {"cpu1"}  # and TF's own plumbing anywhere
    assert {dev[op.name] for op in compute if op.layer == "head"} == {"cpu0"}
    assert not [op for op in g.ops if op.kind is OpKind.COMM]  # executor nodes, not schedlab's link transfers
    sends = {op.id: op for op in g.ops if op.target == "tf._Send"}
    recvs = [op for op in g.ops if op.target == "tf._Recv"]
    assert sends and len(sends) == len(recvs)
    for r in recvs:
        (s,) = [g.producer[v] for v in r.inputs if g.producer.get(v) in sends]
        assert dev[sends[s].name] != dev[r.name]
    assert {e.device for e in res.trace.events} == {"cpu0", "cpu1"}
    assert all(e.device == dev[e.name] for e in res.trace.events)


def test_a_placement_naming_an_unknown_layer_fails_in_the_worker_with_the_plan_error() -> None:
    from schedlab.exec.tf_job import TFRequest
    from schedlab.exec.tf_launch import run_tf_worker

    plan = Plan(layer_devices={"decoder": "cpu1"})
    with pytest.raises(SchedlabError, match=r"placement\.layers: names layer 'decoder'"):
        run_tf_worker(TFRequest("mlp", "tiny", tf_threads_for_plan(plan), steps=1, warmup=0,
                                plan=plan.to_json()), timeout_s=120)


def test_an_order_runs_as_planned_through_control_dependencies() -> None:
    """One inter-op thread and a random topological order: TF's own order differs from it,
    the chained step runs it exactly, and the step's numerics do not change."""
    from schedlab.exec.tf_run import run_tensorflow
    from schedlab.tf.order import order_honoured, order_sequence
    from tests.tf import IN_PROCESS, tiny_models

    plan = Plan(order="random:3")
    free = run_tensorflow(tiny_models.mlp(), IN_PROCESS, steps=1, warmup=0)
    sequence = order_sequence(free.graph, plan)
    natural = [free.graph.ops[e.op].name for e in sorted(free.trace.events, key=lambda e: e.start_ns)]
    assert order_honoured(sequence, natural) < 0.9  # TF alone would not run it
    ordered = run_tensorflow(tiny_models.mlp(), IN_PROCESS, steps=2, warmup=0, plan=plan)
    assert ordered.graph.meta["order_honoured"] == 1.0, ordered.graph.meta["order_reversed"]
    assert ordered.graph.meta["order_reversed"] == []
    assert ordered.check.numerics_ok


def test_order_honoured_counts_planned_pairs_that_ran_in_order() -> None:
    from schedlab.tf.order import order_honoured, reversed_pairs

    assert order_honoured(["a", "b", "c", "d"], ["a", "b", "c", "d"]) == 1.0
    assert order_honoured(["a", "b", "c", "d"], ["b", "a", "c", "d"]) == pytest.approx(2 / 3)
    assert order_honoured(["a", "x", "b"], ["a", "b"]) == 1.0  # a node that did not run is skipped
    # start times: a tie is no evidence against the plan, a later start is
    assert order_honoured(["a", "b", "c"], {"a": 5, "b": 5, "c": 9}) == 1.0
    assert order_honoured(["a", "b", "c"], {"a": 5, "b": 4, "c": 9}) == pytest.approx(1 / 2)
    assert reversed_pairs(["a", "b", "c"], {"a": 5, "b": 4, "c": 9}) == [("a", "b")]


def test_an_order_against_the_graphs_own_edges_never_closes_a_cycle() -> None:
    """Grappler may put a node before one it depends on in the graph as built: the chain
    follows the built graph's edges there and the plan's order elsewhere."""
    from schedlab.tf.order import apply_order
    from schedlab.tf.runtime import import_tensorflow, session_config
    from tests.tf import IN_PROCESS

    tf = import_tensorflow()
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(1.0, name="a")
        b = tf.identity(a, name="b")  # b reads a
        c = tf.constant(2.0, name="c")
        d = tf.constant(3.0, name="d")
        tf.add_n([b, c, d], name="s")
    assert apply_order(g, ["b", "a", "d", "c", "s"]) == 5
    chained = {op.name: [x.name for x in op.control_inputs] for op in g.get_operations()}
    assert chained["b"] == ["a"] and chained["d"] == ["b"] and chained["c"] == ["d"] and chained["s"] == ["c"]
    with tf.compat.v1.Session(graph=g, config=session_config(IN_PROCESS)) as s:
        assert s.run("s:0") == 6.0  # no cycle: it runs
