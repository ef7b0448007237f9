"""One rank of the multi-process executor: the ops of its device, under the plan, with
communication through torch.distributed (gloo on CPU).

A rank runs the ops of the resolved (expanded) graph whose device it drives, and the
communication ops of that device (`schedlab.distribute`):

- ``schedlab.send``: an asynchronous send of the value (`ProcessGroup.send`, what
  `dist.isend` calls); it never blocks. The tensor and handle are kept, and waited on at
  the end of the next step, so a step that ends with a send does not wait for its
  receiver to take it.
- ``schedlab.recv``: an asynchronous receive into a fresh tensor (shape and dtype from
  the graph), completed when its data is there. gloo moves data only once the receiver
  has posted (about 50 us after it, here), and posting costs the receiver tens of
  microseconds, so with one slot a rank posts a receive at its place in the sequence at
  the latest, and earlier while it idles waiting on an earlier receive. gloo's receive
  works say they completed only once waited on, so "idles" is every wait: a one-slot rank
  posts all of its step's receives at its first. With several slots the communication
  thread posts them all when the step starts. Either way, when another step follows, a
  rank posts the next step's receives as soon as this step's last receive is in
  (`RankExecutor.run_step`'s `prepost_next`): a peer that is a step ahead (a pipeline's
  first stage) then never sends into a receive not posted yet.
- Each direction between two ranks has a process group of its own (`dist.new_group` of
  the two), so a rank's sends to a peer and its receives from it use two gloo pairs, not
  one. On one pair, a send issued while the peer's send the other way arrives stalled
  about 4 ms (a scheduler tick of this host's kernel, HZ = 250) in 12-48% of exchanges
  (both ranks sending 4 KiB-1 MiB to each other at once, receives posted before, each
  rank pinned to its core, 60 exchanges per size); with a group per direction, in 0-3%.
  Pipelines exchange that way whenever a forward's send meets a backward's.
- ``schedlab.all_reduce``: its inputs are flattened into one buffer, summed across the
  bucket's group as `exec.reduce` starts it (two ranks: one exchange over the two
  directions' groups; more: gloo's all-reduce), divided by the group's size and
  unflattened into its outputs. Every rank issues its buckets in ascending order.

One slot: the rank runs its ops in the resolved `sequence` (restricted to its device) on
the calling thread, waiting on a receive at its place in the sequence and on an
all-reduce just before the first op that reads its result. Several slots: the worker
threads of `workers.ReadyLoop` run compute ops and sends; a communication thread waits
on receives and issues all-reduces, and pushes the ops they make ready onto the workers'
heap.

Deadlock freedom: `sequence` is one topological order of the whole expanded graph, and
every rank waits on its receives (and issues its all-reduces) in that order, while sends
never block. Take the receive earliest in `sequence` that some rank is blocked on: its
send, and everything the send depends on, come earlier in `sequence`, so every receive
among them has already completed (each rank waits in sequence order) and no worker is
blocked; the send is issued and the receive completes. So no rank waits forever. (For
all-reduces this needs each bucket's ops to be issued in the same relative order on
every rank, which ascending bucket order gives; a rank checks its own order.) A rank
waits on the sends of step k only at the end of step k+1; their receives belong to step k
of their ranks, which depends on steps up to k only, so the same argument posts them.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from schedlab.collectives import sums_by_exchange
from schedlab.distribute import ALL_REDUCE, RECV, SEND, input_homes, outputs_on
from schedlab.errors import SchedlabError
from schedlab.exec.program import Extern, Program, compile_graph
from schedlab.exec.reduce import Reducer, direction_groups, link, make_reducer, pair_directions
from schedlab.exec.runner import OpFailed
from schedlab.exec.workers import KeptWorkers, ReadyLoop, Span, freeing
from schedlab.graph import Graph, OpKind
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.rng import random_op_index

RECV_WORKER = -1  # the trace track of receives and all-reduces (the communication thread)
SEND_WORKER = -2  # the trace track of sends
CLOCK_TAG = 1 << 30  # tags of the clock ping-pong (those of transfers count up from 0)


class CommFailed(SchedlabError):
    """A communication op failed: usually a peer rank died or timed out."""


@dataclass(frozen=True)
class RankStepRecord:
    """One step on one rank, on this rank's `perf_counter_ns` clock."""

    start_ns: int
    wall_ns: int
    spans: tuple[Span, ...]  # per op of `RankExecutor.ops`: (start, end, worker) from `start_ns`


