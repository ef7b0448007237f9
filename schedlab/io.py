"""File helpers: atomic writes of files and folders (nothing half-written) and JSON reads with clear errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from schedlab.errors import SchedlabError


@contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside `path` for writing ("w" or "wb"); on a clean exit rename it
    onto `path`, else delete it: readers never see half a file, an error leaves the old one."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes with mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _cannot_write(path, e) from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:  # disk full, `path` a folder: the user's to fix, not a traceback
        Path(tmp).unlink(missing_ok=True)
        raise _cannot_write(path, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cannot_write(path: Path, e: OSError) -> SchedlabError:
    """The error for a write the file system refused, saying what to fix where it can."""
    if isinstance(e, IsADirectoryError) and path.is_dir():
        return SchedlabError(f"cannot write {path}: it is a folder; give a file path")
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return SchedlabError(f"cannot write {path}: {blocker} is a file, not a folder")
    return SchedlabError(f"cannot write {path}: {e.strerror or e}")


def check_writable(path: str | Path) -> None:
    """Fail now, not after minutes of work, if no file can be written at `path`: create a temp
    file where it would go, then remove it and any folder made for it (nothing is left)."""
    path = Path(path)
    if path.is_dir():
        raise SchedlabError(f"cannot write {path}: it is a folder; give a file path")
    made: list[Path] = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise SchedlabError(f"cannot write {path}: {folder} is a file, not a folder")
    try:
        for d in reversed(made):
            d.mkdir()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise _cannot_write(path, e) from None
    finally:
        for d in made:
            if d.exists():
                d.rmdir()


def write_json_atomic(path: str | Path, data: Any, indent: int | None = None) -> Path:
    """Write JSON atomically (`atomic_file`)."""
    with atomic_file(path) as f:
        json.dump(data, f, indent=indent)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write text atomically (`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(text)
    return Path(path)


@contextmanager
def staging_dir(final: str | Path) -> Iterator[Path]:
    """An empty temp folder beside `final` to build its new content in; pass it to
    `swap_dir` to put it in place. Whatever is not swapped in (an error, an interrupt)
    is removed on the way out, and `final` is untouched."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise SchedlabError(f"cannot write folder {final}: a file is there; give a folder path")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{final.name}.new.", dir=final.parent))
    except OSError as e:
        raise _cannot_write(final, e) from None
    try:
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def swap_dir(staged: Path, final: str | Path, then: Callable[[], object] | None = None) -> Path:
    """Replace folder `final` by `staged` as one step: rename the old folder aside, rename
    the new one in, call `then` (a file written with the folder, say), remove the old.
    Readers see the old folder or the new one, never a mix; if a rename or `then` fails,
    the old folder is put back and the error raised."""
    final = Path(final)
    aside = staged.with_name(staged.name + ".old")  # unique: the staged name is
    moved_aside = swapped = False
    try:
        if final.exists():
            os.rename(final, aside)
            moved_aside = True
        os.rename(staged, final)
        swapped = True
        if then is not None:
            then()
    except BaseException:
        if swapped:
            os.rename(final, staged)  # the caller's staging_dir removes it
        if moved_aside:
            os.rename(aside, final)
        raise
    if moved_aside:
        shutil.rmtree(aside, ignore_errors=True)
    return final


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


def json_number(v: Any, what: str, minimum: float | None = None) -> float:
    """`v` read from JSON as a float; a ValueError naming `what` where it is not a finite
    number or lies below `minimum`."""
    x = float(v)
    if not math.isfinite(x) or (minimum is not None and x < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{what} must be a finite number{bound}, not {v!r}")
    return x
