"""torch's own data parallelism, the side-by-side reference for schedlab's replicas.

`DdpStepper` runs the plain eager training step of a rank's part of the batch under
`torch.nn.parallel.DistributedDataParallel` (gloo on CPU), with the same model, initial
values, optimizer, bucket size and intra-op threads as the schedlab plan it is compared
with. It runs inside a rank whose default process group is initialised (the multi-process
executor's ranks, `schedlab bench --ddp`), so both are timed in the same processes,
interleaved step by step, and share the machine's noise alike.

Process group: DDP runs on its own group of all ranks (`dist.new_group`, made by
`stepper_for_job` on every rank in the same place: right after the rank's executor made
its groups), not on the default group the schedlab step's all-reduces and point-to-point
transfers use. Each step still finishes all its collectives before the other starts (a
schedlab step waits on its all-reduces within the step; the rank drains the step's sends
before the DDP step; DDP waits on its bucket all-reduces at the end of backward), so the
two never overlap in time; the separate group makes that independence structural too:
DDP's collectives (its constructor's broadcast of the module's state, its bucket
all-reduces) can never be matched against a schedlab transfer, whatever either one issues.
Both groups are gloo over the same loopback transport, so neither side is favoured.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from schedlab.data_parallel import split_workload
from schedlab.errors import SchedlabError
from schedlab.exec.check import eager_step
from schedlab.exec.threads import set_intra_op_threads
from schedlab.optim import OPTIMIZERS
from schedlab.workloads import load_workload


class DdpStepper:
    """One rank of a DDP training loop: `step()` runs and times one step (seconds)."""

    def __init__(
        self,
        module: nn.Module,
        inputs: tuple[torch.Tensor, ...],
        *,
        optimizer: str,
        lr: float,
        bucket_mb: float,
        threads: int,
        process_group: object | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise SchedlabError("DdpStepper runs inside a rank: initialise the default process group first")
        if optimizer not in OPTIMIZERS:
            raise SchedlabError(f"unknown optimizer {optimizer!r}")
        self.threads = threads
        self.model = nn.parallel.DistributedDataParallel(
            copy.deepcopy(module), bucket_cap_mb=bucket_mb, process_group=process_group  # type: ignore[arg-type]
        )
        self.inputs = inputs
        self.optimizer = OPTIMIZERS[optimizer].make_torch(list(self.model.parameters()), lr)

    def step(self) -> float:
        """Run one step; its wall time in seconds."""
        return self.timed_step()[1] / 1e9

    def timed_step(self, steps: int = 1) -> tuple[int, int]:
        """Run `steps` steps back to back (as many as one run of a steady-state schedlab
        sequence); (start, wall) in ns on `time.perf_counter_ns`, as the executor's records."""
        before = set_intra_op_threads(self.threads)
        try:
            t0 = time.perf_counter_ns()
            for _ in range(steps):
                eager_step(self.model, self.inputs, self.optimizer)
            return t0, time.perf_counter_ns() - t0
        finally:
            set_intra_op_threads(before)

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.module.named_parameters()}


def stepper_for_job(ddp: dict[str, Any], rank: int, world: int) -> DdpStepper:
    """Rank `rank`'s DDP stepper for a job's `ddp` spec (`schedlab.exec.job.check_ddp_spec`):
    its replica's part of the batch (`split_workload`), the workload's initial values (the
    same seed as the captured step), on a new group of all ranks (see the module doc).
    Every rank must call it at the same point of its collectives."""
    replicas = int(ddp["replicas"])
    if replicas != world:
        raise SchedlabError(
            f"the DDP side-by-side runs one replica per rank, but the plan has {replicas} replicas on {world} ranks; "
            "use a data-parallel plan whose replicas each run on one device"
        )
    workload = load_workload(str(ddp["spec"]), str(ddp["size"]), seed=int(ddp["seed"]))
    part = split_workload(workload, replicas)[rank]
    group = dist.new_group(list(range(world)))
    return DdpStepper(
        part.module, part.inputs, optimizer=str(ddp["optimizer"]), lr=float(ddp["lr"]),
        bucket_mb=float(ddp["bucket_mb"]), threads=int(ddp["threads"]), process_group=group,
    )
