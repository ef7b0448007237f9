"""A pipeline with data-parallel replicas: R copies of a pipelined step, each on its own
group of devices, each stage's gradients averaged over its R copies.

The step is the pipelined graph of one replica (`pipeline_expand.pipeline_graph`), its
rows on the first group of devices. Replica r runs row d on the r-th group's device at
the same place (`replica_rows`), the convention of a data-parallel plan
(`schedlab.plan`: replica r runs on the r-th group of devices). Joined as a data-parallel
step is (`data_parallel.replica_copies`): replica r's copy of op i is op
``r * len(ops) + i``, and each gradient bucket gets one all-reduce per replica over the
devices that hold that stage in every replica. Buckets never mix stages, as one
DistributedDataParallel per stage module keeps them apart, so a device that runs several
stages (interleaved, looped) averages each stage's gradients as soon as that stage's last
backward has made them, before its updates.

Each device runs its replica's schedule row, with each all-reduce issued right after the
op that makes the last gradient of its bucket. Every replica issues its all-reduces in
one order, so the ranks of a group meet them in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.data_parallel import replica_copies
from schedlab.errors import SchedlabError
from schedlab.machine import Machine
from schedlab.pipeline_expand import NO_ACTION, Pipelined
from schedlab.plan import PlanError, replica_groups


def replica_rows(machine: Machine, rows: tuple[str, ...], replicas: int) -> list[tuple[str, ...]]:
    """Per replica, the device of each schedule row: replica 0's are `rows`, which must lie
    in the machine's first group of len(devices) / `replicas`; replica r's are the devices
    at the same places in the r-th group."""
    groups = replica_groups(machine, replicas)
    group0 = groups[0]
    stray = [d for d in rows if d not in group0]
    if stray:
        raise PlanError(
            "pipeline_devices", f"with {replicas} replicas, the schedule's rows run on the first replica's devices "
            f"({', '.join(group0)}); replica r runs on the r-th group of {len(group0)}. Not: {', '.join(stray)}"
        )
    return [tuple(group[group0.index(d)] for d in rows) for group in groups]


def mirrored(settings: dict[str, int], rows: Sequence[tuple[str, ...]]) -> dict[str, int]:
    """Per-device `settings` (co-run slots, threads) with each other replica's device given
    its first-replica twin's, unless it has its own: every replica runs alike."""
    out = {rows[r][d]: settings[dev] for r in range(1, len(rows)) for d, dev in enumerate(rows[0]) if dev in settings}
    return {**out, **settings}


def replicate_pipeline(pipe: Pipelined, rows: Sequence[tuple[str, ...]], bucket_bytes: int) -> Pipelined:
    """`pipe` (one replica's pipelined step, its schedule rows on `rows[0]`) as R =
    len(`rows`) replicas joined by per-stage gradient all-reduces (module docstring); no
    send/recv ops yet, as `pipe` has none."""
    R = len(rows)
    n = len(pipe.graph.ops)
    if len(pipe.stage) != n:  # pragma: no cover - pipeline_graph gives every op its stage
        raise SchedlabError("the pipelined step has no stage per op; this is a schedlab bug")
    where = [dict(zip(rows[0], rows[r], strict=True)) for r in range(R)]
    op_device = [tuple(where[r][d] for d in pipe.device) for r in range(R)]
    ready = {i: k for order in pipe.orders.values() for k, i in enumerate(order)}
    joined, device = replica_copies(
        pipe.graph, op_device, bucket_bytes, ready_rank=ready.__getitem__, bucket_key=pipe.stage.__getitem__
    )
    issued_after: dict[int, list[int]] = {}  # op -> the all-reduces issued right after it
    reduce_stage: list[int] = []
    for a in range(R * n, len(joined.ops)):
        off = (a - R * n) % R * n  # all-reduces come bucket by bucket, one per replica
        last = max((joined.producer[v] - off for v in joined.ops[a].inputs), key=ready.__getitem__)
        issued_after.setdefault(off + last, []).append(a)
        reduce_stage.append(pipe.stage[last])
    orders: dict[str, tuple[int, ...]] = {}
    for r in range(R):
        for dev, order in pipe.orders.items():
            out: list[int] = []
            for i in order:
                out.append(r * n + i)
                out.extend(issued_after.get(r * n + i, ()))
            orders[where[r][dev]] = tuple(out)
    comm = len(reduce_stage)
    return Pipelined(
        graph=joined,
        device=tuple(device),
        orders=orders,
        action=(*pipe.action * R, *[NO_ACTION] * comm),
        copy_of=(*pipe.copy_of * R, *[-1] * comm),
        base_ops=pipe.base_ops,
        stage=(*pipe.stage * R, *reduce_stage),
    )
