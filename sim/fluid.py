"""Processor sharing as an event-driven fluid model, free of any event loop.

A `FluidShare` is one shared server: the cores of a CPU device, the streams of a GPU, or
the wire of a link. Jobs arrive with a *demand* (cores they want: a kernel's threads, 1
for a stream or a transfer) and a *work* in microseconds (their time alone on an idle
server). While the jobs running together demand T units of a server of capacity C, each
runs at rate

    min(1, C / T) / slowdown(job, busy_others)

where ``busy_others = min(T - demand, C)`` is the capacity the other jobs keep busy and
``slowdown`` (>= 1) is the co-run interference of the cost model. Rates only change when a
job starts or finishes, so between those instants every job advances linearly: the model
is exact, and the caller only needs a timer at the next projected finish.

The caller drives time: `start()` and `advance()` take the current time (microseconds)
and return the keys of the jobs that finished at that instant; `next_delay()` says when
to call `advance()` again, and `version` changes whenever an earlier timer went stale.
Jobs whose projected finish lies within `_TOL_US` of the current instant finish at it,
so float rounding never splits one instant into two. The same class, driven by the same
calls, gives bit-identical floats in the SimPy engine and in the fast loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

# Float slack when deciding that a projected finish time has been reached (µs): far below
# a nanosecond at any step length a simulation meets, far above float rounding.
_TOL_US = 1e-9
_REL_TOL = 1e-12

SlowdownFn = Callable[[int, int], float]  # (job key >= 0, busy capacity of the others) -> factor >= 1


class FluidShare:
    """Jobs sharing one server of `capacity` units; at most `max_jobs` run, the rest queue FIFO.

    `slowdown(key, busy_others)` must be a pure function: its values are memoised.
    """

    __slots__ = (
        "_demands",
        "_finish_at",
        "_keys",
        "_last_us",
        "_memo",
        "_memo_held",
        "_next_at",
        "_rates",
        "_remaining",
        "_slowdown",
        "_slowdown_held",
        "_total_demand",
        "busy_unit_us",
        "capacity",
        "held",
        "max_jobs",
        "queue",
        "version",
    )

    def __init__(
        self, capacity: int, slowdown: SlowdownFn | None = None, max_jobs: int | None = None,
        slowdown_held: SlowdownFn | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.max_jobs = max_jobs
        self._slowdown = slowdown
        # the slowdown while `held` (a worker runs Python under the interpreter lock, `hold`)
        self._slowdown_held = slowdown_held
        self.held = False
        self._memo: dict[int, float] = {}  # key * (capacity + 1) + busy_others -> slowdown
        self._memo_held: dict[int, float] = {}
        self._keys: list[int] = []
        self._demands: list[int] = []
        self._remaining: list[float] = []  # work left, µs at rate 1
        self._rates: list[float] = []
        self._finish_at: list[float] = []  # projected finish, µs, at the current rates
        self._next_at = 0.0  # min(_finish_at) while jobs run
        self._total_demand = 0
        self._last_us = 0.0
        self.queue: deque[tuple[int, int, float]] = deque()  # (key, demand, work) waiting for max_jobs
        self.version = 0
        self.busy_unit_us = 0.0  # integral of the busy capacity min(T, C) over time

    @property
    def running(self) -> tuple[int, ...]:
        return tuple(self._keys)

    def start(self, now_us: float, key: int, demand: int, work_us: float) -> list[int]:
        """A job arrives at `now_us`. Returns the keys of jobs that finished at `now_us`."""
        finished = self._advance(now_us) if self._keys else _NONE
        if self.max_jobs is not None and len(self._keys) >= self.max_jobs:
            self.queue.append((key, demand, work_us))
        else:
            self._keys.append(key)
            self._demands.append(demand)
            self._remaining.append(work_us if work_us > 0.0 else 0.0)
            self._rates.append(1.0)
            self._finish_at.append(0.0)
            self._total_demand += demand
        self._last_us = now_us
        self._recompute(now_us)
        return finished

    def advance(self, now_us: float) -> list[int]:
        """Bring the server to `now_us` (a timer fired). Returns the keys that finished."""
        finished = self._advance(now_us) if self._keys else _NONE
        self._last_us = now_us
        self._recompute(now_us)
        return finished

    def hold(self, now_us: float, held: bool) -> bool:
        """A worker takes (True) or leaves (False) the interpreter lock at `now_us`. With a
        `slowdown_held` and a running job whose slowdown it changes, the jobs are brought to
        `now_us` (none finishes here: one due now finishes at the next timer, also now) and
        re-rated; returns whether they were, i.e. whether the caller must arm a new timer. A caller
        that starts a job at the same instant may set `held` itself instead (`start`
        re-rates)."""
        if held == self.held:
            return False
        self.held = held
        if self._slowdown_held is None or not self._keys or not self._held_matters():
            return False
        self._progress(now_us)
        self._last_us = now_us
        self._recompute(now_us)
        return True

    def next_delay(self, now_us: float) -> float | None:
        """Delay from `now_us` to the earliest projected finish; None when idle."""
        if not self._keys:
            return None
        d = self._next_at - now_us
        return d if d > 0.0 else 0.0

    # ---- internals -----------------------------------------------------------------------

    def _held_matters(self) -> bool:
        """Whether any running job's slowdown differs with the lock held and without."""
        slow, held = self._slowdown, self._slowdown_held
        assert held is not None
        cap, td = self.capacity, self._total_demand
        for key, demand in zip(self._keys, self._demands, strict=True):
            others = min(td - demand, cap)
            if held(key, others) != (slow(key, others) if slow is not None else 1.0):
                return True
        return False

    def _progress(self, now_us: float) -> None:
        """Every running job's work done since the last event, at its rate."""
        dt = now_us - self._last_us
        if dt > 0.0:
            rem, rates = self._remaining, self._rates
            for i in range(len(rem)):
                rem[i] -= rates[i] * dt
            td = self._total_demand
            self.busy_unit_us += (td if td < self.capacity else self.capacity) * dt

    def _advance(self, now_us: float) -> list[int]:
        keys = self._keys
        self._progress(now_us)
        limit = now_us + _TOL_US + _REL_TOL * abs(now_us)
        if self._next_at > limit:
            return _NONE
        fin = self._finish_at
        finished: list[int] = []
        i = 0
        while i < len(keys):
            if fin[i] <= limit:
                finished.append(keys[i])
                self._total_demand -= self._demands[i]
                del keys[i], self._demands[i], self._remaining[i], self._rates[i], fin[i]
            else:
                i += 1
        queue = self.queue
        while queue and (self.max_jobs is None or len(keys) < self.max_jobs):
            key, demand, work_us = queue.popleft()
            keys.append(key)
            self._demands.append(demand)
            self._remaining.append(work_us if work_us > 0.0 else 0.0)
            self._rates.append(1.0)
            fin.append(0.0)
            self._total_demand += demand
        return finished

    def _recompute(self, now_us: float) -> None:
        self.version += 1
        keys = self._keys
        if not keys:
            return
        cap = self.capacity
        td = self._total_demand
        share = 1.0 if td <= cap else cap / td
        held = self.held and self._slowdown_held is not None
        slow = self._slowdown_held if held else self._slowdown
        memo = self._memo_held if held else self._memo
        rem, rates, fin, dem = self._remaining, self._rates, self._finish_at, self._demands
        next_at = float("inf")
        for i in range(len(keys)):
            r = share
            if slow is not None:
                others = td - dem[i]
                if others > cap:
                    others = cap
                mkey = keys[i] * (cap + 1) + others
                f = memo.get(mkey)
                if f is None:
                    f = memo[mkey] = slow(keys[i], others)
                if f > 1.0:
                    r = share / f
            rates[i] = r
            left = rem[i]
            t = now_us + left / r if left > 0.0 else now_us
            fin[i] = t
            if t < next_at:
                next_at = t
        self._next_at = next_at


class PooledShare(FluidShare):
    """A FluidShare whose jobs belong to groups (the devices of a core pool, their jobs keyed
    by op), with the busy capacity also kept per group: `busy_by_group[g]` integrates the
    capacity group g's jobs hold, so the groups' figures sum to `busy_unit_us`."""

    __slots__ = ("_group_of", "busy_by_group")

    def __init__(self, capacity: int, slowdown: SlowdownFn | None, group_of: Sequence[int], n_groups: int) -> None:
        super().__init__(capacity, slowdown)
        self._group_of = group_of
        self.busy_by_group = [0.0] * n_groups

    def _advance(self, now_us: float) -> list[int]:
        dt = now_us - self._last_us
        if dt > 0.0:
            td = self._total_demand
            share = 1.0 if td <= self.capacity else self.capacity / td
            busy, group_of = self.busy_by_group, self._group_of
            for key, demand in zip(self._keys, self._demands, strict=True):
                busy[group_of[key]] += demand * share * dt
        return super()._advance(now_us)


_NONE: list[int] = []  # shared empty result; callers only iterate it
