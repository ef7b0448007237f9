"""Several processes (ranks), explicit send/recv and all-reduce ops (times in µs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from schedlab.distribute import ALL_REDUCE, RECV, SEND
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind
from schedlab.machine import LOOPBACK_LINK, Device, Link, Machine, host_ranks, load_machine
from schedlab.plan import Plan, ResolvedPlan, list_schedule, resolve
from schedlab.sim import SimResult, Simulator, simulate
from schedlab.sim.testing import GraphBuilder, TableCost, random_cost, random_dag, random_plan
from schedlab.trace import TraceEvent
from tests.conftest import captured_workload
from tests.sim.conftest import spans

MB = 1_000_000
W = 1e9  # bytes/s: 1 MB takes 1000 µs
LAT = 5e-6  # 5 µs


def machine(
    processes: Sequence[int], links: Sequence[tuple[str, str, str]] = (("a", "b", LOOPBACK_LINK),), cores: int = 1
) -> Machine:
    """CPU devices "a", "b", ... driven by `processes`, joined by `links` (src, dst, name):
    by default one loopback wire, as between local ranks (where a fitted all-reduce applies)."""
    names = "abcd"[: len(processes)]
    devs = tuple(
        Device(id=n, kind="cpu", cores=cores, memory_bytes=2**40, process=p) for n, p in zip(names, processes, strict=True)
    )
    return Machine("test-ranks", devs, tuple(Link(s, d, W, LAT, name) for s, d, name in links))


def by_name(res: SimResult) -> dict[str, TraceEvent]:
    assert res.trace is not None
    return {e.name: e for e in res.trace.events}


def us(ns: int) -> float:
    return ns / 1000


# ---- processes and their interpreter locks -------------------------------------------------


def two_chains() -> Graph:
    b = GraphBuilder("two-chains")
    for c in "ab":
        v = b.input(f"x{c}", 64)
        for i in range(3):
            v = b.op(f"{c}{i}", [v], nbytes=64)
        b.output(v, f"out{c}")
    return b.build()


@pytest.mark.parametrize(("processes", "step_us"), [((0, 1), 180.0), ((0, 0), 310.0)])
def test_each_process_has_its_own_lock(processes: tuple[int, int], step_us: float) -> None:
    # Dispatch 50 (under the lock), kernel 10: a chain alone takes 3 x 60 = 180. Two ranks
    # run their chains side by side; two devices of one process take turns on its lock:
    # a0 0-60, b0 50-110, a1 100-160, b1 150-210, a2 200-260, b2 250-310.
    g = two_chains()
    m = machine(processes)
    plan = Plan(device="a", op_devices={op.id: "b" for op in g.ops if op.name.startswith("b")})
    resolved = resolve(g, plan, m)
    res = simulate(g, resolved, m, TableCost(default_kernel_us=10.0, dispatch=50.0))
    assert res.engine == "simpy"
    assert res.step_time_s == pytest.approx(step_us * 1e-6)
    if processes == (0, 0):
        assert spans(res.trace) == [
            ("a0", 0, 60, 0), ("b0", 50, 110, 0), ("a1", 100, 160, 0),
            ("b1", 150, 210, 0), ("a2", 200, 260, 0), ("b2", 250, 310, 0),
        ]
    ev = by_name(res)
    assert {n: ev[n].rank for n in ev} == {n: processes[0] if n[0] == "a" else processes[1] for n in ev}
    assert set(res.ranks) == set(processes)
    assert sum(r.lock_busy_s for r in res.ranks.values()) == pytest.approx(6 * 50e-6)


def test_slots_are_per_device() -> None:
    # Four independent ops on b (2 cores) with two slots there run two at a time; a's one
    # slot runs its op alone.
    b = GraphBuilder("fan")
    xa, xb = b.input("xa", 64), b.input("xb", 64)
    for name in ("a0", "b0", "b1", "b2", "b3"):
        b.output(b.op(name, [xa if name[0] == "a" else xb], nbytes=64), name)
    g = b.build()
    m = Machine("two", (Device("a", "cpu", 1, 2**40, process=0), Device("b", "cpu", 2, 2**40, process=1)),
                (Link("a", "b", W, LAT, "wire"),))
    plan = Plan(device="a", op_devices={op.id: "b" for op in g.ops if op.name[0] == "b"}, threads=1,
                device_slots={"b": 2})
    res = simulate(g, resolve(g, plan, m), m, TableCost(default_kernel_us=100.0))
    ev = by_name(res)
    assert [(ev[n].worker, us(ev[n].start_ns), us(ev[n].end_ns)) for n in ("b0", "b1", "b2", "b3")] == [
        (0, 0, 100), (1, 0, 100), (0, 100, 200), (1, 100, 200)
    ]
    assert (us(ev["a0"].start_ns), us(ev["a0"].end_ns)) == (0, 100)


# ---- send and recv ---------------------------------------------------------------------------


def producer_consumers(consumers: Mapping[str, str]) -> tuple[Graph, Plan]:
    """p (on a) writes 1 MB; each consumer (name -> device) reads it."""
    b = GraphBuilder("p2p")
    x = b.input("x", 100)
    p = b.op("p", [x], nbytes=MB)
    for name in consumers:
        b.output(b.op(name, [p], nbytes=10), name)
    g = b.build()
    return g, Plan(device="a", op_devices={op.id: consumers[op.name] for op in g.ops if op.name in consumers})


def one_transfer() -> tuple[Graph, ResolvedPlan, Machine, Op, Op]:
    """p on rank a, its consumer q on rank b: the graph, the resolved plan, the machine,
    and the one send and recv between them."""
    g, plan = producer_consumers({"q": "b"})
    m = machine((0, 1))
    resolved = resolve(g, plan, m)
    G = resolved.run_graph(g)
    send = next(op for op in G.ops if op.target == SEND)
    recv = next(op for op in G.ops if op.target == RECV)
    return g, resolved, m, send, recv


def test_send_recv_costs_latency_plus_bytes_over_bandwidth() -> None:
    g, resolved, m, send, recv = one_transfer()
    cost = TableCost(default_kernel_us=10.0, dispatch={send.name: 2.0, recv.name: 3.0})
    res = simulate(g, resolved, m, cost)
    # b's one worker reaches the recv first (its first op in sequence): it posts it (3,
    # under b's lock) and waits. a: p 0-10; the send is dispatched 10-12 and hands 1 MB to
    # the link: it arrives at 12 + 1000 + 5 = 1017; q 1017-1027. Tracks as the executor's:
    # recvs -1, sends -2.
    assert spans(res.trace) == [
        ("p", 0, 10, 0),
        (recv.name, 0, 1017, -1),
        (send.name, 10, 12, -2),
        ("q", 1017, 1027, 0),
    ]
    ev = by_name(res)
    assert (ev[send.name].kind, ev[send.name].rank, ev[send.name].threads) == ("COMM", 0, 0)
    assert (ev[recv.name].kind, ev[recv.name].rank, ev[recv.name].device) == ("COMM", 1, "b")
    assert res.step_time_s == pytest.approx(1027e-6)
    assert (res.transfer_count, res.transfer_bytes) == (1, MB)
    assert (res.ranks[0].sent_bytes, res.ranks[1].sent_bytes) == (MB, 0)
    # b holds the copy (allocated when the recv is posted) and q's output; a holds x and p.
    assert res.peak_memory_bytes == {"a": 100 + MB, "b": MB + 10}
    assert res.ranks[1].lock_busy_s == pytest.approx(3e-6)


def test_a_transfer_waits_until_its_recv_is_posted() -> None:
    # b is busy with w (2000) before it reaches the recv and posts it (2000-2003): the data
    # the send handed off at 12 moves only then: 2003 + 1000 + 5 = 3008.
    b = GraphBuilder("late-post")
    x, y = b.input("x", 100), b.input("y", 100)
    p = b.op("p", [x], nbytes=MB)
    b.output(b.op("w", [y], nbytes=10), "w")
    b.output(b.op("q", [p], nbytes=10), "q")
    g = b.build()
    m = machine((0, 1))
    resolved = resolve(g, Plan(device="a", op_devices={1: "b", 2: "b"}), m)
    G = resolved.run_graph(g)
    send = next(op for op in G.ops if op.target == SEND)
    recv = next(op for op in G.ops if op.target == RECV)
    cost = TableCost(kernel={"p": 10.0, "w": 2000.0, "q": 10.0}, dispatch={send.name: 2.0, recv.name: 3.0})
    ev = by_name(simulate(g, resolved, m, cost))
    assert [(n, us(ev[n].start_ns), us(ev[n].end_ns)) for n in ("w", recv.name, "q")] == [
        ("w", 0, 2000), (recv.name, 2000, 3008), ("q", 3008, 3018)
    ]


@pytest.mark.parametrize(("names", "arrive_us"), [(("bus", "bus"), 10 + 2000 + 5), (("", ""), 10 + 1000 + 5)])
def test_transfers_on_one_named_link_contend(names: tuple[str, str], arrive_us: float) -> None:
    # p's 1 MB goes to b and to c; a's one worker dispatches both sends at 10 (dispatch 0).
    # Links named alike are one wire: each transfer gets half of it.
    g, plan = producer_consumers({"q": "b", "r": "c"})
    m = machine((0, 1, 2), (("a", "b", names[0]), ("a", "c", names[1])))
    res = simulate(g, resolve(g, plan, m), m, TableCost(default_kernel_us=10.0))
    ev = by_name(res)
    assert [us(ev[n].start_ns) for n in ("q", "r")] == pytest.approx([arrive_us, arrive_us])
    recvs = sorted((e.rank, us(e.start_ns), us(e.end_ns)) for e in ev.values() if e.name.startswith("recv"))
    assert [r[0] for r in recvs] == [1, 2]
    assert [t for r in recvs for t in r[1:]] == pytest.approx([0, arrive_us, 0, arrive_us])  # waiting from the start


def test_an_expanded_graph_must_not_read_across_devices() -> None:
    b = GraphBuilder("bad")
    x = b.input("x", 100)
    p = b.op("p", [x], nbytes=100)
    token = b.op("send", [p], nbytes=0, target=SEND, kind=OpKind.COMM)
    copy = b.op("recv", [token], nbytes=100, target=RECV, kind=OpKind.COMM)
    b.output(b.op("q", [copy, p], nbytes=10))  # p itself read on b: no transfer carries it
    g = b.build()
    m = machine((0, 1))
    with pytest.raises(SchedlabError, match="without a send/recv pair"):
        simulate(g, hand_resolved(g, ["a", "a", "b", "b"]), m, TableCost())


# ---- all-reduce --------------------------------------------------------------------------------


def hand_resolved(g: Graph, devices: Sequence[str], priority: Mapping[str, int] | None = None) -> ResolvedPlan:
    """A resolved plan written by hand for a hand-expanded graph (one slot, one thread per op)."""
    prio = tuple(priority[op.name] for op in g.ops) if priority else tuple(range(len(g.ops)))
    return ResolvedPlan(
        plan=Plan(), slots=1, threads=(1,) * len(g.ops), priority=prio, device=tuple(devices),
        sequence=list_schedule(g, prio), device_slots={d: 1 for d in devices},
    )


def all_reduce_graph(buckets: int, nbytes: int = MB) -> tuple[Graph, list[str]]:
    """Per rank r in (a, b) and bucket k: grad g{k}{r} from input x{r}, all_reduce ar{k}{r}
    (bucket k, group [a, b]) and a consumer u{k}{r}. Returns the graph and each op's device."""
    b = GraphBuilder("all-reduce")
    devices: list[str] = []
    xs = {r: b.input(f"x{r}", 64) for r in "ab"}
    grads = {}
    for k in range(buckets):
        for r in "ab":
            grads[(k, r)] = b.op(f"g{k}{r}", [xs[r]], nbytes=nbytes)
            devices.append(r)
    reduced = {}
    for k in range(buckets):
        for r in "ab":
            reduced[(k, r)] = b.op(f"ar{k}{r}", [grads[(k, r)]], nbytes=nbytes, target=ALL_REDUCE, kind=OpKind.COMM)
            devices.append(r)
    for k in range(buckets):
        for r in "ab":
            b.output(b.op(f"u{k}{r}", [reduced[(k, r)]], nbytes=10), f"u{k}{r}")
            devices.append(r)
    g = b.build()
    ops = tuple(
        dataclasses.replace(op, kwargs={"bucket": int(op.name[2]), "group": ["a", "b"], "reduce": "avg"})
        if op.target == ALL_REDUCE else op
        for op in g.ops
    )
    return dataclasses.replace(g, ops=ops), devices


