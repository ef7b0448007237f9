"""The SimPy model of the executor across processes, devices and links: `run_simpy()`.

The model (time unit: microseconds):

- **Processes, workers and interpreter locks.** Each process (a rank: `Device.process`)
  has its own interpreter lock, a `simpy.Resource(capacity=1)`, and its own workers:
  `resolved.slots_of(device)` of them for each device of the process that runs ops. A
  worker takes ops of its device only, from that device's ready heap, so a device never
  runs more ops at once than its slots; devices of one process (a CPU and the GPUs one
  Python process drives) share that process's lock. The Python code of the executor
  (taking an op off the heap, the dispatch part `cost.dispatch_us`) runs only under its
  process's lock. A worker whose kernel ended, or an idle worker woken because ops of
  its device became ready, queues for the lock (FIFO); holding it, it pops the ready op
  of lowest (priority, op id), which starts then, and keeps the lock through the
  dispatch part. Nothing ready: it releases the lock and idles. Who queues, in which
  order, and what is popped is decided at the end of each instant (SimPy priorities 2
  and 3, after every normal event at that time), process by process in ascending order:
  the workers that ended (ascending), then idle workers of each device (ascending) while
  fewer of the device's workers seek the lock than it has ready ops. So the outcome never
  depends on how simultaneous events happen to be ordered; with one process and one
  device these are `sim.fast`'s rules. (A one-slot device of an expanded graph walks its
  ops in sequence instead; see below.)
- **CPU kernels** run on their device's cores, a processor-sharing server
  (`sim.fluid.FluidShare`): k threads demand k cores (one where the kernel runs inline,
  `sim.cost.demand_rule`); above the core count everyone is
  stretched by total_threads/cores; each kernel is further slowed by
  `cost.corun_slowdown(op, busy cores of the others, cores)`. The worker waits for its
  kernel (ATen releases the lock, so kernels of different workers overlap).
- **Core pools.** CPU devices whose processes share a machine's core pool (more local
  ranks than cores: `Machine.core_pools`) run their kernels on one server of the pool's
  cores instead, processor-shared across the ranks as the operating system time-slices
  them (a rank that idles leaves its share to the others), each kernel slowed by the
  co-run rule of its own device at the pool's size. Their processes' Python time under
  the lock (dispatch, posting, waits' done parts) runs there too, as one-core jobs that
  no co-run rule slows: the interpreter needs a core as much as a kernel thread does.
- **GPU kernels.** The worker dispatches on the host (holding the lock), launches the
  kernel and is free again; the kernel runs on one of the device's `streams` (a kernel
  queues FIFO when all are busy; co-running kernels slow each other through
  `corun_slowdown(op, busy streams of the others, streams)`). The host runs ahead of the
  device, as CUDA's asynchronous launches let it: a compute op on the same GPU that reads
  the kernel's output may be dispatched once the kernel is *launched*, and its own kernel
  starts only after the kernels it reads ended (on one stream, FIFO order gives that; on
  several, it waits for them, as an event would make it). With several workers, each
  dispatch grows by `prep.contention_us` x log2(1 + the workers queued for the lock as it
  takes it): the interpreter lock and the driver pass between the threads at every launch
  (`calibrate.cuda_calibrate.stream_costs_us` measures one waiting worker's cost). The
  log2 was chosen over a linear count on the built-ins' two- and four-slot steps on an
  H200 (mean error 13.2% against 16.4%), then checked on the held-out models (17.9%
  against 22.9%). Every other successor (a CPU
  op, a transfer, a send or an all-reduce) becomes ready when the kernel ends. (Measured
  on an H200: an executor step of the built-in models was the host's issue time plus a
  little, not issue plus kernel time; `schedlab fidelity --cuda`.)
- **Send, recv and all-reduce** (an expanded graph's COMM ops, `sim.comm`), as the
  multi-process executor runs them (`exec.dist`). A send is dispatched like any op
  (`dispatch_us` under the lock) and hands the transfer of `op.bytes_moved` bytes to the
  link (`sim.interconnect`: latency plus bytes over bandwidth, contended by name); the
  send ends once its caller wrote the data (a one-thread kernel on its device's cores,
  `CommOpCost.post_kernel_us`, in flight beside the transfer: gloo writes into the socket
  in the caller; with no measured write, at once, as an isend returns), and its input
  stays referenced until the transfer ends. A recv is *posted* (`dispatch_us` under the lock; its buffer is allocated then),
  and its transfer starts when both the send was handed off and the recv was posted
  (gloo moves data only to a posted receive); it ends when the data is there, and its
  consumers become ready on the receiving process (after its done part under the lock, the
  wait, when the cost model measured one). An all-reduce is *issued* (`dispatch_us` under the lock, then
  its kernel, flattening the bucket: `sim.prepare.comm_kernel_us`; its inputs are
  released and its output buffer allocated) and later *finished* (once its collective
  ended: its done part under the lock, then its done kernel, averaging; by default its
  dispatch and kernel again). Where the cost model measured what COMM ops cost their
  rank (`sim.comm.CommHostCost`), those parts come from it (`sim.prepare.comm_host_costs`). A bucket's
  collective starts when every member of its group has issued it; its time alone comes
  from `sim.collective` (ring model or the cost model's fit), its bandwidth part shared
  on the ring's wires and, where the cost model says the collective needs a core of each
  CPU member (`sim.comm.CommOpCost.collective_cpu_share`: gloo copies and reduces on the
  ranks' own cores), that share of it run as a one-thread job on each member's cores too,
  processor-shared with the kernels there; the collective ends when both parts have.
  Between two CPU ranks the executor's all-reduce is a send and a receive (`exec.reduce`),
  and its issue ends with the caller writing the bucket into the socket, as a send's
  (`CommOpCost.write_us`: a one-thread job on its cores that the caller waits for, beside
  the collective, whose CPU part on that member follows it); the collective ends no
  earlier than every member's write. Devices issue a group's buckets in ascending order.
  Who does this depends on the device's slots, as in the executor:
  - *one slot*: its one worker walks the device's ops in the resolved `sequence` (a
    straight-line program): at a recv it posts the receives not posted yet, all of the
    step's (the executor cannot tell whether a gloo receive's data is there before it
    waits on it, so its first wait posts them all: `exec.dist`), then waits; it issues an all-reduce
    at its place, and finishes it just before the first op that reads its result (or
    after its last op);
  - *several slots*: its workers take compute ops and sends off the ready heap; one
    communication thread per device posts all its receives as the step starts, then
    walks its recvs and all-reduces in `sequence` order, one at a time (waiting for
    each recv, issuing and finishing each all-reduce in turn).
  Trace tracks as the executor's: recvs and all-reduces on worker -1 (from the moment
  the walker or the thread starts on them), sends on worker -2.
- **Implicit transfers** (a graph placed on several devices without expansion: tests'
  `sim.testing.place`). A consumer on another device than a value's home waits for one
  transfer of that value to its device, started when the value is ready. The trace shows
  it as kind "COMM", op = the first consumer, name "send <value>", device = the sender,
  worker = -1 - link index, threads 0.
- **Memory.** Outputs are allocated when the kernel starts (a recv's buffer when it is
  posted; an all-reduce's output buffer when it is issued); a storage is
  freed at the end of the instant in which its last reader finishes, unless it holds a
  graph input or output (see `sim.memory`).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from heapq import heapify, heappop, heappush
from typing import Any

import simpy
from simpy.events import EventPriority
from simpy.resources.resource import Request

from schedlab.errors import SchedlabError
from schedlab.machine import Machine
from schedlab.sim.comm import RECV_TRACK, SEND_TRACK, CommOpCost, Role
from schedlab.sim.fluid import FluidShare, PooledShare
from schedlab.sim.interconnect import Network
from schedlab.sim.memory import MemoryTracker
from schedlab.sim.prepare import PINNED, Prepared, Structure
from schedlab.sim.result import Timeline
from schedlab.sim.server import SimServer

_SETTLE = EventPriority(2)  # after NORMAL (1): once every ordinary event of the instant is done
_PICK = EventPriority(3)  # after the settle of the same instant


class _Later(simpy.Event):
    """An event that fires at the current time, after all events of higher priority."""

    def __init__(self, env: simpy.Environment, priority: EventPriority) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, priority)


class _Process:
    """One process (rank): its interpreter lock, and its workers that ended this instant."""

    __slots__ = ("devices", "ended", "lock")

    def __init__(self, env: simpy.Environment, devices: list[int]) -> None:
        self.lock = simpy.Resource(env, capacity=1)  # the interpreter lock
        self.devices = devices  # the devices of this process that have heap workers, ascending
        self.ended: list[int] = []  # workers whose kernels ended (or were handed off) this instant


class _SimpyRun:
    """One simulated step in a fresh SimPy Environment."""

    def __init__(self, prep: Prepared, machine: Machine) -> None:
        self.prep = prep
        self.env = env = simpy.Environment()
        self.servers = _servers(env, prep)
        n_procs = max(prep.device_process, default=0) + 1
        # per process: the pool server its Python time runs on (its pooled CPU device's), or None
        self.host_server: list[SimServer | None] = [None] * n_procs
        for d, server in enumerate(self.servers):
            if prep.pooled(d):
                self.host_server[prep.device_process[d]] = server
        self.network = Network(env, machine)
        self.st = st = prep.structure
        self.comm = st.comm
        self.role: tuple[Role, ...] | None = None if st.comm is None else st.comm.role
        self.mem = MemoryTracker(list(st.initial_live))
        n = prep.n_ops
        n_dev = len(prep.device_ids)
        self.pending = list(st.pending)
        self.refs = list(st.storage_refs)
        role = self.role
        used = sorted(set(st.op_device))
        # A one-slot device of an expanded graph walks its ops in sequence (`_walk`); the
        # others have heap workers (and, with COMM ops, a communication thread: `_comm_thread`).
        self.walks = [role is not None and prep.device_slots[d] == 1 for d in range(n_dev)]
        self.in_sequence: list[list[int]] = [[] for _ in range(n_dev)]  # per device: its ops in sequence order
        if role is not None:
            order = prep.sequence if len(prep.sequence) == n else range(n)
            for o in order:
                self.in_sequence[st.op_device[o]].append(o)
            _check_bucket_order(self.in_sequence, st, prep.device_ids)
        # Heap workers: slots_of(device) for each such device, numbered by device then slot.
        self.worker_dev: list[int] = []
        self.worker_slot: list[int] = []
        for d in used:
            if not self.walks[d]:
                for k in range(prep.device_slots[d]):
                    self.worker_dev.append(d)
                    self.worker_slot.append(k)
        self.procs = [
            _Process(env, [d for d in used if prep.device_process[d] == p and not self.walks[d]]) for p in range(n_procs)
        ]
        # The host runs ahead of a GPU (module docstring): op -> its successors that may be
        # dispatched once its kernel is launched, and op -> the kernels its kernel waits for.
        self.early_succs: list[tuple[int, ...]] = [()] * n
        self.late_succs: tuple[tuple[int, ...], ...] = st.local_succs
        self.kernel_waits: list[list[int]] = [[] for _ in range(n)]
        if any(prep.device_is_gpu):
            early: list[tuple[int, ...]] = []
            late: list[tuple[int, ...]] = []
            for o in range(n):
                d = st.op_device[o]
                if not prep.device_is_gpu[d] or (role is not None and role[o] is not Role.COMPUTE):
                    early.append(())
                    late.append(st.local_succs[o])
                    continue
                e = tuple(x for x in st.local_succs[o] if st.op_device[x] == d and (role is None or role[x] is Role.COMPUTE))
                early.append(e)
                late.append(tuple(x for x in st.local_succs[o] if x not in e))
                for x in e:
                    self.kernel_waits[x].append(o)
            self.early_succs, self.late_succs = early, tuple(late)
        self.kernel_ended = [False] * n
        self.when_kernel_ends: dict[int, simpy.Event] = {}
        self.ready: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]  # per device: heap of (priority, op)
        for o in range(n):
            if self.pending[o] == 0 and self._on_heap(o):
                self.ready[st.op_device[o]].append((prep.priority[o], o))
        for h in self.ready:
            heapify(h)
        self.idle: list[list[int]] = [[] for _ in range(n_dev)]  # per device: heap of worker ids
        for w, d in enumerate(self.worker_dev):
            self.idle[d].append(w)
        self.seekers = [0] * n_dev  # per device: workers queued for the lock to look for work
        self.wakeup: list[simpy.Event | None] = [None] * len(self.worker_dev)
        self.issued = [0] * (len(st.comm.collectives) if st.comm is not None else 0)
        self.when_ready: dict[int, simpy.Event] = {}  # op -> fires when its last token arrives
        self.arrived = [False] * n  # recv: its transfer arrived; all-reduce: its collective ended
        self.writes: dict[int, simpy.Event] = {}  # all-reduce -> its exchange's write in flight (`CommOpCost.write_us`)
        self.posted = [False] * n  # recv: posted (its buffer allocated; its transfer may move)
        self.when_posted: dict[int, simpy.Event] = {}
        self.recvs_of: list[list[int]] = [
            [o for o in ops if role is not None and role[o] is Role.RECV] for ops in self.in_sequence
        ]
        self.n_posted = [0] * n_dev  # per device: how many of recvs_of[d] are posted (in order)
        self.when_arrived: dict[int, simpy.Event] = {}
        self.settle_pending = False
        self.tl = Timeline([0.0] * n, [0.0] * n, [0] * n, [])
        self.done = 0

    def _on_heap(self, o: int) -> bool:
        """Whether op `o` is taken off a ready heap by a worker (else walked, or the comm thread's)."""
        if self.walks[self.st.op_device[o]]:
            return False
        return self.role is None or self.role[o] in (Role.COMPUTE, Role.SEND)

    def run(self) -> None:
        for w in range(len(self.worker_dev)):
            self.env.process(self._worker(w))
        for d, ops in enumerate(self.in_sequence):
            if self.walks[d] and ops:
                self.env.process(self._walk(d))
            elif ops and self.role is not None and any(self.role[o] in (Role.RECV, Role.ALL_REDUCE) for o in ops):
                self.env.process(self._comm_thread(d))
        for x in self.st.initial_sends:
            self.env.process(self._send_implicit(x))
        self._request_settle()
        self.env.run()
        if self.done != self.prep.n_ops:
            raise SchedlabError(f"simulation stalled: {self.prep.n_ops - self.done} of {self.prep.n_ops} ops never ran")

    # ---- processes -------------------------------------------------------------------------

    def _worker(self, w: int) -> Generator[simpy.Event, Any, None]:
        env, prep, st = self.env, self.prep, self.st
        d = self.worker_dev[w]
        proc = self.procs[prep.device_process[d]]
        lock, server, gpu = proc.lock, self.servers[d], prep.device_is_gpu[d]
        contention_us = prep.contention_us[d] if prep.contention_us else 0.0
        role = self.role
        while True:
            wake = env.event()
            self.wakeup[w] = wake
            req: Request = yield wake  # the settle queues us for the lock
            yield req
            yield _Later(env, _PICK)  # let every event of this instant land before choosing
            o = self._pick(w, d)
            if o is None:
                lock.release(req)
                continue
            dispatch_us = prep.dispatch_us[o]
            if contention_us and lock.queue:  # others queued behind us: the lock passes between threads
                dispatch_us += contention_us * math.log2(1 + len(lock.queue))
            dispatching = self._host(d, dispatch_us)
            if not gpu:
                server.hold(True)  # its running kernels re-rated while we run Python (sim.wake)
            yield dispatching
            lock.release(req)
            if role is not None and role[o] is Role.SEND:
                self.tl.worker[o] = SEND_TRACK
                if not gpu:
                    server.hold(False)
                yield from self._send(o)
            else:
                self.mem.alloc(d, st.alloc_bytes[o])
                if gpu:
                    self._launch(o)  # the worker moves on
                else:
                    server.fluid.held = False  # the lock is free: `run` re-rates
                    done = server.run(o, prep.demand[o], prep.kernel_us[o])
                    self._request_settle()  # the lock is free
                    yield done
                    self._complete(o)
            proc.ended.append(w)
            self._request_settle()

    def _walk(self, d: int) -> Generator[simpy.Event, Any, None]:
        """The one worker of a one-slot device: its ops in sequence, as a straight-line program."""
        prep, st = self.prep, self.st
        assert self.comm is not None and self.role is not None
        p = prep.device_process[d]
        # Alone on its process (no other device, no heap workers), nothing contends for its
        # lock: skip the Resource (the same times, fewer events).
        alone = not self.procs[p].devices and sum(1 for e in range(len(self.walks)) if self.walks[e]
                                                  and self.in_sequence[e] and prep.device_process[e] == p) == 1
        lock = None if alone else self.procs[p].lock
        server, gpu = self.servers[d], prep.device_is_gpu[d]
        role, reads_reduced = self.role, self.comm.reads_reduced
        issued: list[int] = []  # all-reduces issued here and not finished yet
        for o in self.in_sequence[d]:
            r = role[o]
            if r is Role.RECV:
                self._begin(o, RECV_TRACK)
                yield from self._post_rest(d, lock)  # all of them: `exec.dist`
                waited_us = 0.0
                if not self.arrived[o]:
                    t0 = self.env.now
                    yield self._arrival_event(o)
                    waited_us = self.env.now - t0
                if prep.done_us[o] > 0.0:  # its wait, once the data is there
                    yield from self._hold(lock, d, prep.done_us[o])
                self._complete(o)
                yield from self._cold(o, waited_us, lock)
                continue
            for a in reads_reduced.get(o, ()):
                if a in issued:
                    issued.remove(a)
                    waited_us = yield from self._finish_reduce(a, lock)
                    yield from self._cold(a, waited_us, lock)
            if self.pending[o]:
                yield self._ready_event(o)  # a GPU kernel it reads is still running
            if r is Role.ALL_REDUCE:
                yield from self._issue_reduce(o, lock)
                issued.append(o)
                continue
            yield from self._hold(lock, d, prep.dispatch_us[o], o, 0 if r is Role.COMPUTE else SEND_TRACK)
            if r is Role.SEND:
                yield from self._send(o)
                yield from self._cold(o, 0.0, lock)
                continue
            self.mem.alloc(d, st.alloc_bytes[o])
            if gpu:
                self._launch(o)
            else:
                yield server.run(o, prep.demand[o], prep.kernel_us[o])
                self._complete(o)
        for a in issued:  # all-reduces whose results no op of this device reads
            waited_us = yield from self._finish_reduce(a, lock)
            yield from self._cold(a, waited_us, lock)  # the next step's first ops pay it

    def _cold(self, o: int, waited_us: float, lock: simpy.Resource | None) -> Generator[simpy.Event, Any, None]:
        """What COMM op `o`, which blocked `waited_us`, costs the ops after it on a one-slot
        rank (`CommOpCost.cold_us`), held before the next one starts."""
        c = self._measured(o)
        if c is not None and not self.prep.device_is_gpu[self.st.op_device[o]]:
            cold_us = c.cold_us(waited_us)
            if cold_us > 0.0:
                yield from self._hold(lock, self.st.op_device[o], cold_us)

    def _measured(self, o: int) -> CommOpCost | None:
        """COMM op `o`'s cost as the cost model measured it (`Prepared.comm_costs`), if it did."""
        return self.prep.comm_costs[o] if self.prep.comm_costs else None

    def _comm_thread(self, d: int) -> Generator[simpy.Event, Any, None]:
        """The communication thread of a device with heap workers: its recvs and all-reduces
        in sequence order, one at a time."""
        assert self.role is not None
        lock = self.procs[self.prep.device_process[d]].lock
        yield from self._post_rest(d, lock)  # all of them, as the step starts
        for o in self.in_sequence[d]:
            r = self.role[o]
            if r is Role.RECV:
                self._begin(o, RECV_TRACK)
                if not self.arrived[o]:
                    yield self._arrival_event(o)
                if self.prep.done_us[o] > 0.0:  # its wait, once the data is there
                    yield from self._hold(lock, d, self.prep.done_us[o])
                self._complete(o)
            elif r is Role.ALL_REDUCE:
                if self.pending[o]:
                    yield self._ready_event(o)
                yield from self._issue_reduce(o, lock)
                yield from self._finish_reduce(o, lock)

    def _hold(
        self, lock: simpy.Resource | None, d: int, dur_us: float, begin: int = -1, track: int = 0
    ) -> Generator[simpy.Event, Any, None]:
        """Hold `lock` (None: uncontended) for `dur_us` of device `d`'s process's Python time;
        op `begin` (if any) starts once it is held."""
        if lock is None:
            if begin >= 0:
                self._begin(begin, track)
            yield self._host(d, dur_us)
            return
        req = lock.request()
        yield req
        if begin >= 0:
            self._begin(begin, track)
        yield self._host(d, dur_us)
        lock.release(req)

    def _host(self, d: int, dur_us: float) -> simpy.Event:
        """`dur_us` of Python time of device `d`'s process, under its lock: a wait, or, where
        its process shares a core pool, a one-core job on the pool (the interpreter needs a
        core as much as a kernel thread does). One process holds its lock at a time, so it
        runs one such job at a time, keyed by its process."""
        p = self.prep.device_process[d]
        server = self.host_server[p]
        if server is None or dur_us <= 0.0:
            return self.env.timeout(dur_us)
        return server.run(self.prep.n_ops + p, 1, dur_us)

    def _post_rest(self, d: int, lock: simpy.Resource | None) -> Generator[simpy.Event, Any, None]:
        """Post device `d`'s receives not posted yet, in order: each holds the lock for its
        `dispatch_us` and allocates its buffer; its transfer may then move."""
        recvs = self.recvs_of[d]
        while self.n_posted[d] < len(recvs):
            r = recvs[self.n_posted[d]]
            self.n_posted[d] += 1
            yield from self._hold(lock, d, self.prep.dispatch_us[r])
            self.mem.alloc(d, self.st.alloc_bytes[r])
            self.posted[r] = True
            ev = self.when_posted.pop(r, None)
            if ev is not None:
                ev.succeed()

    def _issue_reduce(self, a: int, lock: simpy.Resource | None) -> Generator[simpy.Event, Any, None]:
        """Issue all-reduce `a`: dispatch under the lock, flatten its bucket (a kernel)."""
        prep, st = self.prep, self.st
        d = st.op_device[a]
        yield from self._hold(lock, d, prep.dispatch_us[a], a, RECV_TRACK)
        self.mem.alloc(d, st.alloc_bytes[a])  # the flat buffer; its outputs are views of it
        if prep.kernel_us[a] > 0.0:
            yield self.servers[d].run(a, prep.demand[a], prep.kernel_us[a])
        for s in st.issue_release.get(a, ()):
            self._release(s)
        cost = self._measured(a)
        write_us = cost.write_us if cost is not None and not prep.device_is_gpu[d] else 0.0
        if write_us > 0.0:  # the exchange's send, written in the caller beside the collective
            written = self.writes[a] = self.servers[d].run(a, 1, write_us)
            self._issue(a)
            yield written
        else:
            self._issue(a)

    def _finish_reduce(self, a: int, lock: simpy.Resource | None) -> Generator[simpy.Event, Any, float]:
        """Wait for all-reduce `a`'s collective, then average (under the lock, then a kernel) and
        end; how long it blocked (µs)."""
        prep = self.prep
        waited_us = 0.0
        if not self.arrived[a]:
            t0 = self.env.now
            yield self._arrival_event(a)
            waited_us = self.env.now - t0
        yield from self._hold(lock, self.st.op_device[a], prep.done_us[a])
        if prep.done_kernel_us[a] > 0.0:
            yield self.servers[self.st.op_device[a]].run(a, prep.demand[a], prep.done_kernel_us[a])
        self._complete(a)
        return waited_us

    def _launch(self, o: int) -> None:
        """GPU op `o` was dispatched: its kernel goes to the device's streams once the kernels
        it reads ended (at once on one stream: FIFO keeps them in order), and the ops that
        may run ahead (`early_succs`) get their token now."""
        d = self.st.op_device[o]
        waits = [p for p in self.kernel_waits[o] if not self.kernel_ended[p]] if self.prep.capacity[d] > 1 else []
        if waits:
            self.env.process(self._kernel_after(o, waits))
        else:
            self._submit(o)
        for x in self.early_succs[o]:
            self._token_done(x)

    def _kernel_after(self, o: int, waits: list[int]) -> Generator[simpy.Event, Any, None]:
        yield self.env.all_of([self._kernel_end_event(p) for p in waits])
        self._submit(o)

    def _submit(self, o: int) -> None:
        d = self.st.op_device[o]
        self.servers[d].run(o, self.prep.demand[o], self.prep.kernel_us[o]).callbacks.append(self._on_async_kernel_end)

    def _kernel_end_event(self, o: int) -> simpy.Event:
        ev = self.when_kernel_ends.get(o)
        if ev is None:
            ev = self.when_kernel_ends[o] = self.env.event()
        return ev

    def _on_async_kernel_end(self, event: simpy.Event) -> None:
        o = int(event.value or 0)
        self.kernel_ended[o] = True
        ev = self.when_kernel_ends.pop(o, None)
        if ev is not None:
            ev.succeed()
        self._complete(o)

    def _send(self, o: int) -> Generator[simpy.Event, Any, None]:
        """Send `o` was dispatched: its transfer starts, and the send ends once the caller
        wrote its data (its kernel on the device's cores, `CommOpCost.post_kernel_us`: gloo
        writes into the socket in the caller; nothing where the cost model measured none)."""
        assert self.comm is not None
        d = self.st.op_device[o]
        write_us = 0.0 if self.prep.device_is_gpu[d] else self.prep.kernel_us[o]
        written = self.servers[d].run(o, 1, write_us) if write_us > 0.0 else None
        self.env.process(self._transfer(o, self.comm.recv_of[o], written))
        if written is not None:
            yield written
        self.tl.end_us[o] = self.env.now
        self.done += 1

    def _transfer(self, o: int, r: int, written: simpy.Event | None) -> Generator[simpy.Event, Any, None]:
        assert self.comm is not None
        if not self.posted[r]:  # gloo moves the data once the receiver has posted
            ev = self.when_posted.get(r)
            if ev is None:
                ev = self.when_posted[r] = self.env.event()
            yield ev
        prep, ids, dev = self.prep, self.prep.device_ids, self.st.op_device
        nbytes = self.comm.send_bytes[o]
        cores = [  # its CPU at each end (`CommOpCost.transfer_cpu_us`), beside the link part; the
            # sender's once its write (the same job key) is done
            self._cpu_after(written if x == o else None, dev[x], x, c.transfer_cpu_us) for x in (o, r)
            if (c := self._measured(x)) is not None and c.transfer_cpu_us > 0.0 and dev[o] != dev[r]
            and not prep.device_is_gpu[dev[x]]
        ]
        rec = yield self.network.transfer(ids[dev[o]], ids[dev[r]], nbytes)
        if written is not None:  # nor before the caller wrote it all
            yield written
        if cores:
            yield self.env.all_of(cores)
        self.tl.sends.append((o, rec.link, nbytes, rec.start_us, rec.end_us))
        for s in self.st.release[o]:  # the send's input was in use until now
            self._release(s)
        self._arrive(r)
        self._request_settle()

    def _cpu_after(self, first: simpy.Event | None, d: int, key: int, work_us: float) -> simpy.Event:
        """A one-thread job `key` of `work_us` on device `d`'s cores, started now or once `first` fired."""
        if first is None or first.processed:
            return self.servers[d].run(key, 1, work_us)

        def later() -> Generator[simpy.Event, Any, None]:
            yield first
            yield self.servers[d].run(key, 1, work_us)

        return self.env.process(later())

    def _issue(self, o: int) -> None:
        """All-reduce op `o` was issued; its collective starts once every member was."""
        comm = self.comm
        assert comm is not None
        nxt = comm.issue_next.get(o)
        if nxt is not None:
            self._token_done(nxt)
        c = comm.collective_of[o]
        self.issued[c] += 1
        if self.issued[c] == len(comm.collectives[c].members):
            self.env.process(self._collective(c))

    def _collective(self, c: int) -> Generator[simpy.Event, Any, None]:
        assert self.comm is not None
        prep, timing = self.prep, self.prep.collective_time[c]
        link = self.network.collective(timing.links, timing.bw_us, timing.latency_us)
        members = self.comm.collectives[c].members
        writes = {m: w for m in members if (w := self.writes.pop(m, None)) is not None}  # the exchange's sends
        cores = [  # its CPU on each CPU member (`CommOpCost.collective_cpu_share`), beside the link
            # part; on a member still writing its bucket, once that is done (the same job key)
            self._cpu_after(writes.get(m), d, m, cost.collective_cpu_share * timing.bw_us)
            for m in members
            if (cost := self._measured(m)) is not None and cost.collective_cpu_share > 0.0 and timing.bw_us > 0.0
            and not prep.device_is_gpu[d := self.st.op_device[m]]
        ]
        cores += writes.values()
        start, end = yield link
        if cores:  # nor before its CPU part and every member's write are done
            yield self.env.all_of(cores)
            end = self.env.now
        self.tl.collectives.append((c, start, end))
        for m in self.comm.collectives[c].members:
            self._arrive(m)

    def _send_implicit(self, x: int) -> Generator[simpy.Event, Any, None]:
        prep = self.prep
        spec = self.st.transfers[x]
        self.mem.alloc(spec.dst, spec.nbytes)
        rec = yield self.network.transfer(prep.device_ids[spec.src], prep.device_ids[spec.dst], spec.nbytes)
        self.tl.transfers.append((x, rec.link, rec.start_us, rec.end_us))
        self._release(spec.src_storage)
        for c in spec.consumers:
            self._token_done(c)
        self._request_settle()

    # ---- bookkeeping -----------------------------------------------------------------------

    def _pick(self, w: int, d: int) -> int | None:
        """Worker `w` of device `d` holds the lock: the ready op it takes, or None (it goes idle)."""
        self.seekers[d] -= 1
        ready = self.ready[d]
        if not ready:
            heappush(self.idle[d], w)
            return None
        o = heappop(ready)[1]
        self._begin(o, self.worker_slot[w])
        return o

    def _begin(self, o: int, track: int) -> None:
        tl = self.tl
        tl.start_us[o] = self.env.now
        tl.worker[o] = track
        tl.start_order.append(o)

    def _ready_event(self, o: int) -> simpy.Event:
        ev = self.when_ready.get(o)
        if ev is None:
            ev = self.when_ready[o] = self.env.event()
        return ev

    def _arrival_event(self, o: int) -> simpy.Event:
        ev = self.when_arrived.get(o)
        if ev is None:
            ev = self.when_arrived[o] = self.env.event()
        return ev

    def _arrive(self, o: int) -> None:
        """COMM op `o`'s data is there (a recv's transfer, an all-reduce's collective)."""
        self.arrived[o] = True
        ev = self.when_arrived.pop(o, None)
        if ev is not None:
            ev.succeed()

    def _complete(self, o: int) -> None:
        st = self.st
        self.tl.end_us[o] = self.env.now
        self.done += 1
        for s in st.release[o]:
            self._release(s)
        for s in self.late_succs[o]:
            self._token_done(s)
        for x in st.sends[o]:
            self.env.process(self._send_implicit(x))
        self._request_settle()

    def _release(self, s: int) -> None:
        r = self.refs[s]
        if r != PINNED:
            self.refs[s] = r - 1
            if r == 1:
                self.mem.free_later(self.st.storage_device[s], self.st.storage_bytes[s])

    def _token_done(self, o: int) -> None:
        p = self.pending[o] - 1
        self.pending[o] = p
        if p == 0:
            if self._on_heap(o):
                heappush(self.ready[self.st.op_device[o]], (self.prep.priority[o], o))
            else:
                ev = self.when_ready.pop(o, None)
                if ev is not None:
                    ev.succeed()

    def _request_settle(self) -> None:
        if not self.settle_pending:
            self.settle_pending = True
            _Later(self.env, _SETTLE).callbacks.append(self._settle)

    def _settle(self, _event: simpy.Event) -> None:
        """End of an instant: apply frees; per process, queue workers for the lock in a fixed order."""
        self.settle_pending = False
        self.mem.settle()
        worker_dev, seekers = self.worker_dev, self.seekers
        for proc in self.procs:
            queue: list[int] = []
            if proc.ended:
                queue = sorted(proc.ended)
                proc.ended.clear()
            for d in proc.devices:
                idle, ready = self.idle[d], self.ready[d]
                if not idle or not ready:
                    continue
                queued = sum(1 for w in queue if worker_dev[w] == d) if len(proc.devices) > 1 else len(queue)
                while idle and seekers[d] + queued < len(ready):
                    queue.append(heappop(idle))
                    queued += 1
            if queue:
                lock = proc.lock
                for w in queue:
                    wake = self.wakeup[w]
                    assert wake is not None
                    self.wakeup[w] = None
                    seekers[worker_dev[w]] += 1
                    wake.succeed(lock.request())


def _check_bucket_order(in_sequence: list[list[int]], st: Structure, device_ids: tuple[str, ...]) -> None:
    """Every device must issue each group's all-reduces in ascending bucket order (as the
    executor requires): otherwise two ranks could wait on each other's buckets forever."""
    comm = st.comm
    if comm is None or not comm.collectives:
        return
    for d, ops in enumerate(in_sequence):
        last: dict[tuple[int, ...], int] = {}
        for o in ops:
            c = comm.collective_of.get(o)
            if c is None:
                continue
            spec = comm.collectives[c]
            if spec.bucket < last.get(spec.group, -1):
                raise SchedlabError(
                    f"device {device_ids[d]} would issue gradient bucket {spec.bucket} after bucket "
                    f"{last[spec.group]}: every rank must issue its all-reduces in ascending bucket order "
                    "(the resolved sequence must put them so)"
                )
            last[spec.group] = spec.bucket


def _servers(env: simpy.Environment, prep: Prepared) -> list[SimServer]:
    """Per device, the server its kernels run on: its own cores (or streams), or the one
    server of the core pool it shares with other devices' processes (the pool's cores,
    processor-shared by every member's kernels, each slowed by its own device's co-run rule)."""
    op_device, slowdown, n = prep.structure.op_device, prep.slowdown, prep.n_ops
    n_dev = len(prep.device_ids)
    pools: dict[int, SimServer] = {}
    # Jobs keyed by op (kernels), or n + process (Python time, `_SimpyRun._host`), whose
    # busy time is kept apart from the devices' (group n_dev).
    group_of = list(op_device) + [n_dev] * (max(prep.device_process, default=0) + 1)

    def pooled(key: int, busy_others: int) -> float:  # a kernel as its own device's co-run rule says
        return slowdown[op_device[key]](key, busy_others) if key < n else 1.0

    out = []
    for d, cap in enumerate(prep.capacity):
        if not prep.pooled(d):
            held = prep.slowdown_held[d] if prep.slowdown_held else None
            out.append(SimServer(env, FluidShare(cap, prep.slowdown[d], max_jobs=cap if prep.device_is_gpu[d] else None,
                                                 slowdown_held=held)))
            continue
        p = prep.core_pool[d]
        if p not in pools:
            pools[p] = SimServer(env, PooledShare(cap, pooled, group_of, n_dev + 1))
        out.append(pools[p])
    return out


def run_simpy(prep: Prepared, machine: Machine) -> tuple[Timeline, MemoryTracker, list[float]]:
    """Simulate one step with the general SimPy model. Returns times, memory, busy unit-µs per device."""
    r = _SimpyRun(prep, machine)
    r.run()
    return r.tl, r.mem, [
        s.fluid.busy_by_group[d] if isinstance(s.fluid, PooledShare) else s.fluid.busy_unit_us
        for d, s in enumerate(r.servers)
    ]
