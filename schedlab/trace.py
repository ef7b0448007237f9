"""The Trace: what happened (exec) or what would happen (sim) when a Graph ran under a Plan.

Both backends emit this one schema. Events carry op id, kind, device, worker, threads and
start/end in nanoseconds from the start of the step; metadata says where the numbers came
from (machine, versions, graph and plan hashes, source). `to_chrome()` exports the Chrome
trace-event format that Perfetto and chrome://tracing open, one track per worker.
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

TRACE_SCHEMA_VERSION = 1
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

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_row(self) -> list[Any]:
        return [self.op, self.name, self.kind, self.device, self.worker, self.threads, self.start_ns, self.end_ns, self.step]


_ROW_FIELDS = ("op", "name", "kind", "device", "worker", "threads", "start_ns", "end_ns", "step")


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
        if d.get("version") != TRACE_SCHEMA_VERSION:
            raise SchedlabError(f"trace version {d.get('version')!r} is not supported (expected {TRACE_SCHEMA_VERSION})")
        if d.get("event_fields") != list(_ROW_FIELDS):
            raise SchedlabError(f"corrupt trace: event_fields must be {list(_ROW_FIELDS)}")
        try:
            events = tuple(
                TraceEvent(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), int(r[8]))
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

    def to_chrome(self) -> dict[str, Any]:
        devices = sorted({e.device for e in self.events})
        pid_of = {d: i for i, d in enumerate(devices)}
        out: list[dict[str, Any]] = []
        label = f"{self.meta.get('workload', '')} [{self.source}]".strip()
        for d, pid in pid_of.items():
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{d} {label}"}})
        for d, w in sorted({(e.device, e.worker) for e in self.events}):
            out.append(
                {"ph": "M", "name": "thread_name", "pid": pid_of[d], "tid": w, "args": {"name": f"worker {w}"}}
            )
        for e in self.events:
            out.append(
                {
                    "ph": "X",
                    "name": e.name,
                    "cat": e.kind,
                    "pid": pid_of[e.device],
                    "tid": e.worker,
                    "ts": e.start_ns / 1000.0,
                    "dur": max(e.dur_ns, 1) / 1000.0,
                    "args": {"op": e.op, "kind": e.kind, "threads": e.threads, "step": e.step},
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
