"""The job folder of a multi-process run: what the launcher writes for its ranks and what
each rank writes back. Every file is written atomically (`schedlab.io`): a reader sees
all of a file or none of it.

    job.json          steps, warmup, timeouts, the plan and the resolved per-op data
    graph.json        the graph the ranks run (the expanded one, with its COMM ops)
    machine.json      the machine (which device each rank drives)
    inputs.<rank>.pt  graph input value id -> tensor: the inputs homed on that rank's device
    progress.bin      what each rank last began ("start", "rendezvous", "step 3", "done"), and when
    result.<rank>.pt  the rank's step records (and outputs), when it has finished
                      (with a `ddp` job: also its DDP step times, and DDP's parameters after step 0)
    error.<rank>.json why the rank failed, when it has: {"kind", "message", "step"}
"""

from __future__ import annotations

import json
import mmap
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from schedlab.errors import SchedlabError
from schedlab.exec.dist import RankStepRecord
from schedlab.graph import Graph
from schedlab.io import atomic_file, read_json, write_json_atomic, write_text_atomic
from schedlab.machine import Machine
from schedlab.plan import Plan, ResolvedPlan

JOB_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Job:
    graph: Graph  # the graph to run (expanded)
    resolved: ResolvedPlan  # per op of `graph`
    machine: Machine
    steps: int
    warmup: int
    want_outputs: bool  # return the outputs of the first step (for the numerics check)
    collective_timeout_s: float  # passed to init_process_group: every collective and receive
    workload: str = ""
    ddp: dict[str, Any] | None = None  # run a DDP (or torch pipelining) step after each step (`rank.py`)


DDP_KEYS = ("spec", "size", "seed", "optimizer", "lr", "bucket_mb", "threads", "replicas")


def check_ddp_spec(ddp: dict[str, Any]) -> dict[str, Any]:
    """The job's DDP side-by-side spec: the workload (spec, size, seed: the same module,
    initial values and batch as the captured step), optimizer, lr, bucket_mb, threads and
    replicas (one rank each); `want_params` (optional) returns DDP's parameters after step 0.
    A spec whose `kind` is "pipelining" runs torch's pipeline instead (`schedlab.exec.pipelining`);
    its steps are then what `RankResult.ddp_steps` holds."""
    from schedlab.exec.pipelining import PIPELINING_KIND, check_pipelining_spec

    if ddp.get("kind") == PIPELINING_KIND:
        return check_pipelining_spec(ddp)
    missing = [k for k in DDP_KEYS if k not in ddp]
    if missing:
        raise SchedlabError(f"the job's ddp spec lacks {', '.join(missing)}")
    return {**{k: ddp[k] for k in DDP_KEYS}, "want_params": bool(ddp.get("want_params", False))}


@dataclass(frozen=True)
class RankResult:
    """What one rank ran: per-step records on its own clock, and its offset to rank 0's."""

    rank: int
    device: str
    ops: tuple[int, ...]  # the op ids it ran, in the order of `RankStepRecord.spans`
    steps: tuple[RankStepRecord, ...]  # the timed steps
    clock_offset_ns: int  # add to this rank's clock to read rank 0's
    clock_rtt_ns: int  # the round trip the offset was measured with (its error is about half)
    outputs: dict[int, torch.Tensor] | None  # graph outputs of the first step written on its device
    ddp_steps: tuple[tuple[int, int], ...] = ()  # a ddp job: per timed step (start_ns, wall_ns), own clock
    ddp_params: dict[str, torch.Tensor] | None = None  # a ddp job with want_params: after DDP's step 0


def prepare_inputs(
    graph: Graph, input_values: dict[int, torch.Tensor], rank_of_input: dict[int, int], world: int
) -> dict[int, dict[int, torch.Tensor]]:
    """Rank -> the graph inputs it holds (value id -> tensor)."""
    out: dict[int, dict[int, torch.Tensor]] = {r: {} for r in range(world)}
    for i in graph.inputs:
        if i.value not in input_values:
            raise SchedlabError(f"no tensor given for graph input {i.name!r} (value {i.value})")
        out[rank_of_input[i.value]][i.value] = input_values[i.value]
    return out


