"""Baselines: PyTorch's default and TensorFlow's recommended threading, from /proc/cpuinfo."""

from __future__ import annotations

from schedlab.machine import detect_host
from schedlab.plan import resolve
from schedlab.search.baselines import (
    BASELINE_NAMES,
    baseline_plans,
    cpu_topology,
    pytorch_default,
    tensorflow_recommended,
)
from schedlab.sim.testing import cpu_machine
from tests.conftest import captured_workload


def _cpuinfo(sockets: int, cores_per_socket: int, threads_per_core: int) -> str:
    blocks = []
    for s in range(sockets):
        for c in range(cores_per_socket * threads_per_core):
            blocks.append(
                f"processor\t: {len(blocks)}\nmodel name\t: Test CPU\nphysical id\t: {s}\n"
                f"siblings\t: {cores_per_socket * threads_per_core}\ncore id\t\t: {c % cores_per_socket}\n"
                f"cpu cores\t: {cores_per_socket}\n"
            )
    return "\n".join(blocks)


def test_cpu_topology_counts_physical_cores_and_sockets() -> None:
    assert cpu_topology(_cpuinfo(2, 8, 2)) == (16, 2)
    assert cpu_topology(_cpuinfo(1, 4, 1)) == (4, 1)
    assert cpu_topology("") == (0, 0)


def test_tensorflow_recommended_threads_are_physical_cores_and_slots_sockets() -> None:
    text = _cpuinfo(2, 8, 2)
    plan = tensorflow_recommended(cpu_machine(32), text)
    assert (plan.threads, plan.slots, plan.order) == (16, 2, "topo")
    capped = tensorflow_recommended(cpu_machine(4), text)  # fewer usable cores than physical ones
    assert (capped.threads, capped.slots) == (4, 2)


def test_pytorch_default_is_one_op_at_a_time_on_all_cores() -> None:
    plan = pytorch_default(cpu_machine(8))
    assert (plan.slots, plan.threads, plan.order) == (1, None, "topo")


def test_baselines_resolve_on_this_host() -> None:
    graph = captured_workload("mlp")[1].graph  # type: ignore[attr-defined]
    host = detect_host()
    plans = baseline_plans(host)
    assert tuple(plans) == BASELINE_NAMES
    for name, plan in plans.items():
        assert plan.name == name
        resolve(graph, plan, host)
