"""Pipeline plans: micro-batches and stages expanded into one graph whose devices follow a
schedule's order, matching eager PyTorch's full-batch step in one process, predicted by
the simulator in the schedule's order, and one clear error per bad plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from schedlab.capture import capture
from schedlab.errors import SchedlabError
from schedlab.exec import Executor, check_step
from schedlab.graph import InputRole, OpKind, OutputRole
from schedlab.machine import Device, Machine, host_ranks
from schedlab.microbatch import PipelineStep, pipeline_step
from schedlab.pipeline import Kind
from schedlab.pipeline.generators import default_shape, generate, parse_name
from schedlab.pipeline_expand import pipeline_graph
from schedlab.pipeline_plan import check_order
from schedlab.pipeline_stages import Part, split_stages, stage_layers
from schedlab.plan import Plan, PlanError, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import TableCost
from schedlab.steps import as_step_outputs
from schedlab.workloads import load_workload
from tests.conftest import captured_workload

ONE = Machine("one", (Device("cpu0", "cpu", 2, 8 * 2**30),))
TWO = host_ranks(2, ONE)
FOUR = host_ranks(4, Machine("four", (Device("cpu0", "cpu", 4, 8 * 2**30),)))
_STEPS: dict[tuple[str, int, str], PipelineStep] = {}


def step_of(model: str, micro_batches: int, optimizer: str = "sgd") -> PipelineStep:
    key = (model, micro_batches, optimizer)
    if key not in _STEPS:
        step = pipeline_step(load_workload(model, "tiny"), micro_batches, lambda w: capture(w, optimizer))
        assert isinstance(step, PipelineStep)
        _STEPS[key] = step
    return _STEPS[key]


def pipe_plan(schedule: str, micro_batches: int, stages: int, devices: tuple[str, ...] = (), **kw: object) -> Plan:
    return Plan(threads=1, micro_batches=micro_batches, stages=stages, schedule=schedule, pipeline_devices=devices,
                stage_map=parse_name(schedule)[0].stage_map, **kw)  # type: ignore[arg-type]


def device_actions(run_graph_meta: dict[str, object], ops: list[int]) -> list[str]:
    """The actions `ops` (in run order) belong to, consecutive repeats and updates dropped."""
    tags = run_graph_meta["pipeline_actions"]
    assert isinstance(tags, list)
    out: list[str] = []
    for i in ops:
        if tags[i] and (not out or out[-1] != tags[i]):
            out.append(tags[i])
    return out


# ---- the plan file ---------------------------------------------------------------------------


def test_a_pipeline_plan_round_trips_as_version_3_and_other_plans_stay_version_2(tmp_path: Path) -> None:
    rows = (("0F0", "0B0", "0F1", "0B1"), ("1F0", "1B0", "1F1", "1B1"))
    for plan in (pipe_plan("zbv", 4, 4, ("cpu0", "cpu1")), Plan(micro_batches=2, stages=(1,), schedule=rows,
                                                                   pipeline_devices=("cpu0", "cpu1"))):
        loaded = Plan.load(plan.save(tmp_path / "p.json"))
        assert loaded == plan and loaded.hash == plan.hash
        assert json.loads((tmp_path / "p.json").read_text())["version"] == 3
    plain = Plan(slots=2, replicas=2)
    assert plain.to_json()["version"] == 2 and "micro_batches" not in plain.to_json()
    assert not plain.pipelined and pipe_plan("1f1b", 1, 1).pipelined
    assert pipe_plan("1f1b", 1, 1).hash != Plan(threads=1).hash


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        ({"version": 2, "micro_batches": 2}, "unknown field"),
        ({"version": 3, "schedule": 3}, "schedule name"),
        ({"version": 3, "schedule": [["0F0", 1]]}, "schedule name"),
        ({"version": 3, "stages": "two"}, "must be an integer"),
        ({"version": 3, "pipeline_devices": "cpu0"}, "list of device ids"),
        ({"version": 3, "stage_map": 1}, "loop or v"),
    ],
)
def test_malformed_pipeline_fields(body: dict[str, object], msg: str) -> None:
    with pytest.raises(SchedlabError, match=msg):
        Plan.from_json({"schema": "schedlab.plan", **body})


# ---- stages ------------------------------------------------------------------------------------


def test_stages_take_equal_shares_of_layers_or_explicit_cuts() -> None:
    g = captured_workload("mlp")[1].graph  # type: ignore[attr-defined]
    assert stage_layers(g, 2) == (("body.0",), ("body.2", "head"))
    assert stage_layers(g, (2,)) == (("body.0", "body.2"), ("head",))
    with pytest.raises(PlanError, match="need at least 4 layers"):
        stage_layers(g, 4)
    with pytest.raises(PlanError, match="rise strictly"):
        stage_layers(g, (2, 1))


@pytest.mark.parametrize("stages", [2, 4, (1, 5, 8)])
def test_forward_flows_forward_and_gradients_flow_backward(stages: int | tuple[int, ...]) -> None:
    """Capture tags residual adds with the wrong block; the split moves them so that no
    stage's forward reads a later stage's, and no stage's backward an earlier stage's."""
    g = captured_workload("transformer", "adam")[1].graph  # type: ignore[attr-defined]
    split = split_stages(g, stages)
    st, part = split.stage, split.part
    for op in g.ops:
        for p in g.preds[op.id]:
            if part[p] is Part.F and part[op.id] is Part.F:
                assert st[p] <= st[op.id], (g.ops[p].name, op.name)
            if part[p] in (Part.I, Part.W) and part[op.id] in (Part.I, Part.W):
                assert st[p] >= st[op.id], (g.ops[p].name, op.name)
                if st[p] > st[op.id] or part[op.id] is Part.I:
                    assert part[p] is Part.I, (g.ops[p].name, op.name)  # the gradient passed down is input work
    assert set(st) == set(range(split.n_stages))
    loss = next(i for i, op in enumerate(g.ops) if op.target.endswith("nll_loss_forward.default"))
    assert st[loss] == split.n_stages - 1
    assert {st[op.id] for op in g.ops if op.kind is OpKind.OPT and op.layer == "tok_emb"} == {0}


# ---- one process: the pipelined step equals the full batch's ------------------------------------


@pytest.mark.parametrize(
    ("model", "optimizer", "micro_batches", "schedule", "stages"),
    [
        ("mlp", "sgd", 4, "1f1b", 1),
        ("mlp", "adam", 4, "gpipe", 1),
        ("transformer", "sgd", 2, "1f1b", 1),
        ("transformer", "adam", 2, "gpipe", 1),
        ("mlp", "sgd", 4, "looped-bfs", 2),  # two stages on one device
        ("transformer", "adam", 2, "zbv", 2),  # backward split into I and W
    ],
)
def test_the_pipelined_step_in_one_process_matches_eager_on_the_full_batch(
    model: str, optimizer: str, micro_batches: int, schedule: str, stages: int
) -> None:
    step = step_of(model, micro_batches, optimizer)
    r = resolve(step.graph, pipe_plan(schedule, micro_batches, stages), ONE)
    assert not r.multi_device
    run = r.run_graph(step.graph)
    ex = Executor(run, r)
    full = step.full
    outputs = as_step_outputs(full.graph, run, ex.step(step.inputs_for(run))[0])
    check = check_step(step.workload.module, full.graph, full.input_values, lambda iv: outputs)
    assert check.ok(), check.describe()
    # Not trivially so: one micro-batch's loss is not the full batch's, and every gradient is a mean.
    one = Executor(step.graph, resolve(step.graph, Plan(threads=1), ONE)).step(step.micro_inputs[0])[0]
    loss = full.graph.output(OutputRole.LOSS).value
    assert abs(float(one[step.graph.output(OutputRole.LOSS).value]) - float(outputs[loss])) > 1e-6
    n_grads = sum(1 for o in full.graph.outputs if o.role is OutputRole.GRAD)
    means = [op for op in run.ops if op.name.startswith("mean ")]
    assert len(means) == n_grads + 1  # every gradient and the loss
    assert sum(1 for op in run.ops if op.name.startswith("accumulate ")) == (n_grads + 1) * (micro_batches - 1)
    assert sum(1 for op in run.ops if op.kind is OpKind.OPT) == sum(1 for op in full.graph.ops if op.kind is OpKind.OPT)


# ---- several devices: each follows its row of the schedule --------------------------------------


@pytest.mark.parametrize(
    ("schedule", "stages", "machine"),
    [("1f1b", 2, TWO), ("gpipe", 2, TWO), ("zb-h1", 2, TWO), ("zbv", 4, TWO), ("interleaved:2", 4, TWO),
     ("1f1b", 4, FOUR)],
)
def test_each_device_runs_its_ops_in_its_schedule_rows_order(schedule: str, stages: int, machine: Machine) -> None:
    step = step_of("transformer", 2)
    devices = tuple(d.id for d in machine.devices)
    r = resolve(step.graph, pipe_plan(schedule, 2, stages, devices), machine)
    run = r.run_graph(step.graph)
    sched = generate(schedule, default_shape(schedule, len(devices), stages), 2)
    for d, dev in enumerate(devices):
        mine = [i for i in r.sequence if r.device[i] == dev]
        want = [str(a) for a in sched.orders[d]]
        got = device_actions(run.meta, mine)
        # an action with no ops of its own (stage 0's input gradient) leaves no trace
        assert got == [a for a in want if a in got], (dev, got, want)
        assert len(got) >= len(want) - sum(1 for a in sched.orders[d] if a.kind is Kind.I and a.stage == 0)
    pos = {i: k for k, i in enumerate(r.sequence)}
    assert all(pos[p] < pos[i] for i in range(len(run.ops)) for p in run.preds[i])
    assert r.multi_device and any(op.kind is OpKind.COMM for op in run.ops)


def test_the_simulator_predicts_the_plan_in_the_schedules_order() -> None:
    step = step_of("mlp", 4)
    cost = TableCost(default_kernel_us=10.0, dispatch=5.0)
    rows = {}
    for schedule in ("1f1b", "gpipe"):
        r = resolve(step.graph, pipe_plan(schedule, 4, 2, ("cpu0", "cpu1")), TWO)
        run = r.run_graph(step.graph)
        res = simulate(step.graph, r, TWO, cost)
        assert res.trace is not None and res.step_time_s > 0
        for dev in ("cpu0", "cpu1"):
            events = sorted((e for e in res.trace.events if e.device == dev), key=lambda e: (e.start_ns, e.op))
            rows[(schedule, dev)] = " ".join(device_actions(run.meta, [e.op for e in events]))
    assert rows[("1f1b", "cpu0")] == "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"
    assert rows[("1f1b", "cpu1")] == "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"
    assert rows[("gpipe", "cpu0")] == "0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3"
    assert rows[("gpipe", "cpu1")] == "1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3"


def test_an_inline_schedule_runs_as_its_rows_say() -> None:
    step = step_of("mlp", 2)
    rows = (("0F0", "0F1", "0B1", "0B0"), ("1F0", "1F1", "1B1", "1B0"))  # backwards last-in first-out
    r = resolve(step.graph, Plan(threads=1, micro_batches=2, stages=2, schedule=rows,
                                 pipeline_devices=("cpu0", "cpu1")), TWO)
    run = r.run_graph(step.graph)
    assert device_actions(run.meta, [i for i in r.sequence if r.device[i] == "cpu1"]) == list(rows[1])


def test_a_crossed_order_is_refused_naming_who_waits_for_what() -> None:
    step = step_of("mlp", 2)
    g = step.graph
    sched = generate("1f1b", default_shape("1f1b", 2), 2)
    pipe = pipeline_graph(g, split_stages(g, 2), sched, ("cpu0", "cpu1"))
    check_order(pipe, "x")
    first, *rest = pipe.orders["cpu1"]
    crossed = dataclasses.replace(pipe, orders={**pipe.orders, "cpu1": (*rest, first)})
    with pytest.raises(PlanError, match=r"cpu1 at op \d+ .* waits for op \d+"):
        check_order(crossed, "x")


# ---- bad plans ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "msg"),
    [
        (pipe_plan("1f1b", 4, 2, ("cpu0", "cpu1")), "captured for 2 micro-batch.*the plan has 4"),
        (Plan(micro_batches=2, stages=2, schedule="nope", pipeline_devices=("cpu0", "cpu1")), "unknown pipeline schedule"),
        (Plan(micro_batches=2, stages=3, schedule="1f1b", pipeline_devices=("cpu0", "cpu1")), "multiple of 2"),
        (Plan(micro_batches=2, stages=2, schedule="1f1b", stage_map="v", pipeline_devices=("cpu0", "cpu1")), "set it to 'loop'"),
        (Plan(micro_batches=2, stages=2, schedule="1f1b", stage_map="zigzag"), "unknown stage map"),
        (Plan(micro_batches=2, stages=4, schedule="zbv", stage_map="v", pipeline_devices=("cpu0", "cpu1")), "at least 4 layers"),
        (Plan(micro_batches=2, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "cpu1"), replicas=2), "replicas"),
        (Plan(micro_batches=2, stages=1, schedule="1f1b", layer_devices={"head": "cpu1"}), "places ops by its stages"),
        (Plan(micro_batches=2, stages=1, schedule="1f1b", order="w-last"), "schedule's order"),
        (Plan(micro_batches=2, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "gpu7")), "gpu7"),
        (Plan(micro_batches=2, stages=2, schedule="1f1b", pipeline_devices=("cpu0", "cpu0")), "names a device twice"),
        (Plan(micro_batches=2, stages=2, pipeline_devices=("cpu0", "cpu1")), "needs a schedule"),
        (Plan(micro_batches=2, stages=2, schedule=(("0F0", "0B0", "0F1", "0B1"),), pipeline_devices=("cpu0", "cpu1")),
         "lists 1 device"),
        (Plan(micro_batches=2, stages=2, schedule=(("0F0", "0B0"), ("1F0", "1B0")), pipeline_devices=("cpu0", "cpu1")),
         "runs 1 micro-batch"),
        (Plan(micro_batches=2, stages=2, schedule=(("1F0", "1B0", "1F1", "1B1"), ("0F0", "0B0", "0F1", "0B1")),
              pipeline_devices=("cpu0", "cpu1")), "stage map 'loop' puts them"),
        (Plan(micro_batches=2, stages=2, schedule=(("0F0", "0B0", "0F1", "0B1"), ("1B0", "1F0", "1F1", "1B1")),
              pipeline_devices=("cpu0", "cpu1")), "deadlock"),
    ],
)
def test_bad_pipeline_plans_give_one_clear_error(plan: Plan, msg: str) -> None:
    with pytest.raises(PlanError, match=msg):
        resolve(step_of("mlp", 2).graph, plan, TWO)


def test_micro_batches_must_divide_the_batch() -> None:
    with pytest.raises(SchedlabError, match="3 micro-batches must divide the batch"):
        pipeline_step(load_workload("transformer", "tiny"), 3, lambda w: capture(w, "sgd"))


# ---- steady state: steps back to back ------------------------------------------------------------


def test_in_steady_state_each_device_runs_its_row_step_after_step() -> None:
    step = step_of("mlp", 2)
    plan = pipe_plan("1f1b", 2, 2, ("cpu0", "cpu1"))
    one, three = resolve(step.graph, plan, TWO), resolve(step.graph, plan, TWO, steps=3)
    m = len(one.run_graph(step.graph).ops)
    run = three.run_graph(step.graph)
    assert three.steps == 3 and len(run.ops) == 3 * m and three.device == one.device * 3
    for dev in ("cpu0", "cpu1"):
        row = [i for i in one.sequence if one.device[i] == dev]
        assert [i for i in three.sequence if three.device[i] == dev] == [s * m + i for s in range(3) for i in row]
    # the next step reads the parameters this step updated, not the ones it started from
    params = {i.value for i in run.inputs if i.role is InputRole.PARAM}
    assert params and not params & {v for op in run.ops[m:] for v in op.inputs}
    assert params & {v for op in run.ops[:m] for v in op.inputs}


def test_a_steady_state_pipeline_on_two_ranks_matches_eager_step_after_step() -> None:
    from schedlab.exec.launch import run_ranks

    steps = 2
    step = step_of("mlp", 2)
    r = resolve(step.graph, pipe_plan("1f1b", 2, 2, ("cpu0", "cpu1")), TWO, steps=steps)
    run = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, TWO, step.inputs_for(run), steps=1, warmup=0, timeout_s=60, want_outputs=True,
                    workload="mlp")
    outputs = as_step_outputs(step.full.graph, run, res.outputs or {})
    check = check_step(step.workload.module, step.full.graph, step.full.input_values, lambda iv: outputs, steps=steps)
    assert check.ok(), check.describe()
