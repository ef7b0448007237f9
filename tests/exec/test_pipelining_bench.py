"""`schedlab bench --pipelining`: a pipeline plan's step against torch.distributed.pipelining's
on the same ranks, and the stage modules torch runs being the plan's layer split."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from schedlab.capture import capture
from schedlab.errors import SchedlabError
from schedlab.exec.bench import compare_with_pipelining
from schedlab.exec.check import TOLERANCES, eager_reference, eager_step
from schedlab.exec.pipelining import SEGMENTS, stage_modules, torch_schedule_name, traced_stages
from schedlab.machine import host_ranks
from schedlab.microbatch import pipeline_step
from schedlab.pipeline_stages import stage_layers
from schedlab.plan import Plan, resolve
from schedlab.workloads import load_workload


@pytest.mark.parametrize(("model", "stages"), [("mlp", 2), ("mlp", 3), ("transformer", 2), ("transformer", 4)])
def test_stage_modules_chain_to_the_models_loss(model: str, stages: int) -> None:
    w = load_workload(model, "tiny", seed=0)
    layers = [list(st) for st in stage_layers(capture(w).graph, stages)]
    x, target = w.inputs
    try:
        mods = stage_modules(w.module, model, layers)
    except SchedlabError as e:  # a cut inside a piece torch runs whole is refused, naming the cuts that work
        assert "cut points" in str(e)
        return
    assert len(mods) == stages
    out = x
    for m in mods:
        out = m(out)
    loss = SEGMENTS[model][1](out, target)
    torch.testing.assert_close(loss, w.module(x, target))
    # every parameter of the model is in exactly one stage
    held = [id(p) for m in mods for p in m.parameters()]
    assert sorted(held) == sorted(id(p) for p in w.module.parameters())


@pytest.mark.parametrize(("model", "stages"), [
    ("heldout:encoder-classifier", 2), ("heldout:gru-tagger", 2), ("heldout:conv1d-two-branch", 2),
    ("heldout:mixer", 3), ("cnn", 2),
])
def test_torch_traces_any_model_into_the_plans_stages(model: str, stages: int) -> None:
    w = load_workload(model, "tiny", seed=0)
    layers = [list(st) for st in stage_layers(capture(w).graph, stages)]
    pipe = traced_stages(w.module, w.inputs, layers, 2)
    assert pipe.num_stages == stages
    first = tuple(x.chunk(2)[0] for x in w.inputs)
    (out,) = pipe(*first)  # the stages wired as torch runs them give the model's loss
    torch.testing.assert_close(out.reshape(()), w.module(*first))
    names = {n.removeprefix("model.") for s in range(stages) for n, _ in pipe.get_stage_module(s).named_parameters()}
    assert names == {n for n, _ in w.module.named_parameters()}  # every parameter in some stage
    starts = {n.removeprefix("model.").rsplit(".", 1)[0] for n, _ in pipe.get_stage_module(1).named_parameters()}
    assert any(lay in starts or any(x.startswith(lay + ".") for x in starts) for lay in layers[1])


def test_every_value_crossing_torchs_stages_is_contiguous() -> None:
    w = load_workload("heldout:lstm-lm", "tiny", seed=0)
    layers = [list(st) for st in stage_layers(capture(w).graph, 2)]
    pipe = traced_stages(w.module, w.inputs, layers, 1)  # a micro-batch of 2 sequences: a transposed view
    first = tuple(w.inputs)
    outs = pipe.get_stage_module(0)(*first)
    for out in outs if isinstance(outs, tuple) else (outs,):
        assert out.is_contiguous()  # gloo sends contiguous buffers only
    later = [n for n in pipe.get_stage_module(1).graph.nodes if n.op == "placeholder"]
    assert later and all(n.meta["val"].is_contiguous() for n in later)  # torch sizes receive buffers by these
    (loss,) = pipe(*first)
    torch.testing.assert_close(loss.reshape(()), w.module(*first))


def test_a_cut_torch_cannot_trace_is_one_clear_error() -> None:
    w = load_workload("heldout:encoder-classifier", "tiny", seed=0)
    order = [lay for st in stage_layers(capture(w).graph, 1) for lay in st]
    cut = order.index("encoder.layers.0.self_attn.out_proj")  # used as weights, never called as a module
    with pytest.raises(SchedlabError, match="does not call as a module"):
        traced_stages(w.module, w.inputs, [order[:cut], order[cut:]], 2)


def _bench_tiny(model: str, schedule: str, repeats: int, want_params: bool = False,
                micro_batches: int = 2, replicas: int = 1) -> tuple[Any, Any, Any, Any]:
    """(result, the ranks' run, the workload, its pipelined step) of `bench --pipelining` on
    `model` at tiny size: 2 stages on 2 ranks (per replica), `micro_batches`, under `schedule`."""
    plan = Plan(micro_batches=micro_batches, stages=2, schedule=schedule, pipeline_devices=("cpu0", "cpu1"),
                replicas=replicas)
    machine = host_ranks(2 * replicas)
    w = load_workload(model, "tiny", seed=0)
    step = pipeline_step(w, micro_batches, capture, replicas)
    resolved = resolve(step.graph, plan, machine)
    res, dist = compare_with_pipelining(step, resolved, machine, spec=model, size="tiny", seed=0, repeats=repeats,
                                        warmup=1, want_params=want_params)
    return res, dist, w, step


def assert_eagers_step(got: dict[str, torch.Tensor], w: Any, step: Any) -> None:
    """`got` (parameters by the model's names) are eager PyTorch's after one full-batch step."""
    full = step.full
    ref, user, opt = eager_reference(w.module, full.graph, full.input_values)
    eager_step(ref, user, opt)
    expected = {n: p.detach() for n, p in ref.named_parameters()}
    assert set(got) == set(expected)
    for name, p in expected.items():
        tol = TOLERANCES[p.dtype]
        torch.testing.assert_close(got[name], p, atol=tol.atol, rtol=tol.rtol, msg=name)


@pytest.mark.parametrize(("model", "schedule", "cls"), [
    pytest.param("heldout:gru-tagger", "gpipe", "ScheduleGPipe", marks=pytest.mark.slow),
    # nn.LSTM(batch_first=True)'s output, which crosses the cut, is a transposed view (one that
    # is not contiguous when a micro-batch holds more than one sequence: the whole batch here)
    ("heldout:lstm-lm", "gpipe:1", "ScheduleGPipe"),
])
def test_torch_pipelines_a_held_out_model_to_eagers_full_batch_step(model: str, schedule: str, cls: str) -> None:
    name, _, m = schedule.partition(":")
    res, dist, w, step = _bench_tiny(model, name, repeats=2, want_params=True, micro_batches=int(m or 2))
    assert res.torch_schedule == cls and len(res.pipelining_step_times_s) == 2
    assert res.pipelining_step_s > 0 and math.isfinite(res.ratio_vs_pipelining)
    # torch's stages after one step on 2 micro-batches = eager's parameters after one full-batch step
    assert dist.ddp_params is not None
    got = {re.sub(r"^stage\d+\.(model\.)?", "", n): t for n, t in dist.ddp_params.items()}
    assert_eagers_step(got, w, step)


@pytest.mark.parametrize(("model", "schedule", "micro_batches"), [
    pytest.param("heldout:mixer", "gpipe", 1, marks=pytest.mark.slow), ("mlp", "1f1b", 2)])
def test_torch_pipelines_with_replicas_reach_eagers_full_batch_step(model: str, schedule: str,
                                                                   micro_batches: int) -> None:
    """2 replicas x 2 stages on 4 ranks, each stage's gradients averaged over its 2 ranks
    (a written-out stage in DDP, a traced one by hand): torch's side of `bench
    --pipelining` for a plan with replicas, checked as schedlab's is."""
    res, dist, w, step = _bench_tiny(model, schedule, repeats=1, want_params=True, micro_batches=micro_batches,
                                     replicas=2)
    assert res.ranks == 4 and res.pipelining_step_s > 0 and math.isfinite(res.ratio_vs_pipelining)
    assert dist.ddp_params is not None
    if model in SEGMENTS:  # the pieces hold the model's own modules: name them as the model does
        layers = [list(st) for st in stage_layers(capture(w).graph, 2)]
        model_name = {id(p): n for n, p in w.module.named_parameters()}
        as_model = {f"stage{s}.{n}": model_name[id(p)]
                    for s, m in enumerate(stage_modules(w.module, model, layers)) for n, p in m.named_parameters()}
        got = {as_model[n]: t for n, t in dist.ddp_params.items()}
    else:
        got = {re.sub(r"^stage\d+\.(model\.)?", "", n): t for n, t in dist.ddp_params.items()}
    assert_eagers_step(got, w, step)


def test_a_cut_inside_a_piece_is_refused() -> None:
    w = load_workload("transformer", "tiny", seed=0)
    order = [lay for st in stage_layers(capture(w).graph, 1) for lay in st]
    cut = order.index("blocks.0.attn.qkv")  # inside the attention half
    with pytest.raises(SchedlabError, match="falls inside"):
        stage_modules(w.module, "transformer", [order[:cut], order[cut:]])


def test_schedules_without_a_torch_counterpart_are_refused() -> None:
    assert torch_schedule_name("1f1b") == "Schedule1F1B"
    assert torch_schedule_name("interleaved:2") == "ScheduleInterleaved1F1B"
    for name in ("zb-h1", "ooo", [["F0"]]):
        with pytest.raises(SchedlabError, match="pipelining"):
            torch_schedule_name(name)


def test_bench_tiny_mlp_1f1b_against_torch_pipelining() -> None:
    res, _, _, _ = _bench_tiny("mlp", "1f1b", repeats=3)
    assert res.torch_schedule == "Schedule1F1B"
    assert res.ranks == 2 and res.stages == 2 and res.micro_batches == 2
    assert len(res.schedlab_step_times_s) == len(res.pipelining_step_times_s) == 3
    assert res.schedlab_step_s > 0 and res.pipelining_step_s > 0
    assert math.isfinite(res.ratio_vs_pipelining) and res.ratio_vs_pipelining > 0
    lo, hi = res.ratio_spread
    assert 0 < lo <= res.ratio_vs_pipelining <= hi
    assert res.to_json()["ratio_vs_pipelining"] == res.ratio_vs_pipelining
