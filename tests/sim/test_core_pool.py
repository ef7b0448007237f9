"""Ranks that share a host's cores (a core pool): their kernels time-share the pool's cores."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import Device, Machine, host_ranks
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.sim import simulate
from schedlab.sim.fluid import PooledShare
from schedlab.sim.testing import GraphBuilder, TableCost, place, random_cost
from tests.calibrate.factories import make_profile
from tests.conftest import captured_workload

KERNEL_US = 100.0
TWO_CORES = Machine("two-cores", (Device("cpu0", "cpu", 2, 8 * 2**30),))


def four_ranks(pool_cores: int | None) -> Machine:
    """Four one-core ranks, sharing `pool_cores` cores (None: a core each, no pool)."""
    pool = "host" if pool_cores else ""
    devices = tuple(Device(f"cpu{i}", "cpu", 1, 2**40, process=i, core_pool=pool) for i in range(4))
    return Machine("test-pool", devices, core_pools={pool: pool_cores} if pool_cores else {})


def chains(lengths: tuple[int, ...]) -> tuple[Graph, tuple[str, ...]]:
    """Independent chains of 100 us ops, chain i on rank i; and each op's device."""
    b = GraphBuilder("chains")
    device: list[str] = []
    for i, n in enumerate(lengths):
        v = b.input(f"x{i}")
        for k in range(n):
            v = b.op(f"c{i}_{k}", [v])
            device.append(f"cpu{i}")
        b.output(v, f"y{i}")
    return b.build(), tuple(device)


def placed(graph: Graph, device: tuple[str, ...], machine: Machine) -> ResolvedPlan:
    return place(resolve(graph, Plan(slots=1, threads=1), machine), device)


def step_us(lengths: tuple[int, ...], pool_cores: int | None) -> float:
    m = four_ranks(pool_cores)
    g, device = chains(lengths)
    return simulate(g, placed(g, device, m), m, TableCost(default_kernel_us=KERNEL_US)).step_time_s * 1e6


def test_four_busy_ranks_on_two_cores_take_twice_as_long_as_on_four() -> None:
    assert step_us((3, 3, 3, 3), None) == pytest.approx(300.0)
    assert step_us((3, 3, 3, 3), 4) == pytest.approx(300.0)
    assert step_us((3, 3, 3, 3), 2) == pytest.approx(600.0)
    assert step_us((3, 3, 3, 3), 1) == pytest.approx(1200.0)


def test_a_rank_that_goes_idle_leaves_its_core_to_the_others() -> None:
    # Two 300 us chains and two 100 us ones on 2 cores: all four at half speed until the
    # short ones end at 200 us, then the long ones at full speed: 400 us. A fixed split
    # of half a core per rank would give 600.
    assert step_us((3, 3, 1, 1), 2) == pytest.approx(400.0)


def test_each_ranks_busy_core_time_is_its_own_work() -> None:
    m = four_ranks(2)
    g, device = chains((3, 3, 1, 1))
    res = simulate(g, placed(g, device, m), m, TableCost(default_kernel_us=KERNEL_US))
    assert res.busy_core_s == pytest.approx({"cpu0": 300e-6, "cpu1": 300e-6, "cpu2": 100e-6, "cpu3": 100e-6})


def test_the_ranks_python_time_needs_the_pools_cores_too() -> None:
    # 100 us of dispatch then a 100 us kernel per op, on four ranks: alone, 200 us; on
    # two cores the four dispatches share them (200 us), then the four kernels (200 us).
    m = four_ranks(2)
    g, device = chains((1, 1, 1, 1))
    cost = TableCost(default_kernel_us=KERNEL_US, dispatch=100.0)
    res = simulate(g, placed(g, device, m), m, cost)
    assert res.step_time_s * 1e6 == pytest.approx(400.0)
    assert res.busy_core_s == pytest.approx({f"cpu{i}": 100e-6 for i in range(4)})  # kernels only
    alone = four_ranks(None)
    assert simulate(g, placed(g, device, alone), alone, cost).step_time_s * 1e6 == pytest.approx(200.0)


