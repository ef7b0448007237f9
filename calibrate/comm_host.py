"""What a communication op costs the rank that runs it, beyond the link: measured and fitted.

The multi-process executor (`exec.dist`) runs a send, a receive or an all-reduce as a few
Python and torch.distributed calls on the rank's own thread, holding its interpreter
lock. Between 2 local gloo ranks of one core each these cost tens of microseconds each,
and the send's and the flatten's grow with the bytes (a send whose receiver has posted
writes the data into the socket in the caller; a bucket is copied into one buffer) —
much more than the ~2 µs dispatch of a compute op. Each part is timed here with the
calls `exec.dist` makes, between 2 ranks (the send and receive parts on the default
group, one direction at a time, where the executor gives each direction a group of its
own: the same call on a pair that carries one way only; the all-reduce parts through
the executor's own `exec.reduce.Reducer`), in each rank of the link benchmark
(`measure_host_costs`, `calibrate.link_ranks`), over the benchmark's message sizes, and kept as
a table over sizes (`CostTable` says why not a line):

- ``send``: ``value.contiguous()`` and ``ProcessGroup.send`` with the receive already
  posted (the usual case on the critical path: the receiver idles waiting for it);
- ``recv_post``: ``torch.empty`` of the buffer and ``ProcessGroup.recv``;
- ``recv_wait``: ``is_completed()`` and ``wait()`` of a receive whose data is there;
- ``allreduce_flatten``: the bucket's gradients reshaped and concatenated (one tensor:
  cloned) into one buffer, over 1 and 16 tensors;
- ``allreduce_post``: starting the sum as `exec.reduce` does (between 2 ranks, posting
  the exchange's receive and its send);
- ``allreduce_wait``: ``wait()`` of an all-reduce that completed (the exchange's add too);
- ``allreduce_average``: ``div_`` by the group's size and one view per gradient.

And one figure of the collective itself, `HostCosts.collective_cpu_share`: gloo on CPU
ranks copies and reduces the data on the ranks' own cores, so an all-reduce in flight
slows a kernel beside it on a one-core rank, and is slowed by it (data parallelism
overlaps them through backward). Rank 0 starts an all-reduce of the size and runs a
compute loop while the other ranks join later, as the first rank to reach a bucket does
in a step; what it adds to the loop over the all-reduce's time alone is the share of
that time it keeps a core busy (the median over sizes from 256 KiB).

And what a communication call costs the ops after it (`ColdCost`): a rank's first ops
after a send, a receive or an all-reduce's wait run slower than the same ops back to
back (measured here, 2026-11-25, a chain of eight small aten ops: under 1 us more in all
after a receive whose data was there, 46-87 us after one that blocked ~100 us, 87-191 us
after ~10 ms; their code and data are no longer in the core's caches, gloo's thread having
run there, or the core having slept).
Rank 0 times the chain right after the call and again at once (warm); the extra is the
median of the differences, paired so that a drifting clock speed cancels.

Each is the lowest of its round medians (interference only adds time); an all-reduce part
is the slower rank's. The link and collective fits (`calibrate.links`) time the same
calls end to end; the simulator charges a receive's wait and an all-reduce's post and
wait on the ranks at their fixed cost only (the part that grows with the bytes is the
transfer itself, which the fits already time; but see the send and the exchange below), and takes those fixed costs off the link's
latency and the collective's time (`HostCosts.p2p_overlap_s`, `allreduce_overlap_s`;
`calibrate.links.apply_link_fit`, `Profile.allreduce_us`). A send's call is charged
whole: its fixed part under the lock, and the part that grows with the bytes as a kernel
on the sender's core while the transfer is in flight (gloo writes the data into the socket
in the caller: a conv1d-two-branch split's 2 MiB sends took 444-854 us of the sender's
step in its rank trace, 2026-11-27, where a fixed part alone is 17 us). So is an
all-reduce's post between two ranks, the exchange's send: its part that grows with the
bytes is the caller's write, beside the collective (lstm-lm's `dp-b1` rank trace,
2026-11-28: issuing a 1-2 MiB bucket held the rank's one worker 0.2-5.3 ms, where the
post's fixed part is 79 us).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from schedlab.errors import SchedlabError

if TYPE_CHECKING:
    from schedlab.exec.reduce import Reducer

PARTS = (
    "send", "recv_post", "recv_wait", "allreduce_flatten", "allreduce_post", "allreduce_wait", "allreduce_average",
)
BUCKET_TENSORS = (1, 16)  # gradients per all-reduce bucket the flatten and average are timed with
# The collective's own CPU (`collective_cpu_share`): an all-reduce alone, and what it adds to a
# compute loop running beside it, at sizes where the bytes dominate.
CPU_PARTS = ("allreduce_alone", "allreduce_cpu")
# What a point-to-point transfer costs the cores at each end, per message (gloo writes and
# reads the socket on its own thread, on the rank's cores): a burst of sends from rank 0 to
# rank 1 in flight beside a compute loop on each, what it adds to the loop, per message.
# Optional tables: a profile measured before them has none (the simulator then charges none).
TRANSFER_CPU_PARTS = ("p2p_cpu_send", "p2p_cpu_recv")
CPU_MIN_BYTES = 1 << 18
MAX_CPU_SHARE = 1.0
_PER_TENSOR_PARTS = ("allreduce_flatten", "allreduce_average")
HOST_TAG = 1 << 20  # the first tag of the host-cost benchmark's transfers (2 a repetition)
P2P_CPU_TAG = 1 << 27  # the first of the transfer-CPU bursts' (P2P_CPU_MSGS a repetition)
P2P_CPU_MSGS = 64  # tags per burst: at most 32 messages, twice
# The cold cost after a communication call (`ColdCost`): after a send, and after a receive
# that waited about each of these µs for its data (0: the data was there); the points are
# ("cold_after_recv", (waited µs, 1, extra µs)) and ("cold_after_send", (0, 1, extra µs)).
COLD_PARTS = ("cold_after_send", "cold_after_recv")
COLD_WAITS_US = (0, 100, 1000, 3000, 10000)
COLD_REPS = 40
COLD_TAG = 1 << 26  # the first tag of the cold-cost benchmark's transfers


@dataclass(frozen=True)
class CostTable:
    """One part's measured cost over message sizes: ``us(nbytes, tensors)`` interpolates
    linearly in bytes between the measured sizes (below the smallest: its value; beyond the
    largest: the last interval's slope goes on), plus ``(tensors - 1)`` times the
    per-tensor cost interpolated the same way.

    A table rather than a line: the parts do not grow linearly with the bytes on this
    host. A send's call writes into the socket only what its buffer takes (here it grows
    to ~1.4 ms at 4 MiB and stays there); a copy of a bucket that no longer fits the caches,
    or into freshly mapped pages, costs several times more per byte than one that does. A
    line weighted by relative error fits the many small sizes and misses the large buckets
    data parallelism moves by 3-10x. Measured points are made non-decreasing in size
    (pooled where a later one is lower: isotonic), so one noisy round does not make a
    larger message cheaper.
    """

    sizes: tuple[int, ...]  # bytes, ascending, distinct
    us: tuple[float, ...]  # per size: one tensor
    per_tensor_us: tuple[float, ...] = ()  # per size: each tensor beyond the first (empty: none)

    def __post_init__(self) -> None:
        if len(self.sizes) < 1 or len(self.us) != len(self.sizes) or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("a cost table needs ascending distinct sizes and one time per size")
        if self.per_tensor_us and len(self.per_tensor_us) != len(self.sizes):
            raise ValueError("per_tensor_us must have one value per size")
        if any(not (math.isfinite(v) and v >= 0) for v in (*self.us, *self.per_tensor_us)):
            raise ValueError("cost table times must be finite numbers >= 0")

    def us_at(self, nbytes: float, tensors: int = 1) -> float:
        base = _interp(self.sizes, self.us, nbytes)
        if tensors <= 1 or not self.per_tensor_us:
            return base
        return base + (tensors - 1) * _interp(self.sizes, self.per_tensor_us, nbytes)

    def fixed_us(self, tensors: int = 1) -> float:
        """The part that does not grow with the bytes: the cost at the smallest size."""
        return self.us_at(self.sizes[0], tensors)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sizes": list(self.sizes), "us": [float(f"{v:.5g}") for v in self.us]}
        if self.per_tensor_us:
            out["per_tensor_us"] = [float(f"{v:.5g}") for v in self.per_tensor_us]
        return out

    @staticmethod
    def from_json(d: Any) -> CostTable:
        if not isinstance(d, dict):
            raise TypeError(f"a cost table must be an object, got {type(d).__name__}")
        sizes = tuple(_number(x, "sizes", integer=True) for x in d.get("sizes", []))
        us = tuple(_number(x, "us") for x in d.get("us", []))
        per = tuple(_number(x, "per_tensor_us") for x in d.get("per_tensor_us", []) or [])
        return CostTable(tuple(int(x) for x in sizes), us, per)


def _number(v: Any, what: str, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{what}: expected a {'whole' if integer else 'finite'} number >= 0, got {v!r}")
    return float(v)


def _interp(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Linear in x between the points; flat below the first; the last slope beyond the last."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + max(0.0, slope) * (x - xs[-1])
    return float(np.interp(x, xs, ys))


def isotonic(ys: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to `ys` in squared error (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out: list[float] = []
    for total, count in blocks:
        out += [total / count] * int(count)
    return out


Point = tuple[int, int, float]  # (nbytes, tensors, us)


@dataclass(frozen=True)
class ColdCost:
    """The extra µs a rank's next ops take, in all, right after a communication call
    (module docstring): after a send, and after a receive or an all-reduce's wait that
    blocked `wait_us` (linear between the measured waits, flat beyond them; 0: it did not block)."""

    after_send_us: float
    waits_us: tuple[float, ...]  # ascending, distinct
    after_wait_us: tuple[float, ...]  # per wait

    def __post_init__(self) -> None:
        if not self.waits_us or len(self.waits_us) != len(self.after_wait_us) \
                or list(self.waits_us) != sorted(set(self.waits_us)):
            raise ValueError("cold cost: needs ascending distinct waits and one cost per wait")
        if any(not (math.isfinite(v) and v >= 0) for v in (self.after_send_us, *self.waits_us, *self.after_wait_us)):
            raise ValueError("cold cost: times must be finite numbers >= 0")

    def points(self) -> tuple[tuple[float, float], ...]:
        """(wait µs, extra µs) after a receive: what the simulator interpolates."""
        return tuple(zip(self.waits_us, self.after_wait_us, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {"after_send_us": round(self.after_send_us, 2), "waits_us": [round(w, 1) for w in self.waits_us],
                "after_wait_us": [round(v, 2) for v in self.after_wait_us]}

    @staticmethod
    def from_json(d: Any) -> ColdCost:
        if not isinstance(d, dict):
            raise TypeError(f"cold_after_comm must be an object, got {type(d).__name__}")
        send = _number(d.get("after_send_us"), "after_send_us")
        waits = tuple(_number(x, "waits_us") for x in d.get("waits_us") or [])
        after = tuple(_number(x, "after_wait_us") for x in d.get("after_wait_us") or [])
        return ColdCost(send, waits, after)


def cold_cost_of(points: Mapping[str, Sequence[Point]]) -> ColdCost | None:
    """The cold cost from its measured points (`COLD_PARTS`); None when not measured. The
    receive's points are pooled by wait (the median of each nominal wait's repetitions
    came in as one point each) and made non-decreasing in the wait (`isotonic`)."""
    send, recv = (points.get(p) or () for p in COLD_PARTS)
    if not send or not recv:
        return None
    by_wait: dict[int, list[float]] = {}
    for w, _, us in recv:
        by_wait.setdefault(int(w), []).append(float(us))
    waits = sorted(by_wait)
    after = isotonic([statistics.median(by_wait[w]) for w in waits])
    return ColdCost(max(0.0, statistics.median(us for _, _, us in send)), tuple(float(w) for w in waits),
                    tuple(max(0.0, a) for a in after))


@dataclass(frozen=True)
class HostCosts:
    """The measured cost of each part (`PARTS`) over message sizes."""

    tables: dict[str, CostTable]
    # Share of an all-reduce's time alone that keeps one core of each rank busy (gloo on CPU
    # ranks copies and reduces the data on the ranks' own cores): a kernel beside it on a
    # one-core rank is slowed by that much, and so is the collective. None: not measured.
    collective_cpu_share: float | None = None
    cold: ColdCost | None = None  # what a communication call costs the ops after it; None: not measured

    def __post_init__(self) -> None:
        missing = [p for p in PARTS if p not in self.tables]
        if missing:
            raise ValueError(f"host costs miss the parts {missing}")

    def us(self, part: str, nbytes: float, tensors: int = 1) -> float:
        return self.tables[part].us_at(nbytes, tensors)

    def p2p_overlap_s(self) -> float:
        """How much of a fitted one-way time (`P2PFit`: a send's call, the transfer, the
        receive's wait) the fixed parts of the send's call and of the wait are: the simulator
        charges those on the ranks. The send's part that grows with the bytes (its write into
        the socket) stays with the link, whose fitted bandwidth already counts it."""
        return (self.tables["send"].fixed_us() + self.tables["recv_wait"].fixed_us()) * 1e-6

    def allreduce_overlap_s(self) -> float:
        """How much of a fitted all-reduce time (`RingFit`: one blocking call) the fixed parts
        of its post and wait are, which the simulator charges on the ranks (what grows with
        the bytes stays with the collective's fit)."""
        return (self.tables["allreduce_post"].fixed_us() + self.tables["allreduce_wait"].fixed_us()) * 1e-6

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": "table", "parts": {p: self.tables[p].to_json() for p in PARTS}}
        if self.collective_cpu_share is not None:
            out["collective_cpu_share"] = round(self.collective_cpu_share, 4)
        for p in TRANSFER_CPU_PARTS:
            if p in self.tables:
                out["parts"][p] = self.tables[p].to_json()
        if self.cold is not None:
            out["cold_after_comm"] = self.cold.to_json()
        return out

    def transfer_cpu_us(self, nbytes: float) -> tuple[float, float]:
        """(sender's, receiver's) core µs of one transfer of `nbytes`; (0, 0) when not measured."""
        send, recv = (self.tables.get(p) for p in TRANSFER_CPU_PARTS)
        return (send.us_at(nbytes) if send else 0.0, recv.us_at(nbytes) if recv else 0.0)

    @staticmethod
    def from_json(d: Any) -> HostCosts:
        """Parse; a problem raises ValueError naming the part (the Profile wraps it)."""
        if not isinstance(d, dict) or not isinstance(d.get("parts"), dict):
            raise TypeError("host_costs must be an object with 'parts'")
        tables: dict[str, CostTable] = {}
        missing = [p for p in PARTS if p not in d["parts"]]
        if missing:
            raise ValueError(f"host_costs.parts: no part {missing[0]!r}")
        for p in (*PARTS, *(p for p in TRANSFER_CPU_PARTS if p in d["parts"])):  # the transfer CPU is optional
            try:
                tables[p] = CostTable.from_json(d["parts"][p])
            except (TypeError, ValueError) as e:
                raise ValueError(f"host_costs.parts.{p}: {e}") from None
        share = d.get("collective_cpu_share")
        if share is not None:
            share = _number(share, "collective_cpu_share")
        cold = None
        if d.get("cold_after_comm") is not None:
            try:
                cold = ColdCost.from_json(d["cold_after_comm"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"host_costs.cold_after_comm: {e}") from None
        return HostCosts(tables, share, cold)


def table_of(points: Sequence[Point], per_tensor: bool) -> CostTable:
    """A part's table from its (nbytes, tensors, us) points: per size, the one-tensor time
    (the median over tensor counts, when the part does not depend on them) and, with
    `per_tensor`, (time at the most tensors - time at one) / (tensors - 1) (a size too
    small for several tensors: the nearest size's); each made non-decreasing in size
    (`isotonic`)."""
    by_size: dict[int, dict[int, float]] = {}
    for n, k, us in points:
        if not (math.isfinite(us) and us > 0) or k < 1 or n < 0:
            raise SchedlabError(f"host cost table: bad measurement ({n} B, {k} tensors, {us} us)")
        by_size.setdefault(int(n), {})[int(k)] = float(us)
    if not by_size:
        raise SchedlabError("host cost table: no measurements")
    sizes = tuple(sorted(by_size))
    one: list[float] = []
    per_at: list[float | None] = []  # None: no several-tensor measurement at that size
    for n in sizes:
        row = by_size[n]
        if per_tensor:
            if 1 not in row:
                raise SchedlabError(f"host cost table: no one-tensor measurement at {n} B")
            one.append(row[1])
            kmax = max(row)
            per_at.append(max(0.0, (row[kmax] - row[1]) / (kmax - 1)) if kmax > 1 else None)
        else:
            one.append(float(statistics.median(row.values())))
    known = [(i, v) for i, v in enumerate(per_at) if v is not None]
    if not known:
        return CostTable(sizes, tuple(isotonic(one)))
    # A size too small to split into several tensors takes the nearest measured one's cost.
    per = [v if v is not None else min(known, key=lambda kv: abs(kv[0] - i))[1] for i, v in enumerate(per_at)]
    return CostTable(sizes, tuple(isotonic(one)), tuple(isotonic(per)))


def host_costs_of(points: Mapping[str, Sequence[Point]]) -> HostCosts:
    """Every part of `PARTS` as a table of its points."""
    missing = [p for p in PARTS if not points.get(p)]
    if missing:
        raise SchedlabError(f"host costs: no measurements of {missing}")
    tables = {p: table_of(points[p], per_tensor=p in _PER_TENSOR_PARTS) for p in PARTS}
    tables |= {p: table_of(points[p], per_tensor=False) for p in TRANSFER_CPU_PARTS if points.get(p)}
    return HostCosts(tables, cpu_share_of(points.get("allreduce_alone", ()), points.get("allreduce_cpu", ())),
                     cold_cost_of(points))


def cpu_share_of(alone: Sequence[Point], extra: Sequence[Point]) -> float | None:
    """The median over sizes of (what an all-reduce added to a compute loop beside it) /
    (its time alone), each in [0, `MAX_CPU_SHARE`]; None without measurements."""
    t_alone = {n: us for n, _, us in alone}
    shares = [min(MAX_CPU_SHARE, max(0.0, us / t_alone[n])) for n, _, us in extra if t_alone.get(n, 0.0) > 0]
    return float(statistics.median(shares)) if shares else None


# ---- in a rank (torch imported there) ------------------------------------------------------


def host_cases(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(nbytes, tensors) of every case `measure_host_costs` times."""
    return [(n, k) for n in sorted(set(sizes)) for k in BUCKET_TENSORS if n // 4 >= k]


def measure_host_costs(
    rank: int,
    reducer: Reducer,
    sizes: Sequence[int],
    reps: int,
    rounds: int,
    timeout_s: float,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, list[Point]]:
    """Time every part between ranks 0 and 1 of the default gloo group, as `exec.dist` calls
    it (module docstring), its all-reduces through `reducer` (`exec.reduce.world_reducer`);
    every rank of the group must call it. Returns, on rank 0, per part
    (nbytes, tensors, us): the lowest round median, for an all-reduce part the slower
    rank's; the other ranks return what they measured themselves."""
    import torch
    import torch.distributed as dist

    pg: Any = dist.group.WORLD
    world = dist.get_world_size()
    cases = host_cases(sizes)
    rounds_us: dict[tuple[str, int, int], list[float]] = {}
    tag = HOST_TAG  # apart from other tags of the benchmark
    for r in range(rounds):
        for nbytes, k in cases:
            samples: dict[str, list[float]] = {}
            for _ in range(reps):
                tag += 2
                got = _one_rep(rank, world, pg, reducer, nbytes, k, tag, timeout_s, torch, dist)
                for part, us in got.items():
                    samples.setdefault(part, []).append(us)
            meds = {p: statistics.median(v) for p, v in samples.items()}
            for p in ("allreduce_flatten", "allreduce_post", "allreduce_wait", "allreduce_average", *CPU_PARTS,
                      *TRANSFER_CPU_PARTS):
                if p not in meds:
                    continue
                slowest = torch.tensor([meds[p]], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                meds[p] = float(slowest.item())
            for p, med in meds.items():
                rounds_us.setdefault((p, nbytes, k), []).append(med)
            if on_progress is not None:
                on_progress(f"host costs round {r + 1}/{rounds} {nbytes} B x{k}")
    out: dict[str, list[Point]] = {p: [] for p in (*PARTS, *CPU_PARTS, *TRANSFER_CPU_PARTS)}
    for (p, nbytes, k), per_round in sorted(rounds_us.items()):
        out[p].append((nbytes, k, over_rounds(p, per_round)))
    out.update(_cold_after_comm(rank, pg, COLD_TAG, torch, dist))
    if on_progress is not None:
        on_progress("cold cost after communication")
    return out


def over_rounds(part: str, per_round: Sequence[float]) -> float:
    """One figure of a part from its rounds (µs, at least 1e-3): a time, its fastest round
    (a stall of the host only adds); what the collective takes from a loop beside it, its
    middle round (the smallest is the luckiest round, not the typical one)."""
    return max(statistics.median(per_round) if part == "allreduce_cpu" else min(per_round), 1e-3)


def _one_rep(
    rank: int, world: int, pg: Any, reducer: Reducer, nbytes: int, k: int, tag: int, timeout_s: float, torch: Any,
    dist: Any,
) -> dict[str, float]:
    """One repetition of every part; times in µs on this rank."""
    ns = time.perf_counter_ns
    out: dict[str, float] = {}
    n = max(1, nbytes // 4)
    if k == 1 and nbytes >= CPU_MIN_BYTES:
        out.update(_collective_cpu(reducer, nbytes, torch, dist))
    if k == 1:  # send and receive: ranks 0 and 1; rank 0 times them
        out.update(_transfer_cpu(rank, pg, nbytes, P2P_CPU_TAG + (tag - HOST_TAG) * P2P_CPU_MSGS, torch, dist))
        value = torch.ones(n)
        if rank == 1:
            pre = torch.empty(n)
            work = pg.recv([pre], 0, tag)
        dist.barrier()
        if rank == 0:
            t0 = ns()
            work = pg.send([value.contiguous()], 1, tag)
            out["send"] = (ns() - t0) / 1e3
        if rank < 2:
            work.wait()
            if rank == 0:
                t0 = ns()
                buf = torch.empty((n,), dtype=torch.float32)
                work = pg.recv([buf], 1, tag + 1)
                out["recv_post"] = (ns() - t0) / 1e3
            else:
                pg.send([value], 0, tag + 1).wait()
        dist.barrier()  # rank 1's send has completed: the data is on its way
        if rank == 0:
            time.sleep(20e-6 + nbytes / 2e9)  # let rank 0's gloo thread land it
            t0 = ns()
            work.is_completed()
            work.wait()
            out["recv_wait"] = (ns() - t0) / 1e3
    parts = [torch.ones(n // k) for _ in range(k)]
    dist.barrier()
    t0 = ns()
    flat_parts = [p.reshape(-1) for p in parts]
    flat = torch.cat(flat_parts) if k > 1 else flat_parts[0].clone()
    t1 = ns()
    work = reducer.start(flat, tag=0)
    t2 = ns()
    try:
        work.settle(timeout_s)
    except SchedlabError as e:
        raise SchedlabError(f"host costs: {nbytes} B: {e}") from None
    t3 = ns()
    work.wait()
    t4 = ns()
    flat.div_(world)
    offset = 0
    views = []
    for p in parts:
        views.append(flat[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    t5 = ns()
    out.update(allreduce_flatten=(t1 - t0) / 1e3, allreduce_post=(t2 - t1) / 1e3, allreduce_wait=(t4 - t3) / 1e3,
               allreduce_average=(t5 - t4) / 1e3)
    return out


def _collective_cpu(reducer: Reducer, nbytes: int, torch: Any, dist: Any) -> dict[str, float]:
    """An all-reduce of `nbytes` alone, and what it adds to a compute loop (matrix products)
    on rank 0, which starts it first and computes while the others join a third of the
    loop later (µs; the loop long enough to outlast it).

    Ranks reach a bucket at different times in a step: the first computes while the
    others post theirs, and gloo then writes its bucket and reads theirs on its core, in
    the middle of its compute. Started by every rank at once (as measured before
    2026-11-28) most of the reads happen inside each rank's own write, before the loop: a
    scratch comparison on the 2-core AMD EPYC VM (1-16 MiB, 9 repetitions) had the loop
    lose 0.01-0.65 of the all-reduce's fastest time that way and 0.65-1.13 started first;
    `calibrate --links` gave shares of 0.16-0.60 the old way (four runs over two days), 0.44
    this way read from the fastest round (one run), and 0.57-0.62 this way from the middle
    round (`over_rounds`; three runs), 0.77 in the full calibration after them. Rank 0 alone
    measures the loop; the others report a floor."""
    buf = torch.zeros(max(1, nbytes // 4))
    dist.barrier()
    t0 = time.perf_counter()
    reducer.start(buf, tag=0).wait()
    alone_s = time.perf_counter() - t0
    loop = _loop_for(3.0 * alone_s + 1e-3, torch)
    dist.barrier()
    loop_alone_s = loop()
    dist.barrier()
    if dist.get_rank() == 0:
        work = reducer.start(buf, tag=0)
        extra_s = max(0.0, loop() - loop_alone_s)
    else:
        time.sleep(loop_alone_s / 3.0)
        work = reducer.start(buf, tag=0)
        extra_s = 0.0
    work.wait()
    return {"allreduce_alone": alone_s * 1e6, "allreduce_cpu": max(1e-3, extra_s * 1e6)}


def _loop_for(seconds: float, torch: Any) -> Callable[[], float]:
    """A compute loop (matrix products on one core) that lasts about `seconds`; calling it
    returns how long it took (s)."""
    a = torch.randn(96, 96)
    t0 = time.perf_counter()
    for _ in range(20):
        torch.mm(a, a)
    mm_s = max(1e-7, (time.perf_counter() - t0) / 20)
    iters = math.ceil(seconds / mm_s)

    def loop() -> float:
        t = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, a)
        return time.perf_counter() - t

    return loop


def _transfer_cpu(rank: int, pg: Any, nbytes: int, tag: int, torch: Any, dist: Any) -> dict[str, float]:
    """What a burst of sends of `nbytes` from rank 0 to rank 1 (receives posted first) adds
    to a compute loop that each of the two runs while it is in flight, per message (µs).
    Every rank returns both parts (0 for what it did not measure): the caller takes the
    largest over ranks."""
    n = max(1, nbytes // 4)
    msgs = max(2, min(P2P_CPU_MSGS // 2, (8 << 20) // max(1, nbytes)))

    def post(base: int) -> list[Any]:
        works = [pg.recv([torch.empty(n)], 0, base + k) for k in range(msgs)] if rank == 1 else []
        dist.barrier()  # the receives are posted first, as the executor's receivers post early
        if rank == 0:
            works = [pg.send([torch.ones(n)], 1, base + k) for k in range(msgs)]
        return works

    def finish(works: list[Any]) -> None:
        for w in works:
            w.wait()

    dist.barrier()
    t0 = time.perf_counter()
    finish(post(tag))
    alone_s = time.perf_counter() - t0
    loop = _loop_for(3.0 * alone_s + 1e-3, torch)
    dist.barrier()
    loop_alone_s = loop()
    dist.barrier()
    works = post(tag + msgs)
    loop_with_s = loop()
    finish(works)
    extra_us = max(1e-3, (loop_with_s - loop_alone_s) * 1e6 / msgs)
    return {"p2p_cpu_send": extra_us if rank == 0 else 0.0, "p2p_cpu_recv": extra_us if rank == 1 else 0.0}


def _spin_us(us: float, work: Callable[[], object] = lambda: None) -> None:
    """Call `work` over and over (nothing: busy-wait) for `us` microseconds."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        work()


def _cold_chain(torch: Any) -> Callable[[], int]:
    """A chain of eight small aten ops of different kinds, called as the executor calls
    them (`schedlab.aten.fast_callable`); calling it returns how long it took (ns)."""
    from schedlab.aten import fast_callable

    aten = torch.ops.aten
    x, y, w = torch.randn(32, 64), torch.randn(32, 64), torch.randn(64, 64)
    add, mm, relu, mul = (fast_callable(o) for o in (aten.add.Tensor, aten.mm.default, aten.relu.default,
                                                       aten.mul.Tensor))
    tr, view, cat, total = (fast_callable(o) for o in (aten.t.default, aten.view.default, aten.cat.default,
                                                         aten.sum.dim_IntList))
    ns = time.perf_counter_ns

    def chain() -> int:
        t0 = ns()
        a = add(x, y)
        b = mm(a, w)
        c = relu(b)
        d = mul(c, y)
        e = view(d, [-1])
        f = cat([e, e])
        total(f, [0])
        tr(d)
        return ns() - t0

    for _ in range(200):
        chain()
    return chain


def _cold_after_comm(rank: int, pg: Any, tag: int, torch: Any, dist: Any) -> dict[str, list[Point]]:
    """`COLD_PARTS`' points, on rank 0 (module docstring). Rank 0 runs the chain for a while
    (warm, as a rank between its communication calls), then calls: a send to rank 1 (its
    receive posted), or the wait of a receive from rank 1 whose data is there, or which
    blocks about each of `COLD_WAITS_US` (rank 1 spins that long before it sends); then
    times the chain, and again at once. Every rank of the group must call it; ranks
    above 1 only join the barriers."""
    chain = _cold_chain(torch)
    buf, one = torch.empty(16), torch.ones(16)
    out: dict[str, list[Point]] = {p: [] for p in COLD_PARTS}
    extra: list[float] = []
    for _ in range(COLD_REPS):  # after a send
        tag += 1
        if rank == 1:
            work = pg.recv([buf], 0, tag)
        dist.barrier()
        if rank == 0:
            _spin_us(200, chain)
            sent = pg.send([one], 1, tag)
            cold = chain()
            extra.append((cold - chain()) / 1e3)
            sent.wait()
        elif rank == 1:
            work.wait()
    if rank == 0:
        out["cold_after_send"].append((0, 1, max(statistics.median(extra), 1e-3)))  # µs > 0, as every part's
    for wait_us in COLD_WAITS_US:
        waited, extra = [], []
        for _ in range(COLD_REPS):
            tag += 1
            if rank == 0:
                work = pg.recv([buf], 1, tag)
            elif rank == 1 and wait_us == 0:  # the data is there before rank 0 waits for it
                pg.send([one], 0, tag).wait()
            dist.barrier()
            if rank == 1 and wait_us > 0:
                _spin_us(wait_us)
                pg.send([one], 0, tag).wait()
            elif rank == 0:
                _spin_us(200 if wait_us == 0 else 20, chain)
                t0 = time.perf_counter_ns()
                work.wait()
                cold_ns = chain()
                t1 = time.perf_counter_ns()
                extra.append((cold_ns - chain()) / 1e3)
                waited.append((t1 - t0 - cold_ns) / 1e3)
        if rank == 0:
            w = 0 if wait_us == 0 else max(1, round(statistics.median(waited)))
            out["cold_after_recv"].append((w, 1, max(statistics.median(extra), 1e-3)))
    dist.barrier()
    return out
