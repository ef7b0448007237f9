"""File helpers: atomic JSON writes (nothing half-written) and reads with clear errors."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError


def write_json_atomic(path: str | Path, data: Any, indent: int | None = None) -> Path:
    """Write JSON to a temp file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: str | Path, what: str = "file") -> Any:
    """Read a JSON file; a missing or malformed file is one SchedlabError naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SchedlabError(f"{what} file not found: {path}") from None
    except OSError as e:
        raise SchedlabError(f"cannot read {what} file {path}: {e.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SchedlabError(
            f"{what} file {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
