"""Read what a placement search (`schedlab search MODEL --space placement`) leaves in its
run directory, for the placement figures. Reads only.

A placement run is a run directory (search/RUN_DIR.md) whose run.json says
`"space": "placement"` (or whose search.json lists a placement strategy); its `"machine"`
is the machine the placement was searched on (`dgx-8gpu[:4]`, `host-2ranks`, ...), which
may differ from the host validate measured on.
Beside the usual files it holds:

- search.json "strategies": `{name: {"best_predicted_step_time_s", "trials", "wall_s"}}`
  for each placement strategy run into the directory, and "best" (fastest first) with
  each entry's "strategy" and "plan";
- `rl/curve.json` when the RL placer ran: its training curve (`load_rl_curve`), as
  search/placement/rl_run.py writes it (a step time is null until a sampled placement fits).

Anything missing or malformed is one `PlacementDataError` naming the file and the command
that writes it; the figures turn it into the reason they were not drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.io import read_json
from schedlab.machine import Machine
from schedlab.plan import Plan
from schedlab.reports.load import RUN_JSON, SEARCH_JSON, Measured, RunData

PLACEMENT_SPACE = "placement"
RL_CURVE_JSON = "rl/curve.json"
RL_CURVE_SCHEMA = "schedlab.rl_curve"
RL_CURVE_VERSION = 1
REWARDS = ("simulated", "measured")
# The order strategies are shown in: the human split first, Baechi's three, then the learners.
STRATEGY_ORDER = ("layers", "m-topo", "m-etf", "m-sct", "rl", "optuna")
PLACEMENT_ONLY_STRATEGIES = STRATEGY_ORDER[:-1]  # optuna searches every space

_SEARCH_HINT = "schedlab search MODEL --space placement --devices N --strategy STRATEGY --run-dir {dir}"
_RL_HINT = "schedlab search MODEL --space placement --devices N --strategy rl --run-dir {dir}"


class PlacementDataError(SchedlabError):
    """A placement run's file is missing or malformed; the message says which and how to rewrite it."""


def run_space(run: RunData) -> str:
    return str(run.run.get("space") or "")


def is_placement_run(run: RunData) -> bool:
    """Whether the run searched placements: run.json's space is "placement" (or a "+"-joined
    space naming it), or search.json lists a strategy that only places ops on devices (a
    placement strategy run in the "all" space)."""
    if PLACEMENT_SPACE in run_space(run).split("+"):
        return True
    strategies = (run.search or {}).get("strategies")
    return isinstance(strategies, dict) and any(s in PLACEMENT_ONLY_STRATEGIES for s in strategies)


def require_placement_run(run: RunData) -> None:
    """PlacementDataError, saying what the run is, unless it searched placements."""
    if not is_placement_run(run):
        space = run_space(run) or "not given"
        raise PlacementDataError(
            f"not a placement search ({RUN_JSON} space: {space}); run `{_SEARCH_HINT.format(dir=run.path)}`"
        )


def searched_machine(run: RunData) -> Machine:
    """The machine the placement was searched on (run.json "machine"); for a TensorFlow run,
    the logical CPU devices of one TF process on it that the best plans place onto."""
    try:
        host = Machine.from_json(run.run.get("machine"))
    except SchedlabError as e:
        raise PlacementDataError(f"{RUN_JSON} holds no readable machine: {e}") from None
    if not is_tf_run(run):
        return host
    from schedlab.tf.placement import plan_devices, tf_cpu_machine

    n = max((plan_devices(e.plan) for e in best_entries(run)), default=1)
    return tf_cpu_machine(n, host.default_device.cores)


def is_tf_run(run: RunData) -> bool:
    return run.run.get("backend") == "tensorflow"


def machine_label(machine: Machine) -> str:
    """e.g. "dgx-8gpu[:2] (gpu0, gpu1)"."""
    ids = [d.id for d in machine.devices]
    shown = ", ".join(ids) if len(ids) <= 8 else f"{', '.join(ids[:4])}, ... {ids[-1]}"
    return f"{machine.name} ({shown})"


