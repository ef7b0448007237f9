"""`python -m schedlab.search.worker RUN_DIR [--index K]`: one search worker (see search/workers.py).

Everything it needs is in the run directory: run.json (study, storage, space, trial
count, objectives, profile, machine), graph.json and, for pipeline plans, graphs/m{M}.json
(one micro-batch's step per count, written by the search before its workers start). It
needs no model capture.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError


def run_worker(run_dir: Path, index: int) -> int:
    """Run trials until the study holds run.json's trial count; returns how many this worker completed."""
    from schedlab.calibrate.profile import Profile
    from schedlab.graph import Graph
    from schedlab.machine import Machine
    from schedlab.search.micro_graphs import MicroGraphs
    from schedlab.search.objective import Evaluator
    from schedlab.search.run_dir import RunPaths, read_run, storage_url
    from schedlab.search.runner import sampler_seed
    from schedlab.search.schedule_space import MicroBatchEvaluator, searches_pipelines
    from schedlab.search.space import make_space
    from schedlab.search.strategies import OPTUNA
    from schedlab.search.study import load_study, make_sampler, open_storage, optimize

    config = read_run(run_dir)
    if config.strategy != OPTUNA:
        raise SchedlabError(f"workers run Optuna trials; run.json asks for strategy {config.strategy!r}")
    graph = Graph.load(RunPaths(run_dir).graph)
    machine = Machine.from_json(config.machine)
    cost = Profile.load(config.profile, machine=machine, check_machine=False)
    storage = open_storage(storage_url(run_dir, config))
    study = load_study(storage, config.study, make_sampler(config.objectives, 0))
    sampler = make_sampler(config.objectives, sampler_seed(config.seed, index + 1, len(study.get_trials(deepcopy=False))))
    space = make_space(config.space, graph, machine, cost, split_fbw=config.split_fbw)
    evaluator: Any = Evaluator(graph, machine, cost)
    if searches_pipelines(config.space, machine):  # the search wrote each micro-batch count's graph
        evaluator = MicroBatchEvaluator(MicroGraphs(run_dir, graph), machine, cost)
    return optimize(study, storage, space, evaluator, config.objectives, config.trials, sampler=sampler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedlab.search.worker", description=run_worker.__doc__)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--index", type=int, default=0, help="worker number (seeds its sampler)")
    args = parser.parse_args(argv)
    try:
        n = run_worker(args.run_dir, args.index)
    except SchedlabError as e:
        print(f"search worker {args.index}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"search worker {args.index}: {n} trial(s) completed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
