"""The communication ops of an expanded graph (`schedlab.distribute`), as the engine reads them.

A resolved multi-device plan runs an expanded graph: every value that crosses a device
goes through explicit COMM ops, so the simulator charges exactly the transfers the
executor performs (DESIGN.md, "A resolved plan is a graph per rank"). This module checks
that graph and indexes its COMM ops:

- ``schedlab.send`` (`Role.SEND`): on the value's home device; its output is a zero-byte
  token read by exactly one ``schedlab.recv`` on another device. That token edge is the
  only value an expanded graph may read across devices.
- ``schedlab.recv`` (`Role.RECV`): completes when its transfer arrives.
- ``schedlab.all_reduce`` (`Role.ALL_REDUCE`): one op per member device per gradient
  bucket, kwargs ``bucket`` (int, the issue order), ``group`` (device ids, the ring
  order) and ``reduce``. All members of one (group, bucket) form one `CollectiveSpec`;
  each device issues a group's buckets in ascending order (`issue_next`).

What a COMM op costs the rank that runs it (beyond its link or collective) comes from the
cost model when it measured it (`CommHostCost`, e.g. a Profile whose link benchmark timed
the executor's calls: `calibrate.comm_host`); otherwise the op's dispatch cost stands in.

An anomaly here is a bug of the expansion, not of the user's plan: it raises a
SchedlabError that says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, runtime_checkable

from schedlab.distribute import ALL_REDUCE, COMM_TARGETS, RECV, SEND
from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, OpKind


class Role(IntEnum):
    """What the engine does with an op."""

    COMPUTE = 0  # a kernel on its device's cores or streams
    SEND = 1  # dispatched by a worker, then a transfer on a link (the worker moves on)
    RECV = 2  # no worker: completes when its transfer arrives
    ALL_REDUCE = 3  # issued by a worker; runs with the other members of its bucket


_ROLE_OF_TARGET = {SEND: Role.SEND, RECV: Role.RECV, ALL_REDUCE: Role.ALL_REDUCE}

# Trace tracks of COMM ops, as the executor writes them (`exec.dist`): receives and
# all-reduces on the communication thread's track, sends on a track of their own.
RECV_TRACK = -1
SEND_TRACK = -2


@dataclass(frozen=True)
class CollectiveSpec:
    """One all-reduce of one bucket across its group."""

    bucket: int
    group: tuple[int, ...]  # device indices, in the ring order of the op's `group` kwarg
    members: tuple[int, ...]  # the all_reduce op of each group device, same order
    nbytes: int  # bytes each member reduces (the bucket's gradients)


@dataclass(frozen=True)
class CommStructure:
    """The COMM ops of one expanded graph with one placement, indexed for the engine."""

    role: tuple[Role, ...]  # per op
    recv_of: dict[int, int]  # send op -> the recv op that reads its token
    send_bytes: dict[int, int]  # send op -> bytes it puts on the link (its `bytes_moved`)
    collectives: tuple[CollectiveSpec, ...]  # ascending (group, bucket)
    collective_of: dict[int, int]  # all_reduce op -> index into `collectives`
    issue_next: dict[int, int]  # all_reduce op -> the next bucket's op on its device (waits for this issue)
    reads_reduced: dict[int, tuple[int, ...]]  # op -> the all_reduce ops whose results it reads
    comm_ops: tuple[int, ...] = ()  # the ops whose role is not COMPUTE, ascending

    @property
    def n_sends(self) -> int:
        return len(self.recv_of)


@dataclass(frozen=True)
class CommOpCost:
    """What one COMM op costs its rank (µs), beyond its link or collective. The parts "under
    the lock" hold the rank's interpreter lock; the kernels run on its device's cores."""

    post_us: float  # under the lock: a send's call, a recv's post, an all-reduce's issue (flatten's Python, post)
    # after its post part, on the cores: an all-reduce's flatten (a copy of its bucket); a
    # send's write of its data into the socket (the caller waits; the transfer is in flight)
    post_kernel_us: float = 0.0
    done_us: float = 0.0  # under the lock once its data is there: a recv's wait; an all-reduce's wait and average
    done_kernel_us: float = 0.0  # an all-reduce's average (a pass over its bucket), after its done part
    # An all-reduce on a CPU device: the share of its collective's bandwidth part that also
    # keeps one core of its device busy (processor-shared with the kernels there; 0: none).
    collective_cpu_share: float = 0.0
    # An all-reduce between two CPU ranks (the executor's exchange, `exec.reduce`): the part
    # of its issue that grows with the bytes, gloo writing the bucket into the socket in the
    # caller, after its flatten. The caller waits for it; the collective is in flight
    # meanwhile and ends no earlier than every member's write.
    write_us: float = 0.0
    # A send or a recv on a CPU device: what its transfer, while in flight, takes of one core
    # of its device (gloo's socket thread; µs of that core), processor-shared the same way.
    transfer_cpu_us: float = 0.0
    # What the call costs the ops after it on a one-slot rank (they run cold:
    # `calibrate.comm_host.ColdCost`), charged once it ends: interpolated in the µs it
    # blocked over `after_wait` ((wait µs, extra µs), ascending; a receive's or an
    # all-reduce's wait), else `after_us` (a send, which never blocks).
    after_us: float = 0.0
    after_wait: tuple[tuple[float, float], ...] = ()

    def cold_us(self, waited_us: float) -> float:
        return interp_flat(self.after_wait, waited_us) if self.after_wait else self.after_us


