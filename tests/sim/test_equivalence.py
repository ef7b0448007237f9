"""The fast loop and the SimPy model agree exactly, and both are deterministic."""

from __future__ import annotations

import random

import pytest

from schedlab.machine import load_machine
from schedlab.plan import Plan, resolve
from schedlab.sim import SimResult, simulate
from schedlab.sim.testing import TableCost, cpu_machine, place, random_cost, random_dag, random_plan


def rows(res: SimResult) -> list[list[object]]:
    assert res.trace is not None
    return [e.to_row() for e in res.trace.events]


def same(a: SimResult, b: SimResult) -> None:
    assert rows(a) == rows(b)
    assert a.step_time_s == b.step_time_s
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.busy_core_s == b.busy_core_s


@pytest.mark.parametrize("seed", range(12))
def test_fast_equals_simpy_on_random_graphs_and_plans(seed: int) -> None:
    rng = random.Random(seed)
    g = random_dag(rng.randint(20, 150), seed, window=rng.randint(3, 24), view_share=0.2)
    cores = rng.choice([1, 2, 4, 8, 68])
    m = cpu_machine(cores)
    resolved = resolve(g, random_plan(g, cores, seed, max_slots=8), m)
    cost = random_cost(seed, integer=seed % 2 == 0)  # integer times: many exact ties
    same(simulate(g, resolved, m, cost, engine="fast"), simulate(g, resolved, m, cost, engine="simpy"))


@pytest.mark.parametrize("seed", range(6))
def test_fast_equals_simpy_with_zero_times(seed: int) -> None:
    # Zero dispatch and zero-length kernels put many events on the same instant.
    g = random_dag(80, seed, window=6, view_share=0.3)
    m = cpu_machine(4)
    resolved = resolve(g, random_plan(g, 4, seed, max_slots=4), m)
    cost = TableCost(kernel=lambda op, k: float(op.id % 3 * 10 // k), dispatch=float(seed % 2))
    same(simulate(g, resolved, m, cost, engine="fast"), simulate(g, resolved, m, cost, engine="simpy"))


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_deterministic(engine: str) -> None:
    g = random_dag(200, 5)
    m = cpu_machine(8)
    resolved = resolve(g, Plan(slots=4, threads=3, order="critical-path"), m)
    runs = [simulate(g, resolved, m, random_cost(5), engine=engine) for _ in range(2)]
    same(*runs)


def test_deterministic_across_devices() -> None:
    g = random_dag(150, 6, window=6)
    m = load_machine("dgx-8gpu")
    resolved = place(resolve(g, Plan(slots=2), m), lambda i: f"gpu{(i // 20) % 3}")
    a, b = (simulate(g, resolved, m, random_cost(6)) for _ in range(2))
    same(a, b)
    assert any(r[2] == "COMM" for r in rows(a))
