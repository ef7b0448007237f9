"""The Trace: what happened (exec) or what would happen (sim) when a Graph ran under a Plan.

Both backends emit this one schema. Events carry op id, kind, device, worker, threads,
start/end in nanoseconds from the start of the step, and the rank (process) that ran
them; metadata says where the numbers came from (machine, versions, graph and plan hashes,
source). Ranks of one multi-process step share one clock (the executor aligns them).
`to_chrome()` exports the Chrome trace-event format that Perfetto and chrome://tracing
open: one process per rank, one track per worker, communication on its own tracks
(negative workers).
"""

from __future__ import annotations

import contextlib
import functools
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError

TRACE_SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 rows have no rank: rank 0
SOURCES = ("exec", "sim")


@dataclass(frozen=True)
class TraceEvent:
    op: int
    name: str
    kind: str  # OpKind value, or "COMM" / "OVERHEAD"
    device: str
    worker: int
    threads: int
    start_ns: int
    end_ns: int
    step: int = 0
    rank: int = 0  # the process that ran it (0 in a one-process step)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_row(self) -> list[Any]:
        return [self.op, self.name, self.kind, self.device, self.worker, self.threads, self.start_ns, self.end_ns,
                self.step, self.rank]


_ROW_FIELDS = ("op", "name", "kind", "device", "worker", "threads", "start_ns", "end_ns", "step", "rank")


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return str(self.meta.get("source", ""))

    def step_events(self, step: int) -> list[TraceEvent]:
        return [e for e in self.events if e.step == step]

    def makespan_ns(self, step: int | None = None) -> int:
        evs = self.events if step is None else self.step_events(step)
        if not evs:
            return 0
        return max(e.end_ns for e in evs) - min(e.start_ns for e in evs)

    def to_json(self) -> dict[str, Any]:
        # Events as rows: a default-size step has thousands of ops, and rows keep files small.
        return {
            "schema": "schedlab.trace",
            "version": TRACE_SCHEMA_VERSION,
            "meta": self.meta,
            "event_fields": list(_ROW_FIELDS),
            "events": [e.to_row() for e in self.events],
        }

    @staticmethod
    def from_json(d: Any) -> Trace:
        if not isinstance(d, dict) or d.get("schema") != "schedlab.trace":
            raise SchedlabError('not a schedlab trace (missing "schema": "schedlab.trace")')
        version = d.get("version")
        if version not in READABLE_VERSIONS:
            raise SchedlabError(f"trace version {version!r} is not supported (expected one of {list(READABLE_VERSIONS)})")
        fields = list(_ROW_FIELDS) if version == TRACE_SCHEMA_VERSION else list(_ROW_FIELDS[:-1])
        if d.get("event_fields") != fields:
            raise SchedlabError(f"corrupt trace: event_fields must be {fields}")
        try:
            events = tuple(
                TraceEvent(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]),
                           int(r[8]), int(r[9]) if len(fields) > 9 else 0)
                for r in d["events"]
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise SchedlabError(f"corrupt trace: bad event row ({type(e).__name__}: {e})") from None
        meta = d.get("meta", {})
        if not isinstance(meta, dict) or meta.get("source") not in SOURCES:
            raise SchedlabError(f"corrupt trace: meta.source must be one of {SOURCES}")
        for ev in events:
            if ev.end_ns < ev.start_ns:
                raise SchedlabError(f"corrupt trace: event for op {ev.op} ends before it starts")
        return Trace(events=events, meta=meta)

    def save(self, path: str | Path) -> Path:
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> Trace:
        from schedlab.io import read_json

        return Trace.from_json(read_json(path, what="trace"))

    # ---- Chrome / Perfetto export ----------------------------------------------------------

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({e.rank for e in self.events}))

    def to_chrome(self) -> dict[str, Any]:
        """Chrome trace events: a process per rank, a track per (device, worker) of it."""
        out: list[dict[str, Any]] = []
        label = f"{self.meta.get('workload', '')} [{self.source}]".strip()
        tracks = sorted({(e.rank, e.device, e.worker) for e in self.events})
        tid_of = {t: i for i, t in enumerate(tracks)}
        for rank in self.ranks:
            devs = ",".join(sorted({d for r, d, _ in tracks if r == rank}))
            out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank} ({devs}) {label}"}})
        for (rank, dev, w), tid in tid_of.items():
            name = f"{dev} worker {w}" if w >= 0 else f"{dev} comm {-1 - w}"
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        for e in self.events:
            out.append(
                {
                    "ph": "X",
                    "name": e.name,
                    "cat": e.kind,
                    "pid": e.rank,
                    "tid": tid_of[(e.rank, e.device, e.worker)],
                    "ts": e.start_ns / 1000.0,
                    "dur": max(e.dur_ns, 1) / 1000.0,
                    "args": {"op": e.op, "kind": e.kind, "threads": e.threads, "step": e.step, "device": e.device},
                }
            )
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {k: str(v) for k, v in self.meta.items() if not isinstance(v, (dict, list))}}

    def save_chrome(self, path: str | Path) -> Path:
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_chrome())


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "schedlab": _version()}
    for pkg in ("torch", "simpy", "optuna", "numpy"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return tuple(out.items())


def library_versions() -> dict[str, str]:
    """Python, schedlab and key library versions (looked up once per process)."""
    return dict(_versions())


def _version() -> str:
    from schedlab import __version__

    return __version__


def base_meta(source: str, **extra: Any) -> dict[str, Any]:
    """Metadata every trace carries: source, versions, creation time."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    return {"source": source, "versions": library_versions(), "created_unix_s": time.time(), **extra}
