"""The baselines every search and validation is measured against.

- ``pytorch-default``: what a PyTorch user gets: one op at a time (one co-run slot), every
  core as intra-op threads, program order.
- ``tensorflow-recommended``: TensorFlow's performance guide for CPUs: intra-op threads =
  physical cores, inter-op threads = sockets. The inter-op pool becomes co-run slots; the
  order stays program order (TensorFlow's executor runs ready ops as they come).

Physical cores and sockets come from the Machine description (`detect_host` reads them from
``/proc/cpuinfo``), capped by the cores of its device.
"""

from __future__ import annotations

from collections.abc import Callable

from schedlab.machine import Machine, cpu_topology
from schedlab.plan import Plan
from schedlab.tf.plan_map import recommended_threads

PYTORCH_DEFAULT = "pytorch-default"
TENSORFLOW_RECOMMENDED = "tensorflow-recommended"
BASELINE_NAMES = (PYTORCH_DEFAULT, TENSORFLOW_RECOMMENDED)
__all__ = ["BASELINES", "BASELINE_NAMES", "baseline_plans", "cpu_topology", "pytorch_default", "tensorflow_recommended"]


def pytorch_default(machine: Machine) -> Plan:
    return Plan(slots=1, threads=None, order="topo", name=PYTORCH_DEFAULT)


def tensorflow_recommended(machine: Machine, cpuinfo_text: str | None = None) -> Plan:
    """`cpuinfo_text`, if given, describes the CPU instead of `machine.host` (tests)."""
    usable = machine.default_device.cores
    physical, sockets = cpu_topology(cpuinfo_text) if cpuinfo_text is not None else (0, 0)
    if physical <= 0:
        physical = int(machine.host.get("physical_cores", usable) or usable)
        sockets = int(machine.host.get("sockets", 1) or 1)
    tf = recommended_threads(min(physical, usable), min(sockets, usable))  # TF's rule, on the cores usable here
    return Plan(slots=tf.inter_op, threads=tf.intra_op, order="topo", name=TENSORFLOW_RECOMMENDED)


BASELINES: dict[str, Callable[[Machine], Plan]] = {
    PYTORCH_DEFAULT: pytorch_default,
    TENSORFLOW_RECOMMENDED: tensorflow_recommended,
}


def baseline_plans(machine: Machine) -> dict[str, Plan]:
    """Every baseline's plan on `machine`, by name."""
    return {name: make(machine) for name, make in BASELINES.items()}
