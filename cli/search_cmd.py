"""`schedlab search`: search plans for a model in simulation with Optuna or a seed strategy.

    schedlab search transformer                          # Optuna, --space all, 200 trials
    schedlab search nmt --strategy ooo --run-dir runs/nmt
    schedlab search mlp --size tiny --trials 500 --workers 2 --memory --json
    schedlab search transformer --space placement --devices 2 --strategy m-etf   # this host's 2 ranks
    schedlab search nmt --space placement --machine dgx-8gpu --devices 4 --strategy rl --json
    schedlab search transformer --space schedule --devices 2 --trials 40   # pipeline schedules
    schedlab search transformer --devices 2 --trials 80   # placements and pipelines, with concurrency
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from schedlab.cli.common import add_cache_arg, add_model_args, load_profile, print_json, slug
from schedlab.errors import SchedlabError

DEFAULT_TRIALS = 200


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from schedlab.machine import PRESETS
    from schedlab.search.placement.strategies import PLACEMENT_STRATEGIES
    from schedlab.search.space import SPACES
    from schedlab.search.strategies import STRATEGY_NAMES

    p = sub.add_parser(
        "search",
        help="search plans in simulation (Optuna, or a seed paper's algorithm)",
        description="Capture MODEL's training step and search plans for this host in the calibrated "
        "simulator: co-run slots and intra-op threads (--space concurrency), op order (order) or both "
        "(all). Strategies: Optuna's samplers (TPE; NSGA-II with --memory), the concurrency-control "
        "paper's model-guided scheduler (paper-concurrency) or out-of-order backprop's reordering "
        "(ooo). --space placement searches which device runs each layer's ops, on --devices N local ranks "
        "of this host or a --machine preset: the placement paper's RL grouper-placer (rl), Baechi's "
        "heuristics (m-topo, m-etf, m-sct), the expert layer split (layers) or Optuna. --space schedule "
        "pipelines the model over the devices and searches the schedule (gpipe, 1f1b, interleaved:2-4, "
        "looped-bfs, zb-h1, zb-h2, zbv, ooo, and tessel: Tessel's repetend search on the model's stages), "
        "the micro-batch count and the stage cuts; on several devices "
        "--space all searches placements and pipelines together, each with every device's slots and "
        "threads. PyTorch's default and TensorFlow's recommended threading are always evaluated. The "
        "study resumes where it stopped; run again with another --strategy into the same --run-dir to "
        "compare strategies. Writes run.json, graph.json, study.db and search.json into the run directory.",
    )
    add_model_args(p)
    add_cache_arg(p)
    p.add_argument("--space", choices=SPACES, default="all", help="what to search (default all)")
    p.add_argument(
        "--trials", type=int, default=DEFAULT_TRIALS,
        help=f"COMPLETE trials the study should hold for this strategy and space (default {DEFAULT_TRIALS}); "
        "seed strategies stop at their own few candidates",
    )
    p.add_argument("--strategy", choices=(*STRATEGY_NAMES, *PLACEMENT_STRATEGIES), default="optuna",
                   help="search strategy (default optuna); rl, m-topo, m-etf, m-sct and layers place ops (--space placement)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="placement over N devices: N local ranks of this host (processes that split its cores), "
                   "or with --machine the preset's first N devices")
    p.add_argument("--machine", default="host", metavar="MACHINE",
                   help=f"where plans run: 'host' (this machine, default) or a preset ({', '.join(PRESETS)}) or a "
                   "machine JSON file; a preset is simulated only")
    p.add_argument("--split-fbw", action="store_true",
                   help="placement groups split each layer's forward, backward (B, W) and optimizer work apart "
                   "(default: a layer's work stays on one device)")
    p.add_argument("--reward", choices=("simulated", "measured"), default="simulated",
                   help="rl: reward from the simulator (default) or from real runs on this host's ranks, as the paper")
    p.add_argument("--rl-iterations", type=int, default=None, metavar="K",
                   help="rl: policy-gradient iterations (default 80); more extends a stored training")
    p.add_argument("--rl-samples", type=int, default=None, metavar="B",
                   help="rl: placements sampled per iteration (default 16)")
    p.add_argument("--groups", type=int, default=None, metavar="G",
                   help="rl: groups of the grouper (default: min(16, co-location groups))")
    p.add_argument(
        "--storage", default=None, metavar="URL",
        help="Optuna storage URL, e.g. postgresql://user:pw@host/db (default: sqlite file RUN_DIR/study.db)",
    )
    p.add_argument("--study", default=None, metavar="NAME", help="study name (default MODEL-SIZE-OPTIMIZER)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes on the study (default 1)")
    p.add_argument("--run-dir", default=None, metavar="DIR", help="run directory (default runs/MODEL-SIZE-OPTIMIZER)")
    p.add_argument(
        "--profile", default=None, metavar="PROFILE",
        help="calibrated cost model (default traces/profile.json; make one with `schedlab calibrate --quick`)",
    )
    p.add_argument(
        "--memory", action="store_true",
        help="two objectives: step time and peak memory (NSGA-II); search.json then lists the Pareto front",
    )
    p.add_argument(
        "--no-trace-calibration", action="store_true",
        help="search with the profile alone, without first timing a few real steps of MODEL "
        "(the trace-calibrated profile is kept as RUN_DIR/profile.json)",
    )
    p.add_argument(
        "--backend", choices=("torch", "tensorflow"), default="torch",
        help="the runtime to find a plan for: torch (schedlab's executor, default) or tensorflow (TF's intra-op x "
        "inter-op threads, every setting simulated on a cost model from TF's own traces; validate measures the "
        "best in TensorFlow beside TF's recommended and default threading)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print search.json's content (plus the run directory)")
    p.set_defaults(handler=run)


def default_run_dir(args: argparse.Namespace) -> Path:
    return Path("runs") / slug(f"{args.model}-{args.size}-{args.optimizer}")


def run(args: argparse.Namespace) -> int:
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH, Profile
    from schedlab.graph import Graph
    from schedlab.machine import detect_host
    from schedlab.search.run_dir import RunConfig, RunPaths, default_storage, read_run, storage_url
    from schedlab.search.runner import run_search

    if args.backend == "tensorflow":
        from schedlab.cli.search_tf import run_tf_search

        return run_tf_search(args)
    if args.trials < 1:
        raise SchedlabError("--trials must be >= 1")
    if args.workers < 1:
        raise SchedlabError("--workers must be >= 1")
    if args.workers > 1 and args.strategy != "optuna":
        raise SchedlabError(f"--workers runs Optuna trials in parallel; strategy {args.strategy} runs in one process")
    if args.devices is not None and args.devices < 1:
        raise SchedlabError(f"--devices must be >= 1, got {args.devices}")
    if any(v is not None and v < 1 for v in (args.rl_iterations, args.rl_samples, args.groups)):
        raise SchedlabError("--rl-iterations, --rl-samples and --groups must be >= 1")
    profile_path = Path(args.profile) if args.profile else DEFAULT_PROFILE_PATH
    if not profile_path.exists():
        raise SchedlabError(
            f"no calibrated profile at {profile_path}: run `make calibrate` (or `schedlab calibrate --quick` "
            "for a short one), or give --profile PROFILE"
        )
    profile = load_profile(str(profile_path))  # a machine mismatch is one warning line
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args)
    if run_dir.exists() and not run_dir.is_dir():
        raise SchedlabError(f"--run-dir {run_dir} is a file; give a folder (new or of an earlier search)")
    if args.storage:  # a bad URL or a missing driver fails now, before anything is captured or written
        from schedlab.search.study import open_storage

        open_storage(args.storage)
    paths = RunPaths(run_dir)
    objectives = ("time", "memory") if args.memory else ("time",)
    old = read_run(run_dir) if paths.run.exists() else None
    if old is not None:
        mine = (args.model, args.size, args.optimizer, args.seed, objectives)
        theirs = (old.model, old.size, old.optimizer, old.seed, old.objectives)
        if mine != theirs:
            raise SchedlabError(
                f"{run_dir} holds a search of {_describe(*theirs)}, not {_describe(*mine)}; use another --run-dir"
            )
        where = (args.machine, args.devices, args.split_fbw)
        if where != (old.machine_spec, old.devices, old.split_fbw):
            raise SchedlabError(
                f"{run_dir} was searched on --machine {old.machine_spec} --devices {old.devices}"
                f"{' --split-fbw' if old.split_fbw else ''}; this search asks for --machine {args.machine} "
                f"--devices {args.devices}{' --split-fbw' if args.split_fbw else ''}: use another --run-dir"
            )
    host = detect_host()
    machine, baseline_machine = search_machine(args.machine, args.devices, profile, host)
    if args.space == "schedule":  # before anything is captured or written
        from schedlab.search.runner import check_schedule_search

        check_schedule_search(machine, args.strategy)
    run_profile = paths.profile
    if old is not None and paths.graph.exists():
        graph = Graph.load(paths.graph)  # resuming: the captured graph is already there
        if run_profile.exists():  # and so is the profile every trial of it was simulated with
            profile_path, profile = run_profile, Profile.load(run_profile, check_machine=False)
    else:
        from schedlab.cli.common import capture_model

        _, captured = capture_model(args, cache=not args.no_cache)
        graph = captured.graph
        if not args.no_trace_calibration:
            # Trace-driven calibration: a few real steps of this very graph teach the
            # profile what each op costs here (fidelity: ~6% MAPE with it), in two rounds
            # that alternate the thread counts so a slow spell cannot decide one count alone.
            from schedlab.calibrate.trace_cal import calibrate_with_traces

            print(f"schedlab search: timing a few steps of {args.model} to calibrate the simulator", file=sys.stderr)
            from schedlab.search.placement.space import calibration_order

            profile = calibrate_with_traces(profile, graph, captured.input_values, host, steps=2, rounds=2,
                                            one_thread_order=calibration_order(args.space, len(machine.devices)))
            profile = _calibrate_micro_batches(args, profile, graph, machine)
            profile_path = profile.save(run_profile)
    storage = args.storage or (storage_url(run_dir, old) if old else default_storage(run_dir))
    study = args.study or (old.study if old else slug(f"{args.model}-{args.size}-{args.optimizer}"))
    config = RunConfig(
        model=args.model,
        size=args.size,
        optimizer=args.optimizer,
        seed=args.seed,
        space=args.space,
        strategy=args.strategy,
        study=study,
        storage=storage,
        trials=args.trials,
        profile=str(profile_path.resolve()),
        machine=machine.to_json(),
        created_unix_s=old.created_unix_s if old else time.time(),
        objectives=objectives,
        devices=args.devices,
        machine_spec=args.machine,
        split_fbw=args.split_fbw,
    )
    rl = rl_options(args, config, machine, profile)
    summary = run_search(
        run_dir, config, graph, machine, profile, workers=args.workers, progress=not args.no_progress,
        baseline_machine=baseline_machine, rl=rl, graph_of=micro_graphs(args),
    )
    summary["run_dir"] = str(run_dir)
    summary["paths"] = {
        "run": str(paths.run), "graph": str(paths.graph), "search": str(paths.search), "study": storage,
    }
    if args.json:
        print_json(summary)
    else:
        _print_summary(args, summary, len(graph))
    return 0


def _calibrate_micro_batches(args: argparse.Namespace, profile: Any, graph: Any, machine: Any) -> Any:
    """`profile` plus the op times of one micro-batch's step for each micro-batch count the
    search's pipeline plans have (none outside `searches_pipelines`, nor for a model
    ``--space all`` places only), run in one process pinned to one core as a rank runs it
    (`calibrate.rank_fidelity.trace_calibrated`): a pipeline plan's ops are these."""
    from schedlab.calibrate.rank_fidelity import trace_calibrated
    from schedlab.search.schedule_space import searched_shapes

    shapes = [s for s in searched_shapes(args.space, graph, machine, profile) if s != (1, 1)]
    if not shapes:
        return profile
    counts: dict[int, list[str]] = {}
    for r, m in shapes:
        counts.setdefault(r, []).append(str(m))
    named = "; ".join(f"{', '.join(ms)} micro-batch{'' if ms == ['1'] else 'es'}"
                      + ("" if r == 1 else f" of each of {r} replicas") for r, ms in counts.items())
    print(f"schedlab search: timing one micro-batch's step of {args.model} for {named}", file=sys.stderr)
    return trace_calibrated(profile, _steps(args), shapes, steps=3)