def test_data_parallel_ranks_on_a_pool_never_do_more_than_its_cores_worth_of_work() -> None:
    from schedlab.data_parallel import replica_graph

    g = replica_graph(captured_workload("mlp")[1].graph, 4)  # type: ignore[attr-defined]
    pooled = host_ranks(4, TWO_CORES)
    free = dataclasses.replace(
        pooled, devices=tuple(dataclasses.replace(d, core_pool="") for d in pooled.devices), core_pools={}
    )
    steps_us, work_us = {}, {}
    for label, m in (("pooled", pooled), ("free", free)):
        res = simulate(g, resolve(g, Plan(replicas=4, bucket_mb=0.002, order="w-last"), m), m, random_cost(2))
        assert res.engine == "simpy" and res.collective_count > 1
        steps_us[label], work_us[label] = res.step_time_s * 1e6, sum(res.busy_core_s.values()) * 1e6
    assert steps_us["pooled"] >= work_us["pooled"] / 2  # two cores' worth at most
    assert steps_us["free"] < work_us["free"] / 2  # four ranks of a core each do more
    assert steps_us["pooled"] > 1.5 * steps_us["free"]


def test_co_run_slowdown_sees_the_other_ranks_on_the_pools_cores() -> None:
    seen: list[tuple[int, int]] = []

    def corun(_op: Any, busy: int, total: int) -> float:
        seen.append((busy, total))
        return 1.0 + 0.5 * busy / total

    m = four_ranks(2)
    g, device = chains((1, 1))
    res = simulate(g, placed(g, device, m), m, TableCost(default_kernel_us=KERNEL_US, corun=corun))
    assert (1, 2) in seen and res.step_time_s * 1e6 == pytest.approx(125.0)


def test_pooled_share_splits_busy_time_by_group_and_sums_to_the_total() -> None:
    fluid = PooledShare(2, None, group_of=[0, 1, 1], n_groups=2)
    for key in (0, 1, 2):
        fluid.start(0.0, key, 1, 300.0)
    while fluid.next_delay(0.0) is not None:
        delay = fluid.next_delay(0.0)
        assert delay is not None
        fluid.advance(fluid._last_us + delay)
    assert fluid.busy_by_group == pytest.approx([300.0, 600.0])
    assert sum(fluid.busy_by_group) == pytest.approx(fluid.busy_unit_us)


def test_more_local_ranks_than_cores_share_one_pool_of_the_hosts_cores() -> None:
    four = host_ranks(4, TWO_CORES)
    assert four.core_pools == {"host": 2}
    assert {d.core_pool for d in four.devices} == {"host"} and {d.cores for d in four.devices} == {1}
    assert four.pool_cores(four.devices[0]) == 2
    two = host_ranks(2, TWO_CORES)
    assert two.core_pools == {} and {d.core_pool for d in two.devices} == {""}
    assert four.first_devices(3).core_pools == {"host": 2}
    back = Machine.from_json(json.loads(json.dumps(four.to_json())))
    assert back.core_pools == four.core_pools and back.devices == four.devices


@pytest.mark.parametrize(
    ("edit", "msg"),
    [
        (lambda d: d.pop("core_pools"), "core_pool 'host' is not in the machine's core_pools"),
        (lambda d: d.update(core_pools={"host": 0}), "core pool 'host': cores must be >= 1"),
        (lambda d: d.update(core_pools=[2]), "core_pools: must map pool names to core counts"),
        (lambda d: d.update(core_pools={"host": "two"}), "core_pools: field 'host' must be an integer"),
        (lambda d: d["devices"][0].update(kind="cuda"), "only CPU devices share a core pool"),
    ],
)
def test_a_bad_core_pool_is_one_clear_error(edit: Any, msg: str) -> None:
    d = host_ranks(4, TWO_CORES).to_json()
    edit(d)
    with pytest.raises(SchedlabError, match=msg):
        Machine.from_json(d)


def test_simulate_says_when_the_ranks_share_the_hosts_cores(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from schedlab.cli import main
    from schedlab.machine import usable_cores

    more, plan = usable_cores() + 1, tmp_path / "p.json"
    assert main(["plan", "mlp", "--size", "tiny", "--devices", str(more), "--placement", "layers", "--threads", "1",
                 "-o", str(plan)]) == 0
    profile = make_profile().save(tmp_path / "profile.json")  # CI's clean clone has no calibrated one
    assert main(["simulate", "mlp", "--size", "tiny", "--plan", str(plan), "--profile", str(profile),
                 "--out", str(tmp_path / "t.json")]) == 0
    assert f"({more} ranks sharing {usable_cores()} cores)" in capsys.readouterr().out
