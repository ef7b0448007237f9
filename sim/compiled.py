"""The fast engine's event loop compiled with Numba: the search's path, at native speed.

`sim.fast.run_fast` is the single-CPU model written as one Python heap loop; it costs a
few microseconds of interpreter time per op, so a 6,000-op step took longer to simulate
than the executor took to run it. This module runs the *same rules* (see `sim.fast`) on
flat NumPy arrays inside one `numba.njit` function. Numba was chosen over vectorising
because list scheduling with processor sharing is a sequential event loop (each decision
depends on the previous finish times), and over a C extension because it needs no
compiler at install time and keeps the model in Python syntax next to its reference.

Equivalence: the loop performs the same floating-point operations in the same order as
`FluidShare` and `run_fast` (no fast-math, no contraction), so tests require identical
start and end times on random graphs, and `sim.fast` stays the readable reference with
the SimPy engine as the reference of both.

Compilation happens once per machine: `cache=True` stores the machine code next to
this module (or in Numba's user cache folder when that is read-only), so a new process
loads it in about a tenth of a second instead of compiling for several seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from schedlab.sim.prepare import Structure

_DISPATCH_END = 0
_TIMER = 1
_TOL_US = 1e-9  # the same slack as sim.fluid
_REL_TOL = 1e-12

I64 = np.int64
F64 = np.float64


@dataclass(frozen=True)
class FlatStructure:
    """A single-device `Structure` as CSR arrays (built once per graph by `sim.flatgraph`)."""

    pending: np.ndarray  # int64[n]
    succ_ptr: np.ndarray  # int64[n+1]
    succ_idx: np.ndarray  # int64[...]
    rel_ptr: np.ndarray  # int64[n+1]
    rel_idx: np.ndarray  # int64[...]
    alloc_bytes: np.ndarray  # int64[n]
    storage_refs: np.ndarray  # int64[storages]
    storage_bytes: np.ndarray  # int64[storages]
    initial_live: int


def csr(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of integers as (ptr, idx): row i is idx[ptr[i]:ptr[i + 1]]."""
    lengths = np.fromiter((len(r) for r in rows), dtype=I64, count=len(rows))
    ptr = np.zeros(len(rows) + 1, dtype=I64)
    np.cumsum(lengths, out=ptr[1:])
    idx = np.fromiter((x for r in rows for x in r), dtype=I64, count=int(ptr[-1]))
    return ptr, idx


def flatten(st: Structure) -> FlatStructure:
    """CSR arrays of a Python-built structure whose ops all run on one device: the reference
    `sim.flatgraph.flat_single_device` must equal (tests/sim/test_equivalence.py)."""
    succ_ptr, succ_idx = csr(st.local_succs)
    rel_ptr, rel_idx = csr(st.release)
    dev = st.op_device[0] if st.op_device else 0
    return FlatStructure(
        pending=np.asarray(st.pending, dtype=I64),
        succ_ptr=succ_ptr,
        succ_idx=succ_idx,
        rel_ptr=rel_ptr,
        rel_idx=rel_idx,
        alloc_bytes=np.asarray(st.alloc_bytes, dtype=I64),
        storage_refs=np.asarray(st.storage_refs, dtype=I64),
        storage_bytes=np.asarray(st.storage_bytes, dtype=I64),
        initial_live=int(st.initial_live[dev]) if st.initial_live else 0,
    )


def priority_rank(priority: np.ndarray) -> np.ndarray:
    """rank[o]: position of op o when ops are sorted by (priority, op id); ranks are unique."""
    n = len(priority)
    order = np.lexsort((np.arange(n, dtype=I64), priority))
    rank = np.empty(n, dtype=I64)
    rank[order] = np.arange(n, dtype=I64)
    return rank


@dataclass(frozen=True)
class LoopResult:
    start_us: np.ndarray
    end_us: np.ndarray
    worker: np.ndarray
    start_order: np.ndarray
    peak_bytes: int
    busy_unit_us: float


