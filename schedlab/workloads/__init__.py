"""Workloads: the models whose training step schedlab schedules.

`load_workload("transformer", size="tiny")` builds a built-in model; a spec of the form
``package.module:function`` calls your own factory, which returns ``(module, inputs)``.
Either way ``workload.module(*workload.inputs)`` is a scalar loss tensor.
"""

from __future__ import annotations

from schedlab.workloads.loader import BUILTIN_WORKLOADS, SIZES, Workload, load_workload, short_name

__all__ = ["BUILTIN_WORKLOADS", "SIZES", "Workload", "load_workload", "short_name"]
