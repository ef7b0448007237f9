"""The baselines every search and validation is measured against.

- ``pytorch-default``: what a PyTorch user gets: one op at a time (one co-run slot), every
  core as intra-op threads, program order.
- ``tensorflow-recommended``: TensorFlow's performance guide for CPUs: intra-op threads =
  physical cores, inter-op threads = sockets. The inter-op pool becomes co-run slots; the
  order stays program order (TensorFlow's executor runs ready ops as they come).

Physical cores and sockets are read from ``/proc/cpuinfo`` ("cpu cores" per "physical id")
and capped by the cores this process may use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from schedlab.machine import Machine
from schedlab.plan import Plan

PYTORCH_DEFAULT = "pytorch-default"
TENSORFLOW_RECOMMENDED = "tensorflow-recommended"
BASELINE_NAMES = (PYTORCH_DEFAULT, TENSORFLOW_RECOMMENDED)


def cpu_topology(cpuinfo_text: str | None = None) -> tuple[int, int]:
    """(physical cores, sockets) from /proc/cpuinfo text (default: this host's); (0, 0) if unknown."""
    if cpuinfo_text is None:
        try:
            cpuinfo_text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return 0, 0
    cores_of: dict[str, int] = {}
    phys, cores = "0", 0
    for block in cpuinfo_text.split("\n\n"):
        phys, cores = "0", 0
        for line in block.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                phys = value.strip()
            elif key == "cpu cores":
                try:
                    cores = int(value.strip())
                except ValueError:
                    cores = 0
        if cores:
            cores_of[phys] = cores
    return sum(cores_of.values()), len(cores_of)


def pytorch_default(machine: Machine) -> Plan:
    return Plan(slots=1, threads=None, order="topo", name=PYTORCH_DEFAULT)


def tensorflow_recommended(machine: Machine, cpuinfo_text: str | None = None) -> Plan:
    usable = machine.default_device.cores
    physical, sockets = cpu_topology(cpuinfo_text)
    if physical <= 0:  # no /proc/cpuinfo: take the machine description at its word
        physical, sockets = usable, int(machine.host.get("sockets", 1) or 1)
    threads = max(1, min(physical, usable))
    slots = max(1, min(sockets, usable))
    return Plan(slots=slots, threads=threads, order="topo", name=TENSORFLOW_RECOMMENDED)


BASELINES: dict[str, Callable[[Machine], Plan]] = {
    PYTORCH_DEFAULT: pytorch_default,
    TENSORFLOW_RECOMMENDED: tensorflow_recommended,
}


def baseline_plans(machine: Machine) -> dict[str, Plan]:
    """Every baseline's plan on `machine`, by name."""
    return {name: make(machine) for name, make in BASELINES.items()}
