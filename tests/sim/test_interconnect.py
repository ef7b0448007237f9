"""Links: latency, bandwidth and contention (times in µs)."""

from __future__ import annotations

import pytest
import simpy

from schedlab.errors import SchedlabError
from schedlab.machine import Device, Link, Machine, load_machine
from schedlab.plan import Plan, resolve
from schedlab.sim import Network, TransferRecord, link_time_us, simulate
from schedlab.sim.testing import GraphBuilder, TableCost, place, two_device_machine
from tests.sim.conftest import spans

MB = 1_000_000
W = 1e9  # bytes/s: 1 MB takes 1000 µs
LAT = 5e-6  # 5 µs


def transfers(machine: Machine, *jobs: tuple[float, str, str, int]) -> list[TransferRecord]:
    """Run transfers (start µs, src, dst, bytes); return their records in job order."""
    env = simpy.Environment()
    net = Network(env, machine)
    procs: list[simpy.Process] = []

    def starter(at: float, src: str, dst: str, nbytes: int):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        rec = yield net.transfer(src, dst, nbytes)
        return rec

    for job in jobs:
        procs.append(env.process(starter(*job)))
    env.run()
    return [p.value for p in procs]


def test_one_transfer_alone() -> None:
    m = two_device_machine(W, LAT)
    (rec,) = transfers(m, (0.0, "a", "b", MB))
    assert rec.end_us == pytest.approx(1005.0)
    assert rec.end_us == pytest.approx(link_time_us(m.links[0], MB))
    assert (rec.src, rec.dst, rec.nbytes, rec.link) == ("a", "b", MB, 0)


def test_two_transfers_share_one_link() -> None:
    recs = transfers(two_device_machine(W, LAT), (0.0, "a", "b", MB), (0.0, "a", "b", MB))
    assert [r.end_us for r in recs] == pytest.approx([5 + 2000.0, 5 + 2000.0])  # latency + 2B/W


def test_two_transfers_on_separate_links_do_not_contend() -> None:
    devs = tuple(Device(id=i, kind="cpu", cores=1, memory_bytes=2**30) for i in ("a", "b", "c"))
    m = Machine("star", devs, (Link("a", "b", W, LAT, "l1"), Link("a", "c", W, LAT, "l2")))
    recs = transfers(m, (0.0, "a", "b", MB), (0.0, "a", "c", MB))
    assert [r.end_us for r in recs] == pytest.approx([1005.0, 1005.0])  # latency + B/W each


def test_unnamed_links_are_per_pair_and_named_links_share_a_wire() -> None:
    devs = tuple(Device(id=i, kind="cpu", cores=1, memory_bytes=2**30) for i in ("a", "b"))
    both_ways = Machine("duplex", devs, (Link("a", "b", W, 0.0), Link("b", "a", W, 0.0)))
    assert [r.end_us for r in transfers(both_ways, (0, "a", "b", MB), (0, "b", "a", MB))] == pytest.approx([1000, 1000])
    half_duplex = Machine("half", devs, (Link("a", "b", W, 0.0, "bus"), Link("b", "a", W, 0.0, "bus")))
    assert [r.end_us for r in transfers(half_duplex, (0, "a", "b", MB), (0, "b", "a", MB))] == pytest.approx([2000, 2000])


def test_a_late_transfer_shares_only_while_both_run() -> None:
    # t1 alone 0-500 (half done), shared 500-1500 (each 500 more): t1 ends 1500;
    # t2 then has 500 left alone: ends 2000.
    recs = transfers(two_device_machine(W, 0.0), (0.0, "a", "b", MB), (500.0, "a", "b", MB))
    assert [r.start_us for r in recs] == [0.0, 500.0]
    assert [r.end_us for r in recs] == pytest.approx([1500.0, 2000.0])


