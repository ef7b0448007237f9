"""A `FluidShare` inside a SimPy Environment: `run()` returns an event that fires when the job is done.

The server keeps one timer armed at the next projected finish; when a job starts or ends,
the rates change, a new timer is armed, and the old one finds its version stale and does
nothing. Time is in microseconds.
"""

from __future__ import annotations

from functools import partial

import simpy

from schedlab.sim.fluid import FluidShare


class SimServer:
    """Processor-sharing server (cores, streams or a wire) driven by SimPy timers."""

    def __init__(self, env: simpy.Environment, fluid: FluidShare) -> None:
        self.env = env
        self.fluid = fluid
        self._done: dict[int, simpy.Event] = {}

    def run(self, key: int, demand: int, work_us: float) -> simpy.Event:
        """Start job `key` now; the returned event succeeds (value: key) when it completes."""
        if key in self._done:
            raise ValueError(f"job {key} is already running on this server")
        done = self.env.event()
        self._done[key] = done
        self._complete(self.fluid.start(self.env.now, key, demand, work_us))
        self._arm()
        return done

    def hold(self, held: bool) -> None:
        """A worker takes (True) or leaves the interpreter lock now (`FluidShare.hold`)."""
        if self.fluid.hold(self.env.now, held):
            self._arm()

    def _complete(self, keys: list[int]) -> None:
        for k in keys:
            self._done.pop(k).succeed(k)

    def _arm(self) -> None:
        delay = self.fluid.next_delay(self.env.now)
        if delay is not None:
            self.env.timeout(delay).callbacks.append(partial(self._on_timer, self.fluid.version))

    def _on_timer(self, version: int, _event: simpy.Event) -> None:
        if version != self.fluid.version:
            return  # rates changed since this timer was armed
        self._complete(self.fluid.advance(self.env.now))
        self._arm()
