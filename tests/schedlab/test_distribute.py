"""Placement: which device runs each op, and the send/recv ops that expansion adds."""

from __future__ import annotations

import json

import pytest

from schedlab.capture import Captured
from schedlab.distribute import RECV, SEND, expand, input_homes
from schedlab.errors import SchedlabError
from schedlab.graph import OpKind
from schedlab.machine import Device, Machine, host_ranks
from schedlab.plan import Plan, PlanError, place, resolve
from tests.conftest import captured_workload


def captured(name: str) -> Captured:
    return captured_workload(name)[1]  # type: ignore[return-value]


HOST2 = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),)))


def test_v1_plans_keep_their_hash_and_load() -> None:
    # The hash of a one-device plan must not move with the version-2 schema: run
    # directories and traces are keyed by it, and interrupted searches resume by it.
    p = Plan(slots=2, threads=1, order="w-last")
    assert p.hash == "2ce6d5970b8104c9"
    v1 = {"schema": "schedlab.plan", "version": 1, "name": "", "slots": 2, "threads": 1, "class_threads": {},
          "op_threads": {}, "order": "w-last", "device": None}
    assert Plan.from_json(v1) == p
    placed = Plan(device="cpu0", layer_devices={"head": "cpu1"}, device_slots={"cpu1": 1})
    assert Plan.from_json(json.loads(json.dumps(placed.to_json()))) == placed
    assert placed.hash != Plan(device="cpu0").hash


def test_place_follows_op_then_layer_then_producer_then_default() -> None:
    g = captured("mlp").graph
    head = [op.id for op in g.ops if op.layer == "head"]
    body2 = next(op.id for op in g.ops if op.layer == "body.2")
    devs = place(g, Plan(device="cpu0", layer_devices={"head": "cpu1", "body": "cpu1"}, op_devices={body2: "cpu0"}), HOST2)
    assert all(devs[i] == "cpu1" for i in head)
    assert devs[body2] == "cpu0"
    assert all(devs[op.id] == "cpu1" for op in g.ops if op.layer and op.layer.startswith("body.") and op.id != body2)


@pytest.mark.parametrize(
    ("plan", "field", "needle"),
    [
        (Plan(layer_devices={"head": "cpu7"}), "placement.layers[head]", "unknown device 'cpu7'"),
        (Plan(layer_devices={"nosuch": "cpu1"}), "placement.layers", "names layer 'nosuch'"),
        (Plan(op_devices={10**6: "cpu1"}), "placement.ops", "unknown op id"),
        (Plan(layer_devices={"head": "cpu1"}, device_slots={"cpu1": 2}), "device_slots[cpu1]", "co-run slots need 2 cores"),
        (Plan(layer_devices={"head": "cpu1"}, device_threads={"cpu9": 1}), "device_threads[cpu9]", "unknown device"),
    ],
)
def test_bad_placements_name_the_field(plan: Plan, field: str, needle: str) -> None:
    with pytest.raises(PlanError) as e:
        resolve(captured("mlp").graph, plan, HOST2)
    assert e.value.field == field and needle in str(e.value)


def test_memory_over_capacity_is_refused() -> None:
    tiny = Machine("tiny", (Device("cpu0", "cpu", 1, 2**30, process=0), Device("cpu1", "cpu", 1, 64, process=1)))
    with pytest.raises(PlanError, match="device cpu1 would hold"):
        resolve(captured("mlp").graph, Plan(layer_devices={"head": "cpu1"}), tiny)


def test_every_crossing_value_goes_through_one_send_and_one_recv() -> None:
    g = captured("mlp").graph
    devs = place(g, Plan(device="cpu0", layer_devices={"head": "cpu1"}), HOST2)
    ex = expand(g, devs)
    G = ex.graph
    G.validate()
    assert G.ops[: len(g.ops)] != g.ops  # consumers were rewired
    assert [op.name for op in G.ops[: len(g.ops)]] == [op.name for op in g.ops]  # ids kept
    comm = [G.ops[i] for i in ex.comm_ops]
    assert comm and all(op.kind is OpKind.COMM for op in comm)
    assert sum(op.target == SEND for op in comm) == sum(op.target == RECV for op in comm)
    # On every device, each op reads only values that live there: its own device's outputs
    # or inputs homed there; a send's token is the one value that crosses.
    homes = input_homes(G, ex.device)
    for op in G.ops:
        if op.target == RECV:
            continue
        for v in op.inputs:
            src = G.producer.get(v)
            where = ex.device[src] if src is not None else homes[v]
            assert where == ex.device[op.id], (op.name, v)
    # One transfer per (value, destination): tags are unique.
    tags = [op.kwargs["tag"] for op in comm if op.target == SEND]
    assert len(tags) == len(set(tags))


def test_resolved_multi_device_plan_runs_the_expanded_graph() -> None:
    g = captured("mlp").graph
    r = resolve(g, Plan(threads=1, layer_devices={"head": "cpu1"}), HOST2)
    assert r.multi_device and r.graph is not None and r.base_ops == len(g.ops)
    assert r.run_graph(g) is r.graph
    assert len(r.threads) == len(r.priority) == len(r.device) == len(r.graph.ops) == len(r.sequence)
    single = resolve(g, Plan(threads=1), HOST2)
    assert single.graph is None and single.run_graph(g) is g


