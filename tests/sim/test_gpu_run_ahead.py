"""The host runs ahead of its GPU (`sim.model`): a chain of GPU ops is dispatched back to
back while the kernels run, as CUDA's asynchronous launches let PyTorch do; what reads a
GPU result on the host side waits for the kernel."""

from __future__ import annotations

import pytest

from schedlab.graph import Graph
from schedlab.machine import Device, Link, Machine
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.testing import GraphBuilder, TableCost

DISPATCH_US = 10.0
KERNEL_US = 100.0


def machine(streams: int) -> Machine:
    return Machine(
        name="one-gpu",
        devices=(
            Device(id="gpu0", kind="cuda", cores=1, memory_bytes=2**34, streams=streams),
            Device(id="cpu0", kind="cpu", cores=1, memory_bytes=2**34),
        ),
        links=(Link(src="gpu0", dst="cpu0", bw_bytes_per_s=1e12, latency_s=0.0),
               Link(src="cpu0", dst="gpu0", bw_bytes_per_s=1e12, latency_s=0.0)),
    )


def chain(n: int) -> Graph:
    g = GraphBuilder("chain")
    v = g.input("x", 64)
    for i in range(n):
        v = g.op(f"k{i}", [v], nbytes=64)
    g.output(v)
    return g.build()


def step_us(graph: Graph, m: Machine, **plan: object) -> float:
    cost = TableCost(default_kernel_us=KERNEL_US, dispatch=DISPATCH_US)
    return simulate(graph, resolve(graph, Plan(**plan), m), m, cost, record=False).step_time_s * 1e6  # type: ignore[arg-type]


@pytest.mark.parametrize("streams", [1, 2])
def test_a_chain_of_gpu_ops_is_issued_ahead_and_its_kernels_run_back_to_back(streams: int) -> None:
    # Host: 10 us per launch, all three by 30 us; GPU: 100 us each from 10 us on, in order.
    assert step_us(chain(3), machine(streams), device="gpu0") == pytest.approx(DISPATCH_US + 3 * KERNEL_US)


def test_host_bound_gpu_ops_take_the_hosts_issue_time() -> None:
    fast = TableCost(default_kernel_us=1.0, dispatch=DISPATCH_US)
    g, m = chain(50), machine(1)
    got = simulate(g, resolve(g, Plan(device="gpu0"), m), m, fast, record=False).step_time_s * 1e6  # type: ignore[arg-type]
    assert got == pytest.approx(50 * DISPATCH_US + 1.0)


def test_a_cpu_op_reading_a_gpu_result_waits_for_its_kernel() -> None:
    g = chain(2)
    m = machine(1)
    on_cpu = {g.ops[1].id: "cpu0"}
    # k0 on the GPU: launched at 10, ends at 110; its result then crosses to the CPU, where k1 runs.
    got = step_us(g, m, device="gpu0", op_devices=on_cpu)
    assert got >= DISPATCH_US + KERNEL_US + DISPATCH_US + KERNEL_US


class ContendedCost(TableCost):
    """TableCost with a GPU contention cost per op (`Profile.kind_contention_us`)."""

    def __init__(self, contention_us: float, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.contention_us = contention_us

    def kind_contention_us(self, kind: str) -> float:
        return self.contention_us if kind == "cuda" else 0.0


def parallel_chains(chains: int, n: int) -> Graph:
    g = GraphBuilder("chains")
    x = g.input("x", 64)
    ends = []
    for c in range(chains):
        v = x
        for i in range(n):
            v = g.op(f"c{c}k{i}", [v], nbytes=64)
        ends.append(v)
    for v in ends:
        g.output(v)
    return g.build()


def test_workers_issuing_at_once_pay_the_locks_hand_offs() -> None:
    g = parallel_chains(2, 40)
    host_bound = {"default_kernel_us": 1.0, "dispatch": DISPATCH_US}

    def got(contention_us: float, slots: int, device: str = "gpu0") -> float:
        m = machine(slots)
        cost = ContendedCost(contention_us, **host_bound)
        plan = resolve(g, Plan(device=device, slots=slots), m)
        return simulate(g, plan, m, cost, record=False).step_time_s * 1e6  # type: ignore[arg-type]

    # One slot, or no contention cost: the 80 launches back to back, as before.
    assert got(5.0, 1) == pytest.approx(got(0.0, 1)) == pytest.approx(80 * DISPATCH_US + 1.0)
    assert got(0.0, 2) == pytest.approx(80 * DISPATCH_US + 1.0)
    # Two workers on two chains: each takes the lock with the other queued, log2(2) = 1 hand-off each.
    assert got(5.0, 2) == pytest.approx(80 * (DISPATCH_US + 5.0), rel=0.05)
    # The cost is the GPU's: the same plan on a CPU device does not pay it.
    cpu = Machine(name="cpu", devices=(Device(id="cpu0", kind="cpu", cores=2, memory_bytes=2**34),))
    plan = resolve(g, Plan(slots=2, threads=1), cpu)
    on_cpu = [simulate(g, plan, cpu, ContendedCost(h, **host_bound), record=False).step_time_s  # type: ignore[arg-type]
              for h in (0.0, 5.0)]
    assert on_cpu[0] == on_cpu[1]
