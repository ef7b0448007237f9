"""Pipeline plans on real ranks: micro-batches and stages on two gloo processes, each rank
running its row of the schedule, match eager PyTorch's full-batch step."""

from __future__ import annotations

import os
from typing import Any

import pytest

from schedlab.capture import capture
from schedlab.exec.check import check_step
from schedlab.exec.launch import run_ranks
from schedlab.graph import OpKind
from schedlab.machine import Device, Machine, host_ranks
from schedlab.microbatch import pipeline_step
from schedlab.pipeline.generators import default_shape, generate, parse_name
from schedlab.plan import Plan, resolve
from schedlab.workloads import load_workload
from tests.exec.spawned import run_spawned
from tests.exec.test_dist import four_core_ranks

HOST2 = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),)))


def run_pipeline(
    model: str, micro_batches: int, schedule: str, stages: int = 2, optimizer: str = "sgd", slots: int = 1
) -> tuple[object, object, object]:
    w = load_workload(model, "tiny")
    step = pipeline_step(w, micro_batches, lambda part: capture(part, optimizer))
    machine = HOST2 if slots == 1 else four_core_ranks(2)
    plan = Plan(threads=1, slots=slots, micro_batches=micro_batches, stages=stages, schedule=schedule,
                stage_map=parse_name(schedule)[0].stage_map, pipeline_devices=("cpu0", "cpu1"))
    r = resolve(step.graph, plan, machine)
    run_graph = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, machine, step.inputs_for(run_graph), steps=2, warmup=1, timeout_s=60,
                    want_outputs=True, workload=model)
    outputs = step.as_full(run_graph, res.outputs or {})
    check = check_step(w.module, step.full.graph, step.full.input_values, lambda iv: outputs)
    return res, check, run_graph


@pytest.mark.parametrize(("model", "micro_batches", "schedule"), [("mlp", 4, "1f1b"), ("transformer", 2, "gpipe")])
def test_a_pipeline_on_two_ranks_matches_eager_on_the_full_batch(model: str, micro_batches: int, schedule: str) -> None:
    res, check, run_graph = run_pipeline(model, micro_batches, schedule)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]
    assert res.ranks == 2  # type: ignore[attr-defined]
    events = res.trace.events  # type: ignore[attr-defined]
    assert {e.rank for e in events} == {0, 1}
    assert any(e.kind == OpKind.COMM.value for e in events)
    per_step = len(run_graph.ops)  # type: ignore[attr-defined]
    assert len(events) == 2 * per_step  # every op once per timed step, on its rank
    sched = generate(schedule, default_shape(schedule, 2), micro_batches)
    tags = run_graph.meta["pipeline_actions"]  # type: ignore[attr-defined]
    for d, dev in enumerate(("cpu0", "cpu1")):
        ran = sorted((e for e in events if e.device == dev and e.step == 0), key=lambda e: (e.start_ns, e.op))
        got: list[str] = []
        for t in (tags[e.op] for e in ran if tags[e.op]):  # updates and transfers belong to no action
            if not got or got[-1] != t:
                got.append(t)
        want = [str(a) for a in sched.orders[d]]
        assert got == [a for a in want if a in got] and len(got) >= len(want) - micro_batches, (dev, got)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "micro_batches", "schedule", "stages", "optimizer", "slots"),
    [
        ("mlp", 4, "gpipe", 2, "adam", 1),
        ("transformer", 2, "1f1b", 2, "adam", 1),
        ("mlp", 4, "zb-h1", 2, "sgd", 1),
        ("transformer", 2, "zbv", 4, "adam", 1),
        ("transformer", 2, "interleaved:2", 4, "sgd", 1),
        ("mlp", 4, "1f1b", 2, "sgd", 2),
    ],
)
def test_pipelines_on_two_ranks_match_eager_slow(
    model: str, micro_batches: int, schedule: str, stages: int, optimizer: str, slots: int
) -> None:
    _, check, _ = run_pipeline(model, micro_batches, schedule, stages, optimizer, slots)
    assert check.ok(), check.describe()  # type: ignore[attr-defined]


def test_a_pipeline_with_replicas_on_four_ranks_matches_eager_on_the_full_batch() -> None:
    """2 replicas x 2 stages: each replica's 1F1B on its own pair of ranks, each stage's
    gradients averaged over the two ranks that hold it."""
    w = load_workload("mlp", "tiny")
    step = pipeline_step(w, 2, lambda part: capture(part, "sgd"), replicas=2)
    machine = host_ranks(4, Machine("h", (Device("cpu0", "cpu", 4, 8 * 2**30),)))
    plan = Plan(threads=1, micro_batches=2, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "cpu1"), replicas=2)
    r = resolve(step.graph, plan, machine)
    run_graph = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, machine, step.inputs_for(run_graph), steps=1, warmup=1, timeout_s=90,
                    want_outputs=True, workload="mlp")
    check = check_step(w.module, step.full.graph, step.full.input_values,
                       lambda iv: step.as_full(run_graph, res.outputs or {}))
    assert check.ok(), check.describe()
    assert res.ranks == 4
    reduces = {e.rank for e in res.trace.events if e.name.startswith("all_reduce")}
    assert reduces == {0, 1, 2, 3}  # every rank averages its stage's gradients with its replica's peer


def _three_steps(rank: int, port: int, prepost: bool, out: Any) -> None:
    """Rank `rank` of mlp's 1F1B over 2 micro-batches: three steps, the first two posting the
    next step's receives if `prepost`; reports, after each step, whether the next step's
    receives were all posted and how many the rank has, and the last step's outputs."""
    import torch.distributed as dist

    from schedlab.exec.dist import RankExecutor
    from schedlab.exec.runner import next_inputs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        w = load_workload("mlp", "tiny")
        step = pipeline_step(w, 2, lambda part: capture(part, "sgd"))
        plan = Plan(threads=1, micro_batches=2, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "cpu1"))
        r = resolve(step.graph, plan, HOST2)
        run_graph = r.run_graph(step.graph)
        ex = RankExecutor(run_graph, r, HOST2, rank)
        inputs = {v: t for v, t in step.inputs_for(run_graph).items() if v in ex.input_ids}
        posted = []
        for s in range(3):
            outs, _ = ex.run_step(inputs, prepost_next=prepost and s < 2)
            nxt = ex._next
            posted.append((nxt is not None and nxt.posted == len(ex.recvs), len(ex.recvs)))
            inputs = {**inputs, **next_inputs(run_graph, inputs, outs)}
        ex.finish()
        out.put((rank, (posted, {v: t.tolist() for v, t in outs.items()})))
    finally:
        dist.destroy_process_group()


def test_a_rank_posts_the_next_steps_receives_once_its_last_receive_is_in() -> None:
    early, late = run_spawned(_three_steps, 2, True), run_spawned(_three_steps, 2, False)
    for rank in (0, 1):
        posted, outs = early[rank]
        assert posted[0][1] > 0  # both stages receive (activations one way, gradients the other)
        assert [p for p, _ in posted] == [True, True, False]  # not after the last step: nothing would match
        assert [p for p, _ in late[rank][0]] == [False, False, False]
        assert outs == late[rank][1]  # the same numbers, step after step
