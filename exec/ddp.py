"""torch's own data parallelism, the side-by-side reference for schedlab's replicas.

`DdpStepper` runs the plain eager training step of a rank's part of the batch under
`torch.nn.parallel.DistributedDataParallel` (gloo on CPU), with the same model, initial
values, optimizer, bucket size and intra-op threads as the schedlab plan it is compared
with. It runs inside a rank whose default process group is initialised (the multi-process
executor's ranks, `schedlab bench --ddp`), so both are timed in the same processes,
interleaved step by step, and share the machine's noise alike.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch import nn

from schedlab.errors import SchedlabError
from schedlab.exec.check import eager_step
from schedlab.exec.threads import set_intra_op_threads
from schedlab.optim import OPTIMIZERS


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
    ) -> None:
        if not dist.is_initialized():
            raise SchedlabError("DdpStepper runs inside a rank: initialise the default process group first")
        if optimizer not in OPTIMIZERS:
            raise SchedlabError(f"unknown optimizer {optimizer!r}")
        self.threads = threads
        self.model = nn.parallel.DistributedDataParallel(copy.deepcopy(module), bucket_cap_mb=bucket_mb)
        self.inputs = inputs
        self.optimizer = OPTIMIZERS[optimizer].make_torch(list(self.model.parameters()), lr)

    def step(self) -> float:
        before = set_intra_op_threads(self.threads)
        try:
            t0 = time.perf_counter()
            eager_step(self.model, self.inputs, self.optimizer)
            return time.perf_counter() - t0
        finally:
            set_intra_op_threads(before)

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.module.named_parameters()}
