"""Where schedlab keeps files that are not code: the one place that knows the repository.

Generated output (profiles, traces, fidelity tables) never lands inside an installed
package. It goes to, in order of precedence:

1. ``$SCHEDLAB_HOME`` when set;
2. the ``traces/`` folder of the source checkout schedlab runs from (an editable install,
   or ``python -m schedlab`` in the repository), where `make calibrate` has always put it;
3. ``$XDG_DATA_HOME/schedlab`` (default ``~/.local/share/schedlab``) for an installed wheel.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
# Folders that only a schedlab source checkout has side by side with the package.
_CHECKOUT_MARKERS = ("pyproject.toml", "sim", "exec", "search", "tests")


def source_root(package_dir: Path = _PACKAGE_DIR) -> Path | None:
    """The repository root when `package_dir` sits in a schedlab source checkout, else None."""
    root = package_dir.parent
    if all((root / m).exists() for m in _CHECKOUT_MARKERS) and (root / "schedlab") == package_dir:
        return root
    return None


def data_dir(package_dir: Path = _PACKAGE_DIR) -> Path:
    """The folder generated files go to by default (see the module docstring)."""
    home = os.environ.get("SCHEDLAB_HOME")
    if home:
        return Path(home).expanduser()
    root = source_root(package_dir)
    if root is not None:
        return root / "traces"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "schedlab"


def default_profile_path() -> Path:
    """Where `schedlab calibrate` writes the Profile and every command looks for it."""
    return data_dir() / "profile.json"
