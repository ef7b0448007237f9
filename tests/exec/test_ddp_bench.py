"""The side by side with DistributedDataParallel (`schedlab bench --ddp`): both run in the
same ranks, alternating, and DDP computes the same step as eager PyTorch on the full batch."""

from __future__ import annotations

import json
import math

import pytest
import torch

from schedlab.capture import capture
from schedlab.cli import main
from schedlab.data_parallel import plan_step
from schedlab.errors import SchedlabError
from schedlab.exec.bench import compare_with_ddp, ratio_stats
from schedlab.exec.check import TOLERANCES, eager_reference, eager_step
from schedlab.exec.launch import span_step_times_s
from schedlab.machine import Device, Machine, host_ranks
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload

HOST2 = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),)))


def test_ddp_side_by_side_times_both_and_ddp_matches_eager_on_the_full_batch() -> None:
    w, _ = captured_workload("mlp")
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    resolved = resolve(step.graph, Plan(threads=1, replicas=2, bucket_mb=0.001), HOST2)  # several DDP buckets
    res, dist = compare_with_ddp(step, resolved, HOST2, spec="mlp", size="tiny", seed=0, repeats=3, warmup=1,
                                 timeout_s=60, want_params=True)
    assert res.ranks == 2 and res.replicas == 2 and res.repeats == 3 and res.threads == 1
    assert len(res.schedlab_step_times_s) == 3 and len(res.ddp_step_times_s) == 3
    assert all(t > 0 for t in res.schedlab_step_times_s + res.ddp_step_times_s)
    assert math.isfinite(res.ratio_vs_ddp) and res.ratio_vs_ddp > 0
    assert res.ratio_spread[0] <= res.ratio_vs_ddp <= res.ratio_spread[1]
    assert json.loads(json.dumps(res.to_json()))["ratio_vs_ddp"] == res.ratio_vs_ddp
    # DDP's parameters after one step on half batches = eager's after one full-batch step.
    assert dist.ddp_params is not None
    full = step.full
    ref, user, opt = eager_reference(w.module, full.graph, full.input_values)  # type: ignore[attr-defined]
    eager_step(ref, user, opt)
    expected = dict(ref.named_parameters())
    assert set(dist.ddp_params) == set(expected)
    moved = False
    for name, p in expected.items():
        tol = TOLERANCES[p.dtype]
        torch.testing.assert_close(dist.ddp_params[name], p.detach(), atol=tol.atol, rtol=tol.rtol, msg=name)
        init = full.input_values[next(i.value for i in full.graph.inputs if i.name == name)]
        moved |= not torch.equal(init, p.detach())
    assert moved  # the step changed the parameters: the comparison is not of initial values


def test_span_step_times_use_one_clock() -> None:
    # Rank 1's clock reads 1000 ns behind rank 0's: its offset puts both steps on rank 0's clock.
    steps = [[(0, 500), (1000, 500)], [(-800, 600), (200, 900)]]
    assert span_step_times_s(steps, [0, 1000]) == (800e-9, 1100e-9)


def test_ratio_stats_median_and_quartiles() -> None:
    ratio, (lo, hi) = ratio_stats([2.0, 3.0, 4.0, 5.0, 6.0], [1.0] * 5)
    assert ratio == 4.0 and lo < 4.0 < hi


def test_a_plan_without_replicas_is_refused() -> None:
    w, _ = captured_workload("mlp")
    step = plan_step(w, 1, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    resolved = resolve(step.graph, Plan(threads=1), HOST2)
    with pytest.raises(SchedlabError, match="replicas"):
        compare_with_ddp(step, resolved, HOST2, spec="mlp", size="tiny", seed=0, repeats=1)


def test_cli_ddp_needs_a_data_parallel_plan(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "plan.json"
    assert main(["plan", "mlp", "--size", "tiny", "--threads", "1", "-o", str(plan)]) == 0
    assert main(["bench", "mlp", "--size", "tiny", "--plan", str(plan), "--ddp"]) == 2
    assert "replicas > 1" in capsys.readouterr().err
    assert main(["bench", "mlp", "--size", "tiny", "--ddp"]) == 2
    assert "replicas > 1" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_ddp_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "dp.json"
    assert main(["plan", "mlp", "--size", "tiny", "--devices", "2", "--replicas", "2", "--threads", "1",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["bench", "mlp", "--size", "tiny", "--plan", str(plan), "--ddp", "--repeats", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["results"]["mlp"]
    assert row["ranks"] == 2 and row["replicas"] == 2 and row["ratio_vs_ddp"] > 0
    assert len(row["schedlab_step_times_s"]) == len(row["ddp_step_times_s"]) == 2
