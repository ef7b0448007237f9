"""Keep freed tensor memory inside the process (glibc malloc tuning).

A training step allocates and frees hundreds of MB of tensors. With glibc's defaults,
tensors above the mmap threshold are mapped fresh and unmapped on free, and each
worker thread's arena is trimmed back to the OS, so the next step faults every page in
again: measured here (2-core VM, default mlp and transformer), 10-20 thousand minor
faults per step and 15-31% of the CPU in the kernel zeroing pages, and co-running
workers (each a new arena) faulted 1.7x (mlp) to 6x (transformer) as often as one slot.
One arena, no mmap below 32 MiB and no trimming bring the kernel's share to 1.4-4% and
make steps repeatable.

The CLI calls `tune_malloc()` once at start-up, before any worker thread exists, so the
executor, the eager baseline and the calibration all run under the same allocator. The
executor itself (`exec.runner.Executor`) makes sure of it too (`ensure_tuned`), so a step
timed from Python, without the CLI, runs under the allocator the CLI's figures and the
Profile's calibration were measured under. Two scratch studies of the held-out noise
(2026-11-29) had run without it, so their figures were not the CLI protocol's; the same
recurrent coverage graph timed from Python ran its fastest two-slot step at 9.0 ms untuned
and 3.7 ms tuned, a minute apart.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's maximum on 64-bit
_TRIM_THRESHOLD_BYTES = 2**31 - 1


def tune_malloc() -> bool:
    """Apply the settings; False where the C library is not glibc (nothing changes)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES),
        )
    )


_tuned: bool | None = None  # what `tune_malloc` returned in this process; None before


def ensure_tuned() -> bool:
    """`tune_malloc()` once per process (finding the C library costs a subprocess); its result."""
    global _tuned
    if _tuned is None:
        _tuned = tune_malloc()
    return _tuned
