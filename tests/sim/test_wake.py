"""The wake cost of throttled OpenMP helpers: where the simulator charges it (times in µs)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from schedlab.graph import Graph, Op
from schedlab.plan import Plan, resolve
from schedlab.sim import SimResult, Simulator, simulate
from schedlab.sim.testing import (
    GraphBuilder,
    RandomCost,
    TableCost,
    chain,
    cpu_machine,
    independent,
    random_dag,
    random_plan,
)
from schedlab.sim.wake import busy_share, first_shares, idle_share, wake_table, with_wake
from tests.sim.conftest import rows, spans

ENGINES = ("fast", "simpy", "compiled")


@dataclass
class WakingCost(TableCost):
    """A TableCost whose ops pay `wake` µs to wake their helpers at two or more threads."""

    wake: float = 20.0

    def wake_us(self, op: Op, threads: int) -> float:
        return self.wake if threads >= 2 and not op.is_view else 0.0


@dataclass
class RegionWakingCost(WakingCost):
    """A WakingCost whose call beside a busy team pays `region` µs of its wake."""

    region: float = 10.0

    def region_wake_us(self, threads: int) -> float:
        return self.region if threads >= 2 else 0.0


@dataclass(frozen=True)
class WakingRandomCost(RandomCost):
    def wake_us(self, op: Op, threads: int) -> float:
        return 0.0 if op.is_view or threads < 2 else self._draw("wake:" + op.name, 0.0, 80.0)

    def region_wake_us(self, threads: int) -> float:
        return 0.0 if threads < 2 else self._draw(f"region:{threads}", 5.0, 60.0)




def run(graph: GraphBuilder | Graph, plan: Plan, cores: int, cost: TableCost, engine: str) -> SimResult:
    g = graph.build() if isinstance(graph, GraphBuilder) else graph
    m = cpu_machine(cores)
    return simulate(g, resolve(g, plan, m), m, cost, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_co_run_plan_pays_the_wake_of_each_multi_thread_op_that_runs_alone(engine: str) -> None:
    cost = WakingCost(kernel={"op0": 100.0, "op1": 200.0})
    # Two slots of two threads: each op runs alone on 2 cores, its helper finds the other
    # core idle: 100 * (1 + 20/100) and 200 * (1 + 20/200).
    woken = run(chain(2), Plan(slots=2, threads=2), 2, cost, engine)
    assert spans(woken.trace) == [("op0", 0, pytest.approx(120), 0), ("op1", pytest.approx(120), pytest.approx(340), 0)]
    # One slot (the main thread's one team fits the cores) or one thread (no helper): nothing.
    assert run(chain(2), Plan(slots=1, threads=2), 2, cost, engine).step_time_s == pytest.approx(300e-6)
    assert run(chain(2), Plan(slots=2, threads=1), 2, cost, engine).step_time_s == pytest.approx(300e-6)


@dataclass
class InlineWakingCost(WakingCost):
    """ATen's rule for cores (`sim.cost.team_or_inline`): a kernel no faster at more threads ran inline."""

    inlines_small_calls: ClassVar[bool] = True


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_run_inline_wakes_no_helper(engine: str) -> None:
    # op0 is no faster at two threads, so it ran inline: no team, no helper, no wake;
    # op1 halves at two threads and pays its wake: 100 * (1 + 20/100).
    cost = InlineWakingCost(kernel=lambda op, k: 200.0 / k if op.name == "op1" else 100.0)
    res = run(chain(2), Plan(slots=2, threads=2), 2, cost, engine)
    assert spans(res.trace) == [("op0", 0, pytest.approx(100), 0), ("op1", pytest.approx(100), pytest.approx(220), 0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_helper_that_shares_a_busy_core_pays_no_wake(engine: str) -> None:
    cost = WakingCost(kernel={"a": 100.0, "b": 300.0})
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, cost, engine)
    # Together: 4 threads on 2 cores, half speed each and no idle core, so no wake; a ends
    # at 200 with b 100 done. Then b alone wakes its helper: its last 200 at 1 / (1 + 20/300).
    assert spans(res.trace) == [("a", 0, pytest.approx(200), 0), ("b", 0, pytest.approx(200 + 200 * 16 / 15), 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_beside_a_busy_team_pays_its_first_regions_wake(engine: str) -> None:
    cost = RegionWakingCost(kernel={"a": 100.0, "b": 300.0})
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, cost, engine)
    # Together, each helper lands on a core the other team keeps busy and pays one region's
    # 10 of its 20 us of wake: a at 0.5 / (1 + 20/100 * 0.5) ends at 220, b has done
    # 220 * 0.5 / (1 + 20/300 * 0.5) by then, and its rest alone pays the whole wake.
    b_done = 220 * 0.5 / (1 + 20 / 300 * 0.5)
    b_end = 220 + (300 - b_done) * (1 + 20 / 300)
    assert spans(res.trace) == [("a", 0, pytest.approx(220), 0), ("b", 0, pytest.approx(b_end), 1)]
    # A region's wake above the call's whole wake is charged as the whole wake.
    whole = run(independent("a", "b"), Plan(slots=2, threads=2), 2, RegionWakingCost(kernel=cost.kernel, region=500.0), engine)
    assert spans(whole.trace)[0] == ("a", 0, pytest.approx(100 * 1.2 / 0.5), 0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("cost_type", [WakingCost, RegionWakingCost])
def test_a_core_kept_awake_by_a_worker_dispatching_python_wakes_no_helper(engine: str, cost_type: type[WakingCost]) -> None:
    # A core running a worker's Python holds no team: nothing to wait out beside it either.
    cost = cost_type(kernel={"a": 300.0, "b": 0.0}, dispatch={"a": 0.0, "b": 100.0})
    res = run(independent("a", "b"), Plan(slots=2, threads=2), 2, cost, engine)
    # a's kernel starts at 0; the other worker dispatches b under the lock until 100, so a's
    # helper finds no halted core and a runs at full speed. From 100 the other core idles:
    # a's last 200 at 1 / (1 + 20/300).
    assert spans(res.trace) == [("a", 0, pytest.approx(100 + 200 * 16 / 15, abs=1e-3), 0), ("b", 0, pytest.approx(100), 1)]


def test_idle_share_counts_the_cores_the_others_leave_idle() -> None:
    assert idle_share(0, 2, 2) == 1.0
    assert idle_share(1, 2, 2) == 0.0
    assert idle_share(10, 8, 16) == pytest.approx(5 / 7)  # 16 - 1 - 10 idle for 7 helpers
    assert idle_share(0, 1, 16) == 0.0  # no helper
    assert idle_share(0, 2, 2, held=1) == 0.0  # the other core runs a worker's Python
    assert idle_share(0, 4, 8, held=1) == 1.0  # 6 idle cores for 3 helpers


def test_busy_share_counts_the_helpers_landing_beside_other_kernels() -> None:
    assert busy_share(0, 2, 2) == 0.0
    assert busy_share(1, 2, 2) == 1.0
    assert busy_share(2, 2, 2) == 1.0
    assert busy_share(10, 8, 16) == pytest.approx(2 / 7)  # 5 idle cores for 7 helpers
    assert busy_share(3, 1, 4) == 0.0  # no helper


def test_a_call_pays_one_regions_wake_beside_a_busy_team_and_at_most_its_whole_wake() -> None:
    shares = first_shares(np.array([0.0, 20.0, 5.0, 100.0]), np.array([10.0, 10.0, 10.0, 0.0]))
    assert shares.tolist() == [0.0, 0.5, 1.0, 0.0]


@pytest.mark.parametrize("with_firsts", [False, True])
def test_the_table_and_the_function_give_the_same_floats(with_firsts: bool) -> None:
    rng = np.random.default_rng(0)
    n, cores = 40, 8
    table = 1.0 + rng.random((n, cores + 1))
    fractions = np.where(rng.random(n) < 0.3, 0.0, rng.random(n))
    threads = rng.integers(1, cores + 1, n)
    firsts = rng.random(n) if with_firsts else None
    for held in (0, 1):
        scaled = wake_table(table, fractions, threads, cores, held, firsts=firsts)
        fn = with_wake(lambda op, busy: float(table[op, busy]), fractions.tolist(), threads.tolist(), cores, held,
                       firsts=firsts.tolist() if firsts is not None else None)
        assert all(scaled[o, b] == fn(o, b) for o in range(n) for b in range(cores + 1))
        assert (scaled >= table).all() and (scaled > table).any()
    if firsts is not None:  # beside busy cores, more than the idle share alone
        assert (wake_table(table, fractions, threads, cores, firsts=firsts) > wake_table(table, fractions, threads, cores)).any()


@pytest.mark.parametrize("seed", range(10))
def test_engines_agree_exactly_with_wake_costs(seed: int) -> None:
    rng = random.Random(300 + seed)
    g = random_dag(rng.randint(20, 300), seed, window=rng.randint(3, 24), view_share=0.2)
    cores = rng.choice([2, 4, 8])
    m = cpu_machine(cores)
    resolved = resolve(g, random_plan(g, cores, seed, max_slots=4), m)
    cost = WakingRandomCost(seed, integer=seed % 2 == 0)
    compiled = simulate(g, resolved, m, cost, engine="compiled")
    fast = simulate(g, resolved, m, cost, engine="fast")
    assert rows(compiled) == rows(fast)
    if seed < 4:
        assert rows(simulate(g, resolved, m, cost, engine="simpy")) == rows(fast)
    quiet = Simulator(g, m, cost).run(resolved, record=False)
    assert quiet.engine == "compiled" and quiet.step_time_s == compiled.step_time_s
    plain = simulate(g, resolved, m, RandomCost(seed, integer=seed % 2 == 0), engine="compiled")
    if resolved.slots >= 2 and max(resolved.threads) >= 2:
        assert compiled.step_time_s >= plain.step_time_s
    else:
        assert compiled.step_time_s == plain.step_time_s


@dataclass(frozen=True)
class InlineWakingRandomCost(WakingRandomCost):
    """About a third of the ops no faster at more threads: those ran inline."""

    inlines_small_calls: ClassVar[bool] = True

    def kernel_us(self, op: Op, threads: int) -> float:
        inline = self._draw("inline:" + op.name, 0.0, 1.0) < 0.35
        return super().kernel_us(op, 1 if inline else threads)


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_exactly_with_wake_costs_and_inline_calls(seed: int) -> None:
    rng = random.Random(700 + seed)
    g = random_dag(rng.randint(20, 300), seed, window=rng.randint(3, 24), view_share=0.2)
    cores = rng.choice([2, 4])
    m = cpu_machine(cores)
    resolved = resolve(g, random_plan(g, cores, seed, max_slots=4), m)
    cost = InlineWakingRandomCost(seed, integer=seed % 2 == 0)
    compiled = simulate(g, resolved, m, cost, engine="compiled")
    assert rows(compiled) == rows(simulate(g, resolved, m, cost, engine="fast"))
    assert rows(compiled) == rows(simulate(g, resolved, m, cost, engine="simpy"))
    assert Simulator(g, m, cost).run(resolved, record=False).step_time_s == compiled.step_time_s


def test_a_reused_simulator_charges_each_plan_its_own_wake() -> None:
    g = random_dag(200, 5, window=10)
    m = cpu_machine(2)
    cost = WakingRandomCost(5)
    sim = Simulator(g, m, cost)
    for plan in (Plan(slots=2, threads=2), Plan(slots=1, threads=2), Plan(slots=2, threads=1), Plan(slots=2, threads=2)):
        resolved = resolve(g, plan, m)
        assert sim.run(resolved, record=False).step_time_s == simulate(g, resolved, m, cost).step_time_s
