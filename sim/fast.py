"""The fast engine: the SimPy model of `sim.engine`, hand-inlined as one heap loop.

It applies when every op runs on one CPU device (no transfers, no streams), which is
what a concurrency-control search on one host asks thousands of times. It follows the
same rules as the SimPy engine and shares its state classes (`FluidShare`,
`MemoryTracker`, `Prepared`); `tests/sim` checks that both give identical traces.

Rules, in both engines (time in µs). Python code of the executor runs only while its
thread holds the interpreter lock, so a worker takes its next op under the lock:

1. A worker wants work when its kernel ends (it does the bookkeeping and looks at the
   heap) or when it is idle and ops became ready that no other seeker will take; it
   then queues for the interpreter lock (FIFO).
2. Holding the lock, it pops the ready op of lowest (priority, op id); the op starts
   there (trace start). Nothing ready: it releases the lock and goes idle.
3. The op's dispatch part keeps the lock for `dispatch_us` (the running kernels are
   re-rated as it takes the lock, `FluidShare.hold`: see `sim.wake`); the kernel then
   runs on the device's cores (`FluidShare`), allocating the op's outputs as it starts.
4. When the kernel ends, storages whose last reference the op held are freed and ops
   whose inputs are all done become ready.

Decisions are taken at the end of each instant, after every event of that instant, in
a fixed order: frees apply; workers whose kernels ended join the lock queue (ascending
index); idle workers (ascending index) join while fewer seekers than ready ops; the
free lock goes to the head of the queue. No outcome depends on the order in which
simultaneous events happen to be processed.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush

from schedlab.errors import SchedlabError
from schedlab.sim.fluid import FluidShare
from schedlab.sim.memory import MemoryTracker
from schedlab.sim.prepare import Prepared
from schedlab.sim.result import Timeline

_DISPATCH_END = 0
_TIMER = 1


def run_fast(prep: Prepared) -> tuple[Timeline, MemoryTracker, list[float]]:
    """Simulate one step on a single CPU device. Returns times, memory, busy core-µs per device."""
    if not prep.single_cpu:
        raise ValueError("the fast engine needs every op on one CPU device")
    st = prep.structure
    n = prep.n_ops
    dev = st.op_device[0] if n else 0
    slots = prep.slots
    fluid = FluidShare(prep.capacity[dev], prep.slowdown[dev],
                       slowdown_held=prep.slowdown_held[dev] if prep.slowdown_held else None)
    mem = MemoryTracker(list(st.initial_live))
    alloc = mem.alloc
    free_later = mem.free_later

    prio = prep.priority
    pending = list(st.pending)
    refs = list(st.storage_refs)
    sbytes = st.storage_bytes
    disp = prep.dispatch_us
    kern = prep.kernel_us
    demand = prep.demand
    alloc_bytes = st.alloc_bytes
    release = st.release
    local_succs = st.local_succs

    start_us = [0.0] * n
    end_us = [0.0] * n
    worker_of = [0] * n
    order: list[int] = []
    done = 0

    ready = [(prio[o], o) for o in range(n) if pending[o] == 0]
    heapify(ready)
    idle = list(range(slots))  # a heap of worker indices
    ended: list[int] = []  # workers whose kernels ended in this instant
    seekers = 0  # workers queued for the lock to look for work
    cur = [-1] * slots
    gil_free = True
    gil_queue: deque[int] = deque()

    events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, worker or version)
    seq = 0
    now = 0.0
    need_settle = True

    while True:
        if events and events[0][0] <= now:
            _, _, kind, arg = heappop(events)
            if kind == _DISPATCH_END:
                o = cur[arg]
                gil_free = True
                need_settle = True
                alloc(dev, alloc_bytes[o])
                fluid.held = False  # the lock is free: `start` re-rates
                finished = fluid.start(now, o, demand[o], kern[o])
            elif arg != fluid.version:
                continue  # a stale timer
            else:
                finished = fluid.advance(now)
            for o in finished:
                end_us[o] = now
                ended.append(worker_of[o])
                for s in release[o]:
                    r = refs[s] - 1
                    refs[s] = r
                    if r == 0:
                        free_later(dev, sbytes[s])
                for s in local_succs[o]:
                    p = pending[s] - 1
                    pending[s] = p
                    if p == 0:
                        heappush(ready, (prio[s], s))
                need_settle = True
            done += len(finished)
            delay = fluid.next_delay(now)
            if delay is not None:
                seq += 1
                heappush(events, (now + delay, seq, _TIMER, fluid.version))
            continue
        if need_settle:  # the instant is over (see the rules above)
            need_settle = False
            mem.settle()
            if ended:
                ended.sort()
                gil_queue.extend(ended)
                seekers += len(ended)
                ended.clear()
            while idle and seekers < len(ready):
                gil_queue.append(heappop(idle))
                seekers += 1
            while gil_free and gil_queue:
                w = gil_queue.popleft()
                seekers -= 1
                if ready:
                    o = heappop(ready)[1]
                    cur[w] = o
                    start_us[o] = now
                    worker_of[o] = w
                    order.append(o)
                    gil_free = False
                    seq += 1
                    heappush(events, (now + disp[o], seq, _DISPATCH_END, w))
                    if fluid.hold(now, True):  # the running kernels re-rated: a new timer
                        delay = fluid.next_delay(now)
                        seq += 1
                        heappush(events, (now + (delay or 0.0), seq, _TIMER, fluid.version))
                else:
                    heappush(idle, w)
            continue
        if not events:
            break
        now = events[0][0]

    if done != n:  # pragma: no cover - prepare() only builds DAGs
        raise SchedlabError(f"simulation stalled: {n - done} of {n} ops never ran")
    busy = [0.0] * len(prep.device_ids)
    busy[dev] = fluid.busy_unit_us
    return Timeline(start_us, end_us, worker_of, order), mem, busy
