"""What a rank process reads from its environment, and how it takes its share of the cores.

Kept apart from `rank.py` (the entry point) so the launcher can use it without importing
the module that ``python -m schedlab.exec.rank`` runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass

# Environment variables a rank reads besides torchrun's (the launcher sets them).
CPUS_ENV = "SCHEDLAB_CPUS"  # cores to pin to, "0,1"
PARENT_ENV = "SCHEDLAB_PARENT_PID"  # the launcher: die with it
FAULT_ENV = "SCHEDLAB_TEST_FAULT"  # test hook "RANK:exit|kill|hang:STEP": fail at the start of that step (-1: once done)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int


def read_env(environ: dict[str, str] | os._Environ[str]) -> RankEnv:
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in environ]
    if missing:
        raise SystemExit(
            f"schedlab.exec.rank: {', '.join(missing)} not set; start ranks with torchrun or schedlab.exec.launch"
        )
    rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    return RankEnv(
        rank=rank,
        world=world,
        local_rank=int(environ.get("LOCAL_RANK", rank)),
        local_world=int(environ.get("LOCAL_WORLD_SIZE", world)),
    )


def core_share(cores: list[int], index: int, parts: int) -> list[int]:
    """The `index`-th of `parts` equal, contiguous shares of `cores` (all of them when
    there are fewer cores than parts: ranks then share)."""
    cores = sorted(cores)
    if parts <= 1 or len(cores) < parts:
        return cores
    k = len(cores) // parts
    return cores[index * k:(index + 1) * k]


def pin_process(cpus: list[int]) -> None:
    """Pin every thread of this process (those to come inherit it) to `cpus`."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that has exited since
            os.sched_setaffinity(int(tid), cpus)


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies: no orphan if the launcher is killed.
    (Linux means the parent *thread*: a launcher must start workers from a thread that
    outlives them, as `launch.run_ranks` does, for it waits for them on the same thread.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    parent = os.environ.get(PARENT_ENV)
    if parent is not None and os.getppid() != int(parent):  # the parent died before prctl
        os._exit(1)
