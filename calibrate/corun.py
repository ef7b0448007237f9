"""Slowdown of an op when another op co-runs on the other cores.

Two Python threads, each with one intra-op thread (set per thread, see threads.py), call
the same op in a loop; each call's time is compared with the same op alone. Three ops:

- memory-bound: ``add`` of two 8M-element tensors (96 MB of traffic per call, far beyond
  the caches): the slowdown of shared memory bandwidth.
- compute-bound: a 256x256 ``mm`` (fits in L2): the slowdown of shared cores (turbo,
  SMT siblings, neighbours).
- oversubscribed: the same memory- and compute-bound ops, but each thread with as many
  intra-op threads as the machine has cores, so twice as many OpenMP threads as cores.
  Processor sharing alone predicts twice the time alone; what is measured beyond that
  (threads descheduled inside a parallel region while their team waits at a barrier)
  is the oversubscription factor. The ``add`` writes into an output its thread keeps
  (`AddInto`), so that the allocator's page faults stay out of it. It is timed again on
  an ``add`` of 16x the elements: a team descheduled inside its region costs its op a
  bounded time, so a long kernel pays a smaller share of the factor. The two sizes give
  the fade, ``factor - 1 = A * T / (T + kernel)`` (`oversub_fade`;
  `CorunFigures.oversub_share`). On the 2-core Intel Xeon VM
  (2026-12-06, a scratch probe: two threads each calling the op at two intra-op threads,
  against the op alone at two) a 1 MiB ``add`` paid 2.24x and a 16 MiB one 1.14x, and the
  big kernels of the held-out models that co-run two branches paid none: a ``Conv1d``
  0.90x, an LSTM layer 0.96x, ``mm`` of 512 1.00x. Charged the whole factor, those models'
  two slots of two threads were predicted 33-49% slow (conv1d-two-branch,
  bilstm-classifier).
- negligible: ``add`` of 1-element tensors: the interpreter lock. Each call's Python part
  holds it, so two threads of tiny ops take turns; this is what the simulator's dispatch
  resource models, reported here to check it, not used by `corun_slowdown`.
- the serial window (`serial_window`): ``add`` of growing tensors. ATen releases the
  interpreter lock around the kernel, but a waiting thread takes several microseconds to
  wake up and take it: two threads of short ops take turns on the whole call (measured
  here: a 2 us kernel, 4x the time per call with two threads), long ones overlap. The
  kernel time of the largest size that two threads still run in turn (together/alone
  >= `SERIAL_RATIO`) is the window: the Profile charges that much of every kernel under
  the lock when several slots run (`Profile.serial_us`).

Alone and together runs alternate a few times and the fastest of each is taken, so a
burst of load from another process does not land on one side only. A neighbour that
keeps a core busy throughout cannot be measured away: the share of the CPU other
processes used while measuring is recorded with the figures, and `measure_corun_quiet`
measures them again while that share is above `QUIET_CPU_FRAC`, keeping the quietest
reading (see there for what one busy reading did).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from schedlab.calibrate.host_load import foreign_cpu_frac, snapshot
from schedlab.exec.threads import set_intra_op_threads


@dataclass(frozen=True)
class CorunFigures:
    mem_slowdown: float  # factor (>= 1 in theory) for a memory-bound op next to another
    compute_slowdown: float  # factor for a compute-bound op next to another
    gil_slowdown: float  # per-call factor for negligible ops from two Python threads
    measured: bool  # False on a one-core machine: nothing to co-run with
    foreign_cpu_frac: float | None = None  # other processes' CPU share while measuring
    oversub_mem: float = 1.0  # extra factor, beyond processor sharing, when cores are oversubscribed
    oversub_compute: float = 1.0
    serial_window_us: float = 0.0  # kernel time two workers cannot overlap (see `serial_window`)
    # intra-op threads -> wait (us) of each op of the co-run executor beyond its Python
    # (waking an idle worker, handing the lock over), fitted on real graphs (`corun_fit`)
    latency_us: dict[int, float] = field(default_factory=dict)
    # intra-op threads (> 1) -> what each op of a one-slot step at that many threads pays
    # beyond its kernel microbenchmark (its team, between the interpreter's ops; which part
    # of the team's work was not isolated), fitted on real graphs the same way (`corun_fit`)
    team_latency_us: dict[int, float] = field(default_factory=dict)
    # whether `team_latency_us` is the wait of an op in its class's parallel regime, charged
    # times its parallel share (`Profile.team_wait_us`; fitted so since 2026-12-03): an op below
    # ATen's grain size never forks its team. A profile from before charged it to every op
    team_share: bool = False
    # how the oversubscription factor fades with an op's kernel time (`oversub_share`): the
    # two-team penalty of a region is bounded, so a long kernel pays a smaller share of it.
    # The factors were timed on an `add` whose call took `oversub_ref_us` at all the cores;
    # None: no fade (a profile calibrated before 2026-12-06, or two sizes that showed none)
    oversub_decay_us: float | None = None
    oversub_ref_us: float = 0.0
    # the long `add` the fade was read from: its call at all the cores and its factor (0 us:
    # a profile calibrated before 2026-12-07 kept neither), so a profile says why its fade
    # is what it is
    oversub_long_us: float = 0.0
    oversub_long: float = 1.0
    # whether `latency_us` was fitted with views paying it too, as every op of a co-run plan
    # does (`Profile.kernel_us`; calibrated since 2026-11-28); a profile from before fitted it
    # on the other ops alone, and its views keep paying nothing
    views_wait: bool = False

    def latency(self, threads: int) -> float:
        """`latency_us` at `threads` (the nearest measured count; 0 when none was)."""
        return _nearest(self.latency_us, threads)

    def oversub_share(self, kernel_us: Any) -> Any:
        """The share (0..1] of the oversubscription factors' excess that an op whose kernel
        takes `kernel_us` at all the cores pays: ``(decay + ref) / (decay + kernel_us)``
        (`oversub_fade`), at most 1; 1 without a fade. A float or an array of them alike
        (`Profile.corun_slowdown` and its column ask the same arithmetic)."""
        t = self.oversub_decay_us
        if t is None:
            return 1.0
        return np.minimum(1.0, (t + self.oversub_ref_us) / (t + np.maximum(0.0, kernel_us)))

    def team_latency(self, threads: int) -> float:
        """`team_latency_us` at `threads` (the nearest fitted count); 0 at one thread, or
        when none was fitted (a profile calibrated before it was)."""
        return _nearest(self.team_latency_us, threads) if threads > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": "linear_busy_fraction",
            "mem_slowdown": round(self.mem_slowdown, 4),
            "compute_slowdown": round(self.compute_slowdown, 4),
            "gil_slowdown": round(self.gil_slowdown, 4),
            "measured": self.measured,
            "foreign_cpu_frac": None if self.foreign_cpu_frac is None else round(self.foreign_cpu_frac, 3),
            "oversub_mem": round(self.oversub_mem, 4),
            "oversub_compute": round(self.oversub_compute, 4),
            "serial_window_us": round(self.serial_window_us, 4),
            "oversub_decay_us": None if self.oversub_decay_us is None else round(self.oversub_decay_us, 3),
            "oversub_ref_us": round(self.oversub_ref_us, 3),
            "oversub_long_us": round(self.oversub_long_us, 3),
            "oversub_long": round(self.oversub_long, 4),
            "latency_us": {str(k): round(v, 4) for k, v in sorted(self.latency_us.items())},
            "team_latency_us": {str(k): round(v, 4) for k, v in sorted(self.team_latency_us.items())},
            "views_wait": self.views_wait,
            "team_share": self.team_share,
        }


def _nearest(table: dict[int, float], threads: int) -> float:
    """`table` at `threads`, else at the nearest count in it (the lower on a tie); 0 when empty."""
    at = table.get(threads)
    if at is not None:
        return at
    if not table:
        return 0.0
    return table[min(table, key=lambda k: (abs(k - threads), k))]


def _loop(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    duration_s: float,
    barrier: threading.Barrier | None,
    intra: int = 1,
) -> float:
    """Time per call (us) of `fn` called back to back for about `duration_s` in this thread.

    Elapsed time over calls, not the median call: a thread waiting for the interpreter
    lock between calls must count, or the lock's cost would not show.
    """
    set_intra_op_threads(intra)
    fn(*args)
    if barrier is not None:
        barrier.wait()
    n = 0
    start = time.perf_counter()
    end = start + duration_s
    while True:
        fn(*args)
        n += 1
        now = time.perf_counter()
        if now >= end and n >= 3:
            return (now - start) / n * 1e6


def _in_threads(
    fn: Callable[..., Any], args: tuple[Any, ...], n_threads: int, duration_s: float, intra: int = 1
) -> float:
    results: list[float] = [0.0] * n_threads
    barrier = threading.Barrier(n_threads)

    def work(i: int) -> None:
        results[i] = _loop(fn, args, duration_s, barrier, intra)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.mean(results)


def slowdown(
    fn: Callable[..., Any], args: tuple[Any, ...], duration_s: float, rounds: int = 3, intra: int = 1
) -> float:
    """Per-call time with two threads calling `fn` / with one: best of `rounds` each."""
    alone, together = alone_and_together_us(fn, args, duration_s, rounds, intra)
    return together / alone


def alone_and_together_us(
    fn: Callable[..., Any], args: tuple[Any, ...], duration_s: float, rounds: int = 3, intra: int = 1
) -> tuple[float, float]:
    """Per-call time (us) of `fn` from one thread and from two at once, `intra` intra-op
    threads each: the best of `rounds` each, alone and together alternating."""
    alone, together = [], []
    for _ in range(rounds):
        alone.append(_in_threads(fn, args, 1, duration_s, intra))
        together.append(_in_threads(fn, args, 2, duration_s, intra))
    return min(alone), min(together)


SERIAL_RATIO = 1.5  # together / alone per call at or above which two threads take turns
SERIAL_SIZES = (1, 1 << 12, 1 << 14, 1 << 16, 1 << 18)  # elements of the add


def serial_window(duration_s: float, rounds: int) -> float:
    """The longest kernel (us beyond a 1-element call) two threads still run in turn."""
    aten = torch.ops.aten
    window, floor = 0.0, None
    for n in SERIAL_SIZES:
        args = (torch.randn(n), torch.randn(n))
        alone = min(_in_threads(aten.add.Tensor, args, 1, duration_s) for _ in range(rounds))
        together = min(_in_threads(aten.add.Tensor, args, 2, duration_s) for _ in range(rounds))
        floor = alone if floor is None else floor
        if together < SERIAL_RATIO * alone:
            break
        window = max(window, alone - floor)
    return window


def oversub_fade(short: tuple[float, float], long: tuple[float, float]) -> float | None:
    """The decay time T (us) of ``factor - 1 = A * T / (T + kernel_us)`` through two measured
    (kernel us, factor) of the same op at two sizes, `short` and `long`; None where they show
    no fade (the long call's excess not below the short one's); 0 where the excess falls as
    fast as 1 / kernel time or faster (the long call paid nothing, or less than the short
    one's excess times their time ratio: a quick calibration of 2026-12-07 read a 28 us
    call's 2.42x and left the fade out, so every long kernel of a co-run pair paid the full
    factor and held-out bilstm-classifier and conv1d-two-branch were predicted 55-57% slow
    on average at two slots of two threads; the next calibration read a fade of 0)."""
    (d1, f1), (d2, f2) = short, long
    if not (d2 > d1 > 0.0) or f1 <= 1.0:
        return None
    if f2 <= 1.0:
        return 0.0  # the long call paid nothing: the excess falls as 1 / kernel time
    r = (f1 - 1.0) / (f2 - 1.0)
    if r <= 1.0:
        return None
    if d2 <= r * d1:
        return 0.0
    return (d2 - r * d1) / (r - 1.0)


class AddInto:
    """``aten.add.out`` into an output tensor that each calling thread allocates once and
    keeps: the oversubscription probes' call. A fresh output per call put the allocator's
    page faults in the factor: on the 2-core Intel Xeon VM (2026-12-07) the 16 MiB `add`
    took 240-300 minor faults a call with a fresh output and none into a kept one; in five
    fresh processes, three rounds each, it read x1.12-1.33 beyond processor sharing with a
    fresh output and x0.93-0.99 into a kept one (x1.08 and x1.66 in two quick calibrations
    an hour apart before; x1.00 in each of the three after), and each call alone ran 1-27% slower.
    The two teams' own cost is what the factor is for. The 1 MiB call read x2.2-3.0 and
    x1.9-2.8."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = getattr(self._local, "out", None)
        if out is None or out.shape != a.shape:
            out = self._local.out = torch.empty_like(a)
        return torch.ops.aten.add.out(a, b, out=out)


