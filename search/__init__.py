"""search: plans searched in the calibrated simulator, and the best validated on hardware.

    from schedlab.search import SearchSpace, Evaluator, optimize, run_search, validate_run

- `space`: Optuna trial -> Plan (``concurrency``, ``order``, ``all``)
- `objective`: a plan's simulated step time and peak memory (`Evaluator`)
- `strategies`: the seed papers' algorithms (``paper-concurrency``, ``ooo``)
- `baselines`: PyTorch's default and TensorFlow's recommended threading
- `study`: storage URLs, the shared trial budget, resume
- `workers`, `worker`: N processes on one study
- `runner`: one search end to end; `validate`: measured on the real executor
- `run_dir`: the files of a run directory (search/RUN_DIR.md)
"""

from __future__ import annotations

from schedlab.search.baselines import BASELINE_NAMES, baseline_plans
from schedlab.search.objective import Evaluation, Evaluator
from schedlab.search.run_dir import RunConfig, RunPaths, default_storage, read_run
from schedlab.search.runner import run_search, summarize
from schedlab.search.space import SPACES, OrderParams, SearchSpace, parametric_order
from schedlab.search.strategies import STRATEGY_NAMES, strategy_plans
from schedlab.search.study import create_study, open_storage, optimize
from schedlab.search.validate import validate_run

__all__ = [
    "BASELINE_NAMES",
    "SPACES",
    "STRATEGY_NAMES",
    "Evaluation",
    "Evaluator",
    "OrderParams",
    "RunConfig",
    "RunPaths",
    "SearchSpace",
    "baseline_plans",
    "create_study",
    "default_storage",
    "open_storage",
    "optimize",
    "parametric_order",
    "read_run",
    "run_search",
    "strategy_plans",
    "summarize",
    "validate_run",
]