def test_all_reduce_starts_when_every_member_is_ready_and_lasts_the_ring_time() -> None:
    g, devices = all_reduce_graph(1)
    m = machine((0, 1))
    cost = TableCost(kernel={"g0a": 100.0, "g0b": 500.0, "ar0a": 0.0, "ar0b": 0.0})
    res = simulate(g, hand_resolved(g, devices), m, cost)
    ev = by_name(res)
    # a issues at 100, b at 500; ring over 2 ranks: 2(n-1)/n * 1 MB / W + 2(n-1) * 5 µs = 1010.
    # Each event runs from its issue to its end, on the communication track (-1).
    for r, rank, issued in (("a", 0, 100), ("b", 1, 500)):
        e = ev[f"ar0{r}"]
        assert (us(e.start_ns), us(e.end_ns), e.kind, e.rank, e.worker) == (issued, 1510, "COMM", rank, -1)
        assert us(ev[f"u0{r}"].start_ns) == 1510
    assert res.collective_count == 1 and res.transfer_count == 0
    assert res.step_time_s == pytest.approx(1520e-6)


@dataclasses.dataclass
class FittedCost(TableCost):
    """A cost model with a fitted all-reduce: 40 µs + 1 µs per kB."""

    def allreduce_us(self, nbytes: float, n_ranks: int) -> float | None:
        return 40.0 + nbytes / 1000.0


