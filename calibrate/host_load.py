"""How much of the CPU other processes used while we measured, and how much the
hypervisor took (quality flags).

Microbenchmarks on a shared machine are only as good as the machine is idle: on two
cores, one busy neighbour makes every two-thread timing meaningless. We read the
system-wide busy time from /proc/stat and subtract our own process time, and that of
the child processes we ran and waited for (a TensorFlow worker, ranks).

On a virtual machine the host may also run something else on our virtual CPUs' physical
cores: /proc/stat's steal time, which no process here used. It is reported on its own
(`steal_frac`) and left out of the other processes' share. Measured on the 2-core
development VM (2026-12-02): none while idle, 18% of both CPUs' time over five seconds
while the test suite kept both busy. That morning, before steal was told apart, 7 of 176
held-out plans had been flagged as measured beside other processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuSnapshot:
    busy_s: float  # all processes, all cores
    total_s: float  # all cores, busy or idle
    own_s: float  # this process and its waited-for children (user + system)
    steal_s: float = 0.0  # all cores: time the hypervisor ran something else (inside busy_s)


def snapshot() -> CpuSnapshot | None:
    """A reading of the system and process CPU counters; None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    total = sum(ticks[:8])  # guest time is already inside user
    steal = ticks[7] if len(ticks) > 7 else 0
    t = os.times()
    return CpuSnapshot(busy_s=(total - idle) / hz, total_s=total / hz,
                       own_s=t.user + t.system + t.children_user + t.children_system, steal_s=steal / hz)


def foreign_cpu_frac(start: CpuSnapshot | None, end: CpuSnapshot | None) -> float | None:
    """Share of all CPU time between two snapshots used by other processes (0..1); the
    hypervisor's steal is not theirs (`steal_frac`)."""
    return _share(start, end, lambda s: s.busy_s - s.steal_s - s.own_s)


def steal_frac(start: CpuSnapshot | None, end: CpuSnapshot | None) -> float | None:
    """Share of all CPU time between two snapshots that the hypervisor gave to something
    else (/proc/stat's steal; 0 on bare metal), 0..1."""
    return _share(start, end, lambda s: s.steal_s)


def _share(start: CpuSnapshot | None, end: CpuSnapshot | None, part: Callable[[CpuSnapshot], float]) -> float | None:
    """How much `part` of the counters grew between two snapshots, as a share (0..1) of all
    CPU time between them; None without both or with no time between."""
    if start is None or end is None:
        return None
    total = end.total_s - start.total_s
    if total <= 0:
        return None
    return min(1.0, max(0.0, (part(end) - part(start)) / total))