def test_dgx_nvlink_port_is_shared_by_everything_a_gpu_sends() -> None:
    m = load_machine("dgx-8gpu")
    recs = transfers(m, (0, "gpu0", "gpu1", MB), (0, "gpu0", "gpu2", MB), (0, "gpu3", "gpu1", MB))
    alone = 1e6 * MB / 300e9 + 5.0
    assert [r.end_us for r in recs] == pytest.approx([alone + MB * 1e6 / 300e9, alone + MB * 1e6 / 300e9, alone])


def test_routing() -> None:
    devs = tuple(Device(id=i, kind="cpu", cores=1, memory_bytes=2**30) for i in ("a", "b", "c"))
    m = Machine("line", devs, (Link("a", "b", W, 0.0),))
    net = Network(simpy.Environment(), m)
    assert net.route("a", "b") == 0
    assert net.route("b", "a") == 0  # a link listed once serves both ways
    with pytest.raises(SchedlabError, match="no link between 'a' and 'c'"):
        net.route("a", "c")
    (rec,) = transfers(m, (0.0, "a", "a", MB))
    assert (rec.end_us, rec.link) == (0.0, -1)  # within one device: free


def two_device_graph() -> GraphBuilder:
    """p (on a) writes 1 MB; q and r (on b) read it; s (on a) reads q and r."""
    g = GraphBuilder("two")
    x = g.input("x", 100)
    p = g.op("p", [x], nbytes=MB)
    q = g.op("q", [p], nbytes=10)
    r = g.op("r", [p], nbytes=10)
    g.output(g.op("s", [q, r], nbytes=10))
    return g


def test_engine_sends_values_between_devices() -> None:
    g = two_device_graph().build()
    m = two_device_machine(W, LAT)
    resolved = place(resolve(g, Plan(slots=2, threads=1), m), ["a", "b", "b", "a"])
    res = simulate(g, resolved, m, TableCost(default_kernel_us=10.0))
    assert res.engine == "simpy"
    # p 0-10; one send of p's 1 MB to b 10-1015; q, r 1015-1025; their 10 B each go back
    # together on the a->b link (listed once: serves both ways) at 1025: 2*10 B / W = 0.02
    # µs + 5 µs; s 1030.02-1040.02.
    assert spans(res.trace) == (  # ns in the trace: exact
        [
            ("p", 0, 10, 0),
            ("send 1", 10, 1015, -1),
            ("q", 1015, 1025, 0),
            ("r", 1015, 1025, 1),
            ("send 2", 1025, 1030.02, -1),
            ("send 3", 1025, 1030.02, -1),
            ("s", 1030.02, 1040.02, 0),
        ]
    )
    assert res.trace is not None
    comm = [e for e in res.trace.events if e.kind == "COMM"]
    assert [(e.op, e.device, e.threads) for e in comm] == [(1, "a", 0), (3, "b", 0), (3, "b", 0)]
    # Memory on b: the received copy of p (1 MB) and q, r; on a: x, p (freed after the
    # send ends), the copies of q and r, and s.
    assert res.peak_memory_bytes == {"a": 100 + MB, "b": MB + 20}


def test_gpu_kernels_run_on_streams_after_host_dispatch() -> None:
    # One slot dispatches 5 independent ops on gpu0 (10 µs each under the lock) and
    # moves on; kernels (100 µs) run on 4 streams, the 5th waits for a free one.
    g = GraphBuilder("gpu")
    x = g.input("x", 64)
    for i in range(5):
        g.output(g.op(f"k{i}", [x], nbytes=64), f"k{i}")
    graph = g.build()
    m = load_machine("dgx-8gpu")
    res = simulate(graph, resolve(graph, Plan(slots=1), m), m, TableCost(default_kernel_us=100.0, dispatch=10.0))
    assert spans(res.trace) == (
        [("k0", 0, 110, 0), ("k1", 10, 120, 0), ("k2", 20, 130, 0), ("k3", 30, 140, 0), ("k4", 40, 210, 0)]
    )
    assert res.busy_core_s["gpu0"] == pytest.approx(500e-6)  # stream-seconds
