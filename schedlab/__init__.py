"""schedlab: find faster ways to run a neural-network training step.

The shared language of the platform lives here: the Graph of a training step, the Plan
that says how to run it, the Machine it runs on and the Trace of what happened.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
