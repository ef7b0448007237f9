"""Models that draw random numbers pass the numerics check on every executor (`schedlab.rng`)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from schedlab.cli import main
from schedlab.plan import Plan
from schedlab.rng import EagerSeeded, random_op_index, seeded, seeded_random, split_batch_draws
from schedlab.workloads import load_workload

DROPOUT_MODEL = "tests.fixtures.random_models:dropout_mlp"
NOISE_MODEL = "tests.fixtures.random_models:reparameterised"


def test_under_the_check_a_dropout_keeps_every_element_scaled_as_a_real_draw_would() -> None:
    x = torch.randn(4, 6, requires_grad=True)
    with seeded_random(), EagerSeeded():
        y = torch.nn.functional.dropout(x, 0.25, True)  # eager CPU: a bernoulli, a scale, a product
    assert torch.allclose(y, x / 0.75)
    y.sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, torch.full_like(x, 1 / 0.75))
    op = torch.ops.aten.native_dropout.default  # the captured graph's form
    _, mask = seeded(op, 0, "aten.native_dropout.default")(torch.randn(4096), 0.25, True)
    assert not bool(mask.all())  # off the check: a real draw drops some
    with seeded_random():
        out, mask = seeded(op, 0, "aten.native_dropout.default")(x.detach(), 0.25, True)
    assert bool(mask.all()) and torch.allclose(out, x.detach() / 0.75)


def test_seeded_draws_depend_on_the_ops_place_not_on_order_or_thread() -> None:
    randn = seeded(torch.ops.aten.randn_like.default, 3, "aten.randn_like.default")
    x = torch.empty(1000)
    with seeded_random():
        first = randn(x)
        torch.rand(5)  # other draws in between change nothing
        again: list[torch.Tensor] = []
        t = threading.Thread(target=lambda: again.append(randn(x)))
        t.start()
        t.join()
        other = seeded(torch.ops.aten.randn_like.default, 4, "aten.randn_like.default")(x)
    assert torch.equal(first, again[0]) and not torch.equal(first, other)
    with seeded_random(), EagerSeeded():  # eager's 4th draw (k = 3) is the executor's op of k = 3
        eager = [torch.randn_like(x) for _ in range(4)]
    assert torch.equal(eager[3], first)
    state = torch.get_rng_state()
    with seeded_random():
        randn(x)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was


def test_random_ops_are_numbered_in_graph_order() -> None:
    from schedlab.capture import capture

    graph = capture(load_workload(NOISE_MODEL)).graph
    index = random_op_index(graph)
    assert [graph.ops[i].target for i in index] == ["aten.randn_like.default"] and list(index.values()) == [0]
    assert split_batch_draws(graph) == []  # one replica, one micro-batch


@pytest.mark.parametrize("plan", [Plan(), Plan(slots=2, threads=1, order="random:1")])
def test_a_dropout_model_matches_eager_in_one_process(plan: Plan, capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    plan.save(path)
    rc = main(["trace", DROPOUT_MODEL, "--plan", str(path), "--steps", "2", "--out", str(tmp_path / "t.json"), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["numerics_ok"], d.get("numeric_check", d)


def test_a_dropout_model_matches_eager_over_split_batches_on_ranks(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "dp.json"
    assert main(["plan", DROPOUT_MODEL, "--devices", "2", "--replicas", "2", "-o", str(path)]) == 0
    capsys.readouterr()
    rc = main(["trace", DROPOUT_MODEL, "--plan", str(path), "--steps", "1", "--warmup", "0",
               "--out", str(tmp_path / "t.json"), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["ranks"] == 2 and d["numerics_ok"]


def test_noise_over_a_split_batch_is_said_to_be_the_draws(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "dp.json"
    assert main(["plan", NOISE_MODEL, "--devices", "2", "--replicas", "2", "-o", str(path)]) == 0
    capsys.readouterr()
    main(["trace", NOISE_MODEL, "--plan", str(path), "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "aten.randn_like.default" in out and "splits the batch" in out
