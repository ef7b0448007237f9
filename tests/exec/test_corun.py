"""Co-running is real: two workers with one thread each overlap in time."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from schedlab.capture import capture
from schedlab.exec import Executor, run_steps
from schedlab.exec.runner import OpFailed
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
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


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("schedlab-worker")]


def _ended(threads: list[threading.Thread]) -> bool:
    for t in threads:
        t.join(timeout=5.0)
    return not any(t.is_alive() for t in threads)


def test_a_co_run_executor_keeps_its_workers_from_step_to_step() -> None:
    torch.manual_seed(0)
    w = Workload("two-branches", "-", TwoBranches(), (torch.randn(64, 384), torch.randn(64, 384)))
    c = capture(w, "sgd")
    before = set(_workers())
    resolved = resolve(c.graph, Plan(slots=2, threads=1), detect_host())
    ex = Executor(c.graph, resolved)
    seen: list[set[threading.Thread]] = []
    for _ in range(3):
        ex.step(c.input_values)
        seen.append(set(_workers()) - before)
    assert len(seen[0]) == 2 and seen[0] == seen[1] == seen[2]  # the same two threads each step
    ex.close()
    assert _ended(list(seen[0]))
    ex.step(c.input_values)  # closed, it starts new workers at its next step
    again = set(_workers()) - before
    assert len(again) == 2 and not again & seen[0]
    ex.close()
    assert _ended(list(again))


def test_run_steps_ends_the_workers_of_the_executor_it_made() -> None:
    torch.manual_seed(0)
    w = Workload("two-branches", "-", TwoBranches(), (torch.randn(64, 384), torch.randn(64, 384)))
    c = capture(w, "sgd")
    before = set(_workers())
    run_steps(c.graph, c.input_values, Plan(slots=2, threads=1), steps=2, warmup=1)
    assert _ended(list(set(_workers()) - before))


def test_a_failed_co_run_step_leaves_the_workers_able_to_run_the_next() -> None:
    torch.manual_seed(0)
    w = Workload("two-branches", "-", TwoBranches(), (torch.randn(64, 384), torch.randn(64, 384)))
    c = capture(w, "sgd")
    ex = Executor(c.graph, resolve(c.graph, Plan(slots=2, threads=1), detect_host()))
    good, _ = ex.step(c.input_values)
    bad = {v: (t[:3] if t.dim() == 2 and t.shape[0] == 64 else t) for v, t in c.input_values.items()}  # wrong batch
    with pytest.raises(OpFailed):
        ex.step(bad)
    again, _ = ex.step(c.input_values)
    assert all(torch.equal(good[v], again[v]) for v in good)
    ex.close()