def _steps(args: argparse.Namespace) -> Any:
    """(replicas, micro-batches) -> the model's step for a plan of those (`plan_steps_of`,
    through the graph cache unless --no-cache)."""
    from schedlab.cli.common import plan_steps_of

    return plan_steps_of(args.model, args.size, args.optimizer, args.seed, cache=not args.no_cache)


def micro_graphs(args: argparse.Namespace) -> Any:
    """(M, R) -> the graph a plan of M micro-batches and R replicas of the model resolves
    against (one replica's micro-batch step)."""
    step_of = _steps(args)
    return lambda micro_batches, replicas=1: step_of(replicas, micro_batches).graph


def search_machine(spec: str, devices: int | None, profile: Any, host: Any) -> tuple[Any, Any]:
    """(the machine plans are simulated on, the machine of the baselines or None: the same).
    This host as N local ranks has the Profile's fitted links, and its baselines are the one-
    process ones on the whole host; a preset or file is simulated as described."""
    from schedlab.calibrate.links import apply_link_fit
    from schedlab.machine import host_ranks, load_machine

    if spec == "host":
        if devices is None or devices == 1:
            return host, None
        return apply_link_fit(host_ranks(devices, host), profile), host
    return apply_link_fit(load_machine(spec, devices), profile), None


def rl_options(args: argparse.Namespace, config: Any, machine: Any, profile: Any) -> Any:
    """The rl strategy's training and reward (None for other strategies)."""
    if args.strategy != "rl":
        return None
    from schedlab.exec import DEFAULT_TIMEOUT_S
    from schedlab.search.placement.rl import RLConfig
    from schedlab.search.runner import RLOptions

    given = {"iterations": args.rl_iterations, "samples": args.rl_samples}
    rl_config = RLConfig(groups=args.groups, seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    measure = None
    if args.reward == "measured":
        if args.machine != "host" or not args.devices:
            raise SchedlabError("--reward measured runs placements on this host's local ranks: give --devices N "
                                "without --machine (a preset can only be simulated)")
        from schedlab.search.placement.validate import measured_reward

        measure = measured_reward(config, machine, profile, timeout_s=DEFAULT_TIMEOUT_S)
    return RLOptions(config=rl_config, reward=args.reward, measure=measure)


def _describe(model: str, size: str, optimizer: str, seed: int, objectives: tuple[str, ...]) -> str:
    return f"{model}/{size}/{optimizer} seed {seed} ({' and '.join(objectives)})"


def _ms(x: Any) -> str:
    return "   n/a  " if x is None else f"{x * 1e3:8.2f}"


def _print_summary(args: argparse.Namespace, s: dict[str, Any], n_ops: int) -> None:
    print(
        f"{args.model}/{args.size} ({n_ops} ops): {s['new_trials']} new trial(s) of {s['strategy']} "
        f"({s['trials_per_s']:.1f} trials/s), study holds {s['n_trials']} complete"
    )
    print("  predicted step time (simulated), ms:")
    for name, b in s["baselines"].items():
        print(f"    {_ms(b['predicted_step_time_s'])}  baseline {name}")
    for name, st in s["strategies"].items():
        print(f"    {_ms(st['best_predicted_step_time_s'])}  best of {name} ({st['trials']} trials)")
    if s["best"]:
        from schedlab.plan import Plan

        b = s["best"][0]
        print(f"  best: trial {b['trial']} ({b['strategy']}): {Plan.from_json(b['plan']).describe()}")
    print(f"  run directory {s['run_dir']}  (next: schedlab validate {s['run_dir']})")
