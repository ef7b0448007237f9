"""How long a blocked worker of the co-run executor takes to run again, by how long it slept.

The executor's workers share a ready heap under one condition variable
(`exec.workers.ReadyLoop`): a worker with nothing to run waits on it, and a worker that
makes more ops ready than it can take notifies one; a worker also blocks whenever it asks
for the interpreter lock while another holds it. A blocked thread sleeps in the kernel,
and once released it runs again only when the operating system has woken it. This module
measures that wake, a condition of the host the co-run figures depend on: `schedlab
calibrate` records it in the Profile's meta (`thread_wake`) with the host's CPU idle
settings (`idle_state`), and prints it. The simulator does not charge it (yet): see
"Tried and left out" in the README's held-out section for the two ways it was tried.

The benchmark: a thread waits on a `threading.Condition` as the executor's workers do;
the notifying thread keeps its own core busy in ATen kernels (which release the
interpreter lock) before and after each notify, as a worker running ops does, so the
waker takes the lock as soon as it is awake. Each wake is timed from `notify()` to the
woken thread running Python again, against how long it had been blocked; the blocked
times are spread over `GAPS_US`, and each level's median wake and median blocked time is
one point of the curve.

Measured on the 2-core development VM (AMD EPYC, KVM, the guest's `haltpoll` idle driver
with `guest_halt_poll_ns` 0, so an idle virtual CPU halts at once; 2026-12-01, two runs
back to back): 22-25 µs after about 20 µs blocked, 25-31 after 100, 37-42 after 330, 51-56
after 1 ms and 74-81 after 3 ms. With `guest_halt_poll_ns` set to 200000 for a probe (then
set back; an earlier version of this benchmark, whose notifier ran a 96x96 mm, so no
blocked time under 50 µs): 9.5 µs after 52 µs blocked, 23 after 124, 49 after 333, 74 after
1 ms. Against
it the small dev models' two-slot steps of one thread measured 16-23 µs an op more than
their one-slot steps (`schedlab fidelity --dev`, same day).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.exec.threads import set_intra_op_threads

GAPS_US = (0.0, 80.0, 300.0, 1000.0, 3000.0)  # how long the notifier works before each notify
ROUNDS = 200  # wakes per level
BUSY_N = 16  # the notifier's kernel: a 16x16 mm on one thread, about a microsecond
IDLE_FILES = {  # the host's CPU idle settings that decide how deep an idle CPU sleeps (Linux)
    "cpuidle_driver": "/sys/devices/system/cpu/cpuidle/current_driver",
    "guest_halt_poll_ns": "/sys/module/haltpoll/parameters/guest_halt_poll_ns",
}


@dataclass(frozen=True)
class WakeLevel:
    """One level of the benchmark: median blocked time and wake (µs), and the wake's spread."""

    gap_us: float
    blocked_us: float
    wake_us: float
    p10_us: float
    p90_us: float
    rounds: int

    def to_json(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {k: round(float(v), 3) for k, v in self.__dict__.items()}
        out["rounds"] = self.rounds
        return out


def measure_thread_wake(
    gaps_us: Sequence[float] | None = None, rounds: int | None = None, timeout_s: float = 10.0
) -> list[WakeLevel]:
    """Each level of the benchmark (default: `GAPS_US`, `ROUNDS` wakes each), by ascending gap."""
    gaps_us = GAPS_US if gaps_us is None else gaps_us
    rounds = ROUNDS if rounds is None else rounds
    if rounds < 1 or not gaps_us:
        raise ValueError(f"need at least one level and one round, not {len(gaps_us)} and {rounds}")
    return [measure_level(g, rounds, timeout_s) for g in sorted(gaps_us)]


def idle_state() -> dict[str, str]:
    """The host's CPU idle settings that exist here (`IDLE_FILES`), as read."""
    out = {}
    for key, path in IDLE_FILES.items():
        try:
            with open(path) as f:
                out[key] = f.read().strip()
        except OSError:
            continue
    return out


def describe(levels: Sequence[WakeLevel], idle: dict[str, str]) -> str:
    """One line for `schedlab calibrate`'s summary."""
    points = ", ".join(f"{lv.wake_us:.0f} us after {_span(lv.blocked_us)}" for lv in levels)
    settings = ", ".join(f"{k} {v}" for k, v in idle.items())
    return f"thread wake (a blocked co-run worker, median): {points}" + (f" ({settings})" if settings else "")


def _span(us: float) -> str:
    return f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} us"


def measure_level(gap_us: float, rounds: int = ROUNDS, timeout_s: float = 10.0) -> WakeLevel:
    """Wake a waiting thread `rounds` times, each after the notifier worked about `gap_us`
    in ATen kernels; raises if a notified thread does not run within `timeout_s`."""
    cond = threading.Condition()
    posted: list[int] = []  # perf_counter_ns of each notify, appended under the condition's lock
    woke: list[int] = []  # when the waiter ran again after each notify
    stop = threading.Event()

    def waiter() -> None:
        set_intra_op_threads(1)
        seen = 0
        with cond:
            woke.append(time.perf_counter_ns())  # blocked from here before the first notify
            while not stop.is_set():
                while len(posted) == seen and not stop.is_set():
                    cond.wait(timeout_s)
                if len(posted) > seen:
                    woke.append(time.perf_counter_ns())
                    seen = len(posted)

    a, b = torch.randn(BUSY_N, BUSY_N), torch.randn(BUSY_N, BUSY_N)
    mm: Callable[..., Any] = torch.ops.aten.mm.default
    before = set_intra_op_threads(1)
    thread = threading.Thread(target=waiter, name="schedlab-wake-waiter", daemon=True)
    thread.start()
    try:
        _until(lambda: len(woke) >= 1, mm, a, b, timeout_s, "the waiting thread did not start")
        for _ in range(rounds):
            _busy(mm, a, b, gap_us)  # the waiter sleeps while this core works
            with cond:
                posted.append(time.perf_counter_ns())
                cond.notify()
            n = len(posted)
            _until(lambda n=n: len(woke) > n, mm, a, b, timeout_s, "a notified thread did not wake")  # type: ignore[misc]
    finally:
        stop.set()
        with cond:
            cond.notify()
        thread.join(timeout_s)
        set_intra_op_threads(before)
    wakes = sorted((woke[i + 1] - posted[i]) / 1e3 for i in range(len(posted)))
    blocked = [(posted[i] - woke[i]) / 1e3 for i in range(len(posted))]
    tenth = len(wakes) // 10
    return WakeLevel(
        gap_us=gap_us,
        blocked_us=statistics.median(blocked),
        wake_us=statistics.median(wakes),
        p10_us=wakes[tenth],
        p90_us=wakes[len(wakes) - 1 - tenth],
        rounds=len(wakes),
    )


def _until(done: Callable[[], bool], mm: Callable[..., Any], a: torch.Tensor, b: torch.Tensor, timeout_s: float,
           what: str) -> None:
    """Keep this core busy in kernels (the interpreter lock released) until `done()`."""
    deadline = time.perf_counter() + timeout_s
    while not done():
        mm(a, b)
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what} within {timeout_s} s")


def _busy(mm: Callable[..., Any], a: torch.Tensor, b: torch.Tensor, us: float) -> None:
    """Keep this core busy in ATen kernels for about `us` microseconds."""
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        mm(a, b)
