from __future__ import annotations

import platform

import pytest

from schedlab import allocator
from schedlab.allocator import tune_malloc


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tune_malloc_applies_on_glibc() -> None:
    assert tune_malloc() is True


def test_the_executor_tunes_the_allocator_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step timed from Python runs under the CLI's allocator: the executor tunes it, once."""
    from schedlab.exec.runner import Executor
    from schedlab.machine import detect_host
    from schedlab.plan import Plan, resolve
    from tests.conftest import captured_workload

    calls: list[int] = []
    monkeypatch.setattr(allocator, "_tuned", None)
    monkeypatch.setattr(allocator, "tune_malloc", lambda: calls.append(1) or True)
    _, captured = captured_workload("mlp")
    graph = captured.graph  # type: ignore[attr-defined]
    resolved = resolve(graph, Plan(slots=2, threads=1), detect_host())
    Executor(graph, resolved)
    Executor(graph, resolved)
    assert calls == [1] and allocator.ensure_tuned() is True
