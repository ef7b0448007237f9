"""A cache of captured training steps, so that a command does not pay the capture twice.

Capturing a step (`schedlab.capture`) traces the model through aot_autograd and costs
seconds (about 14 s of a 16 s `schedlab simulate nmt`); building the model and hashing it
costs a fraction of that. `capture_cached` looks the capture up under a key of everything
it depends on, and stores what it captured otherwise.

What is stored, per key, in the cache folder (the CLI uses ``data_dir()/graphs``):

- ``KEY.json``: the Graph (its JSON, as `Graph.save` writes it), the key's ingredients,
  and the SHA-256 of the tensor file;
- ``KEY.pt``: the captured input tensors (value id -> tensor: parameters, buffers,
  optimizer state, user inputs), written with `torch.save`. Commands that only simulate
  need the Graph alone, but `schedlab search` times real steps of the graph to calibrate
  the simulator, so both are kept. They are read back with ``weights_only=True``: tensors
  and plain containers only, never code (DESIGN.md, invariant 6).

The key hashes the workload spec, size, optimizer and seed; the bytes of the source files
the model is built from (the factory's module for ``package.module:function``, and the
module of every layer class in the model that is not torch's own); the source of
schedlab's language floor (capture, graph, optimizer and the built-in workloads); the
torch, Python and schedlab versions; and the shape, dtype and bytes of every parameter,
buffer and input. So an edited model, a new torch or another seed is a new key, and the
stored tensors are exactly the ones a fresh capture would hold. (Code the model calls in
other files, outside any layer class, is not in the key: `--no-cache` captures afresh.)

Both files are written atomically, the JSON last. A file that cannot be read, or does not
match, is a `GraphCacheWarning` and a fresh capture, never an error; so is a cache folder
that cannot be written.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from schedlab.capture import Captured, capture
from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.io import atomic_file, read_json, write_json_atomic
from schedlab.workloads import Workload

CACHE_SCHEMA = "schedlab.graph_cache"
CACHE_VERSION = 5  # 2: ops record whether they read a strided input (Op.strided); 3: a softmax its row (Op.row_len); 4: a grouped convolution its channels per group (Op.group_channels); 5: a copy of long rows is not strided (capture.reads_strided)
_LANGUAGE_DIR = Path(__file__).resolve().parent  # schedlab/: capture, graph, optim, workloads


class GraphCacheWarning(UserWarning):
    """A cache entry was unreadable or could not be written; the step was captured afresh."""


def capture_cached(workload: Workload, optimizer: str, seed: int, root: Path | None) -> Captured:
    """`capture(workload, optimizer)`, through the cache folder `root` (None: no cache).

    `seed` is the one `workload` was built with (it is part of the key)."""
    if root is None:
        return capture(workload, optimizer)
    key = cache_key(workload, optimizer, seed)
    hit = _read(root, key)
    if hit is not None:
        return hit
    captured = capture(workload, optimizer)
    _write(root, key, captured, workload, optimizer, seed)
    return captured


def cache_key(workload: Workload, optimizer: str, seed: int) -> str:
    """32 hex digits naming everything a capture depends on (see the module docstring)."""
    h = hashlib.sha256()
    h.update(json.dumps(_ingredients(workload, optimizer, seed), sort_keys=True).encode())
    for path in model_sources(workload):
        h.update(path.encode())
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    h.update(_language_digest().encode())
    for name, t in _tensors(workload):
        h.update(name.encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()[:32]


def model_sources(workload: Workload) -> list[str]:
    """The source files `workload`'s model is built from, torch's own left out: the module of
    a ``package.module:function`` factory and the module of every layer class in the model."""
    names = {type(m).__module__ for m in workload.module.modules()}
    module_name, sep, _ = workload.name.partition(":")
    if sep:
        names.add(module_name)
    files = set()
    for name in names:
        if name == "torch" or name.startswith("torch."):
            continue
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and Path(file).is_file():
            files.add(str(Path(file).resolve()))
    return sorted(files)


def _ingredients(workload: Workload, optimizer: str, seed: int) -> dict[str, Any]:
    from schedlab import __version__

    return {
        "schema": CACHE_SCHEMA,
        "version": CACHE_VERSION,
        "spec": workload.name,
        "size": workload.size,
        "optimizer": optimizer,
        "seed": seed,
        "inputs": [[list(t.shape), str(t.dtype)] for t in workload.inputs],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "schedlab": __version__,
    }


@functools.cache
def _language_digest() -> str:
    """SHA-256 of schedlab's language floor (schedlab/*.py and the built-in workloads):
    in a source checkout the version number does not change when capture does."""
    h = hashlib.sha256()
    for path in sorted([*_LANGUAGE_DIR.glob("*.py"), *(_LANGUAGE_DIR / "workloads").glob("*.py")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _tensors(workload: Workload) -> list[tuple[str, torch.Tensor]]:
    state = [(f"state.{k}", v) for k, v in workload.module.state_dict(keep_vars=False).items()]
    return state + [(f"input{i}", t) for i, t in enumerate(workload.inputs)]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """Shape, dtype and the SHA-256 of the tensor's bytes (hashed in place, not copied)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    head = f"{list(t.shape)}:{t.dtype}:".encode()
    data = flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")
    return head + hashlib.sha256(data).digest()


