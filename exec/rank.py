"""The rank entry point of the multi-process executor: ``python -m schedlab.exec.rank JOB_DIR``.

`schedlab.exec.launch` (what `schedlab trace` uses for a multi-device plan) starts one of
these per rank on this host. The same entry point runs under torchrun, on one host or
across hosts, because it reads what torchrun sets (env:// rendezvous):

    RANK, WORLD_SIZE             this rank and how many there are
    MASTER_ADDR, MASTER_PORT     where rank 0 listens for the rendezvous
    LOCAL_RANK, LOCAL_WORLD_SIZE this rank among the ranks of its host (to split the cores)

For example, with a job folder written by `schedlab.exec.launch.prepare_job` (and
copied to the same path on every host):

    torchrun --nproc-per-node 2 -m schedlab.exec.rank JOB_DIR
    torchrun --nnodes 2 --node-rank K --nproc-per-node 1 \\
        --master-addr HOST0 --master-port 29500 -m schedlab.exec.rank JOB_DIR

then `schedlab.exec.launch.collect(JOB_DIR, ...)` merges the ranks' results into one
Trace. Rank r drives the devices whose `process` is r in the job's machine.

A rank pins itself to its share of the host's usable cores (``SCHEDLAB_CPUS``, a list
like "0,1", else the LOCAL_RANK-th of LOCAL_WORLD_SIZE equal shares), runs the warmup and
timed steps, and writes its result file, or an error file saying why it failed.

A job with a `ddp` spec (`schedlab bench --ddp`) also runs torch's DistributedDataParallel
on the rank's part of the batch (`schedlab.exec.ddp`): after each schedlab step (warmup
ones too) the rank drains that step's sends and runs one DDP step, so both are timed in
the same processes, alternately, and see the same noise. A job whose `ddp` spec has kind
"pipelining" (`schedlab bench --pipelining`) runs torch.distributed.pipelining's step of
the same stages and schedule there instead (`schedlab.exec.pipelining`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from schedlab.allocator import ensure_tuned
from schedlab.exec.ddp import DdpStepper, stepper_for_job
from schedlab.exec.dist import CommFailed, RankExecutor, clock_offset_ns, rank_device
from schedlab.exec.job import (
    DONE,
    RENDEZVOUS,
    START,
    Progress,
    RankResult,
    load_inputs,
    load_job,
    write_error,
    write_result,
)
from schedlab.exec.pipelining import PIPELINING_KIND, PipeliningStepper
from schedlab.exec.rankenv import CPUS_ENV, FAULT_ENV, RankEnv, core_share, die_with_parent, pin_process, read_env
from schedlab.exec.runner import OpFailed, next_inputs
from schedlab.rng import seeded_random


def _fault(spec: str, rank: int) -> tuple[str, int] | None:
    try:
        r, action, step = spec.split(":")
        return (action, int(step)) if int(r) == rank else None
    except ValueError:
        return None


def _inject(action: str) -> None:
    sys.stderr.write(f"schedlab.exec.rank: test fault {action!r}\n")
    sys.stderr.flush()
    if action == "exit":
        os._exit(3)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # "hang"
        time.sleep(3600)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m schedlab.exec.rank JOB_DIR", file=sys.stderr)
        return 2
    env = read_env(os.environ)
    ensure_tuned()  # the allocator the CLI runs under, and the profile was calibrated under
    die_with_parent()
    if os.environ.get(CPUS_ENV):
        pin_process([int(c) for c in os.environ[CPUS_ENV].split(",")])
    elif hasattr(os, "sched_getaffinity"):
        pin_process(core_share(sorted(os.sched_getaffinity(0)), env.local_rank, env.local_world))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher asks where a hung rank is
    job_dir = Path(argv[0])

    progress = Progress(job_dir, env.rank)
    progress.mark(START)
    state: dict[str, int | None] = {"step": None}
    try:
        _run(job_dir, env, state, progress)
    except BaseException as e:  # every failure becomes the error file
        comm = isinstance(e, CommFailed) or type(e).__module__.startswith("torch.distributed") or (
            "gloo" in str(e).lower() or "connection" in str(e).lower()
        )
        kind = "comm" if comm else "op" if isinstance(e, OpFailed) else "setup"
        message = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
        write_error(job_dir, env.rank, kind, message, state["step"])
        sys.stderr.flush()
        os._exit(1)  # no exit handlers: a communication thread may still wait on a dead peer
    return 0


def _run(job_dir: Path, env: RankEnv, state: dict[str, int | None], progress: Progress) -> None:
    job = load_job(job_dir)
    if env.world != len(job.machine.processes):
        raise SystemExit(
            f"WORLD_SIZE is {env.world} but the job's machine {job.machine.name!r} has "
            f"{len(job.machine.processes)} processes; start that many ranks"
        )
    fault = _fault(os.environ.get(FAULT_ENV, ""), env.rank)
    timeout = timedelta(seconds=job.collective_timeout_s)
    try:
        dist.init_process_group("gloo", rank=env.rank, world_size=env.world, timeout=timeout)
    except Exception as e:
        raise CommFailed(f"rank {env.rank}: rendezvous failed: {e}") from e
    progress.mark(RENDEZVOUS)
    try:
        offset_ns, rtt_ns = clock_offset_ns()
    except Exception as e:
        raise CommFailed(f"rank {env.rank}: clock alignment with rank 0 failed: {e}") from e
    ex = RankExecutor(job.graph, job.resolved, job.machine, env.rank)
    inputs = load_inputs(job_dir, env.rank)
    missing = [v for v in ex.input_ids if v not in inputs]
    if missing:
        raise SystemExit(f"rank {env.rank}: the job has no tensors for graph inputs {missing[:5]}")
    ddp: DdpStepper | PipeliningStepper | None = None
    if job.ddp is not None and job.ddp.get("kind") == PIPELINING_KIND:
        ddp = PipeliningStepper(job.ddp, env.rank, env.world, timeout)
    elif job.ddp is not None:
        ddp = stepper_for_job(job.ddp, env.rank, env.world)
    ddp_steps: list[tuple[int, int]] = []
    ddp_params = None
    records = []
    outputs = None
    for s in range(job.warmup + job.steps):
        state["step"] = s
        progress.mark(s)
        if fault is not None and fault[1] == s:
            _inject(fault[0])
        if s == job.warmup:
            try:
                dist.barrier()  # the timed steps start together
            except Exception as e:
                raise CommFailed(f"rank {env.rank}: barrier before the timed steps failed: {e}") from e
        # the numerics check's step: random ops draw what eager PyTorch's do (`schedlab.rng`)
        with seeded_random() if s == 0 and job.want_outputs else contextlib.nullcontext():
            out, rec = ex.run_step(inputs, prepost_next=s + 1 < job.warmup + job.steps)
        if s == 0 and job.want_outputs:
            outputs = {v: t.clone() for v, t in out.items()}
        inputs = next_inputs(job.graph, inputs, out)
        if s >= job.warmup:
            records.append(rec)
        if ddp is not None:
            ex.finish()  # this step's sends are done before DDP's step starts (see exec/ddp.py)
            ddp_rec = ddp.timed_step(job.resolved.steps)
            if s == 0 and job.ddp is not None and job.ddp["want_params"]:
                ddp_params = {n: t.clone() for n, t in ddp.parameters().items()}
            if s >= job.warmup:
                ddp_steps.append(ddp_rec)
    state["step"] = None
    ex.finish()
    ex.close()  # its co-run workers end before the process does (exec.workers.WorkerPool.close)
    write_result(job_dir, RankResult(
        rank=env.rank,
        device=rank_device(job.resolved, job.machine, env.rank),
        ops=ex.ops,
        steps=tuple(ex.record(r) for r in records),
        clock_offset_ns=offset_ns,
        clock_rtt_ns=rtt_ns,
        outputs=outputs,
        ddp_steps=tuple(ddp_steps),
        ddp_params=ddp_params,
    ))
    progress.mark(DONE)
    if fault is not None and fault[1] == DONE:
        _inject(fault[0])  # tests: a rank stuck after writing its result
    try:
        dist.barrier()  # no rank leaves while a peer may still read from it
        dist.destroy_process_group()
    except Exception as e:
        raise CommFailed(f"rank {env.rank}: final barrier failed: {e}") from e


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
