"""Co-running is real: two workers with one thread each overlap in time."""

from __future__ import annotations

import torch
from torch import nn

from schedlab.capture import capture
from schedlab.exec import run_steps
from schedlab.plan import Plan
from schedlab.workloads import Workload


class TwoBranches(nn.Module):
    """Two independent matmul branches: their ops can run side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(384, 384)
        self.b = nn.Linear(384, 384)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x).square().mean() + self.b(y).square().mean()


def test_two_slots_overlap_in_the_trace() -> None:
    torch.manual_seed(0)
    w = Workload("two-branches", "-", TwoBranches(), (torch.randn(512, 384), torch.randn(512, 384)))
    c = capture(w, "sgd")
    res = run_steps(c.graph, c.input_values, Plan(slots=2, threads=1), steps=5, warmup=1)
    evs = [e for e in res.trace.events if e.kind != "OVERHEAD"]
    assert {e.worker for e in evs} == {0, 1}
    overlaps = sum(
        1
        for a in evs
        for b in evs
        if a.worker == 0 and b.worker == 1 and a.step == b.step and a.start_ns < b.end_ns and b.start_ns < a.end_ns
    )
    assert overlaps > 0
