"""Shared fixtures: captured tiny workloads, cached per session (capture takes ~0.5 s)."""

from __future__ import annotations

import pytest

_CACHE: dict[tuple[str, str, str], object] = {}


def captured_workload(name: str, optimizer: str = "sgd", size: str = "tiny") -> tuple[object, object]:
    """(workload, captured) for a workload spec, captured once per test session."""
    from schedlab.capture import capture
    from schedlab.workloads import load_workload

    key = (name, optimizer, size)
    if key not in _CACHE:
        w = load_workload(name, size)
        _CACHE[key] = (w, capture(w, optimizer))
    return _CACHE[key]  # type: ignore[return-value]


@pytest.fixture
def capture_cached():  # type: ignore[no-untyped-def]
    return captured_workload


@pytest.fixture(scope="session", autouse=True)
def _graph_cache_in_a_temp_folder(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """`simulate` and `search` cache captured graphs under the data folder (traces/graphs/);
    in the tests they share one temp folder instead, fresh each session."""
    from schedlab.cli import common

    root = tmp_path_factory.mktemp("graph-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "graph_cache_dir", lambda: root)
        yield root
