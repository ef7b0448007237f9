"""Live bytes per device over a simulated step, and their peak.

Storage, not values, is what occupies memory: a view (`TensorMeta.alias_of`, or any output
of an op with `is_view`) shares the storage of the value it aliases and allocates nothing,
but keeps that storage alive. `sim.prepare` reduces the graph to *storages* (one per alias
root and device) with a reference count each; this tracker only adds and releases bytes.

Within one instant of simulated time, allocations come before frees: a free is deferred to
the end of the instant (`settle()`). The peak then never depends on the order in which
simultaneous events happen to be processed, which keeps both engines identical.
"""

from __future__ import annotations


class MemoryTracker:
    """Live and peak bytes of each device (indexed by device position in the Machine)."""

    __slots__ = ("_deferred", "live", "peak")

    def __init__(self, initial_bytes: list[int]) -> None:
        self.live = list(initial_bytes)
        self.peak = list(initial_bytes)
        self._deferred: list[tuple[int, int]] = []

    def alloc(self, device: int, nbytes: int) -> None:
        if nbytes:
            live = self.live[device] + nbytes
            self.live[device] = live
            if live > self.peak[device]:
                self.peak[device] = live

    def free_later(self, device: int, nbytes: int) -> None:
        """Release `nbytes` at the end of the current instant."""
        if nbytes:
            self._deferred.append((device, nbytes))

    def settle(self) -> None:
        """The instant is over: apply the deferred frees."""
        if self._deferred:
            live = self.live
            for device, nbytes in self._deferred:
                live[device] -= nbytes
            self._deferred.clear()
