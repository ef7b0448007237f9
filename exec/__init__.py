"""The real executor: runs a Graph under a Plan with torch kernels and records a Trace.

One device: in this process (`Executor`, `run_steps`). Several devices: one process per
rank, started and merged by `run_ranks` (`launch.py`; the rank entry point is
``python -m schedlab.exec.rank JOB_DIR``, which torchrun can start too).
"""

from __future__ import annotations

from schedlab.exec.backend import DistBackend, ExecBackend
from schedlab.exec.check import NumericCheck, check_step, eager_reference, eager_step
from schedlab.exec.launch import DEFAULT_TIMEOUT_S, RANK_WARMUP, DistResult, run_ranks, warmup_for
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.runner import ExecResult, Executor, OpFailed, next_inputs, run_steps

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RANK_WARMUP",
    "DistBackend",
    "DistResult",
    "ExecBackend",
    "ExecResult",
    "Executor",
    "NumericCheck",
    "OpFailed",
    "Program",
    "check_step",
    "compile_graph",
    "eager_reference",
    "eager_step",
    "next_inputs",
    "run_ranks",
    "run_steps",
    "warmup_for",
]