@dataclass(frozen=True)
class StepStamps:
    """One step's clock readings, before `RankExecutor.record` turns them into spans."""

    start_ns: int
    wall_ns: int
    line_ns: list[int]  # one slot: the line's readings (`_step_one`)
    issued_ns: dict[int, int]  # one slot: when each all-reduce was issued
    spans: list[Span] | None = None  # several slots: the spans, made as the step ran


@dataclass
class _Pending:
    """An issued all-reduce: its flat buffer and handle."""

    flat: torch.Tensor
    work: Any
    start_ns: int


class _Transfers:
    """The point-to-point traffic of one step on one rank: receives posted in sequence
    order (`post_through`), and the sends issued, kept until they are waited on."""

    def __init__(self, ex: RankExecutor) -> None:
        self.ex = ex
        self.bufs: dict[int, torch.Tensor] = {}
        self.works: dict[int, Any] = {}
        self.posted = 0  # how many of ex.recvs are posted
        self.sends: list[tuple[torch.Tensor, Any, int]] = []  # (tensor, work, op id)

    def post_through(self, j: int) -> None:
        """Post the receives ex.recvs[..j] not posted yet."""
        ex = self.ex
        while self.posted <= j:
            i = ex.recvs[self.posted]
            op = ex.graph.ops[i]
            meta = ex.graph.values[op.outputs[0]]
            assert meta is not None  # checked by RankExecutor
            buf = torch.empty(meta.shape, dtype=getattr(torch, meta.dtype))
            self.bufs[i] = buf
            group, peer = ex._link[i]
            self.works[i] = group.recv([buf], peer, int(op.kwargs["tag"]))
            self.posted += 1

    def send(self, i: int, value: torch.Tensor) -> None:
        ex = self.ex
        t = value.contiguous()
        group, peer = ex._link[i]
        self.sends.append((t, group.send([t], peer, int(ex.graph.ops[i].kwargs["tag"])), i))

    def wait_recv(self, i: int) -> torch.Tensor:
        """The value of receive `i`, once there: posted first if need be, and while its
        data is not there yet (the rank idles) the step's other receives too."""
        ex = self.ex
        j = ex.recv_index[i]
        self.post_through(j)
        work = self.works[i]
        if not work.is_completed():
            self.post_through(len(ex.recvs) - 1)
        op = ex.graph.ops[i]
        try:
            work.wait()
        except Exception as e:
            raise CommFailed(f"rank {ex.rank}: op {i} ({op.name}) failed waiting for rank {ex._peer[i]}: {e}") from e
        if j == len(ex.recvs) - 1 and ex._prepost:
            ex._post_next_step()
        return self.bufs.pop(i)


def rank_device(resolved: ResolvedPlan, machine: Machine, rank: int) -> str:
    """The one device rank `rank` runs ops on (the first of its devices if it runs none)."""
    mine = [d.id for d in machine.devices_of(rank)]
    if not mine:
        raise SchedlabError(f"machine {machine.name!r} has no device driven by rank {rank}")
    used = [d for d in resolved.devices if d in mine]
    if len(used) > 1:
        raise SchedlabError(
            f"rank {rank} would drive devices {', '.join(used)}: the multi-process executor runs one device "
            "per rank; place those ops on one device or give each device its own process in the machine"
        )
    return used[0] if used else mine[0]


def p2p_directions(graph: Graph, devices: Sequence[str], rank_of: dict[str, int]) -> list[tuple[int, int]]:
    """(sender's rank, receiver's rank) of every direction the graph's sends take, sorted:
    the point-to-point groups every rank creates, in this order."""
    return sorted({
        (rank_of[devices[i]], rank_of[str(op.kwargs["dst"])]) for i, op in enumerate(graph.ops) if op.target == SEND
    })


