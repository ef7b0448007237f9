"""Baechi's heuristics (`search.placement.baechi`): m-TOPO, m-ETF, m-SCT on captured tiny
workloads and on hand-made DAGs whose best placement is known."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from functools import cache

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind, TensorMeta
from schedlab.machine import Device, Machine, load_machine
from schedlab.plan import resolve
from schedlab.search.placement.baechi import (
    BAECHI,
    favourite_children,
    favourite_parents,
    m_etf,
    m_sct,
    m_topo,
    solve_sct_lp,
)
from schedlab.search.placement.problem import Group, PlacementProblem, build_problem
from schedlab.sim.testing import TableCost, random_cost

HEURISTICS = tuple(BAECHI)
WORKLOADS = ("mlp", "transformer", "nmt", "cnn")


@cache
def _graph(workload: str) -> Graph:
    from schedlab.capture import capture
    from schedlab.workloads.loader import load_workload

    return capture(load_workload(workload, size="tiny")).graph


@cache
def _problem(workload: str, split_fbw: bool = False) -> PlacementProblem:
    return build_problem(_graph(workload), load_machine("dgx-8gpu", 4), random_cost(0), split_fbw=split_fbw)


def synthetic(
    preds: Sequence[Sequence[int]],
    *,
    time_us: float | Sequence[Sequence[float]] = 100.0,
    out_bytes: int | Sequence[int] = 1000,
    groups: Sequence[int] | None = None,
    n_devices: int = 4,
    bw_bytes_per_s: float = 1e9,
    latency_s: float = 0.0,
    capacity_bytes: int = 2**40,
) -> PlacementProblem:
    """A PlacementProblem over a hand-made op DAG: op i reads the outputs of `preds[i]`;
    `groups[i]` its group (default: one group per op); a group holds its ops' output bytes."""
    n = len(preds)
    nbytes = [out_bytes] * n if isinstance(out_bytes, int) else list(out_bytes)
    group_of = list(range(n)) if groups is None else list(groups)
    n_groups = max(group_of) + 1
    ops = tuple(
        Op(id=i, name=f"op{i}", target="aten.mm.default", kind=OpKind.F, args=(), kwargs={},
           inputs=tuple(sorted(set(preds[i]))), outputs=(i,), flops=0.0, bytes_moved=0, layer=f"l{group_of[i]}")
        for i in range(n)
    )
    graph = Graph(name="synthetic", inputs=(), outputs=(), ops=ops,
                  values=tuple(TensorMeta((1,), "float32", nbytes[i]) for i in range(n)))
    devs = tuple(Device(id=f"d{k}", kind="cpu", cores=1, memory_bytes=capacity_bytes) for k in range(n_devices))
    times = (
        tuple(tuple([float(time_us)] * n_devices) for _ in range(n))
        if isinstance(time_us, (int, float))
        else tuple(tuple(float(t) for t in row) for row in time_us)
    )
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for i, g in enumerate(group_of):
        members[g].append(i)
    mem = [0] * n_groups
    for i, g in enumerate(group_of):
        mem[g] += nbytes[i]
    links = {(a, b): (latency_s, bw_bytes_per_s) for a in range(n_devices) for b in range(n_devices) if a != b}
    return PlacementProblem(
        graph=graph, machine=Machine(name="synthetic", devices=devs), devices=devs,
        groups=tuple(Group(f"l{g}", f"l{g}", None, tuple(m)) for g, m in enumerate(members)),
        op_group=tuple(group_of), op_time_us=times, op_out_bytes=tuple(nbytes), group_mem_bytes=tuple(mem),
        capacity_bytes=tuple([capacity_bytes] * n_devices), _links=links,
    )


def chain(n: int) -> list[list[int]]:
    return [[i - 1] if i else [] for i in range(n)]


