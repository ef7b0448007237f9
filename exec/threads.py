"""Intra-op thread counts per calling thread (DESIGN.md, "facts measured here").

In torch 2.13 CPU the intra-op thread count belongs to the calling thread once that thread
has called `torch.get_num_threads()` (which forces ATen's lazy per-thread init); only then
does `torch.set_num_threads(k)` give this thread its own OpenMP team of k threads.
`torch.init_num_threads()` resets to the global value, so it is not the way.
"""

from __future__ import annotations

import torch


def set_intra_op_threads(k: int) -> int:
    """Give the calling thread `k` intra-op threads; returns the count it had before."""
    before = torch.get_num_threads()  # first: forces the per-thread init
    if k != before:
        torch.set_num_threads(k)
    return before