# ---- the files -------------------------------------------------------------------------


def _paths(root: Path, key: str) -> tuple[Path, Path]:
    return root / f"{key}.json", root / f"{key}.pt"


def _read(root: Path, key: str) -> Captured | None:
    meta_path, values_path = _paths(root, key)
    if not meta_path.exists():
        return None
    try:
        d = read_json(meta_path, what="graph cache")
        if not isinstance(d, dict) or d.get("schema") != CACHE_SCHEMA or d.get("version") != CACHE_VERSION:
            raise ValueError("not a schedlab graph cache entry of this version")
        if d.get("key") != key:
            raise ValueError(f"it is the entry of key {d.get('key')!r}")
        graph = Graph.from_json(d["graph"])
        data = values_path.read_bytes()
        if hashlib.sha256(data).hexdigest() != d["values_sha256"]:
            raise ValueError(f"{values_path.name} does not match the checksum its entry recorded")
        values = torch.load(io.BytesIO(data), weights_only=True)  # tensors only: a file is data, never code
        _check_values(graph, values)
    except Exception as e:  # a cache is an optimisation: whatever is wrong with it, capture again
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        warnings.warn(
            f"ignoring graph cache entry {meta_path} ({type(e).__name__}: {detail}); capturing the model again",
            GraphCacheWarning,
            stacklevel=3,
        )
        return None
    return Captured(graph=graph, input_values=values)


def _check_values(graph: Graph, values: Any) -> None:
    """The stored tensors are the graph's inputs, each of the shape and dtype it says."""
    if not isinstance(values, dict) or set(values) != {i.value for i in graph.inputs}:
        raise ValueError("its tensors are not the graph's inputs")
    for v, t in values.items():
        meta = graph.values[v]
        if not isinstance(t, torch.Tensor) or meta is None or list(t.shape) != list(meta.shape):
            raise ValueError(f"the stored tensor of value {v} does not have the graph's shape")
        if str(t.dtype).removeprefix("torch.") != meta.dtype:
            raise ValueError(f"the stored tensor of value {v} is {t.dtype}, the graph says {meta.dtype}")


def _write(root: Path, key: str, captured: Captured, workload: Workload, optimizer: str, seed: int) -> None:
    meta_path, values_path = _paths(root, key)
    try:
        with atomic_file(values_path, "wb") as f:
            torch.save(captured.input_values, f)
        entry = {
            "schema": CACHE_SCHEMA,
            "version": CACHE_VERSION,
            "key": key,
            "ingredients": _ingredients(workload, optimizer, seed),
            "sources": model_sources(workload),
            "values_sha256": hashlib.sha256(values_path.read_bytes()).hexdigest(),
            "graph": captured.graph.to_json(),
        }
        write_json_atomic(meta_path, entry)  # last: an entry is complete once its JSON exists
    except (OSError, SchedlabError) as e:  # a full disk or a read-only data folder: carry on without
        warnings.warn(
            f"could not write graph cache entry {meta_path} ({e}); the next run captures again",
            GraphCacheWarning,
            stacklevel=3,
        )
