"""The real executor: runs a Graph under a Plan with torch kernels and records a Trace."""

from __future__ import annotations

from schedlab.exec.backend import ExecBackend
from schedlab.exec.check import NumericCheck, check_step, eager_reference, eager_step
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.runner import ExecResult, Executor, OpFailed, next_inputs, run_steps

__all__ = [
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
    "run_steps",
]