def _oversub_and_alone(fn: Callable[..., Any], args: tuple[Any, ...], duration_s: float, rounds: int,
                       cores: int) -> tuple[float, float]:
    """(factor beyond processor sharing, time per call alone) of two teams of `cores` threads."""
    alone, together = alone_and_together_us(fn, args, duration_s, rounds, intra=cores)
    return max(1.0, together / alone / 2.0), alone


def measure_corun(cores: int, duration_s: float = 0.25, rounds: int = 3) -> CorunFigures:
    """Co-run slowdowns on a machine with `cores` cores (1.0 each where cores < 2)."""
    if cores < 2:
        return CorunFigures(1.0, 1.0, 1.0, measured=False)
    start = snapshot()
    aten = torch.ops.aten
    big = (torch.randn(1 << 23), torch.randn(1 << 23))
    mat = (torch.randn(256, 256), torch.randn(256, 256))
    tiny = (torch.ones(1), torch.ones(1))
    mid = (torch.randn(1 << 18), torch.randn(1 << 18))  # 1 MiB each: short parallel regions
    long = (torch.randn(1 << 22), torch.randn(1 << 22))  # 16 MiB each: the same op, 16x the work
    # The one-thread pairs before any team of `cores` threads: timed after the
    # oversubscribed ones (as from 2026-12-06 to 12-07), the 96 MB add beside itself read
    # 1.60-2.36 in three quick calibrations, where it had read 1.08-1.12 in five before. On
    # the 2-core Intel Xeon VM (the dispatch probe, then this function): 2.50 and 1.56 with
    # the teams first, 1.11-1.17 with the pairs first; three quick calibrations after the
    # fix read 1.10-1.21. The big ops of the held-out models measure 1.03-1.04x co-run in a step.
    mem = slowdown(aten.add.Tensor, big, duration_s, rounds)
    compute = slowdown(aten.mm.default, mat, duration_s, rounds)
    gil = slowdown(aten.add.Tensor, tiny, duration_s, rounds)
    oversub_mem, mid_us = _oversub_and_alone(AddInto(), mid, duration_s, rounds, cores)
    long_factor, long_us = _oversub_and_alone(AddInto(), long, duration_s, rounds, cores)
    return CorunFigures(
        mem_slowdown=mem,
        compute_slowdown=compute,
        gil_slowdown=gil,
        measured=True,
        # Two teams of `cores` threads on `cores` cores: processor sharing accounts for 2x.
        oversub_mem=oversub_mem,
        oversub_decay_us=oversub_fade((mid_us, oversub_mem), (long_us, long_factor)),
        oversub_ref_us=mid_us,
        oversub_long_us=long_us,
        oversub_long=long_factor,
        oversub_compute=max(1.0, slowdown(aten.mm.default, mat, duration_s, rounds, intra=cores) / 2.0),
        serial_window_us=serial_window(duration_s / 4, rounds),
        foreign_cpu_frac=foreign_cpu_frac(start, snapshot()),
    )