# ---- the expanded step computes what eager PyTorch computes -----------------------------

@pytest.mark.parametrize("model", ["mlp", "transformer", "nmt", "cnn"])
def test_placed_step_matches_eager(model: str) -> None:
    from schedlab.exec.check import check_step
    from tests.tools.one_process import run_one_process

    w, c = captured_workload(model)
    g = c.graph  # type: ignore[attr-defined]
    layers = sorted({op.layer.split(".")[0] for op in g.ops if op.layer})
    r = resolve(g, Plan(threads=1, device="cpu0", layer_devices={layers[-1]: "cpu1"}), HOST2)
    assert r.multi_device
    check = check_step(w.module, g, c.input_values, lambda iv: run_one_process(r.run_graph(g), iv))  # type: ignore[attr-defined]
    assert check.ok(), check.describe()


@pytest.mark.parametrize("model", ["mlp", "transformer", "nmt"])
def test_data_parallel_step_matches_eager_on_the_full_batch(model: str) -> None:
    from schedlab.capture import capture
    from schedlab.data_parallel import full_batch_outputs, replica_graph, replica_inputs, split_workload
    from schedlab.exec.check import check_step
    from tests.tools.one_process import run_one_process

    w, full = captured_workload(model)
    parts = [capture(p, "sgd") for p in split_workload(w, 2)]  # type: ignore[arg-type]
    local = replica_graph(parts[0].graph, 2)
    r = resolve(local, Plan(threads=1, replicas=2, bucket_mb=0.01), HOST2)
    joined = r.run_graph(local)
    assert sum(op.target == "schedlab.all_reduce" for op in joined.ops) >= 4  # small buckets: several
    inputs = replica_inputs(joined, [p.input_values for p in parts], local)

    def step(_: dict) -> dict:  # type: ignore[type-arg]
        return full_batch_outputs(joined, full.graph, run_one_process(joined, inputs))  # type: ignore[attr-defined]

    check = check_step(w.module, full.graph, full.input_values, step)  # type: ignore[attr-defined]
    assert check.ok(), check.describe()


def test_data_parallel_refuses_what_would_change_results() -> None:
    from schedlab.capture import capture
    from schedlab.data_parallel import replica_graph, split_workload

    w, _ = captured_workload("cnn")  # batch norm
    local = replica_graph(capture(split_workload(w, 2)[0], "sgd").graph, 2)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="batch norm"):
        resolve(local, Plan(replicas=2), HOST2)
    assert resolve(local, Plan(threads=1, replicas=2, split_batch_stats=True), HOST2).multi_device
    with pytest.raises(PlanError, match="captured for 1 replica"):
        resolve(captured("mlp").graph, Plan(replicas=2), HOST2)
    with pytest.raises(SchedlabError, match="must divide the batch"):
        split_workload(w, 3)  # type: ignore[arg-type]
    three = host_ranks(3, Machine("h", (Device("cpu0", "cpu", 3, 8 * 2**30),)))
    with pytest.raises(PlanError, match="do not divide the 3 devices"):
        resolve(local, Plan(replicas=2, split_batch_stats=True), three)


def test_balanced_blocks_minimise_the_largest_block() -> None:
    from schedlab.layer_split import balanced_blocks

    assert balanced_blocks([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert balanced_blocks([5, 1, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1]
    blocks = balanced_blocks([3, 1, 4, 1, 5, 9, 2, 6], 3)
    assert blocks == sorted(blocks) and len(set(blocks)) == 3  # contiguous, every device used
    sums = [sum(c for c, b in zip([3, 1, 4, 1, 5, 9, 2, 6], blocks, strict=True) if b == j) for j in range(3)]
    assert max(sums) == 14  # the optimum: [3 1 4 1 5] [9] [2 6] -> 14, 9, 8


def test_layer_split_places_contiguous_blocks_on_each_device() -> None:
    from schedlab.layer_split import layer_split, layers_in_order

    g = captured("transformer").graph
    split = layer_split(g, ["cpu0", "cpu1"])
    order = layers_in_order(g)
    devs = [split[lay] for lay in order]
    assert devs == sorted(devs) and set(devs) == {"cpu0", "cpu1"}
    r = resolve(g, Plan(threads=1, layer_devices=split), HOST2)
    assert r.multi_device


def test_replicas_with_a_placement_inside_each() -> None:
    from schedlab.capture import capture
    from schedlab.data_parallel import plan_step
    from schedlab.exec.check import check_step
    from tests.tools.one_process import run_one_process

    w, _ = captured_workload("mlp")
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    four = host_ranks(4, Machine("h", (Device("cpu0", "cpu", 4, 8 * 2**30),)))
    r = resolve(step.graph, Plan(threads=1, device="cpu0", layer_devices={"head": "cpu1"}, replicas=2), four)
    run_graph = r.run_graph(step.graph)
    assert set(r.devices) == {"cpu0", "cpu1", "cpu2", "cpu3"}
    heads = {r.device[op.id] for op in run_graph.ops if op.layer == "head"}
    assert heads == {"cpu1", "cpu3"}  # replica 1 runs its head on the second device of its group
    outputs = step.as_full(run_graph, run_one_process(run_graph, step.inputs_for(run_graph)))
    check = check_step(w.module, step.full.graph, step.full.input_values, lambda iv: outputs)  # type: ignore[attr-defined]
    assert check.ok(), check.describe()
