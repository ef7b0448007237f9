"""The `schedlab` command line: one module per command, each with `register` and `run`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from schedlab.errors import SchedlabError

# Command modules, in the order `schedlab --help` lists them.
COMMANDS = (
    "schedlab.cli.demo_cmd",
    "schedlab.cli.plan_cmd",
    "schedlab.cli.trace_cmd",
    "schedlab.cli.bench_cmd",
    "schedlab.cli.calibrate_cmd",
    "schedlab.cli.simulate_cmd",
    "schedlab.cli.schedule_cmd",
    "schedlab.cli.fidelity_cmd",
    "schedlab.cli.search_cmd",
    "schedlab.cli.validate_cmd",
    "schedlab.cli.report_cmd",
)


class OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one line on stderr like every other error (exit status 2), not the usage
    text plus a line; subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from schedlab import __version__

    parser = OneLineErrors(
        prog="schedlab",
        description="Find faster ways to run a neural-network training step: capture it as a graph, "
        "run it under a plan, simulate plans, search them, validate the best on hardware.",
    )
    parser.add_argument("--version", action="version", version=f"schedlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # a command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Before any worker thread exists: executor, eager baseline and calibration all run
    # with freed tensor memory kept in the process (see schedlab/allocator.py).
    from schedlab.allocator import ensure_tuned

    ensure_tuned()
    try:
        return int(args.handler(args) or 0)
    except SchedlabError as e:
        print(f"schedlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"schedlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
