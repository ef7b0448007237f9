from __future__ import annotations

import json

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import OpKind
from schedlab.machine import Device, Machine
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload

TWO_CORES = Machine(name="two", devices=(Device(id="cpu0", kind="cpu", cores=2, memory_bytes=2**30),))


def _graph():  # type: ignore[no-untyped-def]
    return captured_workload("transformer")[1].graph


def test_default_plan_is_what_pytorch_does() -> None:
    g = _graph()
    r = resolve(g, Plan(), TWO_CORES)
    assert r.slots == 1
    assert set(r.threads) == {2}  # all cores
    assert r.sequence == tuple(range(len(g)))  # program order


@pytest.mark.parametrize("order", ["topo", "critical-path", "w-last", "random:1", "random:7"])
def test_every_policy_gives_a_valid_order(order: str) -> None:
    g = _graph()
    seq = resolve(g, Plan(order=order), TWO_CORES).sequence
    pos = {op: k for k, op in enumerate(seq)}
    assert sorted(seq) == list(range(len(g)))
    assert all(pos[p] < pos[i] for i in range(len(g)) for p in g.preds[i])


def test_w_last_defers_weight_gradients() -> None:
    g = _graph()
    seq = resolve(g, Plan(order="w-last"), TWO_CORES).sequence
    first_w = min(k for k, i in enumerate(seq) if g.ops[i].kind is OpKind.W)
    last_b = max(k for k, i in enumerate(seq) if g.ops[i].kind is OpKind.B)
    assert first_w > last_b  # with one worker, no W work runs while B work is ready


def test_random_orders_differ_by_seed_and_repeat_with_the_same_seed() -> None:
    g = _graph()
    a = resolve(g, Plan(order="random:1"), TWO_CORES).sequence
    b = resolve(g, Plan(order="random:2"), TWO_CORES).sequence
    assert a != b and a == resolve(g, Plan(order="random:1"), TWO_CORES).sequence


def test_explicit_order_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = _graph()
    seq = resolve(g, Plan(order="critical-path"), TWO_CORES).sequence
    plan = Plan(slots=2, threads=1, order=seq, op_threads={0: 2}, class_threads={"mm": 2}, name="x")
    loaded = Plan.load(plan.save(tmp_path / "p.json"))
    assert loaded == plan and loaded.hash == plan.hash
    r = resolve(g, loaded, TWO_CORES)
    assert r.sequence == seq
    assert r.threads[0] == 2
    assert all(r.threads[op.id] == 2 for op in g.ops if op.op_class == "mm")


@pytest.mark.parametrize(
    "plan, msg",
    [
        (Plan(threads=3), "3 threads is more than the 2 cores"),
        (Plan(op_threads={0: 8}), "more than the 2 cores"),
        (Plan(op_threads={10**6: 1}), "unknown op id 1000000"),
        (Plan(class_threads={"nosuchop": 1}), "op class 'nosuchop'"),
        (Plan(slots=3), "3 co-run slots"),
        (Plan(slots=0), "plan slots: must be >= 1"),
        (Plan(order="fastest"), "unknown order policy 'fastest'"),
        (Plan(order="random:x"), "seed after 'random:'"),
        (Plan(order=(1, 0)), "every op id exactly once"),
        (Plan(device="gpu7"), "unknown device 'gpu7'"),
    ],
)
def test_bad_plans_give_one_clear_error(plan: Plan, msg: str) -> None:
    with pytest.raises(SchedlabError, match=msg):
        resolve(_graph(), plan, TWO_CORES)


def test_order_breaking_dependencies_names_the_ops() -> None:
    g = _graph()
    seq = list(range(len(g)))
    consumer = next(i for i in range(len(g)) if g.preds[i])
    producer = g.preds[consumer][0]
    seq[producer], seq[consumer] = seq[consumer], seq[producer]
    with pytest.raises(SchedlabError, match=f"op {consumer} .* comes before its input op {producer}"):
        resolve(g, Plan(order=tuple(seq)), TWO_CORES)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a schedlab plan"),
        (json.dumps({"schema": "schedlab.plan", "version": 1, "slots": "two"}), "must be an integer"),
        (json.dumps({"schema": "schedlab.plan", "version": 1, "slotz": 2}), "unknown field"),
        (json.dumps({"schema": "schedlab.plan", "version": 1, "order": [1, "a"]}), "list of op ids"),
    ],
)
def test_malformed_plan_files(tmp_path, text: str, msg: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "plan.json"
    p.write_text(text)
    with pytest.raises(SchedlabError, match=msg):
        Plan.load(p)


def test_missing_plan_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match="plan file not found"):
        Plan.load(tmp_path / "nope.json")
