"""The fast loop and the SimPy model agree exactly, and both are deterministic."""

from __future__ import annotations

import random

import pytest

from schedlab.machine import load_machine
from schedlab.plan import Plan, resolve
from schedlab.sim import SimResult, Simulator, simulate
from schedlab.sim.testing import TableCost, cpu_machine, place, random_cost, random_dag, random_plan
from tests.sim.conftest import rows


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


@pytest.mark.parametrize("seed", range(16))
def test_compiled_equals_fast_and_simpy_on_random_graphs_and_plans(seed: int) -> None:
    rng = random.Random(100 + seed)
    g = random_dag(rng.randint(20, 400), seed, window=rng.randint(3, 24), view_share=0.2)
    cores = rng.choice([1, 2, 4, 8, 68])
    m = cpu_machine(cores)
    resolved = resolve(g, random_plan(g, cores, seed, max_slots=8), m)
    cost = random_cost(seed, integer=seed % 2 == 0)
    compiled = simulate(g, resolved, m, cost, engine="compiled")
    same(compiled, simulate(g, resolved, m, cost, engine="fast"))
    if seed < 6:
        same(compiled, simulate(g, resolved, m, cost, engine="simpy"))
    # The search's path (no trace) gives the same step time, memory peak and busy time.
    quiet = Simulator(g, m, cost).run(resolved, record=False)
    assert quiet.engine == "compiled"
    assert (quiet.step_time_s, quiet.peak_memory_bytes, quiet.busy_core_s) == (
        compiled.step_time_s, compiled.peak_memory_bytes, compiled.busy_core_s)


@pytest.mark.parametrize("seed", range(4))
def test_compiled_equals_fast_with_zero_times(seed: int) -> None:
    g = random_dag(80, seed, window=6, view_share=0.3)
    m = cpu_machine(4)
    resolved = resolve(g, random_plan(g, 4, seed, max_slots=4), m)
    cost = TableCost(kernel=lambda op, k: float(op.id % 3 * 10 // k), dispatch=float(seed % 2))
    same(simulate(g, resolved, m, cost, engine="compiled"), simulate(g, resolved, m, cost, engine="fast"))


def test_reused_simulator_gives_each_plan_what_a_fresh_one_gives() -> None:
    g = random_dag(300, 11, window=12)
    m = cpu_machine(4)
    cost = random_cost(11)
    sim = Simulator(g, m, cost)
    for seed in range(6):
        resolved = resolve(g, random_plan(g, 4, seed, max_slots=4), m)
        again = sim.run(resolved, record=False)
        fresh = simulate(g, resolved, m, cost, record=False)
        assert again.step_time_s == fresh.step_time_s and again.peak_memory_bytes == fresh.peak_memory_bytes


@pytest.mark.parametrize("engine", ["fast", "simpy", "compiled"])
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


@pytest.mark.parametrize("seed", range(8))
def test_compiled_one_device_structure_equals_the_python_one(seed: int) -> None:
    import numpy as np

    from schedlab.sim.compiled import flatten
    from schedlab.sim.flatgraph import flat_single_device
    from schedlab.sim.prepare import build_structure

    rng = random.Random(200 + seed)
    g = random_dag(rng.randint(1, 300), seed, window=rng.randint(2, 20), view_share=0.3)
    want = flatten(build_structure(g, (0,) * len(g.ops), 1))
    got = flat_single_device(g)
    for field in ("pending", "succ_ptr", "succ_idx", "rel_ptr", "rel_idx", "alloc_bytes", "storage_refs", "storage_bytes"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    assert got.initial_live == want.initial_live


def test_compiled_structure_of_a_captured_workload() -> None:
    import numpy as np

    from schedlab.sim.compiled import flatten
    from schedlab.sim.flatgraph import flat_single_device
    from schedlab.sim.prepare import build_structure
    from tests.conftest import captured_workload

    _, cap = captured_workload("nmt")
    g = cap.graph  # type: ignore[attr-defined]
    want = flatten(build_structure(g, (0,) * len(g.ops), 1))
    got = flat_single_device(g)
    for field in ("pending", "succ_idx", "rel_idx", "storage_refs", "storage_bytes"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field


class _SharedPoolCost(TableCost):
    """Some kernels scale with threads, some do not; the pool is shared (TensorFlow's)."""

    shares_idle_threads = True


class _AtenCost(TableCost):
    """Some kernels scale with threads, some do not and ran inline (ATen's)."""

    inlines_small_calls = True


@pytest.mark.parametrize("cost_type", [_SharedPoolCost, _AtenCost])
@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_when_kernels_hold_fewer_cores_than_threads(seed: int, cost_type: type[TableCost]) -> None:
    rng = random.Random(300 + seed)
    g = random_dag(rng.randint(40, 200), seed, window=rng.randint(3, 16), view_share=0.2)
    cores = rng.choice([2, 4, 8])
    m = cpu_machine(cores)
    resolved = resolve(g, random_plan(g, cores, seed, max_slots=4), m)
    cost = cost_type(kernel=lambda op, k: 50.0 + op.id % 7 * 20.0 / (k if op.id % 2 else 1), dispatch=2.0,
                           corun=lambda op, b, c: 1.0 + 0.3 * b / c)
    compiled = simulate(g, resolved, m, cost, engine="compiled")
    same(compiled, simulate(g, resolved, m, cost, engine="fast"))
    same(compiled, simulate(g, resolved, m, cost, engine="simpy"))
    quiet = Simulator(g, m, cost).run(resolved, record=False)
    assert (quiet.step_time_s, quiet.busy_core_s) == (compiled.step_time_s, compiled.busy_core_s)


def test_a_kernel_that_cannot_use_its_threads_leaves_them_to_others_in_a_shared_pool() -> None:
    from schedlab.sim.testing import fork_join

    g = fork_join(2)
    m = cpu_machine(2)
    resolved = resolve(g, Plan(slots=2, threads=2), m)
    flat = {"b0": 100.0, "b1": 100.0}  # the branches do not speed up with a second thread
    team = TableCost(kernel=flat, default_kernel_us=0.0)
    pool = _SharedPoolCost(kernel=flat, default_kernel_us=0.0)
    # OpenMP teams hold 2 cores each: 4 threads on 2 cores, both branches stretched to 200 us
    assert simulate(g, resolved, m, team).step_time_s == pytest.approx(200e-6)
    # one shared pool: each branch keeps one core busy, and they run side by side
    assert simulate(g, resolved, m, pool).step_time_s == pytest.approx(100e-6)