def test_all_reduce_takes_the_cost_models_fit_when_it_has_one() -> None:
    g, devices = all_reduce_graph(1)
    res = simulate(g, hand_resolved(g, devices), machine((0, 1)), FittedCost())
    e = by_name(res)["ar0a"]
    # Every kernel 10, the all-reduce's too: issued at 10, its bucket flattened 10-20, the
    # fit's 40 + 1000 µs, averaged in 10 more.
    assert (us(e.start_ns), us(e.end_ns)) == (10, 20 + 40 + 1000 + 10)


def test_buckets_are_issued_in_order() -> None:
    # On a, bucket 1's gradient is ready first (at 10), bucket 0's at 310; b issues both at
    # 110. Bucket 1 is not issued on a before bucket 0, so both collectives start at 310,
    # and share the wire: 2 x 1000 + 10 -> 2320. (Out of order, bucket 1 would start at 110.)
    g, devices = all_reduce_graph(2)
    prio = {"g1a": 0, "g0a": 1, "g0b": 0, "g1b": 1}
    priority = {op.name: prio.get(op.name, 2 + op.id) for op in g.ops}
    cost = TableCost(kernel={"g1a": 10.0, "g0a": 300.0, "g0b": 50.0, "g1b": 60.0}, default_kernel_us=0.0)
    res = simulate(g, hand_resolved(g, devices, priority), machine((0, 1)), cost)
    ev = by_name(res)
    assert [(us(ev[n].start_ns), us(ev[n].end_ns)) for n in ("ar0a", "ar1a", "ar0b", "ar1b")] == (
        [(310, 2320)] * 2 + [(110, 2320)] * 2
    )
    assert res.collective_count == 2
    # A sequence that issues bucket 1 before bucket 0 on a device is refused, as the executor does.
    backwards = {**priority, "ar1a": 0, "ar0a": 5}
    with pytest.raises(SchedlabError, match="would issue gradient bucket 0 after bucket 1"):
        simulate(g, hand_resolved(g, devices, backwards), machine((0, 1)), cost)


