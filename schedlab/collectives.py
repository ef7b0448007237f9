"""Closed-form times of point-to-point transfers and collectives (seconds).

Pure formulas, shared by the simulator (which may not import `calibrate`) and by the
link calibration that fits their parameters (`calibrate.links`):

    p2p_s(nbytes, latency_s, bw)            = latency_s + nbytes / bw
    ring_allreduce_s(nbytes, n, alpha_s, bw) = 2(n-1) alpha_s + 2(n-1)/n * nbytes / bw

The ring all-reduce (Patarasuk and Yuan, JPDC 2009; NCCL's and gloo's ring) splits the
buffer into n chunks and takes n-1 reduce-scatter steps and n-1 all-gather steps, each
sending one chunk of nbytes/n to the next rank: 2(n-1) messages of start-up cost
alpha_s, and 2(n-1)/n of the buffer through each rank's link. One rank: no time.
"""

from __future__ import annotations

__all__ = ["p2p_s", "ring_allreduce_s", "sums_by_exchange"]


def sums_by_exchange(n_ranks: int) -> bool:
    """Whether the executor sums a buffer across `n_ranks` ranks by one exchange (each rank
    sends its buffer to the other and adds the other's in: two ranks, `exec.reduce`) rather
    than by gloo's all-reduce (more ranks)."""
    return n_ranks == 2


def p2p_s(nbytes: float, latency_s: float, bw_bytes_per_s: float) -> float:
    """One message of `nbytes` from one rank to another: latency plus bytes over bandwidth."""
    if bw_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bw_bytes_per_s}")
    return latency_s + max(0.0, float(nbytes)) / bw_bytes_per_s


def ring_allreduce_s(nbytes: float, n: int, alpha_s: float, bw_bytes_per_s: float) -> float:
    """A ring all-reduce of an `nbytes` buffer over `n` ranks (see the module docstring)."""
    if n <= 1:
        return 0.0
    if bw_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bw_bytes_per_s}")
    steps = 2 * (n - 1)
    return steps * alpha_s + steps / n * max(0.0, float(nbytes)) / bw_bytes_per_s
