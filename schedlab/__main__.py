"""`python -m schedlab` runs the CLI."""

import sys

from schedlab.cli import main

sys.exit(main())
