"""Which intra-op thread counts to benchmark (setting them: `exec.threads`)."""

from __future__ import annotations


def thread_counts(cores: int, limit: int | None = None) -> tuple[int, ...]:
    """The intra-op thread counts to benchmark: 1..cores, capped at `limit` if given."""
    top = max(1, cores if limit is None else min(cores, limit))
    return tuple(range(1, top + 1))