def test_a_bucket_missing_a_member_is_an_expansion_bug() -> None:
    g, devices = all_reduce_graph(1)
    ops = tuple(dataclasses.replace(op, kwargs={**op.kwargs, "bucket": 1}) if op.name == "ar0b" else op for op in g.ops)
    bad = dataclasses.replace(g, ops=ops)
    with pytest.raises(SchedlabError, match=r"malformed expanded graph.*has no all_reduce op on"):
        simulate(bad, hand_resolved(bad, devices), machine((0, 1)), TableCost())


def test_a_corun_rank_receives_and_reduces_on_its_communication_thread() -> None:
    # Two slots per device: workers run compute ops and sends off the heap, a communication
    # thread per device posts the recv as the step starts (0-3), then waits for it and runs
    # the all-reduce. With nothing else to do, the times are the one-slot walk's (above).
    g, plan = producer_consumers({"q": "b"})
    m = machine((0, 1), cores=2)
    resolved = resolve(g, dataclasses.replace(plan, slots=2, threads=1), m)
    G = resolved.run_graph(g)
    send = next(op for op in G.ops if op.target == SEND)
    recv = next(op for op in G.ops if op.target == RECV)
    cost = TableCost(default_kernel_us=10.0, dispatch={send.name: 2.0, recv.name: 3.0})
    ev = by_name(simulate(g, resolved, m, cost))
    assert [(n, us(ev[n].start_ns), us(ev[n].end_ns), ev[n].worker) for n in ("p", send.name, recv.name, "q")] == [
        ("p", 0, 10, 0), (send.name, 10, 12, -2), (recv.name, 3, 1017, -1), ("q", 1017, 1027, 0)
    ]
    g2, devices = all_reduce_graph(1)
    hand = dataclasses.replace(hand_resolved(g2, devices), slots=2, device_slots={"a": 2, "b": 2})
    cost2 = TableCost(kernel={"g0a": 100.0, "g0b": 500.0, "ar0a": 0.0, "ar0b": 0.0})
    ev2 = by_name(simulate(g2, hand, machine((0, 1), cores=2), cost2))
    assert [(us(ev2[n].start_ns), us(ev2[n].end_ns), ev2[n].worker) for n in ("ar0a", "ar0b", "u0a")] == [
        (100, 1510, -1), (500, 1510, -1), (1510, 1520, 0)
    ]


