"""One namespace: a wheel built from the repository holds every module, as `schedlab.*`.

The folders stay at the top level (`sim/` is `schedlab.sim`, mapped in pyproject.toml);
these tests build a real wheel, install it outside the checkout and import it from there.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.tools.package_tree import ROOT, build_tree, package_dirs

pytestmark = pytest.mark.slow

_TOP_FOLDERS = ("schedlab", "cli", "exec", "sim", "calibrate", "search", "reports")


def _source_modules() -> set[str]:
    """Every module under the top-level code folders, named as it imports."""
    by_dir = {d.resolve(): pkg for pkg, d in package_dirs().items()}
    names: set[str] = set()
    for top in _TOP_FOLDERS:
        for f in (ROOT / top).rglob("*.py"):
            pkg = by_dir.get(f.parent.resolve())
            assert pkg is not None, f"{f.relative_to(ROOT)} is in a folder pyproject.toml does not list as a package"
            names.add(pkg if f.stem == "__init__" else f"{pkg}.{f.stem}")
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (whl,) = out.glob("schedlab-*.whl")
    return whl


def test_wheel_holds_every_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        in_wheel = {
            n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            for n in z.namelist() if n.endswith(".py")
        }
    expected = _source_modules()
    assert expected - in_wheel == set(), "modules missing from the wheel"
    assert all(n == "schedlab" or n.startswith("schedlab.") for n in in_wheel), sorted(in_wheel)


def test_installed_wheel_imports_only_as_schedlab_and_writes_outside_it(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "search.py").write_text("raise RuntimeError('a user file named search.py was imported')\n")
    (work / "sim.py").write_text("raise RuntimeError('a user file named sim.py was imported')\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    probe = (
        "import importlib.util, schedlab.sim, schedlab.search.study, schedlab.cli, schedlab.paths as p;"
        "print(importlib.util.find_spec('calibrate') is None);"
        "print(p.default_profile_path())"
    )
    done = subprocess.run([sys.executable, "-I", "-c", probe], env=env, cwd=work, capture_output=True, text=True,
                          timeout=120)
    # -I: isolated mode, so neither the checkout nor the working directory is on sys.path.
    assert done.returncode == 0, done.stderr
    no_bare, profile = done.stdout.split()
    assert no_bare == "True"
    assert not Path(profile).is_relative_to(site), f"the profile would land inside the installed package: {profile}"
    # The CLI itself, from a directory holding search.py and sim.py.
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; from schedlab.cli import main; sys.exit(main(['--help']))"],
        env=env, cwd=work, capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert "simulate" in cli.stdout


def test_mypy_checks_across_packages(tmp_path: Path) -> None:
    """A wrong annotation in one package about a function of another is caught."""
    pkg = build_tree(tmp_path / "tree")
    (pkg / "search" / "_probe.py").write_text(
        "from typing import Any\n\nfrom schedlab.sim.interconnect import link_time_us\n\n\n"
        "def wrong(link: Any) -> str:\n    return link_time_us(link, 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "-m", "schedlab.search._probe"],
        cwd=tmp_path / "tree", capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "_probe.py:7: error: Incompatible return value type" in done.stdout, done.stdout