QUIET_CPU_FRAC = 0.03  # co-run figures read while other processes used more of the CPU than this are read again
CORUN_TRIES = 3  # readings at most, the first included


def measure_corun_quiet(
    cores: int, duration_s: float = 0.25, rounds: int = 3, tries: int = CORUN_TRIES
) -> tuple[CorunFigures, list[float | None]]:
    """`measure_corun` until other processes used at most `QUIET_CPU_FRAC` of the CPU
    while it measured, at most `tries` times: the quietest reading, and every reading's
    foreign share in order (None where /proc/stat cannot be read: taken as it is).

    Why: a quick calibration on the 2-core AMD EPYC VM (2026-12-08) read the co-run
    figures while other processes used 9.2% of the CPU (two short Python commands that
    started torch). They read the oversubscription factors at 1.40 (mm) and 1.51 (16 MiB
    add) against 1.05-1.19 and 1.20-1.22 in two quiet calibrations of that day and the
    one before, the tiny ops' slowdown at 3.66 against 2.69-2.85 and the serial window at
    5.5 us against 0.33-0.34; that profile predicted held-out models' two slots a mean
    +7.8% (one thread) and +11.4% (two) slow, where a quiet one of the same code had
    +0.7% and -0.6%."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    readings: list[CorunFigures] = []
    for _ in range(tries):
        figs = measure_corun(cores, duration_s, rounds)
        readings.append(figs)
        if not figs.measured or figs.foreign_cpu_frac is None or figs.foreign_cpu_frac <= QUIET_CPU_FRAC:
            break
    quietest = min(readings, key=lambda f: 0.0 if f.foreign_cpu_frac is None else f.foreign_cpu_frac)
    return quietest, [f.foreign_cpu_frac for f in readings]
