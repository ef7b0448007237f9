"""The numerics guard of a plan that splits a batch-norm model's batch (`split_batch_stats`):
eager PyTorch runs the same parts (`exec.check.eager_split_step`), so the check still
holds the executor to what such a plan promises, and still catches a wrong result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from schedlab.capture import capture
from schedlab.cli import main
from schedlab.exec.check import batch_parts, eager_reference, eager_split_step, output_diffs
from schedlab.graph import OutputRole
from schedlab.workloads import load_workload

MODEL = "cnn"  # batch norm in training: its statistics are the batch's


def _trace(capsys, tmp_path: Path, *plan_args: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    plan = tmp_path / "p.json"
    assert main(["plan", MODEL, "--size", "tiny", "--split-batch-stats", *plan_args, "-o", str(plan)]) == 0
    capsys.readouterr()
    rc = main(["trace", MODEL, "--size", "tiny", "--plan", str(plan), "--steps", "1", "--warmup", "0",
               "--out", str(tmp_path / "t.json"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return out  # type: ignore[no-any-return]


def test_micro_batches_on_one_device_match_eager_on_the_same_parts(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = _trace(capsys, tmp_path, "--micro-batches", "2", "--schedule", "gpipe")
    assert out["numerics_ok"] and out["worst_ratio"] <= 1.0


def test_replicas_on_two_ranks_match_eager_on_the_same_parts(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = _trace(capsys, tmp_path, "--devices", "2", "--replicas", "2", "--threads", "1")
    assert out["ranks"] == 2 and out["numerics_ok"]


def test_the_split_reference_is_not_the_full_batch_and_catches_a_wrong_gradient() -> None:
    w = load_workload(MODEL, "tiny")
    c = capture(w)
    split = {o.value: t for (o, t) in zip(c.graph.outputs, _eager_outputs(w, c, parts=2), strict=True)}
    # the parts' batch statistics are not the batch's: the full-batch reference rejects them
    assert not all(d.ok for _, d in output_diffs(w.module, c.graph, c.input_values, split))
    assert all(d.ok for _, d in output_diffs(w.module, c.graph, c.input_values, split, parts=2))
    grad = next(o for o in c.graph.outputs if o.role is OutputRole.GRAD)
    wrong = {**split, grad.value: split[grad.value] * 1.01}
    bad = [d.name for _, d in output_diffs(w.module, c.graph, c.input_values, wrong, parts=2) if not d.ok]
    assert f"grad {grad.name}" in bad and all(b.endswith(f" {grad.name}") for b in bad)  # and its update


def test_batch_parts_splits_only_batch_statistics() -> None:
    cnn = capture(load_workload(MODEL, "tiny")).graph
    mlp = capture(load_workload("mlp", "tiny")).graph
    marked = dataclasses.replace(cnn, meta={**cnn.meta, "replicas": 2, "micro_batches": 3})
    assert batch_parts(cnn, marked) == 6
    assert batch_parts(cnn, None) == 1 and batch_parts(cnn, cnn) == 1
    assert batch_parts(mlp, marked) == 1  # no batch norm: the full batch's step is the reference


def _eager_outputs(w, c, parts: int) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """The graph's outputs (loss, gradients, updated parameters, buffers) as eager PyTorch
    computes them over `parts` parts of the batch."""
    ref, user, opt = eager_reference(w.module, c.graph, c.input_values)
    loss = eager_split_step(ref, user, opt, parts).detach()
    values = {
        OutputRole.LOSS: {None: loss},
        OutputRole.GRAD: {n: p.grad for n, p in ref.named_parameters()},
        OutputRole.PARAM: {n: p.detach() for n, p in ref.named_parameters()},
        OutputRole.BUFFER: dict(ref.named_buffers()),
    }
    roles = {o.role for o in c.graph.outputs}
    if not roles <= values.keys():
        pytest.skip(f"{MODEL}'s step has outputs of roles {roles - values.keys()}, not built here")
    return [values[o.role][None if o.role is OutputRole.LOSS else o.name] for o in c.graph.outputs]
