"""`nn.LSTM` captured as eager runs it on a CPU (`schedlab.recurrent`): one fused oneDNN op
per layer and direction each way, the same numbers as eager, the patch undone after."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from schedlab.capture import capture
from schedlab.data_parallel import plan_step
from schedlab.exec import Executor
from schedlab.exec.check import check_step
from schedlab.exec.launch import run_ranks
from schedlab.flops import lstm_layer_backward_flops, lstm_layer_flops
from schedlab.graph import Graph, OpKind
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from schedlab.recurrent import FUSED_LSTM_TARGETS
from schedlab.workloads.loader import Workload
from tests.exec.test_dist_dp import HOST2

FORWARD, BACKWARD = FUSED_LSTM_TARGETS


class Tagger(nn.Module):
    def __init__(self, bidirectional: bool = False, proj_size: int = 0) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 12)
        self.lstm = nn.LSTM(12, 16, num_layers=2, batch_first=True, bidirectional=bidirectional, proj_size=proj_size)
        width = (proj_size or 16) * (2 if bidirectional else 1)
        self.out = nn.Linear(width, 5)

    def forward(self, tokens: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(tokens))
        return nn.functional.cross_entropy(self.out(h).flatten(0, 1), tags.flatten())


def workload(**kw: object) -> Workload:
    torch.manual_seed(0)
    return Workload("tagger", "tiny", Tagger(**kw), (torch.randint(30, (4, 7)), torch.randint(5, (4, 7))))  # type: ignore[arg-type]


def targets(g: Graph) -> list[str]:
    return [op.target for op in g.ops]


def run_and_check(w: Workload, g: Graph, input_values: dict[int, torch.Tensor]) -> None:
    executor = Executor(g, resolve(g, Plan(threads=1), detect_host()))
    check = check_step(w.module, g, input_values, lambda iv: executor.step(iv)[0])
    assert check.ok(), check.describe()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_each_layer_and_direction_is_one_fused_op_each_way_with_eagers_numbers(bidirectional: bool) -> None:
    w = workload(bidirectional=bidirectional)
    c = capture(w, "sgd")
    fused = 2 * (2 if bidirectional else 1)  # layers x directions
    assert targets(c.graph).count(FORWARD) == fused and targets(c.graph).count(BACKWARD) == fused
    kinds = {op.kind for op in c.graph.ops if op.target in FUSED_LSTM_TARGETS}
    assert kinds == {OpKind.F, OpKind.B}  # the backward makes input and weight gradients at once
    assert len(c.graph.ops) < 150  # not one cell per time step (unrolled, the one-direction tagger was 685 ops)
    run_and_check(w, c.graph, c.input_values)
    assert all(op.flops > 0 for op in c.graph.ops if op.target in FUSED_LSTM_TARGETS)


def test_an_lstm_eager_does_not_fuse_stays_unrolled_and_the_patch_is_undone() -> None:
    from torch._decomp import decompositions

    before = decompositions.select_one_layer_lstm_function
    w = workload(proj_size=8)  # projections: eager runs no oneDNN layer either
    c = capture(w, "sgd")
    assert not set(targets(c.graph)) & set(FUSED_LSTM_TARGETS)
    run_and_check(w, c.graph, c.input_values)
    assert decompositions.select_one_layer_lstm_function is before


def test_lstm_layer_flops_count_its_matmuls_and_cell() -> None:
    t, b, i, h = 5, 3, 12, 16
    x, w_ih = torch.empty(t, b, i), torch.empty(4 * h, i)
    matmuls = 2 * t * b * 4 * h * (i + h)
    assert lstm_layer_flops(x, w_ih) == matmuls + 13 * t * b * h
    assert lstm_layer_backward_flops(x, w_ih) == 2 * matmuls + 26 * t * b * h


def test_data_parallel_lstm_averages_each_bias_gradient_on_real_ranks() -> None:
    """The second bias's gradient is made from the first's; each replica makes it from
    its own, and each is averaged in its bucket (no cycle through the all-reduce)."""
    w = workload()
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))
    r = resolve(step.graph, Plan(threads=1, replicas=2, bucket_mb=0.001), HOST2)
    run_graph = r.run_graph(step.graph)
    res = run_ranks(step.graph, r, HOST2, step.inputs_for(run_graph), steps=1, warmup=0, timeout_s=60,
                    want_outputs=True)
    outputs = step.as_full(run_graph, res.outputs or {})
    check = check_step(w.module, step.full.graph, step.full.input_values, lambda iv: outputs)
    assert check.ok(), check.describe()