def write_job(
    job_dir: Path,
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    inputs_of_rank: dict[int, dict[int, torch.Tensor]],
    *,
    steps: int,
    warmup: int,
    want_outputs: bool,
    collective_timeout_s: float,
    workload: str = "",
    ddp: dict[str, Any] | None = None,
) -> None:
    """Write everything the ranks read. `graph` is the graph the ranks run (the expanded one)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    graph.save(job_dir / "graph.json")
    machine.save(job_dir / "machine.json")
    for rank, inputs in inputs_of_rank.items():
        with atomic_file(job_dir / f"inputs.{rank}.pt", "wb") as f:
            torch.save(inputs, f)
    make_progress_file(job_dir, len(machine.processes))
    write_json_atomic(job_dir / "job.json", {
        "schema": "schedlab.job",
        "version": JOB_SCHEMA_VERSION,
        "steps": steps,
        "warmup": warmup,
        "want_outputs": want_outputs,
        "collective_timeout_s": collective_timeout_s,
        "workload": workload,
        "ddp": None if ddp is None else check_ddp_spec(ddp),
        "plan": resolved.plan.to_json(),
        "resolved": {
            "slots": resolved.slots,
            "threads": list(resolved.threads),
            "priority": list(resolved.priority),
            "device": list(resolved.device),
            "sequence": list(resolved.sequence),
            "device_slots": resolved.device_slots,
            "base_ops": resolved.base_ops,
            "steps": resolved.steps,
        },
    })


def load_job(job_dir: Path) -> Job:
    d = read_json(job_dir / "job.json", what="job")
    if not isinstance(d, dict) or d.get("schema") != "schedlab.job" or d.get("version") != JOB_SCHEMA_VERSION:
        raise SchedlabError(f"{job_dir / 'job.json'} is not a schedlab job of version {JOB_SCHEMA_VERSION}")
    graph = Graph.load(job_dir / "graph.json")
    machine = Machine.from_json(read_json(job_dir / "machine.json", what="machine"))
    r = d["resolved"]
    resolved = ResolvedPlan(
        plan=Plan.from_json(d["plan"]),
        slots=int(r["slots"]),
        threads=tuple(r["threads"]),
        priority=tuple(r["priority"]),
        device=tuple(r["device"]),
        sequence=tuple(r["sequence"]),
        device_slots={str(k): int(v) for k, v in r["device_slots"].items()},
        base_ops=int(r["base_ops"]),
        steps=int(r.get("steps", 1)),
    )
    return Job(
        graph=graph,
        resolved=resolved,
        machine=machine,
        steps=int(d["steps"]),
        warmup=int(d["warmup"]),
        want_outputs=bool(d["want_outputs"]),
        collective_timeout_s=float(d["collective_timeout_s"]),
        workload=str(d.get("workload", "")),
        ddp=None if d.get("ddp") is None else check_ddp_spec(d["ddp"]),
    )


def load_inputs(job_dir: Path, rank: int) -> dict[int, torch.Tensor]:
    path = job_dir / f"inputs.{rank}.pt"
    if not path.exists():
        return {}
    inputs: dict[int, torch.Tensor] = torch.load(path, weights_only=True)
    return inputs


PROGRESS_FILE = "progress.bin"
_SLOT = struct.Struct("<qq")  # (what, when: time.time_ns()) per rank
_LABELS = {-3: "start", -2: "rendezvous", -1: "done"}
START, RENDEZVOUS, DONE = -3, -2, -1  # what a rank begins; a step is its index (>= 0)


def label(what: int) -> str:
    return _LABELS.get(what, f"step {what}")


class Progress:
    """What each rank last began, and when: a small shared file each rank writes its slot of
    in place (a memory write per step: no file is opened or renamed on the step path)."""

    def __init__(self, job_dir: Path, rank: int) -> None:
        self.rank = rank
        path = job_dir / PROGRESS_FILE
        with open(path, "r+b") as f:
            self._mm = mmap.mmap(f.fileno(), 0)

    def mark(self, what: int) -> None:
        _SLOT.pack_into(self._mm, _SLOT.size * self.rank, what, time.time_ns())


def make_progress_file(job_dir: Path, world: int) -> None:
    write_bytes_atomic(job_dir / PROGRESS_FILE, bytes(_SLOT.size * world))


def read_progress(job_dir: Path, rank: int) -> tuple[str, float] | None:
    """(what the rank last began, when in s since the epoch), or None before it began anything."""
    try:
        with open(job_dir / PROGRESS_FILE, "rb") as f:
            f.seek(_SLOT.size * rank)
            raw = f.read(_SLOT.size)
    except OSError:
        return None
    if len(raw) < _SLOT.size:
        return None
    what, when_ns = _SLOT.unpack(raw)
    return (label(what), when_ns / 1e9) if when_ns else None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def write_result(job_dir: Path, result: RankResult) -> None:
    with atomic_file(job_dir / f"result.{result.rank}.pt", "wb") as f:
        torch.save({
            "rank": result.rank,
            "device": result.device,
            "ops": list(result.ops),
            "steps": [(s.start_ns, s.wall_ns, list(s.spans)) for s in result.steps],
            "clock_offset_ns": result.clock_offset_ns,
            "clock_rtt_ns": result.clock_rtt_ns,
            "outputs": result.outputs,
            "ddp_steps": [list(x) for x in result.ddp_steps],
            "ddp_params": result.ddp_params,
        }, f)


def read_result(job_dir: Path, rank: int) -> RankResult:
    path = job_dir / f"result.{rank}.pt"
    if not path.exists():
        raise SchedlabError(f"rank {rank} exited without writing its result ({path})")
    d: dict[str, Any] = torch.load(path, weights_only=True)
    return RankResult(
        rank=int(d["rank"]),
        device=str(d["device"]),
        ops=tuple(d["ops"]),
        steps=tuple(RankStepRecord(int(a), int(w), tuple(tuple(x) for x in sp)) for a, w, sp in d["steps"]),
        clock_offset_ns=int(d["clock_offset_ns"]),
        clock_rtt_ns=int(d["clock_rtt_ns"]),
        outputs=d["outputs"],
        ddp_steps=tuple((int(a), int(w)) for a, w in d.get("ddp_steps", [])),
        ddp_params=d.get("ddp_params"),
    )


def write_error(job_dir: Path, rank: int, kind: str, message: str, step: int | None) -> None:
    """Why rank `rank` failed; `kind` is "comm" (a peer failed or timed out), "op" or "setup"."""
    write_text_atomic(job_dir / f"error.{rank}.json", json.dumps({"kind": kind, "message": message, "step": step}))


def read_error(job_dir: Path, rank: int) -> dict[str, Any] | None:
    path = job_dir / f"error.{rank}.json"
    if not path.exists():
        return None
    try:
        d: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return d
