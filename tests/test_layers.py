"""Layers you can see: each package imports only the floors below it; nothing imports the CLI.

    language (schedlab.*: Graph, Plan, Machine, Trace, Backend, capture, workloads)
      exec, sim              two implementations of schedlab.backend.Backend
        calibrate            microbenchmarks and fits (runs exec, predicts with sim)
          search             Optuna over plans, validation
            reports          figures from stored files
              cli            the command line: the top floor

A `__main__` module is an entry point, not a floor: it may start the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tools.package_tree import package_dirs

FLOOR = {
    "schedlab": 0,
    "schedlab.workloads": 0,
    "schedlab.tf": 0,
    "schedlab.tf.builtins": 0,
    "schedlab.pipeline": 0,
    "schedlab.exec": 1,
    "schedlab.sim": 1,
    "schedlab.calibrate": 2,
    "schedlab.search": 3,
    "schedlab.search.placement": 3,
    "schedlab.search.tessel": 3,
    "schedlab.reports": 4,
    "schedlab.reports.figures": 4,
    "schedlab.cli": 5,
}


def _floor_of(module: str) -> tuple[str, int]:
    """The package a module name belongs to and its floor (the longest listed prefix)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in FLOOR:
            return name, FLOOR[name]
    raise AssertionError(f"{module} is in no listed package")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return [(line, m) for line, m in out if m == "schedlab" or m.startswith("schedlab.")]


def test_every_package_has_a_floor() -> None:
    assert set(package_dirs()) == set(FLOOR)


def test_no_import_runs_up_a_floor() -> None:
    upward: list[str] = []
    for pkg, folder in package_dirs().items():
        own = FLOOR[pkg]
        for f in sorted(folder.glob("*.py")):
            for line, mod in _imports(f):
                target, floor = _floor_of(mod)
                is_entry = f.name == "__main__.py" and target == "schedlab.cli"
                same_package_family = target.split(".")[:2] == pkg.split(".")[:2] and pkg != "schedlab"
                if floor > own and not is_entry and not same_package_family:
                    upward.append(f"{f}:{line} ({pkg}, floor {own}) imports {mod} (floor {floor})")
    assert upward == [], "\n".join(upward)


def test_exec_and_sim_do_not_import_each_other() -> None:
    dirs = package_dirs()
    for pkg, other in (("schedlab.exec", "schedlab.sim"), ("schedlab.sim", "schedlab.exec")):
        for f in dirs[pkg].glob("*.py"):
            assert not any(m.startswith(other) for _, m in _imports(f)), f"{f} imports {other}"