class RankExecutor:
    """The ops of one rank's device, compiled once; `step()` runs one training step.

    Needs an initialised default process group (`dist.init_process_group`). Every rank
    must construct its executor in the same order relative to its other collectives: the
    constructor creates the process groups of the graph's all-reduces.
    """

    def __init__(self, graph: Graph, resolved: ResolvedPlan, machine: Machine, rank: int) -> None:
        self.graph = graph
        self.resolved = resolved
        self.rank = rank
        self.device = dev = rank_device(resolved, machine, rank)
        self.slots = resolved.slots_of(dev)
        devices = resolved.device
        if len(devices) != len(graph.ops):
            raise SchedlabError(f"the resolved plan covers {len(devices)} ops, the graph has {len(graph.ops)}")
        rank_of = {d.id: d.process for d in machine.devices}
        self.ops: tuple[int, ...] = tuple(i for i in resolved.sequence if devices[i] == dev)
        local = set(self.ops)
        ops = graph.ops
        self.kind: dict[int, str] = {}
        for i in self.ops:
            op = ops[i]
            t = op.target if op.kind is OpKind.COMM else "compute"
            self.kind[i] = t
            for p in graph.preds[i]:
                if p not in local and t != RECV:
                    raise SchedlabError(
                        f"op {i} ({op.name}) on {dev} reads a value of op {p} on {devices[p]} without a receive: "
                        "the graph was not expanded for this placement (resolve the plan against its machine)"
                    )
        # Compute ops compiled as one program, renumbered 0..m-1 (values keep their ids).
        compute = [i for i in self.ops if self.kind[i] == "compute"]
        sub = Graph(
            name=f"{graph.name}@{dev}",
            inputs=graph.inputs,
            outputs=(),
            ops=tuple(dataclasses.replace(ops[i], id=j) for j, i in enumerate(compute)),
            values=graph.values,
        )
        full_index = random_op_index(graph)
        program = compile_graph(sub, {j: full_index[i] for j, i in enumerate(compute) if i in full_index})
        self._fn: dict[int, Callable[[list[Any]], None]] = {i: program.op_fns[j] for j, i in enumerate(compute)}
        # Sends and receives: peers and tags.
        self._peer: dict[int, int] = {}
        for i in self.ops:
            op = ops[i]
            if self.kind[i] == SEND:
                self._peer[i] = rank_of[str(op.kwargs["dst"])]
            elif self.kind[i] == RECV:
                self._peer[i] = rank_of[str(op.kwargs["src"])]
                meta = graph.values[op.outputs[0]]
                if meta is None:
                    raise SchedlabError(f"op {i} ({op.name}) receives a value with no tensor shape: cannot preallocate it")
        self.recvs = tuple(i for i in self.ops if self.kind[i] == RECV)
        self.recv_index = {i: j for j, i in enumerate(self.recvs)}
        self._unsent: list[tuple[torch.Tensor, Any, int]] = []  # the last step's sends
        self._prepost = False  # whether this step posts the next one's receives (`run_step`)
        self._next: _Transfers | None = None  # the next step's traffic, its receives posted
        # Groups: every rank creates every group, in one order (dist.new_group's rule). Each
        # all-reduce group of more than two ranks has a gloo group; each direction that sends
        # take, and both of every two-rank all-reduce group, have one of their own (module
        # docstring; `exec.reduce`).
        world = dist.get_world_size()
        all_groups = sorted({
            tuple(sorted(rank_of[str(d)] for d in op.kwargs["group"])) for op in ops if op.target == ALL_REDUCE
        })
        gloo_groups = {g: None if len(g) == world else dist.new_group(list(g))
                       for g in all_groups if not sums_by_exchange(len(g))}
        directions = direction_groups([*p2p_directions(graph, devices, rank_of), *pair_directions(all_groups)])
        self._reducers: dict[tuple[int, ...], Reducer] = {
            g: make_reducer(g, rank, directions, gloo_groups.get(g)) for g in all_groups if rank in g
        }
        # op -> (its direction's group, the peer's rank in it)
        self._link: dict[int, tuple[Any, int]] = {
            i: link(directions, rank, peer, rank) if self.kind[i] == SEND else link(directions, peer, rank, rank)
            for i, peer in self._peer.items()
        }
        self._group_of: dict[int, tuple[int, ...]] = {}
        buckets: list[int] = []
        for i in self.ops:
            if self.kind[i] == ALL_REDUCE:
                op = ops[i]
                if op.kwargs.get("reduce", "avg") != "avg":
                    raise SchedlabError(f"op {i} ({op.name}): only reduce='avg' all-reduces are supported")
                self._group_of[i] = tuple(sorted(rank_of[str(d)] for d in op.kwargs["group"]))
                buckets.append(int(op.kwargs["bucket"]))
        if buckets != sorted(buckets):
            raise SchedlabError(
                f"device {dev} would issue gradient buckets in the order {buckets}: every rank must issue its "
                "all-reduces in ascending bucket order (the resolved sequence must put them so)"
            )
        self.externals = tuple(i for i in self.ops if self.kind[i] in (RECV, ALL_REDUCE))
        # Values: what this rank holds at the start, keeps at the end, and frees on the way.
        homes = input_homes(graph, devices)
        self.input_ids = tuple(i.value for i in graph.inputs if homes[i.value] == dev)
        self.keep = frozenset(o.value for o in outputs_on(graph, devices, dev))
        self._uses: dict[int, int] = {}  # value -> how many ops read it (several slots)
        self._local_inputs: dict[int, tuple[int, ...]] = {}
        for i in self.ops:
            # A receive's input is the send's token, written on the peer: never on this rank.
            reads = () if self.kind[i] == RECV else ops[i].inputs
            self._local_inputs[i] = reads
            for v in reads:
                self._uses[v] = self._uses.get(v, 0) + 1
        # First use of each all-reduce's outputs: where the one-slot loop waits for it.
        first_use: dict[int, int] = {}
        for pos, i in enumerate(self.ops):
            for v in ops[i].inputs:
                first_use.setdefault(v, pos)
        self._wait_before: dict[int, list[int]] = {}
        self._wait_at_end: list[int] = []
        for i in self.ops:
            if self.kind[i] == ALL_REDUCE:
                uses = [first_use[v] for v in ops[i].outputs if v in first_use]
                if uses:
                    self._wait_before.setdefault(min(uses), []).append(i)
                else:
                    self._wait_at_end.append(i)
        # The co-run loop's structure over local ops.
        self._succs: list[tuple[int, ...]] = [()] * len(ops)
        self._indeg: list[int] = [0] * len(ops)
        for i in self.ops:
            self._succs[i] = tuple(s for s in graph.succs[i] if s in local)
            self._indeg[i] = sum(1 for p in graph.preds[i] if p in local)
        # One slot: the whole sequence as one compiled straight line.
        self._tr: _Transfers | None = None  # the step's traffic, while a straight line runs
        self._workers = KeptWorkers(self.slots)  # the co-run workers, as the one-process executor's
        self._pending: dict[int, _Pending] = {}  # issued all-reduces not waited on yet
        self._issued_ns: dict[int, int] = {}
        if self.slots == 1:
            self._compile_line(program, compute)

    def close(self) -> None:
        """End the co-run workers (before the rank's process exits: `WorkerPool.close`)."""
        self._workers.close()

    # ---- one step --------------------------------------------------------------------------

    def step(self, inputs: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], RankStepRecord]:
        """Run one step from this rank's inputs (graph input value id -> tensor, those homed
        on its device); the graph outputs written on its device and the record.

        The sends of a step are waited on at the end of the next step (or by `finish`), so
        a rank whose last op sends starts its next step at once.
        """
        out, stamps = self.run_step(inputs)
        return out, self.record(stamps)

    def run_step(self, inputs: dict[int, torch.Tensor], prepost_next: bool = False,
                 ) -> tuple[dict[int, torch.Tensor], StepStamps]:
        """`step` without turning the clock readings into spans: a loop of timed steps calls
        this and `record` after the loop, so the step-to-step bookkeeping (a pass over every
        op) stays out of the steps it times.

        `prepost_next`: another step follows, so once this step's last receive is in, post
        the next step's receives (their buffers allocated then). A peer that starts its next
        step while this rank still finishes this one (a pipeline's first stage, while the
        last finishes its backward) sends into a posted receive, which gloo writes in the
        caller; into one not posted yet, gloo's own thread of the sender writes it once the
        receiver posts, and on a rank whose one core computes that thread waited for the core
        up to a scheduler tick: conv1d-two-branch's 1F1B over 4 micro-batches (2 ranks,
        2026-11-28) waited 5.1 ms a step (median) on the last stage's first receive, a tiny
        one sent 1.3 ms before it was posted. Leave it False on the last step: nothing would
        match those receives."""
        V: list[Any] = [None] * len(self.graph.values)
        for v in self.input_ids:
            V[v] = inputs[v]
        start_ns = time.perf_counter_ns()
        tr = self._next if self._next is not None else _Transfers(self)  # receives posted early, if any
        self._next, self._prepost = None, prepost_next
        line_ns: list[int] = []
        issued: dict[int, int] = {}
        spans = None
        if self.slots == 1:
            line_ns = self._step_one(V, tr)
            issued, self._issued_ns = self._issued_ns, {}
        else:
            spans = self._step_corun(V, tr, start_ns)
        self._wait_sends(self._unsent)
        self._unsent = tr.sends
        end_ns = time.perf_counter_ns()
        return {v: V[v] for v in self.keep}, StepStamps(start_ns, end_ns - start_ns, line_ns, issued, spans)

    def _post_next_step(self) -> None:
        """Post every receive of the next step now (`run_step`'s `prepost_next`)."""
        self._prepost = False
        nxt = self._next = _Transfers(self)
        nxt.post_through(len(self.recvs) - 1)

    def record(self, stamps: StepStamps) -> RankStepRecord:
        """A step's record from `run_step`'s clock readings."""
        spans = stamps.spans
        if spans is None:
            spans = self._line_spans(stamps.line_ns, stamps.issued_ns, stamps.start_ns)
        return RankStepRecord(start_ns=stamps.start_ns, wall_ns=stamps.wall_ns,
                              spans=tuple(spans[i] for i in self.ops))

    def finish(self) -> None:
        """Wait for the sends of the last step."""
        self._wait_sends(self._unsent)
        self._unsent = []

    def _wait_sends(self, sends: list[tuple[torch.Tensor, Any, int]]) -> None:
        for _, work, i in sends:
            try:
                work.wait()
            except Exception as e:
                op = self.graph.ops[i]
                raise CommFailed(f"rank {self.rank}: op {i} ({op.name}) failed sending to rank {self._peer[i]}: {e}") from e

    def _issue_all_reduce(self, i: int, values: Sequence[torch.Tensor]) -> _Pending:
        op = self.graph.ops[i]
        t0 = time.perf_counter_ns()
        parts = [t.reshape(-1) for t in values]
        flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        if not flat.is_floating_point():
            raise SchedlabError(f"op {i} ({op.name}) averages a {flat.dtype} bucket; only floating-point values can be averaged")
        work = self._reducers[self._group_of[i]].start(flat, tag=int(op.kwargs["bucket"]))
        return _Pending(flat=flat, work=work, start_ns=t0)

    def _finish_all_reduce(self, i: int, p: _Pending) -> list[torch.Tensor]:
        """The averaged values of all-reduce `i`, in its outputs' order, once it completed."""
        op = self.graph.ops[i]
        try:
            p.work.wait()
        except Exception as e:
            raise CommFailed(f"rank {self.rank}: op {i} ({op.name}) failed: {e}") from e
        p.flat.div_(len(self._group_of[i]))
        out: list[torch.Tensor] = []
        offset = 0
        for v in op.outputs:
            meta = self.graph.values[v]
            assert meta is not None
            n = 1
            for d in meta.shape:
                n *= d
            out.append(p.flat[offset:offset + n].view(meta.shape))
            offset += n
        return out

    def _failed(self, i: int, e: BaseException) -> BaseException:
        if isinstance(e, SchedlabError):
            return e
        op = self.graph.ops[i]
        return OpFailed(f"rank {self.rank}: op {op.id} ({op.name}, {op.target}) failed: {type(e).__name__}: {e}")

    def _step_one(self, V: list[Any], tr: _Transfers) -> list[int]:
        """One slot: the rank's sequence as one compiled straight line (`Program.straight_line`,
        as the one-process executor runs it), its communication called in place; the clock
        readings before each item and after the last (`_line_spans` reads them)."""
        items = self._line_items
        T = [0] * (len(items) + 1)
        self._tr = tr
        self._pending.clear()
        prev = torch.get_num_threads()
        try:
            self._line(V, T)
        except BaseException as e:
            k = max(idx for idx, t in enumerate(T) if t) if any(T) else 0
            raise self._failed(self._line_ops[min(k, len(items) - 1)], e) from e
        finally:
            torch.set_num_threads(prev)
            self._tr = None
        return T

    def _line_spans(self, T: Sequence[int], issued_ns: dict[int, int], start_ns: int) -> list[Span]:
        items = self._line_items
        spans: list[Span] = [(0, 0, 0)] * len(self.graph.ops)
        for pos, i in enumerate(self._line_ops):
            item = items[pos]
            worker = 0
            if isinstance(item, Extern):
                if item.call == "ISSUE":
                    continue
                if item.call == "FIN":  # the all-reduce's span: from its issue to its wait's end
                    spans[i] = (issued_ns[i] - start_ns, T[pos + 1] - start_ns, RECV_WORKER)
                    continue
                worker = SEND_WORKER if item.call == "SEND" else RECV_WORKER
            spans[i] = (T[pos] - start_ns, T[pos + 1] - start_ns, worker)
        return spans

    def _compile_line(self, program: Program, compute: Sequence[int]) -> None:
        """The one-slot step as one straight line: compute ops by their index in `program`,
        sends, receives and all-reduces (issued at their place, waited on before the first
        op that reads them, or at the end) as `Extern` calls into this executor."""
        ops = self.graph.ops
        index = {i: j for j, i in enumerate(compute)}
        items: list[int | Extern] = []
        line_ops: list[int] = []

        def finish(a: int) -> None:
            items.append(Extern("FIN", a, writes=ops[a].outputs))
            line_ops.append(a)

        for pos, i in enumerate(self.ops):
            for a in self._wait_before.get(pos, ()):
                finish(a)
            k = self.kind[i]
            if k == "compute":
                items.append(index[i])
            elif k == SEND:
                items.append(Extern("SEND", i, reads=ops[i].inputs[:1]))
            elif k == RECV:
                items.append(Extern("RECV", i, writes=ops[i].outputs[:1]))
            else:
                items.append(Extern("ISSUE", i, reads=ops[i].inputs))
            line_ops.append(i)
        for a in self._wait_at_end:
            finish(a)
        threads = [self.resolved.threads[i] for i in compute]
        # Through a weak reference: the line is kept on this executor, and a cycle through it
        # would keep the executor (and its process groups) alive past the rank's teardown,
        # for the garbage collector to free at exit (an abort in gloo, now and then).
        me = weakref.ref(self)

        def call(method: Callable[..., Any]) -> Callable[..., Any]:
            def through(*args: Any) -> Any:
                return method(me(), *args)
            return through

        env = {"SEND": call(RankExecutor._line_send), "RECV": call(RankExecutor._line_recv),
               "ISSUE": call(RankExecutor._line_issue), "FIN": call(RankExecutor._line_finish)}
        self._line_items: tuple[int | Extern, ...] = tuple(items)
        self._line_ops: tuple[int, ...] = tuple(line_ops)
        self._line = program.straight_line(items, threads, self.keep, inputs=self.input_ids, env=env)

    def _line_send(self, i: int, value: torch.Tensor) -> None:
        assert self._tr is not None
        self._tr.send(i, value)

    def _line_recv(self, i: int) -> torch.Tensor:
        assert self._tr is not None
        return self._tr.wait_recv(i)

    def _line_issue(self, i: int, *values: torch.Tensor) -> None:
        p = self._issue_all_reduce(i, values)
        self._pending[i] = p
        self._issued_ns[i] = p.start_ns

    def _line_finish(self, i: int) -> torch.Tensor | list[torch.Tensor]:
        out = self._finish_all_reduce(i, self._pending.pop(i))
        return out[0] if len(out) == 1 else out

    def _step_corun(self, V: list[Any], tr: _Transfers, start_ns: int) -> list[Span]:
        uses = dict(self._uses)
        inputs_of = self._local_inputs
        keep = self.keep
        kind = self.kind
        fn = self._fn

        def run_op(i: int) -> None:
            if kind[i] == "compute":
                fn[i](V)
            else:
                tr.send(i, V[inputs_of[i][0]])

        release = freeing(inputs_of, uses, keep, V)

        loop = ReadyLoop(
            ops=self.ops,
            prio=self.resolved.priority,
            succs=self._succs,
            indeg=list(self._indeg),
            threads=self.resolved.threads,
            run_op=run_op,
            release=release,
            fail=self._failed,
            n_spans=len(self.graph.ops),
            external=self.externals,
            start_ns=start_ns,
        )
        ns = time.perf_counter_ns

        def comm() -> None:
            # Receives and all-reduces in sequence order: the deadlock-free order (module doc).
            i = -1
            try:
                if self.recvs:
                    tr.post_through(len(self.recvs) - 1)
                for i in self.externals:
                    if kind[i] == RECV:
                        t0 = ns()
                        V[self.graph.ops[i].outputs[0]] = tr.wait_recv(i)
                    else:
                        if not loop.wait_ready(i):
                            return
                        op = self.graph.ops[i]
                        p = self._issue_all_reduce(i, [V[v] for v in op.inputs])
                        t0 = p.start_ns
                        for v, t in zip(op.outputs, self._finish_all_reduce(i, p), strict=True):
                            V[v] = t
                    loop.complete(i, t0, ns(), RECV_WORKER)
            except BaseException as e:
                loop.error(self._failed(i, e))

        spans = loop.run(self.slots, comm if self.externals else None, pool=self._workers.pool())
        for i in self.ops:
            if kind[i] == SEND:
                a, b, _ = spans[i]
                spans[i] = (a, b, SEND_WORKER)
        return spans


# ---- clocks -------------------------------------------------------------------------------


def clock_offset_ns(rounds: int = 8) -> tuple[int, int]:
    """(offset, round trip) in ns: add `offset` to this rank's `perf_counter_ns()` to read
    rank 0's clock. Each rank in turn ping-pongs `rounds` times with rank 0; the round trip
    of least delay gives the estimate (rank 0's stamp taken halfway), good to about half
    that round trip. Every rank of the default group must call it together."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ns = time.perf_counter_ns
    buf = torch.zeros(1, dtype=torch.int64)
    best = (0, -1)
    for peer in range(1, world):
        for k in range(rounds):
            if rank == 0:
                dist.recv(buf, peer, tag=CLOCK_TAG + k)
                buf[0] = ns()
                dist.send(buf, peer, tag=CLOCK_TAG + k)
            elif rank == peer:
                t1 = ns()
                dist.send(buf, 0, tag=CLOCK_TAG + k)
                dist.recv(buf, 0, tag=CLOCK_TAG + k)
                t2 = ns()
                rtt = t2 - t1
                if best[1] < 0 or rtt < best[1]:
                    best = (int(buf[0]) - (t1 + t2) // 2, rtt)
    return (0, 0) if rank == 0 else best