# ---- one process: the model of before ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_one_process_is_the_compiled_engine(seed: int) -> None:
    g = random_dag(120, seed, window=8)
    m = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 4, 2**40),)))
    plan = dataclasses.replace(random_plan(g, 2, seed, max_slots=2), device="cpu0")
    resolved = resolve(g, plan, m)
    a = simulate(g, resolved, m, random_cost(seed), engine="simpy")
    b = simulate(g, resolved, m, random_cost(seed), engine="compiled")
    assert a.trace is not None and b.trace is not None
    assert [e.to_row() for e in a.trace.events] == [e.to_row() for e in b.trace.events]
    assert (a.step_time_s, a.peak_memory_bytes, a.busy_core_s) == (b.step_time_s, b.peak_memory_bytes, b.busy_core_s)
    assert a.ranks == b.ranks
    fast = simulate(g, resolved, m, random_cost(seed), record=False)  # the search's path
    assert fast.engine == "compiled" and fast.step_time_s == a.step_time_s
    assert fast.ranks[0].lock_busy_s == pytest.approx(a.ranks[0].lock_busy_s)
    assert fast.ranks[0].busy_core_s == a.ranks[0].busy_core_s and fast.ranks[0].ops == a.ranks[0].ops


def test_devices_of_one_process_share_its_lock_on_a_preset() -> None:
    m = load_machine("cpu-2gpu")  # one process drives the CPU and both GPUs
    g = random_dag(60, 3, window=6)
    resolved = resolve(g, Plan(device="cpu0", op_devices={i: "gpu0" for i in range(20, 40)}), m)
    res = simulate(g, resolved, m, random_cost(3))
    assert res.trace is not None and {e.rank for e in res.trace.events} == {0}
    assert set(res.ranks) == {0} and res.transfer_count > 0


