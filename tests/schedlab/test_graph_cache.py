"""The graph cache: a hit skips the capture and gives the same graph and tensors; an edited
model is a new key; a corrupt entry is a warning and a fresh capture, never an error."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from schedlab import graph_cache
from schedlab.capture import Captured
from schedlab.graph_cache import GraphCacheWarning, cache_key, capture_cached, model_sources
from schedlab.workloads import load_workload


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each real capture by workload name; `forbid_capture` makes the next one fail."""
    calls: list[str] = []
    real = graph_cache.capture

    def counting(workload: Any, optimizer: str) -> Captured:
        calls.append(workload.name)
        return real(workload, optimizer)

    monkeypatch.setattr(graph_cache, "capture", counting)
    return calls


def forbid_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(workload: Any, optimizer: str) -> Captured:
        raise AssertionError(f"captured {workload.name} again instead of reading the cache")

    monkeypatch.setattr(graph_cache, "capture", fail)


def same_values(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_a_second_capture_reads_the_cache(tmp_path: Path, captures: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    first = capture_cached(load_workload("mlp", "tiny", seed=3), "adam", 3, tmp_path)
    assert captures == ["mlp"] and sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".pt"]
    forbid_capture(monkeypatch)
    second = capture_cached(load_workload("mlp", "tiny", seed=3), "adam", 3, tmp_path)
    assert second.graph.hash == first.graph.hash and second.graph == first.graph
    assert same_values(second.input_values, first.input_values)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_the_key_changes_with_what_the_capture_depends_on() -> None:
    w = load_workload("mlp", "tiny", seed=0)
    key = cache_key(w, "sgd", 0)
    assert cache_key(load_workload("mlp", "tiny", seed=0), "sgd", 0) == key  # stable
    assert cache_key(w, "adam", 0) != key
    assert cache_key(load_workload("mlp", "tiny", seed=1), "sgd", 1) != key  # other parameter values
    assert cache_key(load_workload("mlp", "default", seed=0), "sgd", 0) != key
    assert any(p.endswith("schedlab/workloads/mlp.py") for p in model_sources(w))


def test_an_edited_model_source_is_a_new_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user factory `cachemodel:make` whose layer lives in another file: editing either changes the key."""
    layer = tmp_path / "cachelayer.py"
    layer.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(8, 8)

            def forward(self, x):
                return torch.relu(self.lin(x))
    """))
    factory = tmp_path / "cachemodel.py"
    factory.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from cachelayer import Block

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()

            def forward(self, x):
                return self.block(x).sum()

        def make():
            return Net(), (torch.randn(4, 8),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cachemodel", raising=False)
    monkeypatch.delitem(sys.modules, "cachelayer", raising=False)
    w = load_workload("cachemodel:make", seed=0)
    assert set(model_sources(w)) == {str(factory.resolve()), str(layer.resolve())}
    key = cache_key(w, "sgd", 0)
    factory.write_text(factory.read_text().replace(".sum()", ".mean()"))
    edited_factory = cache_key(w, "sgd", 0)
    layer.write_text(layer.read_text().replace("torch.relu", "torch.tanh"))
    edited_layer = cache_key(w, "sgd", 0)
    assert len({key, edited_factory, edited_layer}) == 3


@pytest.mark.parametrize("damage", ["json", "pt", "mismatch"])
def test_a_corrupt_entry_is_a_warning_and_a_fresh_capture(
    tmp_path: Path, captures: list[str], monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    w = load_workload("mlp", "tiny")
    first = capture_cached(w, "sgd", 0, tmp_path)
    key = cache_key(w, "sgd", 0)
    meta, values = tmp_path / f"{key}.json", tmp_path / f"{key}.pt"
    if damage == "json":
        meta.write_text(meta.read_text()[:200])  # cut short
    elif damage == "pt":
        values.write_bytes(values.read_bytes()[:100])
    else:  # a well-formed entry whose tensors are not the graph's
        entry = json.loads(meta.read_text())
        torch.save({0: torch.zeros(1)}, values)
        import hashlib

        entry["values_sha256"] = hashlib.sha256(values.read_bytes()).hexdigest()
        meta.write_text(json.dumps(entry))
    with pytest.warns(GraphCacheWarning, match="ignoring graph cache entry"):
        again = capture_cached(w, "sgd", 0, tmp_path)
    assert captures == ["mlp", "mlp"] and again.graph.hash == first.graph.hash
    forbid_capture(monkeypatch)  # the entry was rewritten whole
    assert same_values(capture_cached(w, "sgd", 0, tmp_path).input_values, first.input_values)


def test_an_unwritable_cache_is_a_warning(tmp_path: Path, captures: list[str]) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.warns(GraphCacheWarning, match="could not write graph cache entry"):
        captured = capture_cached(load_workload("mlp", "tiny"), "sgd", 0, blocked / "graphs")
    assert captures == ["mlp"] and len(captured.graph) > 0


def test_simulate_captures_once_and_no_cache_captures_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captures: list[str]
) -> None:
    from schedlab.cli import common, main
    from schedlab.machine import detect_host
    from tests.calibrate.factories import make_profile

    monkeypatch.setattr(common, "graph_cache_dir", lambda: tmp_path / "graphs")
    profile = make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")
    argv = ["simulate", "cnn", "--size", "tiny", "--profile", str(profile), "--out", str(tmp_path / "s.json"), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)["predicted_step_time_s"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["predicted_step_time_s"] == first
    assert captures == ["cnn"]
    assert main([*argv, "--no-cache"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_step_time_s"] == first
    assert captures == ["cnn", "cnn"]
    for entry in (tmp_path / "graphs").glob("*.pt"):
        entry.write_bytes(b"garbage")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["predicted_step_time_s"] == first
    assert err.count("schedlab: warning: ignoring graph cache entry") == 1 and "Traceback" not in err
    assert captures == ["cnn", "cnn", "cnn"]