def random_dag(n: int, seed: int, max_preds: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [sorted(set(rng.sample(range(max(0, i - 50), i), min(i, rng.randint(1, max_preds))))) for i in range(n)]


def makespan_us(problem: PlacementProblem, group_device: Sequence[int]) -> float:
    """The step time of a placement under the list model the heuristics use (ops in id
    order, one at a time per device, transfers delaying inputs): an independent check."""
    free = [0.0] * problem.n_devices
    finish = [0.0] * len(problem.graph.ops)
    for op in problem.graph.ops:
        d = group_device[problem.op_group[op.id]]
        ready = max((finish[p] + problem.transfer_us(group_device[problem.op_group[p]], d, problem.op_out_bytes[p])
                     for p in problem.graph.preds[op.id]), default=0.0)
        finish[op.id] = max(free[d], ready) + problem.op_time_us[op.id][d]
        free[d] = finish[op.id]
    return max(finish, default=0.0)


# ---- captured workloads -------------------------------------------------------------------


@pytest.mark.parametrize("split_fbw", [False, True])
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_group_placed_and_the_plan_resolves(workload: str, split_fbw: bool) -> None:
    problem = _problem(workload, split_fbw)
    for name, heuristic in BAECHI.items():
        out = heuristic(problem)
        assert len(out) == problem.n_groups, name
        assert all(isinstance(d, int) and 0 <= d < problem.n_devices for d in out), name
        assert problem.memory_fits(out), name
        plan = problem.to_plan(out, name=name)
        resolved = resolve(problem.graph, plan, problem.machine)
        n = len(problem.graph.ops)  # the expanded graph's communication ops come after the graph's own
        assert resolved.device[:n] == problem.op_devices(out), name


@pytest.mark.parametrize("name", HEURISTICS)
def test_tight_memory_spreads_the_groups_and_is_respected(name: str) -> None:
    problem = _problem("transformer", True)
    total = sum(problem.group_mem_bytes)
    cap = max(max(problem.group_mem_bytes), int(total * 0.4))  # no device holds more than 40%
    tight = dataclasses.replace(problem, capacity_bytes=(cap,) * problem.n_devices)
    out = BAECHI[name](tight)
    assert tight.over_memory(out) == {}
    assert len(set(out)) >= 3


@pytest.mark.parametrize("name", HEURISTICS)
def test_memory_that_cannot_hold_the_groups_raises(name: str) -> None:
    problem = _problem("transformer")
    total = sum(problem.group_mem_bytes)
    too_small = dataclasses.replace(problem, capacity_bytes=(int(total / problem.n_devices * 0.9),) * problem.n_devices)
    with pytest.raises(SchedlabError, match="no placement fits in memory"):
        BAECHI[name](too_small)
    big = max(problem.group_mem_bytes)  # enough in all, but the largest group fits no device
    split = dataclasses.replace(problem, capacity_bytes=(big - 1,) * problem.n_devices)
    assert (big - 1) * problem.n_devices >= total
    with pytest.raises(SchedlabError, match="more than any device"):
        BAECHI[name](split)


@pytest.mark.parametrize("name", HEURISTICS)
def test_deterministic(name: str) -> None:
    problem = _problem("nmt", True)
    first = BAECHI[name](problem)
    again = BAECHI[name](dataclasses.replace(problem))  # a fresh object: no cached state
    assert first == again


class GpuRooflineCost(TableCost):
    """A cost model calibrated on the CPU only (slow kernels there); GPUs by the preset's roofline."""

    def calibrated_kinds(self) -> dict[str, str]:
        return {"cpu": "test cpu table"}

    def kind_kernel_us(self, op: Op, kind: str) -> float | None:
        return None

    def kind_launch_us(self, kind: str) -> float:
        return 5.0

    def kind_issue_us(self, op: Op, kind: str) -> float | None:
        return None


@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_etf_puts_the_work_on_the_gpus_not_the_slow_cpu(workload: str) -> None:
    problem = build_problem(_graph(workload), load_machine("cpu-2gpu"), GpuRooflineCost(default_kernel_us=2000.0))
    cpu = next(i for i, d in enumerate(problem.devices) if d.kind == "cpu")
    assert problem.group_time_us[0][cpu] > 10 * min(problem.group_time_us[0])  # the CPU really is slower
    for heuristic in (m_etf, m_sct):
        out = heuristic(problem)
        on_cpu = sum(problem.group_time_us[g][cpu] for g, d in enumerate(out) if d == cpu)
        assert on_cpu == 0.0, heuristic.__name__
        heaviest = max(range(problem.n_groups), key=lambda g: min(problem.group_time_us[g]))
        assert problem.devices[out[heaviest]].kind == "cuda"


# ---- hand-made DAGs -----------------------------------------------------------------------


def test_a_chain_with_costly_links_stays_on_one_device() -> None:
    problem = synthetic(chain(12), out_bytes=10**7, bw_bytes_per_s=1e9)  # 10 ms per hop vs 100 µs ops
    for heuristic in (m_etf, m_sct):
        out = heuristic(problem)
        assert len(set(out)) == 1, heuristic.__name__
        assert makespan_us(problem, out) == pytest.approx(1200.0)


def test_independent_heavy_branches_spread_over_the_devices() -> None:
    # a light source, four heavy branches of three ops each, a light sink; cheap links
    preds: list[list[int]] = [[]]
    for _ in range(4):
        head = len(preds)
        preds += [[0], [head], [head + 1]]
    preds.append([3, 6, 9, 12])
    times = [[1.0] * 4] + [[1000.0] * 4] * 12 + [[1.0] * 4]
    problem = synthetic(preds, time_us=times, out_bytes=100, bw_bytes_per_s=1e10, latency_s=1e-6)
    for heuristic in (m_etf, m_sct):
        out = heuristic(problem)
        branch_devices = {out[1 + 3 * b] for b in range(4)}
        assert len(branch_devices) == 4, heuristic.__name__
        for b in range(4):  # each branch whole on one device
            assert out[1 + 3 * b] == out[2 + 3 * b] == out[3 + 3 * b]
        assert makespan_us(problem, out) < 3100.0  # vs 12002 µs on one device


def test_an_op_of_a_placed_group_follows_its_group() -> None:
    # chains 0 -> 2 -> 4 and 1 -> 3 -> 5; the two sources share group 0, so op 1 waits for
    # op 0 on its device (though another is idle), and op 2 (ready there at the same time,
    # a larger id) moves to another device
    groups = [0, 0, 1, 2, 3, 4]
    problem = synthetic([[], [], [0], [1], [2], [3]], groups=groups, out_bytes=10, bw_bytes_per_s=1e12)
    out = m_etf(problem)
    assert out[1] != out[0]  # op 2's group
    assert out[2] == out[0]  # op 3 stays after op 1
    assert makespan_us(problem, out) == pytest.approx(400.0, abs=1.0)


def test_topo_splits_a_uniform_chain_into_contiguous_balanced_runs() -> None:
    problem = synthetic(chain(12))
    assert m_topo(problem) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    uneven = synthetic(chain(10), n_devices=3)
    out = m_topo(uneven)
    assert out == sorted(out) and set(out) == {0, 1, 2}


def test_topo_moves_on_when_memory_is_full_and_shares_by_speed() -> None:
    roomy = synthetic(chain(6), out_bytes=100, n_devices=2)
    assert m_topo(roomy) == [0, 0, 0, 1, 1, 1]
    small_first = dataclasses.replace(roomy, capacity_bytes=(250, 10**6))  # device 0 holds two groups
    out = m_topo(small_first)
    assert out == [0, 0, 1, 1, 1, 1]
    assert small_first.over_memory(out) == {}
    # device 0 runs everything 3x faster than device 1: it takes 3/4 of the chain
    fast = synthetic(chain(8), time_us=[[10.0, 30.0]] * 8, n_devices=2)
    assert m_topo(fast) == [0, 0, 0, 0, 0, 0, 1, 1]


def test_heuristics_on_a_random_dag_place_everything_within_memory() -> None:
    preds = random_dag(600, seed=3)
    rng = random.Random(5)
    out_bytes = [rng.randint(1, 10**6) for _ in preds]
    groups = [i // 6 for i in range(len(preds))]  # runs of six ops
    loose = synthetic(preds, out_bytes=out_bytes, groups=groups, n_devices=8, latency_s=1e-5)
    total = sum(loose.group_mem_bytes)
    problem = dataclasses.replace(loose, capacity_bytes=(int(total / 8 * 1.3),) * 8)
    for name, heuristic in BAECHI.items():
        out = heuristic(problem)
        assert len(out) == problem.n_groups and problem.over_memory(out) == {}, name
        assert len(set(out)) >= 7, name  # 1.3x an even share: every device but at most one is needed


def reference_list_schedule(problem: PlacementProblem, fav_parent: Sequence[int] | None = None) -> list[int]:
    """The list scheduling of m-ETF / m-SCT by its definition, every (ready op, device) pair
    recomputed at every step (quadratic): what the heap bookkeeping must reproduce."""
    n, n_dev = len(problem.graph.ops), problem.n_devices
    gdev = [-1] * problem.n_groups
    used = [0] * n_dev
    free = [0.0] * n_dev
    op_dev = [-1] * n
    finish = [0.0] * n
    done: set[int] = set()

    def allowed(j: int, d: int) -> bool:
        g = problem.op_group[j]
        return gdev[g] == d if gdev[g] >= 0 else used[d] + problem.group_mem_bytes[g] <= problem.capacity_bytes[d]

    def start(j: int, d: int) -> float:
        data = max((finish[p] + problem.transfer_us(op_dev[p], d, problem.op_out_bytes[p])
                    for p in problem.graph.preds[j]), default=0.0)
        return max(free[d], data)

    while len(done) < n:
        ready = [j for j in range(n) if j not in done and all(p in done for p in problem.graph.preds[j])]
        pairs = [
            (start(j, d), 0 if fav_parent is not None and fav_parent[j] >= 0 and op_dev[fav_parent[j]] == d else 1, j)
            for j in ready for d in range(n_dev) if allowed(j, d)
        ]
        if not pairs:
            raise SchedlabError("stuck")
        j = min(pairs)[2]
        fin = {d: start(j, d) + problem.op_time_us[j][d] for d in range(n_dev) if allowed(j, d)}
        dev = min(fin, key=lambda d: (fin[d], d))
        if fav_parent is not None and fav_parent[j] >= 0:
            home = op_dev[fav_parent[j]]
            saved = problem.transfer_us(home, dev, problem.op_out_bytes[fav_parent[j]])
            if home in fin and fin[home] <= fin[dev] + saved:
                dev = home
        g = problem.op_group[j]
        if gdev[g] < 0:
            gdev[g] = dev
            used[dev] += problem.group_mem_bytes[g]
        op_dev[j], finish[j], free[dev] = dev, fin[dev], fin[dev]
        done.add(j)
    return gdev


@pytest.mark.parametrize("seed", range(6))
def test_list_scheduling_matches_its_definition(seed: int) -> None:
    rng = random.Random(seed)
    n, n_dev = 60, 3
    preds = random_dag(n, seed, max_preds=2)
    times = [[float(rng.choice([10, 20, 40])) * (1 + d % 2) for d in range(n_dev)] for _ in range(n)]
    out_bytes = [rng.choice([0, 10**4, 10**5]) for _ in range(n)]
    groups = [rng.randrange(20) for _ in range(n)]  # groups scattered over the DAG
    used_groups = sorted(set(groups))
    groups = [used_groups.index(g) for g in groups]
    problem = synthetic(preds, time_us=times, out_bytes=out_bytes, groups=groups, n_devices=n_dev,
                        bw_bytes_per_s=1e9, latency_s=5e-6)
    total = sum(problem.group_mem_bytes)
    cap = max(max(problem.group_mem_bytes), int(total * 0.45))
    tight = dataclasses.replace(problem, capacity_bytes=(cap,) * n_dev)
    for prob in (problem, tight):
        try:
            want = reference_list_schedule(prob)
        except SchedlabError:
            with pytest.raises(SchedlabError):
                m_etf(prob)
        else:
            assert m_etf(prob) == want
        fav = favourite_parents(solve_sct_lp(prob), n)
        try:
            want = reference_list_schedule(prob, fav)
        except SchedlabError:
            with pytest.raises(SchedlabError):
                m_sct(prob)
        else:
            assert m_sct(prob) == want


# ---- m-SCT's linear program ---------------------------------------------------------------


def test_lp_makes_the_heavy_branch_the_favourite() -> None:
    # s -> A (heavy), s -> B (light); A, B -> t; a transfer costs 10 µs
    problem = synthetic([[], [0], [0], [1, 2]], time_us=[[5.0] * 2, [100.0] * 2, [1.0] * 2, [5.0] * 2],
                        out_bytes=0, latency_s=10e-6, n_devices=2)
    lp = solve_sct_lp(problem)
    assert lp.makespan_us == pytest.approx(110.0)  # s, A, t with no transfer on the heavy path
    assert favourite_children(lp, 4) == (1, 3, -1, -1)  # s -> A -> t is the favourite path
    assert favourite_parents(lp, 4) == (-1, 0, -1, 1)
    assert lp.x[lp.edges.index((0, 2))] == pytest.approx(1.0)  # B pays its transfers


def test_lp_constraints_hold_and_favourites_are_a_matching() -> None:
    problem = _problem("nmt")
    lp = solve_sct_lp(problem)
    tol = 1e-6 * max(1.0, lp.makespan_us)
    n = len(problem.graph.ops)
    for (i, j), x, c in zip(lp.edges, lp.x, lp.edge_cost_us):
        assert -1e-9 <= x <= 1 + 1e-9
        assert lp.start_us[j] >= lp.start_us[i] + lp.op_time_us[i] + c * x - tol
    assert all(lp.start_us[i] + lp.op_time_us[i] <= lp.makespan_us + tol for i in range(n))
    out_deg = [len(problem.graph.succs[i]) for i in range(n)]
    x_out = [0.0] * n
    for (i, _), x in zip(lp.edges, lp.x):
        x_out[i] += x
    assert all(x_out[i] >= out_deg[i] - 1 - 1e-6 for i in range(n) if out_deg[i])
    child = favourite_children(lp, n)
    assert sum(c >= 0 for c in child) > n // 4  # the LP makes many edges favourite
    picked = [c for c in child if c >= 0]
    assert len(picked) == len(set(picked))  # at most one favourite parent per op
    assert all(c in problem.graph.succs[i] for i, c in enumerate(child) if c >= 0)
    assert lp.makespan_us >= max(lp.op_time_us)


def test_sct_runs_the_favourite_child_on_its_parents_device() -> None:
    # source 0 feeds a 150 µs child 1 and a 500 µs child 2 (the favourite); the transfer of
    # its output costs 100 µs. ETF runs child 1 first (smaller id) on the source's device and
    # moves child 2 off (610 µs); SCT runs the urgent favourite there and moves child 1 (510 µs).
    problem = synthetic([[], [0], [0]], time_us=[[10.0] * 2, [150.0] * 2, [500.0] * 2],
                        out_bytes=[10**5, 0, 0], bw_bytes_per_s=1e9, n_devices=2)
    lp = solve_sct_lp(problem)
    assert favourite_children(lp, 3) == (2, -1, -1)
    assert lp.makespan_us == pytest.approx(510.0)
    etf, sct = m_etf(problem), m_sct(problem)
    assert etf[1] == etf[0] != etf[2]
    assert sct[2] == sct[0] != sct[1]
    assert makespan_us(problem, etf) == pytest.approx(610.0)
    assert makespan_us(problem, sct) == pytest.approx(510.0)


@pytest.mark.slow
def test_large_graph_runs_within_seconds() -> None:
    preds = random_dag(6000, seed=1)
    problem = synthetic(preds, out_bytes=[(i * 7919) % 10**6 for i in range(6000)], groups=[i // 4 for i in range(6000)],
                        n_devices=8, latency_s=1e-5)
    for name, heuristic in BAECHI.items():
        t0 = time.perf_counter()
        out = heuristic(problem)
        assert len(out) == problem.n_groups
        assert time.perf_counter() - t0 < 20.0, name