# ---- expanded graphs of real workloads ---------------------------------------------------------

HOST2 = host_ranks(2, Machine("h", (Device("cpu0", "cpu", 2, 8 * 2**30),)))


def check_expanded(g: Graph, resolved: ResolvedPlan, m: Machine, res: SimResult) -> Graph:
    G = resolved.run_graph(g)
    assert res.trace is not None and res.engine == "simpy"
    assert sorted(e.op for e in res.trace.events) == list(range(len(G.ops)))  # every op once
    for e in res.trace.events:
        assert e.rank == m.device(resolved.device[e.op]).process
        assert (e.kind == "COMM") == (G.ops[e.op].kind is OpKind.COMM)
        if G.ops[e.op].target in (RECV, ALL_REDUCE):
            assert e.worker < 0  # a communication track
        assert e.start_ns <= e.end_ns
    sends = [op for op in G.ops if op.target == SEND]
    assert res.transfer_count == len(sends)
    assert res.transfer_bytes == sum(op.bytes_moved for op in sends)
    assert set(res.ranks) == {0, 1}
    assert max(r.end_s for r in res.ranks.values()) == pytest.approx(res.step_time_s)
    return G


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_placed_workload_simulates_on_two_ranks(name: str) -> None:
    g = captured_workload(name)[1].graph  # type: ignore[attr-defined]
    resolved = resolve(g, Plan(device="cpu0", layer_devices={"head": "cpu1"}), HOST2)
    res = simulate(g, resolved, HOST2, random_cost(1))
    G = check_expanded(g, resolved, HOST2, res)
    assert res.transfer_count > 0 and res.collective_count == 0
    # The copies of ops 0..n-1 cost what the captured graph's ops cost.
    base = simulate(g, resolve(g, Plan(device="cpu0"), HOST2), HOST2, random_cost(1))
    assert base.trace is not None and res.trace is not None
    kernel = {e.op: e.dur_ns for e in base.trace.events}
    alone = [e for e in res.trace.events if e.op < len(g.ops) and G.ops[e.op].kind is not OpKind.COMM]
    assert alone and all(abs(e.dur_ns - kernel[e.op]) <= 1 for e in alone)  # ns rounding of start and end


def test_data_parallel_workload_simulates_on_two_ranks() -> None:
    from schedlab.data_parallel import replica_graph

    g = replica_graph(captured_workload("mlp")[1].graph, 2)  # type: ignore[attr-defined]
    # (order w-last: the other orders' sequences issue buckets out of order, which the
    # executor and the simulator refuse)
    resolved = resolve(g, Plan(replicas=2, bucket_mb=0.002, order="w-last"), HOST2)
    sim = Simulator(g, HOST2, random_cost(2))
    res = sim.run(resolved)
    G = check_expanded(g, resolved, HOST2, res)
    reduces = [op for op in G.ops if op.target == ALL_REDUCE]
    assert res.collective_count == len(reduces) // 2 > 1
    assert res.trace is not None
    spans_of: dict[int, list[tuple[int, int, int]]] = {}  # bucket -> (rank, start, end)
    for e in res.trace.events:
        if G.ops[e.op].target == ALL_REDUCE:
            spans_of.setdefault(G.ops[e.op].kwargs["bucket"], []).append((e.rank, e.start_ns, e.end_ns))
    for ends in spans_of.values():
        (r0, s0, e0), (r1, s1, e1) = sorted(ends)
        assert (r0, r1) == (0, 1) and max(s0, s1) < min(e0, e1)  # the two ranks' halves overlap
    for rank in (0, 1):  # each rank issues its buckets in order
        starts = [next(s for r, s, _ in spans_of[b] if r == rank) for b in sorted(spans_of)]
        assert starts == sorted(starts)
    # Replica 1's op n+i is costed as op i (one op at a time on each rank: the same span).
    n = len(g.ops)
    dur = {e.op: e.dur_ns for e in res.trace.events}
    assert all(abs(dur[n + i] - dur[i]) <= 1 for i in range(n))
    again = sim.run(resolved, record=False)
    assert again.step_time_s == res.step_time_s
