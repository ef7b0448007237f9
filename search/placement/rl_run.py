"""The ``rl`` placement strategy inside a run directory: train, keep the curve, resume.

`run_rl` trains the grouper-placer (`search.placement.rl.train_placer`) with a reward from
the simulator (the Evaluator of the search) or, with ``--reward measured``, from the real
executor, and keeps in the run directory:

- ``rl/checkpoint.pt``: the training state after every iteration (written atomically), so
  a search killed at any point resumes where it stopped with nothing lost;
- ``rl/curve.json``: the training curve (schema ``schedlab.rl_curve``), which the report
  draws.

The configuration of a resumed training must equal the stored one (another
``--rl-iterations`` may extend it): the curve would otherwise mix two trainings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.io import read_json, write_json_atomic
from schedlab.plan import Plan
from schedlab.search.placement.problem import PlacementProblem
from schedlab.search.placement.rl import RLConfig, RLResult, train_placer
from schedlab.search.placement.space import base_plan

CURVE_SCHEMA = "schedlab.rl_curve"
CURVE_VERSION = 1
REWARDS = ("simulated", "measured")


def rl_dir(run_dir: Path) -> Path:
    return run_dir / "rl"


def curve_path(run_dir: Path) -> Path:
    return rl_dir(run_dir) / "curve.json"


def checkpoint_path(run_dir: Path) -> Path:
    return rl_dir(run_dir) / "checkpoint.pt"


def _same_training(a: RLConfig, b: RLConfig) -> bool:
    return replace(a, iterations=0) == replace(b, iterations=0)


def run_rl(
    run_dir: Path,
    problem: PlacementProblem,
    step_time_s: Callable[[Plan], float],
    config: RLConfig,
    *,
    reward: str = "simulated",
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Plan, RLResult]:
    """Train (or resume) RL placement in `run_dir`; the best plan found and the result."""
    if reward not in REWARDS:
        raise SchedlabError(f"unknown --reward {reward!r}; use one of: {', '.join(REWARDS)}")
    curve_file = curve_path(run_dir)
    if curve_file.exists():
        old = read_json(curve_file, what="RL curve")
        try:
            old_config = RLConfig(**old["config"])
        except (KeyError, TypeError) as e:
            raise SchedlabError(f"corrupt {curve_file}: {e}") from None
        if not _same_training(old_config, config) or old.get("reward") != reward:
            raise SchedlabError(
                f"{run_dir} holds an RL training with {asdict(old_config)} and a {old.get('reward')} reward; "
                f"this one asks for {asdict(config)} and a {reward} reward: use another --run-dir"
            )
    rl_dir(run_dir).mkdir(parents=True, exist_ok=True)
    base = base_plan()

    def reward_time(group_device: list[int]) -> float:
        return step_time_s(problem.to_plan(group_device, base, name="rl"))

    result = train_placer(problem, reward_time, config, checkpoint=checkpoint_path(run_dir), progress=progress)
    write_json_atomic(curve_file, curve_json(result, reward), indent=1)
    return problem.to_plan(result.group_device, base, name="rl"), result


def curve_json(result: RLResult, reward: str) -> dict[str, Any]:
    best = result.step_time_s
    return {
        "schema": CURVE_SCHEMA,
        "version": CURVE_VERSION,
        "config": asdict(result.config),
        "reward": reward,
        "curve": result.curve,
        "best_step_time_s": best if math.isfinite(best) else None,
        "evaluations": result.evaluations,
    }