def run_compiled(
    flat: FlatStructure,
    *,
    slots: int,
    capacity: int,
    priority: np.ndarray,
    dispatch_us: np.ndarray,
    kernel_us: np.ndarray,
    demand: np.ndarray,
    slowdown: np.ndarray | None,
    slowdown_held: np.ndarray | None = None,
) -> LoopResult:
    """Simulate one step of ops on one CPU device; `slowdown[o, busy_others]` or None (all 1);
    `slowdown_held`: the same while a worker holds the interpreter lock (`FluidShare.hold`),
    or None where it changes nothing."""
    n = len(kernel_us)
    rank = priority_rank(priority)
    op_of_rank = np.empty(n, dtype=I64)
    op_of_rank[rank] = np.arange(n, dtype=I64)
    table = slowdown if slowdown is not None else np.ones((1, 1), dtype=F64)
    held = slowdown_held if slowdown_held is not None and slowdown is not None else table
    start, end, worker, order, peak, busy, done = _loop(
        n, slots, capacity, rank, op_of_rank, dispatch_us, kernel_us, demand,
        flat.alloc_bytes, flat.pending, flat.succ_ptr, flat.succ_idx, flat.rel_ptr, flat.rel_idx,
        flat.storage_refs, flat.storage_bytes, flat.initial_live, table, slowdown is not None,
        held, slowdown_held is not None and slowdown is not None,
    )  # fmt: skip
    if done != n:  # pragma: no cover - prepare() only builds DAGs
        raise RuntimeError(f"simulation stalled: {n - done} of {n} ops never ran")
    return LoopResult(start, end, worker, order, int(peak), float(busy))


# ---- the compiled loop ---------------------------------------------------------------------
# Events are a binary heap over (time, seq) in parallel arrays; the ready set is a binary
# heap of priority ranks; the fluid share keeps its running jobs in insertion order, as
# FluidShare's lists do.


@njit(cache=True, inline="always")
def _ev_less(t: np.ndarray, s: np.ndarray, a: int, b: int) -> bool:
    return t[a] < t[b] or (t[a] == t[b] and s[a] < s[b])


@njit(cache=True, inline="always")
def _ev_swap(et, es, ek, ea, a, b):  # type: ignore[no-untyped-def]
    et[a], et[b] = et[b], et[a]
    es[a], es[b] = es[b], es[a]
    ek[a], ek[b] = ek[b], ek[a]
    ea[a], ea[b] = ea[b], ea[a]


@njit(cache=True)
def _ev_push(et, es, ek, ea, size, time, seq, kind, arg):  # type: ignore[no-untyped-def]
    i = size
    et[i], es[i], ek[i], ea[i] = time, seq, kind, arg
    while i > 0:
        p = (i - 1) >> 1
        if _ev_less(et, es, i, p):
            _ev_swap(et, es, ek, ea, i, p)
            i = p
        else:
            break
    return size + 1


@njit(cache=True)
def _ev_pop(et, es, ek, ea, size):  # type: ignore[no-untyped-def]
    last = size - 1
    et[0], es[0], ek[0], ea[0] = et[last], es[last], ek[last], ea[last]
    size = last
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        c = left
        if left + 1 < size and _ev_less(et, es, left + 1, left):
            c = left + 1
        if _ev_less(et, es, c, i):
            _ev_swap(et, es, ek, ea, i, c)
            i = c
        else:
            break
    return size


@njit(cache=True)
def _heap_push(h, size, x):  # type: ignore[no-untyped-def]
    i = size
    h[i] = x
    while i > 0:
        p = (i - 1) >> 1
        if h[i] < h[p]:
            h[i], h[p] = h[p], h[i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True)
