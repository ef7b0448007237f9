"""The co-run worker loop: worker threads that share one heap of ready ops.

One loop serves the one-process executor (`runner.py`, every op run by a worker) and a
rank of the multi-process executor (`dist.py`), where some ops are *external*: a
receive or an all-reduce is completed by the rank's communication thread
(`ReadyLoop.complete`), never run by a worker. Everything the loop shares (heap,
in-degrees, spans, the count of ops left) is guarded by one lock.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from typing import Any

import torch

Span = tuple[int, int, int]  # (start_ns, end_ns, worker); start and end from the step start
CLOSE_TIMEOUT_S = 10.0  # how long closing a pool waits for each worker to end (its op finishing first)


def freeing(
    inputs_of: Sequence[Sequence[int]] | Mapping[int, Sequence[int]],
    uses: list[int] | MutableMapping[int, int],
    keep: Collection[int],
    V: list[Any],
) -> Callable[[int], None]:
    """A `ReadyLoop` release: drop op i's reference to each input, and free a value
    (`V[v] = None`) after its last use unless it is kept. `uses` is consumed."""

    def release(i: int) -> None:
        for v in inputs_of[i]:
            uses[v] -= 1
            if uses[v] == 0 and v not in keep:
                V[v] = None

    return release


class ReadyLoop:
    """One step of the ops in `ops`, run by `run(n_workers)`.

    `succs[i]` must name only ops in `ops`; `indeg[i]` counts the predecessors of `i`
    among `ops` (a list the loop consumes). `run_op(i)` runs op `i` (called without the
    lock held); `release(i)` is called with the lock held once op `i` has finished (free
    its inputs there). Spans count from `start_ns` (default: now). Ops in `external` are
    never run by a worker: another thread waits for them to become ready (`wait_ready`)
    and finishes them (`complete`).
    """

    def __init__(
        self,
        *,
        ops: Sequence[int],
        prio: Sequence[int],
        succs: Sequence[Sequence[int]],
        indeg: list[int],
        threads: Sequence[int],
        run_op: Callable[[int], None],
        release: Callable[[int], None],
        fail: Callable[[int, BaseException], BaseException],
        n_spans: int,
        external: Collection[int] = (),
        start_ns: int | None = None,
    ) -> None:
        lock = threading.Lock()
        self.cond = threading.Condition(lock)  # workers wait here for ready ops
        self.external_cond = threading.Condition(lock)  # the communication thread waits here
        self.prio = prio
        self.succs = succs
        self.indeg = indeg
        self.threads = threads
        self.run_op = run_op
        self.release = release
        self.fail = fail
        self.external = frozenset(external)
        self.heap = [(prio[i], i) for i in ops if indeg[i] == 0 and i not in self.external]
        heapq.heapify(self.heap)
        self.external_ready = {i for i in ops if indeg[i] == 0 and i in self.external}
        self.remaining = len(ops)
        self.spans: list[Span] = [(0, 0, 0)] * n_spans
        self.errors: list[BaseException] = []
        self.idle = 0  # workers waiting for work
        self.start_ns = time.perf_counter_ns() if start_ns is None else start_ns  # spans count from here

    # ---- called with the lock held -----------------------------------------------------

    def _finish(self, i: int, t0: int, t1: int, w: int) -> None:
        self.spans[i] = (t0 - self.start_ns, t1 - self.start_ns, w)
        self.release(i)
        indeg = self.indeg
        for s in self.succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                if s in self.external:
                    self.external_ready.add(s)
                    self.external_cond.notify_all()
                else:
                    heapq.heappush(self.heap, (self.prio[s], s))
        self.remaining -= 1
        if self.remaining == 0:
            self.cond.notify_all()

    def _error(self, e: BaseException) -> None:
        self.errors.append(e)
        self.cond.notify_all()
        self.external_cond.notify_all()

    # ---- called from threads -----------------------------------------------------------

    def worker(self, w: int) -> None:
        # The worker that finishes an op takes the next ready op itself, and wakes an
        # idle worker only when more work is ready than it can take: every wake-up is a
        # thread hand-off through the interpreter lock, tens of microseconds.
        torch.get_num_threads()  # force ATen's per-thread init before setting (DESIGN.md)
        ns = time.perf_counter_ns
        heap = self.heap
        cond = self.cond
        cur = -1
        cond.acquire()
        try:
            while True:
                while not heap:
                    if self.remaining <= 0 or self.errors:
                        return
                    self.idle += 1
                    cond.wait()
                    self.idle -= 1
                if self.errors:
                    return
                _, i = heapq.heappop(heap)
                if heap and self.idle:
                    cond.notify()
                cond.release()
                try:
                    k = self.threads[i]
                    if k != cur:
                        torch.set_num_threads(k)
                        cur = k
                    t0 = ns()
                    self.run_op(i)
                    t1 = ns()
                except BaseException as e:
                    cond.acquire()
                    self._error(self.fail(i, e))
                    return
                cond.acquire()
                self._finish(i, t0, t1, w)
                if self.remaining <= 0:
                    return
        finally:
            cond.release()

    def complete(self, i: int, t0: int, t1: int, w: int) -> None:
        """Finish external op `i` (it ran from `t0` to `t1` ns on track `w`) and wake
        as many idle workers as it made ops ready."""
        with self.cond:
            before = len(self.heap)
            self._finish(i, t0, t1, w)
            woken = len(self.heap) - before
            if woken > 0 and self.idle:
                self.cond.notify(min(woken, self.idle))

    def wait_ready(self, i: int) -> bool:
        """Block until external op `i` has all its inputs; False if the step failed first."""
        with self.external_cond:
            while i not in self.external_ready and not self.errors:
                self.external_cond.wait()
            return not self.errors

    def error(self, e: BaseException) -> None:
        """Stop the step: workers return, and `run` raises `e`."""
        with self.cond:
            self._error(e)

    def run(self, n_workers: int, helper: Callable[[], None] | None = None, pool: WorkerPool | None = None) -> list[Span]:
        """Run the step with `n_workers` worker threads (and `helper`, the communication
        thread, started anew for the step, if given); the spans of every op, indexed by op
        id. With `pool`, its threads (as many as `n_workers`) are the workers, else new
        threads are started."""
        if pool is not None and pool.size != n_workers:
            raise ValueError(f"a pool of {pool.size} workers runs a step of {n_workers} workers")
        comm = None
        if helper is not None:
            # A daemon: if the step fails it may still wait on a peer that never sends,
            # until the collective timeout; the process exits without it.
            comm = threading.Thread(target=helper, name="schedlab-comm", daemon=True)
            comm.start()
        if pool is not None:
            pool.run(self.worker, self.error)
        else:
            threads = [threading.Thread(target=self.worker, args=(w,), name=f"schedlab-worker-{w}")
                       for w in range(n_workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if comm is not None and not self.errors:
            comm.join()
        if self.errors:
            raise self.errors[0]
        return self.spans


class WorkerPool:
    """`size` worker threads kept from step to step, for state a thread keeps: a CUDA
    stream made current once, and what CUDA libraries cache per thread (cuDNN's execution
    plans are thread-local in PyTorch: a new thread per step would plan every convolution
    again), and on a CPU each worker's OpenMP team. `init(w)` runs first in worker `w`'s
    thread. Daemon threads: `close()` ends them and waits for them to end."""

    def __init__(self, size: int, init: Callable[[int], None] | None = None, name: str = "schedlab-worker") -> None:
        self.size = size
        self._jobs: list[queue.SimpleQueue[Callable[[int], None] | None]] = [queue.SimpleQueue() for _ in range(size)]
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._init_errors: dict[int, BaseException] = {}
        self._init = init
        self._threads = [threading.Thread(target=self._serve, args=(w,), name=f"{name}-{w}", daemon=True)
                         for w in range(size)]
        for t in self._threads:
            t.start()

    def _serve(self, w: int) -> None:
        if self._init is not None:
            try:
                self._init(w)
            except BaseException as e:
                self._init_errors[w] = e
        while (job := self._jobs[w].get()) is not None:
            try:
                job(w)
            finally:
                self._done.put(w)

    def run(self, job: Callable[[int], None], fail: Callable[[BaseException], None]) -> None:
        """Run `job(w)` on every worker `w` and wait for all (a ReadyLoop's `worker`, which
        returns once the step is done or failed); a worker whose `init` failed calls
        `fail(its error)` instead."""

        def guarded(w: int) -> None:
            err = self._init_errors.get(w)
            if err is not None:
                fail(err)
            else:
                job(w)

        for q in self._jobs:
            q.put(guarded)
        for _ in range(self.size):
            self._done.get()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """End the workers and wait for them (each up to `timeout_s`): a worker thread that
        holds an OpenMP team still running while the interpreter shuts down aborts the
        process ("terminate called without an active exception"), so a pool is closed
        before exit (`weakref.finalize` runs at exit too). Closing twice is harmless."""
        for q in self._jobs:
            q.put(None)
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout=timeout_s)


class KeptWorkers:
    """The co-run workers an executor keeps from step to step: a `WorkerPool` of `size`
    started at the first `pool()` and ended by `close()`, or when this object is collected
    (or at exit) through `weakref.finalize`, whose callback holds the pool, not its owner.
    `close()` leaves it usable: the next `pool()` starts new workers."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: WorkerPool | None = None
        self._end: weakref.finalize | None = None

    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.size)
            self._end = weakref.finalize(self, self._pool.close)
        return self._pool

    def close(self) -> None:
        if self._end is not None:
            self._end()  # closes the pool once, and detaches the finalizer
        self._pool = self._end = None
