"""`python -m schedlab.calibrate [--quick] [--out PROFILE] [--json]`: what `make calibrate` runs."""

from __future__ import annotations

import argparse
import sys

from schedlab.cli.calibrate_cmd import add_arguments, run
from schedlab.errors import SchedlabError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedlab.calibrate", description=run.__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except SchedlabError as e:
        print(f"python -m schedlab.calibrate: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
