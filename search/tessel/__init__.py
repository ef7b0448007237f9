"""Tessel's schedule search (Lin et al., HPCA 2024): a repeating pattern (the repetend)
holding one micro-batch's worth of every block, searched for the shortest length under
a memory limit, then completed with warm-up and cool-down into a full pipeline schedule.

    from schedlab.pipeline.tessel_shapes import tessel_shape
    from schedlab.search.tessel import search_tessel

    result = search_tessel(tessel_shape("mshape", 4), 16, memory_limit=4)
    result.repetend_time, result.lower_bound, result.makespan

- `blocks`: the problem and the repetend; `formulation`: the repetend as a MILP
- `linear`, `highs`, `smt`: the model's form and its two solvers (HiGHS, z3)
- `fast`: Tessel-fast, the repetend built without a solver
- `complete`: warm-up and cool-down around the repetitions
- `listsched`, `baseline`: a list scheduler and the 1F1B-like baseline it gives
- `search`: `search_tessel`, all of it within one time limit
"""

from __future__ import annotations

from schedlab.search.tessel.baseline import best_1f1b_like
from schedlab.search.tessel.blocks import BlockProblem, Repetend
from schedlab.search.tessel.search import DEFAULT_SOLVER, SOLVERS, TesselResult, search_tessel

__all__ = [
    "DEFAULT_SOLVER",
    "SOLVERS",
    "BlockProblem",
    "Repetend",
    "TesselResult",
    "best_1f1b_like",
    "search_tessel",
]
