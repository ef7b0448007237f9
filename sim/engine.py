"""The SimPy model of the executor, and `simulate()`, which runs it (or its fast twin).

The model (time unit: microseconds):

- **Workers and the interpreter lock.** `plan.slots` worker processes share one ready
  heap and one interpreter lock, a `simpy.Resource(capacity=1)`: the executor is one
  Python process, and its Python code (taking an op off the heap, the dispatch part
  `cost.dispatch_us`) runs only under the lock, on any device. A worker whose kernel
  ended, or an idle worker woken because ops became ready, queues for the lock (FIFO);
  holding it, it pops the ready op of lowest (priority, op id), which starts then, and
  keeps the lock through the dispatch part. Nothing ready: it releases the lock and
  idles. Who queues, in which order, and what is popped is decided at the end of each
  instant (SimPy priorities 2 and 3, after every normal event at that time), so the
  outcome never depends on how simultaneous events happen to be ordered; `sim.fast`
  spells the rules out.
- **CPU kernels** run on their device's cores, a processor-sharing server
  (`sim.fluid.FluidShare`): k threads demand k cores; above the core count everyone is
  stretched by total_threads/cores; each kernel is further slowed by
  `cost.corun_slowdown(op, busy cores of the others, cores)`. The worker waits for its
  kernel (ATen releases the lock, so kernels of different workers overlap).
- **GPU kernels.** The worker dispatches on the host (holding the lock), launches the
  kernel and is free again; the kernel runs on one of the device's `streams` (a kernel
  queues FIFO when all are busy; co-running kernels slow each other through
  `corun_slowdown(op, busy streams of the others, streams)`). Successors become ready when
  the kernel ends: the host does not run ahead of the device.
- **Transfers.** A consumer on another device than a value's home waits for one transfer
  of that value to its device (`sim.interconnect`), started when the value is ready. The
  trace shows it as kind "COMM", op = the first consumer, name "send <value>", device =
  the sender, worker = -1 - link index, threads 0.
- **Memory.** Outputs are allocated when the kernel starts (a transfer's copy when the
  transfer starts); a storage is freed at the end of the instant in which its last
  reader finishes, unless it holds a graph input or output (see `sim.memory`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

import numpy as np
import simpy
from simpy.events import EventPriority
from simpy.resources.resource import Request

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.sim.compiled import FlatStructure, LoopResult, run_compiled
from schedlab.sim.cost import CostModel
from schedlab.sim.fast import run_fast
from schedlab.sim.flatgraph import flat_single_device
from schedlab.sim.fluid import FluidShare
from schedlab.sim.interconnect import Network
from schedlab.sim.memory import MemoryTracker
from schedlab.sim.prepare import PINNED, Prepared, Structure, build_structure, op_devices, prepare, slowdown_fns
from schedlab.sim.result import SimResult, Timeline, build_trace
from schedlab.sim.server import SimServer

ENGINES = ("auto", "simpy", "fast", "compiled")
_SETTLE = EventPriority(2)  # after NORMAL (1): once every ordinary event of the instant is done
_PICK = EventPriority(3)  # after the settle of the same instant


class _Later(simpy.Event):
    """An event that fires at the current time, after all events of higher priority."""

    def __init__(self, env: simpy.Environment, priority: EventPriority) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, priority)


class _SimpyRun:
    """One simulated step in a fresh SimPy Environment."""

    def __init__(self, prep: Prepared, machine: Machine) -> None:
        self.prep = prep
        self.env = env = simpy.Environment()
        self.lock = simpy.Resource(env, capacity=1)  # the interpreter lock
        self.servers = [
            SimServer(env, FluidShare(cap, prep.slowdown[d], max_jobs=cap if prep.device_is_gpu[d] else None))
            for d, cap in enumerate(prep.capacity)
        ]
        self.network = Network(env, machine)
        self.st = st = prep.structure
        self.mem = MemoryTracker(list(st.initial_live))
        n = prep.n_ops
        self.pending = list(st.pending)
        self.refs = list(st.storage_refs)
        self.ready = [(prep.priority[o], o) for o in range(n) if self.pending[o] == 0]
        heapify(self.ready)
        self.idle: list[int] = list(range(prep.slots))  # a heap of worker indices
        self.ended: list[int] = []  # workers whose kernels ended (or were launched) this instant
        self.seekers = 0  # workers queued for the lock to look for work
        self.wakeup: list[simpy.Event | None] = [None] * prep.slots
        self.settle_pending = False
        self.tl = Timeline([0.0] * n, [0.0] * n, [0] * n, [])
        self.done = 0

    def run(self) -> None:
        for w in range(self.prep.slots):
            self.env.process(self._worker(w))
        for x in self.st.initial_sends:
            self.env.process(self._send(x))
        self._request_settle()
        self.env.run()
        if self.done != self.prep.n_ops:  # pragma: no cover - prepare() only builds DAGs
            raise SchedlabError(f"simulation stalled: {self.prep.n_ops - self.done} of {self.prep.n_ops} ops never ran")

    # ---- processes -------------------------------------------------------------------------

    def _worker(self, w: int) -> Generator[simpy.Event, Any, None]:
        env, prep, st = self.env, self.prep, self.st
        while True:
            wake = env.event()
            self.wakeup[w] = wake
            req: Request = yield wake  # the settle queues us for the lock
            yield req
            yield _Later(env, _PICK)  # let every event of this instant land before choosing
            o = self._pick(w)
            if o is None:
                self.lock.release(req)
                continue
            yield env.timeout(prep.dispatch_us[o])
            self.lock.release(req)
            d = st.op_device[o]
            self.mem.alloc(d, st.alloc_bytes[o])
            done = self.servers[d].run(o, prep.demand[o], prep.kernel_us[o])
            if prep.device_is_gpu[d]:
                done.callbacks.append(self._on_async_kernel_end)  # launched; the worker moves on
            else:
                self._request_settle()  # the lock is free
                yield done
                self._complete(o)
            self.ended.append(w)
            self._request_settle()

    def _on_async_kernel_end(self, event: simpy.Event) -> None:
        self._complete(int(event.value or 0))

    def _send(self, x: int) -> Generator[simpy.Event, Any, None]:
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

    def _pick(self, w: int) -> int | None:
        """Worker `w` holds the lock: the ready op it takes, or None (it goes idle)."""
        self.seekers -= 1
        if not self.ready:
            heappush(self.idle, w)
            return None
        o = heappop(self.ready)[1]
        tl = self.tl
        tl.start_us[o] = self.env.now
        tl.worker[o] = w
        tl.start_order.append(o)
        return o

    def _complete(self, o: int) -> None:
        st = self.st
        self.tl.end_us[o] = self.env.now
        self.done += 1
        for s in st.release[o]:
            self._release(s)
        for s in st.local_succs[o]:
            self._token_done(s)
        for x in st.sends[o]:
            self.env.process(self._send(x))
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
            heappush(self.ready, (self.prep.priority[o], o))

    def _request_settle(self) -> None:
        if not self.settle_pending:
            self.settle_pending = True
            _Later(self.env, _SETTLE).callbacks.append(self._settle)

    def _settle(self, _event: simpy.Event) -> None:
        """End of an instant: apply frees, queue seekers for the lock in a fixed order."""
        self.settle_pending = False
        self.mem.settle()
        queue: list[int] = []
        if self.ended:
            queue = sorted(self.ended)
            self.ended.clear()
        while self.idle and self.seekers + len(queue) < len(self.ready):
            queue.append(heappop(self.idle))
        for w in queue:
            wake = self.wakeup[w]
            assert wake is not None
            self.wakeup[w] = None
            self.seekers += 1
            wake.succeed(self.lock.request())


def run_simpy(prep: Prepared, machine: Machine) -> tuple[Timeline, MemoryTracker, list[float]]:
    """Simulate one step with the general SimPy model. Returns times, memory, busy unit-µs per device."""
    r = _SimpyRun(prep, machine)
    r.run()
    return r.tl, r.mem, [s.fluid.busy_unit_us for s in r.servers]


class Simulator:
    """A graph, a machine and a cost model bound once; `run(resolved)` simulates one plan.

    A search reuses one Simulator for thousands of plans: it keeps the structure (tokens,
    transfers, storages) of each placement it meets, and the cost model's dispatch time of
    each op, kernel time of each (op, threads) and co-run slowdowns, so a run only computes what the plan
    changes. The cost model must be a pure function of its arguments.
    """

    def __init__(self, graph: Graph, machine: Machine, cost: CostModel, *, max_placements: int = 16) -> None:
        self.graph = graph
        self.machine = machine
        self.cost = cost
        self.max_placements = max_placements
        self._structures: dict[tuple[int, ...], Structure] = {}
        self._dispatch_us: list[float] | None = None
        self._kernel_us: dict[int, float] = {}  # op id * _stride + threads -> µs
        self._stride = max(d.cores for d in machine.devices) + 1
        self._slowdown = slowdown_fns(graph, machine, cost, memo=True)
        # The compiled engine's per-graph arrays: kernel µs per (op, threads) and co-run
        # slowdown per (op, busy cores of the others) on the one device, NaN until asked.
        self._flat_one: FlatStructure | None = None  # every op on one device (sim.flatgraph)
        self._kernel_table: np.ndarray | None = None
        self._slow_table: np.ndarray | None = None
        self._dispatch_arr: np.ndarray | None = None

    def run(self, resolved: ResolvedPlan, *, record: bool = True, engine: str = "auto") -> SimResult:
        """Predict one step under `resolved`; see `simulate`."""
        t0 = time.perf_counter()
        if engine not in ENGINES:
            raise SchedlabError(f"unknown simulator engine {engine!r}; use one of {', '.join(ENGINES)}")
        graph, machine = self.graph, self.machine
        if len(resolved.device) != len(graph.ops):
            raise SchedlabError(f"resolved plan covers {len(resolved.device)} ops but graph {graph.name!r} has {len(graph.ops)}")
        if engine in ("auto", "compiled") and not record:
            dev = self._uniform_cpu_device(resolved)
            if dev is not None:
                return self._run_compiled(resolved, dev, t0)
        placement = op_devices(resolved, machine)
        structure = self._structures.get(placement)
        if structure is None:
            structure = build_structure(graph, placement, len(machine.devices))
            if len(self._structures) >= self.max_placements:
                self._structures.pop(next(iter(self._structures)))
            self._structures[placement] = structure
        prep = prepare(
            graph,
            resolved,
            machine,
            self.cost,
            structure=structure,
            kernel_us=self._kernels(resolved.threads),
            dispatch_us=self._dispatches(),
            slowdown=self._slowdown,
        )
        if engine in ("fast", "compiled") and not prep.single_cpu:
            raise SchedlabError(f"the {engine} simulator engine needs every op on one CPU device; use engine='simpy'")
        if engine == "fast":
            tl, mem, busy = run_fast(prep)
        elif prep.single_cpu and engine in ("auto", "compiled"):
            engine = "compiled"
            tl, mem, busy = self._compiled_timeline(prep, placement[0] if placement else 0, structure)
        else:
            engine = "simpy"
            tl, mem, busy = run_simpy(prep, machine)
        step_us = max(max(tl.end_us, default=0.0), max((t[3] for t in tl.transfers), default=0.0))
        dev_ids = prep.device_ids
        oom = tuple(d for i, d in enumerate(dev_ids) if mem.peak[i] > prep.memory_bytes[i])
        name = engine
        trace = None
        if record:
            trace = build_trace(graph, resolved, machine, prep, tl, {"engine": name, "oom_devices": list(oom)})
        return SimResult(
            step_time_s=step_us / 1e6,
            peak_memory_bytes={d: mem.peak[i] for i, d in enumerate(dev_ids)},
            trace=trace,
            sim_wall_s=time.perf_counter() - t0,
            busy_core_s={d: busy[i] / 1e6 for i, d in enumerate(dev_ids)},
            oom_devices=oom,
            engine=name,
        )

    # ---- the compiled engine (sim.compiled) ----------------------------------------------

    def _uniform_cpu_device(self, resolved: ResolvedPlan) -> int | None:
        """The index of the one CPU device every op runs on, or None."""
        devices = resolved.device
        if not devices or devices.count(devices[0]) != len(devices):
            return None
        for i, d in enumerate(self.machine.devices):
            if d.id == devices[0]:
                return i if d.kind == "cpu" else None
        raise SchedlabError(f"resolved plan places an op on device {devices[0]!r}, not in machine {self.machine.name!r}")

    def _flat(self) -> FlatStructure:
        if self._flat_one is None:
            self._flat_one = flat_single_device(self.graph)
        return self._flat_one

    def _loop(self, slots: int, priority: Sequence[int], dev: int, threads: np.ndarray, kernel_us: np.ndarray,
              dispatch_us: np.ndarray) -> LoopResult:
        capacity = self.machine.devices[dev].cores
        return run_compiled(
            self._flat(),
            slots=slots,
            capacity=capacity,
            priority=np.asarray(priority, dtype=np.int64),
            dispatch_us=dispatch_us,
            kernel_us=kernel_us,
            demand=threads,
            slowdown=self._slowdowns(dev, capacity, slots, int(threads.max()) if len(threads) else 1),
        )

    def _run_compiled(self, resolved: ResolvedPlan, dev: int, t0: float) -> SimResult:
        """The search's path: one CPU device, no trace; per-op work happens in arrays only."""
        threads = np.asarray(resolved.threads, dtype=np.int64)
        res = self._loop(resolved.slots, resolved.priority, dev, threads, self._kernels_arr(threads), self._dispatches_arr())
        machine = self.machine
        peaks = {d.id: 0 for d in machine.devices}
        peaks[machine.devices[dev].id] = res.peak_bytes
        oom = tuple(d.id for d in machine.devices if peaks[d.id] > d.memory_bytes)
        busy = {d.id: 0.0 for d in machine.devices}
        busy[machine.devices[dev].id] = res.busy_unit_us / 1e6
        step_us = float(res.end_us.max()) if len(res.end_us) else 0.0
        return SimResult(
            step_time_s=step_us / 1e6,
            peak_memory_bytes=peaks,
            trace=None,
            sim_wall_s=time.perf_counter() - t0,
            busy_core_s=busy,
            oom_devices=oom,
            engine="compiled",
        )

    def _compiled_timeline(
        self, prep: Prepared, dev: int, structure: Structure
    ) -> tuple[Timeline, MemoryTracker, list[float]]:
        """The compiled loop on a prepared one-device plan, as the engines' common Timeline (for traces)."""
        threads = np.asarray(prep.threads, dtype=np.int64)
        res = self._loop(prep.slots, prep.priority, dev, threads,
                         np.asarray(prep.kernel_us, dtype=np.float64), np.asarray(prep.dispatch_us, dtype=np.float64))
        mem = MemoryTracker(list(structure.initial_live))
        mem.peak[dev] = res.peak_bytes
        busy = [0.0] * len(prep.device_ids)
        busy[dev] = res.busy_unit_us
        tl = Timeline(res.start_us.tolist(), res.end_us.tolist(), res.worker.tolist(), res.start_order.tolist())
        return tl, mem, busy

    def _kernels_arr(self, threads: np.ndarray) -> np.ndarray:
        """Kernel µs of every op at its thread count, from a per-(op, threads) table."""
        n = len(self.graph.ops)
        table = self._kernel_table
        if table is None:
            table = self._kernel_table = np.full((n, self._stride), np.nan)
        rows = np.arange(n)
        if threads.size and (threads.min() < 1 or threads.max() >= self._stride):
            raise SchedlabError(f"thread counts must be 1..{self._stride - 1} on machine {self.machine.name!r}")
        out = table[rows, threads]
        missing = np.flatnonzero(np.isnan(out))
        if missing.size:
            ops, kernel = self.graph.ops, self.cost.kernel_us
            for i in missing.tolist():
                k = int(threads[i])
                table[i, k] = out[i] = float(kernel(ops[i], k))
        return out

    def _dispatches_arr(self) -> np.ndarray:
        if self._dispatch_arr is None:
            self._dispatch_arr = np.asarray(self._dispatches(), dtype=np.float64)
        return self._dispatch_arr

    def _slowdowns(self, dev: int, capacity: int, slots: int, max_threads: int) -> np.ndarray:
        """slowdown[op, busy cores of the others], filled for the columns this plan can read.

        The others are at most `slots - 1` kernels of at most `max_threads` threads each, so
        with one slot only column 0 is read, and two one-thread slots read columns 0 and 1.
        """
        n = len(self.graph.ops)
        table = self._slow_table
        if table is None or table.shape[1] != capacity + 1:
            table = self._slow_table = np.full((n, capacity + 1), np.nan)
        cols = range(min(capacity, (slots - 1) * max_threads) + 1)
        fn = self._slowdown[dev]
        for b in cols:
            if n and np.isnan(table[0, b]):
                table[:, b] = [fn(o, b) for o in range(n)]
        return table

    def _dispatches(self) -> list[float]:
        if self._dispatch_us is None:
            self._dispatch_us = [float(self.cost.dispatch_us(op)) for op in self.graph.ops]
        return self._dispatch_us

    def _kernels(self, threads: tuple[int, ...]) -> list[float]:
        memo, stride, ops, kernel = self._kernel_us, self._stride, self.graph.ops, self.cost.kernel_us
        out: list[float] = []
        for i, k in enumerate(threads):
            if not 0 < k < stride:  # resolve() never gives this; do not let keys collide
                out.append(float(kernel(ops[i], k)))
                continue
            key = i * stride + k
            t = memo.get(key)
            if t is None:
                t = memo[key] = float(kernel(ops[i], k))
            out.append(t)
        return out


def simulate(
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    cost: CostModel,
    *,
    record: bool = True,
    engine: str = "auto",
) -> SimResult:
    """Predict one step of `graph` under `resolved` on `machine` with `cost`.

    `record`: also build the Trace (source "sim"); a search passes False. `engine`: "auto"
    takes the compiled loop (`sim.compiled`) when every op runs on one CPU device and the
    SimPy model otherwise; "simpy", "fast" (the Python reference of the compiled loop) and
    "compiled" force one (the tests compare them). To simulate many
    plans of one graph, bind a `Simulator` once instead.
    """
    return Simulator(graph, machine, cost).run(resolved, record=record, engine=engine)