def strategy_sort_key(name: str) -> tuple[int, str]:
    return (STRATEGY_ORDER.index(name) if name in STRATEGY_ORDER else len(STRATEGY_ORDER), name)


# ---- search.json: one summary per strategy ----------------------------------------------


@dataclass(frozen=True)
class BestEntry:
    """One of search.json's "best" plans."""

    rank: int  # position in search.json "best" (0: the fastest of the whole search)
    trial: int | None
    strategy: str
    plan: Plan
    predicted_s: float


@dataclass(frozen=True)
class StrategyResult:
    """What one placement strategy found, as search.json and results.json record it."""

    name: str
    best_predicted_s: float  # simulated step time of its best placement
    trials: int
    wall_s: float | None  # search wall time; None where the study did not record it
    best: BestEntry | None  # its fastest plan in search.json "best", if listed
    measured: Measured | None  # its validated candidate with the lowest prediction, if any


def search_json(run: RunData) -> dict[str, Any]:
    if run.search is None:
        why = run.problems.get(SEARCH_JSON, f"{SEARCH_JSON} missing")
        raise PlacementDataError(f"{why} (written by `{_SEARCH_HINT.format(dir=run.path)}`)")
    return run.search


def best_entries(run: RunData) -> tuple[BestEntry, ...]:
    """search.json "best", fastest first, each with its plan parsed."""
    raw = search_json(run).get("best") or []
    if not isinstance(raw, list):
        raise PlacementDataError(f"corrupt {run.path / SEARCH_JSON}: \"best\" must be a list")
    out = []
    for i, b in enumerate(raw):
        try:
            trial = b.get("trial")
            out.append(BestEntry(
                rank=i,
                trial=None if trial is None else int(trial),
                strategy=str(b.get("strategy") or "?"),
                plan=Plan.from_json(b["plan"]),
                predicted_s=_positive(b["predicted_step_time_s"], "predicted_step_time_s"),
            ))
        except (KeyError, TypeError, ValueError, AttributeError, SchedlabError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise PlacementDataError(f"corrupt {run.path / SEARCH_JSON}: bad best[{i}]: {detail}") from None
    return tuple(out)


def strategy_results(run: RunData) -> tuple[StrategyResult, ...]:
    """One StrategyResult per strategy of search.json "strategies", in STRATEGY_ORDER."""
    raw = search_json(run).get("strategies")
    if not isinstance(raw, dict) or not raw:
        raise PlacementDataError(
            f"{run.path / SEARCH_JSON} lists no strategies (written by `{_SEARCH_HINT.format(dir=run.path)}`)"
        )
    best = best_entries(run)
    out = []
    for name in sorted(raw, key=strategy_sort_key):
        s = raw[name]
        try:
            wall = None if s.get("wall_s") is None else float(s["wall_s"])
            if wall is not None and not (math.isfinite(wall) and wall >= 0):
                raise ValueError(f"wall_s must be a non-negative number of seconds, got {s['wall_s']!r}")
            result = StrategyResult(
                name=str(name),
                best_predicted_s=_positive(s["best_predicted_step_time_s"], "best_predicted_step_time_s"),
                trials=int(s["trials"]),
                wall_s=wall,
                best=next((b for b in best if b.strategy == name), None),
                measured=strategy_measured(run, str(name)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise PlacementDataError(f"corrupt {run.path / SEARCH_JSON}: bad strategies[{name!r}]: {detail}") from None
        out.append(result)
    return tuple(out)


def strategy_measured(run: RunData, strategy: str) -> Measured | None:
    """The validated candidate of `strategy` the search ranked first (lowest prediction;
    the faster measured on a tie), or None when validate measured none of its plans cleanly."""
    mine = [m for m in run.results.candidates if m.strategy == strategy]
    return min(mine, key=lambda m: (math.inf if m.predicted_s is None else m.predicted_s, m.measured_s), default=None)


def _positive(x: Any, what: str) -> float:
    v = float(x)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {x!r}")
    return v


# ---- rl/curve.json ------------------------------------------------------------------------


@dataclass(frozen=True)
class RlPoint:
    """One policy-gradient iteration of the RL placer."""

    iteration: int
    mean_reward: float
    mean_step_time_s: float | None  # over the iteration's feasible samples; None if none was feasible
    best_step_time_s: float | None  # best so far; None until a sampled placement was feasible
    entropy: float  # of the placement policy (nats per decision)
    feasible_share: float  # share of the samples that fit memory
    wall_s: float


@dataclass(frozen=True)
class RlCurve:
    path: Path
    config: dict[str, Any]  # groups, iterations, samples, lr, entropy, baseline_decay, seed
    reward: str  # "simulated" or "measured": what the step times (and rewards) are
    points: tuple[RlPoint, ...]  # by iteration
    best_step_time_s: float | None  # None: no sampled placement was feasible
    evaluations: int | None = None  # distinct placements whose reward was computed


def load_rl_curve(run_dir: Path) -> RlCurve:
    """rl/curve.json of a run directory; PlacementDataError when missing or malformed."""
    path = run_dir / RL_CURVE_JSON
    hint = _RL_HINT.format(dir=run_dir)
    if not path.is_file():
        raise PlacementDataError(f"{RL_CURVE_JSON} missing (the RL placer did not run here: `{hint}`)")
    try:
        d = read_json(path, what="RL curve")
    except SchedlabError as e:
        raise PlacementDataError(f"{e} (re-run `{hint}`)") from None
    where = "file"
    try:
        if not isinstance(d, dict) or d.get("schema") != RL_CURVE_SCHEMA:
            raise ValueError(f'not a {RL_CURVE_SCHEMA} file (expected "schema": "{RL_CURVE_SCHEMA}")')
        if d.get("version") != RL_CURVE_VERSION:
            raise ValueError(f"version {d.get('version')!r} is not supported (expected {RL_CURVE_VERSION})")
        where = "reward"
        reward = d.get("reward")
        if reward not in REWARDS:
            raise ValueError(f"must be one of {list(REWARDS)}, got {reward!r}")
        where = "config"
        config = d.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError("must be an object")
        where = "curve"
        raw = d["curve"]
        if not isinstance(raw, list) or not raw:
            raise ValueError("must be a non-empty list of iterations")
        points = []
        for i, p in enumerate(raw):
            where = f"curve[{i}]"
            mean, best_p = p.get("mean_step_time_s"), p.get("best_step_time_s")
            points.append(RlPoint(
                iteration=int(p["iteration"]),
                mean_reward=_finite(p["mean_reward"], "mean_reward"),
                mean_step_time_s=None if mean is None else _positive(mean, "mean_step_time_s"),
                best_step_time_s=None if best_p is None else _positive(best_p, "best_step_time_s"),
                entropy=_finite(p["entropy"], "entropy"),
                feasible_share=_finite(p["feasible_share"], "feasible_share"),
                wall_s=_finite(p["wall_s"], "wall_s"),
            ))
        where = "best_step_time_s"
        best = None if d.get("best_step_time_s") is None else _positive(d["best_step_time_s"], "best_step_time_s")
        evaluations = d.get("evaluations")
        evaluations = None if evaluations is None else int(evaluations)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise PlacementDataError(f"corrupt {path}: bad {where}: {detail} (re-run `{hint}`)") from None
    return RlCurve(
        path=path, config=dict(config), reward=str(reward), points=tuple(sorted(points, key=lambda q: q.iteration)),
        best_step_time_s=best, evaluations=evaluations,
    )


def _finite(x: Any, what: str) -> float:
    if isinstance(x, bool):
        raise ValueError(f"{what} must be a number, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {x!r}")
    return v
