"""A link tree of the `schedlab` namespace as a wheel lays it out, read from pyproject.toml.

The folders stay at the repository's top level (`sim/` is `schedlab.sim`), which
setuptools maps with `package-dir`. Tools that resolve modules from file paths (mypy)
cannot follow that mapping, so `make lint` type-checks this tree instead: every file is a
symbolic link to the real one, and errors name the tree's path of the module.

    python -m tests.tools.package_tree OUT_DIR    # prints OUT_DIR/schedlab
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Every package pyproject.toml lists -> the folder its modules are in."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = conf.get("package-dir", {})
    out: dict[str, Path] = {}
    for pkg in conf["packages"]:
        # The longest mapped prefix decides, as in setuptools.
        parts = pkg.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in mapping:
                out[pkg] = root / mapping[prefix] / Path(*parts[i:])
                break
        else:
            out[pkg] = root / Path(*parts)
    return out


def build_tree(out_dir: Path, root: Path = ROOT) -> Path:
    """Lay out `out_dir/schedlab/...` with one link per module; return the package folder."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for pkg, src in package_dirs(root).items():
        dst = out_dir / Path(*pkg.split("."))
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.py")):
            (dst / f.name).symlink_to(f)
    return out_dir / "schedlab"


if __name__ == "__main__":
    print(build_tree(Path(sys.argv[1])))
