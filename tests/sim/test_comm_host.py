"""A cost model that measured what COMM ops cost their rank (`sim.comm.CommHostCost`):
the simulator charges those parts instead of the ops' dispatch (times in µs)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedlab.distribute import ALL_REDUCE, RECV, SEND
from schedlab.graph import Op, OpKind
from schedlab.plan import resolve
from schedlab.sim import simulate
from schedlab.sim.comm import CommHostCost, CommOpCost
from schedlab.sim.testing import GraphBuilder, TableCost
from tests.sim.test_ranks import all_reduce_graph, by_name, hand_resolved, machine, one_transfer, us


@dataclasses.dataclass
class HostCost(TableCost):
    """Send 7 to post; recv 4 to post and 6 once its data is there; an all-reduce 5 + 20
    (flatten) to issue and 7 + 30 (average) to finish, its collective 40 + 1 µs per kB."""

    measured: bool = True

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        if not self.measured:
            return None
        if op.target == SEND:
            return CommOpCost(7.0)
        if op.target == RECV:
            return CommOpCost(4.0, 0.0, 6.0)
        if op.target == ALL_REDUCE:
            return CommOpCost(5.0, 20.0, 7.0, 30.0)
        return None

    def allreduce_us(self, nbytes: float, n_ranks: int) -> float | None:
        return 40.0 + nbytes / 1000.0


def test_the_protocol_is_optional() -> None:
    assert isinstance(HostCost(), CommHostCost)
    assert not isinstance(TableCost(), CommHostCost)


def test_send_and_recv_cost_what_the_model_measured() -> None:
    g, resolved, m, send, recv = one_transfer()
    # Dispatch 2 and 3 would be the ops' dispatch; the measured parts replace them. b posts
    # the recv 0-4; a: p 0-10, the send's call 10-17; the data arrives at 17 + 1000 + 5 =
    # 1022; b's wait 1022-1028 under its lock; q 1028-1038.
    cost = HostCost(default_kernel_us=10.0, dispatch={send.name: 2.0, recv.name: 3.0})
    res = simulate(g, resolved, m, cost)
    ev = by_name(res)
    assert [(n, us(ev[n].start_ns), us(ev[n].end_ns)) for n in ("p", send.name, recv.name, "q")] == [
        ("p", 0, 10), (send.name, 10, 17), (recv.name, 0, 1028), ("q", 1028, 1038),
    ]
    assert res.ranks[1].lock_busy_s == pytest.approx((4 + 6) * 1e-6)  # the recv's post and wait (q's dispatch: 0)
    # Without measurements: the dispatch costs, no wait (the older model).
    old = by_name(simulate(g, resolved, m, dataclasses.replace(cost, measured=False)))
    assert (us(old[send.name].end_ns), us(old[recv.name].end_ns), us(old["q"].end_ns)) == (12, 1017, 1027)


def test_an_all_reduce_issues_and_finishes_at_its_measured_costs() -> None:
    g, devices = all_reduce_graph(1)
    res = simulate(g, hand_resolved(g, devices), machine((0, 1)), HostCost(default_kernel_us=10.0, dispatch=0.0))
    e = by_name(res)["ar0a"]
    # The gradient 0-10; issue: 5 under the lock, the flatten 20 (10-35); the fit's 40 +
    # 1000; finish: 7 under the lock, the average 30: 1075 + 37 = 1112.
    assert (us(e.start_ns), us(e.end_ns)) == (10, 1112)
    old = by_name(simulate(g, hand_resolved(g, devices), machine((0, 1)),
                           HostCost(default_kernel_us=10.0, dispatch=0.0, measured=False)))["ar0a"]
    assert (us(old.start_ns), us(old.end_ns)) == (10, 20 + 40 + 1000 + 10)  # dispatch 0, kernel 10 twice


@dataclasses.dataclass
class CpuCollectiveCost(HostCost):
    """An all-reduce costs its ranks nothing to issue or finish; its collective keeps a core
    of each CPU member busy for `share` of its bandwidth part."""

    share: float = 1.0
    write: float = 0.0

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        if op.target != ALL_REDUCE:
            return None
        return CommOpCost(0.0, collective_cpu_share=self.share, write_us=self.write)


def collective_beside_a_kernel(share: float, write: float = 0.0) -> dict[str, Any]:
    """Per rank a, b: a gradient g (10), its all-reduce (1 MB: 40 + 1000 us on the link), a
    reader u (10); a also has w (2000), after its all-reduce's issue in a's sequence."""
    b = GraphBuilder("collective-cpu")
    xa, xb, y = b.input("xa", 64), b.input("xb", 64), b.input("y", 64)
    ga, gb = b.op("ga", [xa], nbytes=10**6), b.op("gb", [xb], nbytes=10**6)
    ara = b.op("ara", [ga], nbytes=10**6, target=ALL_REDUCE, kind=OpKind.COMM)
    arb = b.op("arb", [gb], nbytes=10**6, target=ALL_REDUCE, kind=OpKind.COMM)
    b.output(b.op("w", [y], nbytes=10), "w")
    b.output(b.op("ua", [ara], nbytes=10), "ua")
    b.output(b.op("ub", [arb], nbytes=10), "ub")
    g = b.build()
    ops = tuple(dataclasses.replace(op, kwargs={"bucket": 0, "group": ["a", "b"], "reduce": "avg"})
                if op.target == ALL_REDUCE else op for op in g.ops)
    g = dataclasses.replace(g, ops=ops)
    devices = ["a", "b", "a", "b", "a", "a", "b"]
    cost = CpuCollectiveCost(kernel={"ga": 10.0, "gb": 10.0, "w": 2000.0, "ua": 10.0, "ub": 10.0, "ara": 0.0,
                                     "arb": 0.0}, dispatch=0.0, share=share, write=write)
    return by_name(simulate(g, hand_resolved(g, devices), machine((0, 1)), cost))


@pytest.mark.parametrize(("share", "w_end", "reduced"), [(1.0, 3010, 2010), (0.5, 2510, 1050), (0.0, 2010, 1050)])
def test_a_collective_shares_its_ranks_cores_with_their_kernels(share: float, w_end: float, reduced: float) -> None:
    # Per rank a, b: a gradient g (10), its all-reduce (1 MB: 40 + 1000 us on the link), a
    # reader u (10); a also has w (2000), run while the collective is in flight. With share
    # 1 the collective needs a's one core for 1000 us: w and it take turns (half each)
    # until it is done at 2010; w ends at 3010. b's core is free: its part ends at 1010, the
    # link part at 1050, so the collective ends at 2010. With share 0.5: 500 us of core,
    # done at 1010 on a; the link's 1050 is then the end; w ends at 10 + 2000 + 500.
    ev = collective_beside_a_kernel(share)
    assert (us(ev["w"].start_ns), us(ev["w"].end_ns)) == pytest.approx((10, w_end))
    assert us(ev["arb"].end_ns) == pytest.approx(reduced)
    assert us(ev["ub"].start_ns) == pytest.approx(reduced)
    assert us(ev["ua"].start_ns) == pytest.approx(max(w_end, reduced))


@dataclasses.dataclass
class CpuTransferCost(HostCost):
    """A send's and a recv's transfer takes `send_cpu_us` and `recv_cpu_us` of a core at its
    end while in flight (gloo's socket thread on a CPU rank); a send's caller writes its data
    for `write_us` on its core."""

    send_cpu_us: float = 0.0
    recv_cpu_us: float = 0.0
    write_us: float = 0.0

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        if op.target == SEND:
            return CommOpCost(7.0, self.write_us, transfer_cpu_us=self.send_cpu_us)
        if op.target == RECV:
            return CommOpCost(4.0, 0.0, 6.0, transfer_cpu_us=self.recv_cpu_us)
        return None


def transfer_beside_a_kernel(send_cpu_us: float, recv_cpu_us: float, write_us: float = 0.0) -> dict[str, tuple[float, float]]:
    """p (a) sends 1 MB to q (b): 1000 us on the link, 5 latency; r (a, 2000 us) reads p too
    and runs while the transfer is in flight."""
    from tests.sim.test_ranks import producer_consumers

    g, plan = producer_consumers({"q": "b", "r": "a"})
    m = machine((0, 1))
    cost = CpuTransferCost(default_kernel_us=10.0, kernel={"r": 2000.0}, dispatch=0.0,
                           send_cpu_us=send_cpu_us, recv_cpu_us=recv_cpu_us, write_us=write_us)
    ev = by_name(simulate(g, resolve(g, plan, m), m, cost))
    return {n: (us(e.start_ns), us(e.end_ns)) for n, e in ev.items()}


@pytest.mark.parametrize(("send_cpu_us", "recv_cpu_us", "r_end", "recv_end"), [
    # None: a posts the send 10-17 and runs r 17-2017; the data is there at 17 + 1000 + 5,
    # b's wait takes 6: 1028.
    (0.0, 0.0, 2017, 1028),
    # The send's 1000 us of a's core beside r: each at half speed until the send's part is
    # done at 2017, r's last 1000 us alone; the data is b's only then: 2017 + 6.
    (1000.0, 0.0, 3017, 2023),
    # 500 us of core: done at 1017, before the link's 1022.
    (500.0, 0.0, 2517, 1028),
    # The receiver's core is idle while it waits: its part costs nothing more.
    (0.0, 1000.0, 2017, 1028),
])
def test_a_transfer_takes_its_share_of_the_core_at_each_end(
        send_cpu_us: float, recv_cpu_us: float, r_end: float, recv_end: float) -> None:
    ev = transfer_beside_a_kernel(send_cpu_us, recv_cpu_us)
    assert ev["r"] == pytest.approx((17, r_end))
    assert ev["recv v1:a->b"] == pytest.approx((0, recv_end))
    assert ev["q"] == pytest.approx((recv_end, recv_end + 10))


@pytest.mark.parametrize(("write_us", "send_cpu_us", "r_start", "r_end", "recv_end"), [
    # The caller writes 17-317 (a's worker waits: r starts after), the link carries the
    # data meanwhile: it is there at 17 + 1000 + 5, b's wait takes 6.
    (300.0, 0.0, 317, 2317, 1028),
    # A write longer than the link: the data is b's once written.
    (1500.0, 0.0, 1517, 3517, 1523),
    # The transfer's core share on a's side follows the write (both are the send's): r and
    # it at half speed from 317 until its 1000 us are done at 2317, r's last 1000 us alone.
    (300.0, 1000.0, 317, 3317, 2323),
])
def test_a_send_ends_once_its_caller_wrote_the_data(
        write_us: float, send_cpu_us: float, r_start: float, r_end: float, recv_end: float) -> None:
    ev = transfer_beside_a_kernel(send_cpu_us, 0.0, write_us)
    assert ev["send v1:a->b"] == pytest.approx((10, 17 + write_us))
    assert ev["r"] == pytest.approx((r_start, r_end))
    assert ev["recv v1:a->b"] == pytest.approx((0, recv_end))


@dataclasses.dataclass
class ColdCost(HostCost):
    """The ops after a send run `after_send_us` slower in all; after a recv, by how long it
    blocked: 1 µs when it did not, 20 after 100 µs, 40 after 2000 (linear between, flat after)."""

    after_send_us: float = 0.0

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        c = super().comm_host_us(op)
        if c is None:
            return None
        if op.target == SEND:
            return dataclasses.replace(c, after_us=self.after_send_us)
        return dataclasses.replace(c, after_wait=((0.0, 1.0), (100.0, 20.0), (2000.0, 40.0)))


@pytest.mark.parametrize(("waited_us", "cold_us"), [
    (0.0, 1.0), (50.0, 10.5), (100.0, 20.0), (1050.0, 30.0), (2000.0, 40.0), (10_000.0, 40.0),
])
def test_the_cold_cost_grows_with_how_long_a_wait_blocked(waited_us: float, cold_us: float) -> None:
    c = ColdCost().comm_host_us(Op(0, "r", RECV, OpKind.COMM, (), {}, (), (), 0.0, 0))
    assert c is not None and c.cold_us(waited_us) == pytest.approx(cold_us)


def test_the_ops_after_a_blocking_recv_and_a_send_start_later_by_their_cold_cost() -> None:
    g, resolved, m, send, recv = one_transfer()
    # As test_send_recv_costs_what_the_model_measured: b posts 0-4 and blocks from 4 until
    # the data is there at 1022 (1018 us: 20 + 20 * 918 / 1900 cold), waits 6 (1028); q
    # starts once the cold cost is paid. a's send ends at 17: a has no op after it.
    cold = 20.0 + 20.0 * 918.0 / 1900.0
    ev = by_name(simulate(g, resolved, m, ColdCost(default_kernel_us=10.0, dispatch=0.0, after_send_us=3.0)))
    assert (us(ev[recv.name].end_ns), us(ev["q"].start_ns), us(ev["q"].end_ns)) == pytest.approx(
        (1028, 1028 + cold, 1038 + cold))
    assert us(ev[send.name].end_ns) == pytest.approx(17)
    # A cost model that measured no cold cost: q starts when the recv ends.
    warm = by_name(simulate(g, resolved, m, HostCost(default_kernel_us=10.0, dispatch=0.0)))
    assert us(warm["q"].start_ns) == pytest.approx(1028)


def test_what_local_cpu_ranks_measured_does_not_price_gpus_on_other_links() -> None:
    """The fitted all-reduce and the host costs were measured between local CPU ranks
    (gloo on loopback): two GPUs on NVLink take the ring model and their dispatch instead."""
    from schedlab.machine import LOOPBACK_LINK, Device, Link, Machine
    from schedlab.sim.collective import allreduce_time

    g, devices = all_reduce_graph(1)
    cpus = machine((0, 1))
    gpus = Machine("two-gpus", tuple(Device(n, "cuda", 1, 2**40, process=p, peak_flops=1e12, mem_bw_bytes_per_s=1e12)
                                    for n, p in (("a", 0), ("b", 1))),
                   (Link("a", "b", 100e9, 2e-6, "nvlink"),))
    cost = HostCost(default_kernel_us=10.0, dispatch=0.0)
    assert allreduce_time(cpus, ["a", "b"], 10**6, cost).source == "fit"
    on_gpus = allreduce_time(gpus, ["a", "b"], 10**6, cost)
    assert on_gpus.source == "ring" and on_gpus.alone_us < 40.0  # 10 µs of bytes and 4 of latency, not the fit's 1040
    unmeasured = dataclasses.replace(cost, measured=False)
    assert us(by_name(simulate(g, hand_resolved(g, devices), gpus, cost))["ar0a"].end_ns) == us(
        by_name(simulate(g, hand_resolved(g, devices), gpus, unmeasured))["ar0a"].end_ns)
    assert LOOPBACK_LINK in {lk.name for lk in cpus.links}


@pytest.mark.parametrize(("write", "share", "w_start", "reduced"), [
    (600.0, 0.0, 610, 1050), (1500.0, 0.0, 1510, 1510), (600.0, 0.5, 610, 1610),
])
def test_an_exchange_issue_waits_while_its_caller_writes_the_bucket(
        write: float, share: float, w_start: float, reduced: float) -> None:
    # Between two ranks the executor's all-reduce is a send and a receive, and gloo writes
    # the bucket into the socket in the caller (`CommOpCost.write_us`): a's one worker
    # issues ara at 10 and waits for the write (to 10 + write) before w. The collective is
    # in flight from 10 (both issued), on the link until 1050, and ends no earlier than
    # both writes (1510 when they take 1500). With share 0.5, each member's 500 us of core
    # run after its write: on b alone (610-1110), on a beside w from 610, at half speed
    # (to 1610), which ends the collective.
    ev = collective_beside_a_kernel(share, write)
    assert us(ev["w"].start_ns) == pytest.approx(w_start)
    assert us(ev["arb"].end_ns) == pytest.approx(reduced)
    assert us(ev["ub"].start_ns) == pytest.approx(reduced)