def _heap_pop(h, size):  # type: ignore[no-untyped-def]
    top = h[0]
    size -= 1
    h[0] = h[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        c = left
        if left + 1 < size and h[left + 1] < h[left]:
            c = left + 1
        if h[c] < h[i]:
            h[i], h[c] = h[c], h[i]
            i = c
        else:
            break
    return top, size


@njit(cache=True, inline="always")
def _rerate(now, nj, td, cap, fk, fdem, frem, frate, ffin, slow, use_slow):  # type: ignore[no-untyped-def]
    """FluidShare._recompute: every running job's rate and projected finish; the earliest."""
    share = 1.0 if td <= cap else cap / td
    next_at = np.inf
    for i in range(nj):
        r = share
        if use_slow:
            others = td - fdem[i]
            if others > cap:
                others = cap
            f = slow[fk[i], others]
            if f > 1.0:
                r = share / f
        frate[i] = r
        left = frem[i]
        t = now + left / r if left > 0.0 else now
        ffin[i] = t
        if t < next_at:
            next_at = t
    return next_at


@njit(cache=True)
def _loop(  # type: ignore[no-untyped-def]
    n, slots, cap, rank, op_of_rank, disp, kern, demand, alloc_bytes,
    pending0, succ_ptr, succ_idx, rel_ptr, rel_idx, refs0, sbytes, initial_live, slow, use_slow,
    slow_held, use_held,
):  # fmt: skip
    start = np.zeros(n)
    end = np.zeros(n)
    worker_of = np.zeros(n, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    n_order = 0
    pending = pending0.copy()
    refs = refs0.copy()

    ready = np.empty(n + 1, dtype=np.int64)
    n_ready = 0
    for o in range(n):
        if pending[o] == 0:
            n_ready = _heap_push(ready, n_ready, rank[o])

    # Workers: idle flags (the lowest idle index goes first), the lock's FIFO queue.
    idle = np.ones(slots, dtype=np.bool_)
    n_idle = slots
    ended = np.empty(slots, dtype=np.int64)
    n_ended = 0
    seekers = 0
    cur = np.full(slots, -1, dtype=np.int64)
    gil_free = True
    held = False  # a worker holds the lock for a dispatch (FluidShare.held)
    q = np.empty(slots + 1, dtype=np.int64)
    q_head = 0
    q_len = 0

    # Events.
    cap_e = 5 * n + 16  # dispatch ends, timers, and a timer per re-rating at a dispatch (FluidShare.hold)
    et = np.empty(cap_e)
    es = np.empty(cap_e, dtype=np.int64)
    ek = np.empty(cap_e, dtype=np.int64)
    ea = np.empty(cap_e, dtype=np.int64)
    n_ev = 0
    seq = 0
    now = 0.0
    need_settle = True

    # Fluid share of the device's cores (FluidShare, max_jobs=None).
    fk = np.empty(slots + 1, dtype=np.int64)
    fdem = np.empty(slots + 1, dtype=np.int64)
    frem = np.empty(slots + 1)
    frate = np.empty(slots + 1)
    ffin = np.empty(slots + 1)
    nj = 0
    td = 0
    last = 0.0
    next_at = 0.0
    version = 0
    busy = 0.0
    fin_buf = np.empty(slots + 1, dtype=np.int64)

    # Memory of the one device.
    live = initial_live
    peak = initial_live
    deferred = 0

    done = 0
    while True:
        if n_ev > 0 and et[0] <= now:
            kind = ek[0]
            arg = ea[0]
            n_ev = _ev_pop(et, es, ek, ea, n_ev)
            nf = 0
            if kind == _DISPATCH_END or arg == version:
                # FluidShare.start / advance: first bring running jobs to `now`.
                if nj > 0:
                    dt = now - last
                    if dt > 0.0:
                        for i in range(nj):
                            frem[i] -= frate[i] * dt
                        busy += (td if td < cap else cap) * dt
                    limit = now + _TOL_US + _REL_TOL * abs(now)
                    if next_at <= limit:
                        j = 0
                        for i in range(nj):
                            if ffin[i] <= limit:
                                fin_buf[nf] = fk[i]
                                nf += 1
                                td -= fdem[i]
                            else:
                                fk[j] = fk[i]
                                fdem[j] = fdem[i]
                                frem[j] = frem[i]
                                frate[j] = frate[i]
                                ffin[j] = ffin[i]
                                j += 1
                        nj = j
                if kind == _DISPATCH_END:
                    o = cur[arg]
                    gil_free = True
                    held = False  # the lock is free: re-rated below
                    need_settle = True
                    b = alloc_bytes[o]
                    if b != 0:
                        live += b
                        if live > peak:
                            peak = live
                    work = kern[o]
                    fk[nj] = o
                    fdem[nj] = demand[o]
                    frem[nj] = work if work > 0.0 else 0.0
                    frate[nj] = 1.0
                    ffin[nj] = 0.0
                    nj += 1
                    td += demand[o]
                last = now
                # FluidShare._recompute
                version += 1
                if nj > 0:
                    next_at = _rerate(now, nj, td, cap, fk, fdem, frem, frate, ffin, slow_held if held else slow, use_slow)
            else:
                continue  # a stale timer
            for k in range(nf):
                o = fin_buf[k]
                end[o] = now
                ended[n_ended] = worker_of[o]
                n_ended += 1
                for p in range(rel_ptr[o], rel_ptr[o + 1]):
                    s = rel_idx[p]
                    r = refs[s] - 1
                    refs[s] = r
                    if r == 0:
                        deferred += sbytes[s]
                for p in range(succ_ptr[o], succ_ptr[o + 1]):
                    s = succ_idx[p]
                    c = pending[s] - 1
                    pending[s] = c
                    if c == 0:
                        n_ready = _heap_push(ready, n_ready, rank[s])
                need_settle = True
            done += nf
            if nj > 0:
                d = next_at - now
                delay = d if d > 0.0 else 0.0
                seq += 1
                n_ev = _ev_push(et, es, ek, ea, n_ev, now + delay, seq, _TIMER, version)
            continue
        if need_settle:
            need_settle = False
            live -= deferred
            deferred = 0
            if n_ended > 0:
                ended[:n_ended].sort()
                for k in range(n_ended):
                    q[(q_head + q_len) % (slots + 1)] = ended[k]
                    q_len += 1
                seekers += n_ended
                n_ended = 0
            while n_idle > 0 and seekers < n_ready:
                w = 0
                while not idle[w]:
                    w += 1
                idle[w] = False
                n_idle -= 1
                q[(q_head + q_len) % (slots + 1)] = w
                q_len += 1
                seekers += 1
            while gil_free and q_len > 0:
                w = q[q_head]
                q_head = (q_head + 1) % (slots + 1)
                q_len -= 1
                seekers -= 1
                if n_ready > 0:
                    top, n_ready = _heap_pop(ready, n_ready)
                    o = op_of_rank[top]
                    cur[w] = o
                    start[o] = now
                    worker_of[o] = w
                    order[n_order] = o
                    n_order += 1
                    gil_free = False
                    seq += 1
                    n_ev = _ev_push(et, es, ek, ea, n_ev, now + disp[o], seq, _DISPATCH_END, w)
                    if use_held and not held:  # FluidShare.hold: re-rate the running kernels
                        held = True
                        matters = False
                        for i in range(nj):
                            others = td - fdem[i]
                            if others > cap:
                                others = cap
                            if slow_held[fk[i], others] != slow[fk[i], others]:
                                matters = True
                                break
                        if matters:
                            dt = now - last
                            if dt > 0.0:
                                for i in range(nj):
                                    frem[i] -= frate[i] * dt
                                busy += (td if td < cap else cap) * dt
                            last = now
                            version += 1
                            next_at = _rerate(now, nj, td, cap, fk, fdem, frem, frate, ffin, slow_held, use_slow)
                            d = next_at - now
                            seq += 1
                            n_ev = _ev_push(et, es, ek, ea, n_ev, now + (d if d > 0.0 else 0.0), seq, _TIMER, version)
                else:
                    idle[w] = True
                    n_idle += 1
            continue
        if n_ev == 0:
            break
        now = et[0]
    return start, end, worker_of, order[:n_order], peak, busy, done