def interp_flat(points: Sequence[tuple[float, float]], x: float) -> float:
    """y at `x` over (x, y) `points` (ascending x): linear between them, flat beyond them."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@runtime_checkable
class CommHostCost(Protocol):
    """Optional part of a cost model: the measured cost of a COMM op on its rank."""

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        """What COMM op `op` costs its rank; None when the model never measured it (the
        simulator then charges the op's dispatch cost, and an all-reduce's kernel, as for
        any op: once to post or issue it and, for an all-reduce, again to finish it)."""
        ...


def has_comm(graph: Graph) -> bool:
    """Whether `graph` carries explicit communication ops (it is an expanded graph)."""
    return any(op.kind is OpKind.COMM for op in graph.ops)


def comm_structure(graph: Graph, op_device: Sequence[int], device_ids: Sequence[str]) -> CommStructure:
    """Check and index the COMM ops of `graph` with op i on device index `op_device[i]`."""
    ops = graph.ops
    role: list[Role] = []
    for op in ops:
        known = _ROLE_OF_TARGET.get(op.target)
        if op.kind is OpKind.COMM and known is None:
            raise _bug(f"op {op.id} ({op.name}) is of kind COMM but its target {op.target!r} is none of {COMM_TARGETS}")
        role.append(Role.COMPUTE if known is None else known)
    index_of = {d: i for i, d in enumerate(device_ids)}

    recv_of: dict[int, int] = {}
    send_bytes: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for op in ops:
        for v in op.inputs:
            readers.setdefault(v, []).append(op.id)
    for op in ops:
        if role[op.id] is Role.SEND:
            if len(op.inputs) != 1 or len(op.outputs) != 1:
                raise _bug(f"send op {op.id} ({op.name}) must read one value and write one token")
            rs = readers.get(op.outputs[0], [])
            if len(rs) != 1 or role[rs[0]] is not Role.RECV:
                raise _bug(f"the token of send op {op.id} ({op.name}) must be read by exactly one recv, not by ops {rs}")
            r = rs[0]
            if op_device[r] == op_device[op.id]:
                raise _bug(f"send op {op.id} ({op.name}) and its recv op {r} are on the same device")
            dst = op.kwargs.get("dst")
            if dst is not None and index_of.get(str(dst)) != op_device[r]:
                raise _bug(f"send op {op.id} ({op.name}) names dst {dst!r} but its recv op {r} runs on "
                           f"{device_ids[op_device[r]]!r}")
            recv_of[op.id] = r
            send_bytes[op.id] = int(op.bytes_moved)
        elif role[op.id] is Role.RECV:
            p = graph.producer.get(op.inputs[0]) if len(op.inputs) == 1 else None
            if p is None or role[p] is not Role.SEND or len(op.outputs) != 1:
                raise _bug(f"recv op {op.id} ({op.name}) must read the token of one send and write one value")

    by_key: dict[tuple[tuple[int, ...], int], dict[int, int]] = {}  # (group, bucket) -> device -> op
    for op in ops:
        if role[op.id] is not Role.ALL_REDUCE:
            continue
        bucket, group = op.kwargs.get("bucket"), op.kwargs.get("group")
        if not isinstance(bucket, int) or not isinstance(group, (list, tuple)) or len(group) < 1:
            raise _bug(f"all_reduce op {op.id} ({op.name}) needs kwargs bucket (int) and group (device ids), "
                       f"got {op.kwargs!r}")
        try:
            members = tuple(index_of[str(g)] for g in group)
        except KeyError as e:
            raise _bug(f"all_reduce op {op.id} ({op.name}) names device {e.args[0]!r}, not in the machine") from None
        if len(set(members)) != len(members) or op_device[op.id] not in members:
            raise _bug(f"all_reduce op {op.id} ({op.name}) runs on {device_ids[op_device[op.id]]!r}, "
                       f"which must be one of its distinct group members {list(group)}")
        at = by_key.setdefault((members, bucket), {})
        if op_device[op.id] in at:
            raise _bug(f"bucket {bucket} of group {list(group)} has two all_reduce ops on "
                       f"{device_ids[op_device[op.id]]!r}: {at[op_device[op.id]]} and {op.id}")
        at[op_device[op.id]] = op.id

    collectives: list[CollectiveSpec] = []
    collective_of: dict[int, int] = {}
    issue_next: dict[int, int] = {}
    last_on: dict[tuple[tuple[int, ...], int], int] = {}  # (group, device) -> its op of the previous bucket
    values = graph.values
    for (members, bucket), at in sorted(by_key.items()):
        if set(at) != set(members):
            missing = [device_ids[d] for d in members if d not in at]
            raise _bug(f"bucket {bucket} of group {[device_ids[d] for d in members]} has no all_reduce op on {missing}")
        ops_in_order = tuple(at[d] for d in members)
        sizes = {sum(_nbytes(values[v]) for v in ops[o].inputs) for o in ops_in_order}
        if len(sizes) != 1:
            raise _bug(f"bucket {bucket} of group {[device_ids[d] for d in members]} reduces different sizes "
                       f"on its members: {sorted(sizes)} bytes")
        for d, o in zip(members, ops_in_order, strict=True):
            prev = last_on.get((members, d))
            if prev is not None:
                issue_next[prev] = o
            last_on[(members, d)] = o
            collective_of[o] = len(collectives)
        collectives.append(CollectiveSpec(bucket, members, ops_in_order, sizes.pop()))
    reads_reduced: dict[int, tuple[int, ...]] = {}
    for op in ops:
        mine = tuple(dict.fromkeys(p for v in op.inputs if (p := graph.producer.get(v)) is not None
                                   and role[p] is Role.ALL_REDUCE))
        if mine:
            reads_reduced[op.id] = mine
    comm_ops = tuple(o for o, r in enumerate(role) if r is not Role.COMPUTE)
    return CommStructure(tuple(role), recv_of, send_bytes, tuple(collectives), collective_of, issue_next, reads_reduced,
                         comm_ops)


def _nbytes(meta: object) -> int:
    return int(getattr(meta, "nbytes", 0) or 0)


def _bug(detail: str) -> SchedlabError:
    return SchedlabError(f"malformed expanded graph (a bug in schedlab.distribute, not in your plan): {detail}")
