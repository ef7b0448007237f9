"""`schedlab search MODEL --backend tensorflow` and `schedlab validate RUN_DIR` of such a run:
TensorFlow's threading searched in simulation and validated in TensorFlow
(`schedlab.search.tf_search`), in a run directory of the usual layout (run.json, graph.json,
search.json, results.json; plus tf_costs.json, the cost model the search simulated with)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from schedlab.cli.common import load_profile, print_json
from schedlab.errors import SchedlabError

# flags of the torch search that mean nothing for TF's two thread pools, with their defaults
_TORCH_ONLY = {"devices": None, "machine": "host", "split_fbw": False, "reward": "simulated", "rl_iterations": None,
               "rl_samples": None, "groups": None, "storage": None, "study": None, "memory": False,
               "no_trace_calibration": False}


def run_tf_search(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schedlab.cli.search_cmd import default_run_dir
    from schedlab.io import write_json_atomic
    from schedlab.machine import detect_host
    from schedlab.search.run_dir import RunConfig, RunPaths, write_run, write_search
    from schedlab.search.tf_search import TF_COSTS_FILE, TF_SPACE, TF_STRATEGY, search_tf
    from schedlab.tf.runtime import INSTALL_HINT, tensorflow_available
    from schedlab.tf.user import require_tf_model

    given = [k for k, default in _TORCH_ONLY.items() if getattr(args, k, default) != default]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise SchedlabError(f"{flags}: not for --backend tensorflow, which searches TF's intra-op and inter-op "
                            "threads on this host's one CPU device")
    if args.strategy != "optuna" or args.space not in ("all", "placement") or args.workers != 1:
        raise SchedlabError("--backend tensorflow simulates every intra-op x inter-op setting (strategy exhaustive), "
                            "with --space placement also each split of the layers over two logical CPU devices; "
                            "drop --strategy and --workers, and give --space placement or none")
    require_tf_model(args.model, args.optimizer)
    if not tensorflow_available():
        raise SchedlabError(f"--backend tensorflow needs tensorflow; {INSTALL_HINT}")
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args).with_name(
        default_run_dir(args).name + "-tf")
    paths = RunPaths(run_dir)
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise SchedlabError(f"--run-dir {run_dir} exists and is not an empty folder; a TensorFlow search runs whole "
                            "in minutes: give a new --run-dir")
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH

    profile_path = Path(args.profile) if args.profile else DEFAULT_PROFILE_PATH
    profile = load_profile(str(profile_path))  # the machine's co-run contention and unseen kernels
    machine = detect_host()
    with tqdm(total=3, desc=f"search {args.model} (tensorflow)", unit="step", file=sys.stderr,
              disable=True if args.no_progress else None) as bar:
        def note(msg: str) -> None:
            bar.set_postfix_str(msg)
            bar.update(1)

        found = search_tf(args.model, args.size, machine, profile, optimizer=args.optimizer,
                          placement=args.space == "placement", progress=note)
    run_dir.mkdir(parents=True, exist_ok=True)
    found.graph.save(paths.graph)
    write_json_atomic(run_dir / TF_COSTS_FILE, found.costs.to_json(), indent=1)
    config = RunConfig(
        model=args.model, size=args.size, optimizer=args.optimizer, seed=args.seed,
        space=TF_SPACE + ("+placement" if args.space == "placement" else ""),
        strategy=TF_STRATEGY, study="", storage="", trials=found.summary["n_trials"],
        profile=str(profile_path.resolve()), machine=machine.to_json(), created_unix_s=time.time(), backend="tensorflow",
    )
    write_search(run_dir, found.summary)
    write_run(run_dir, config)  # last: a run.json means the search is whole
    summary = {**found.summary, "run_dir": str(run_dir)}
    if args.json:
        print_json(summary)
        return 0
    _print(args, summary, len(found.graph))
    return 0


def _ms(x: Any) -> str:
    return "     n/a" if x is None else f"{x * 1e3:8.2f}"


def _threads(t: dict[str, int]) -> str:
    devs = f", {t['cpu_devices']} CPU devices" if t.get("cpu_devices", 1) > 1 else ""
    return f"intra-op {t['intra_op'] or 'TF default'}, inter-op {t['inter_op'] or 'TF default'}{devs}"


def _print(args: argparse.Namespace, s: dict[str, Any], n_nodes: int) -> None:
    cm = s["cost_model"]
    print(f"{args.model}/{args.size} in TensorFlow ({n_nodes} executed nodes): {s['n_trials']} settings simulated "
          f"({s['trials_per_s']:.0f}/s); cost model from {len(s['calibration'])} TF runs at one inter-op thread "
          f"(node {cm['node_us']:.1f} us, Session.run {cm['session_us'] / 1e3:.2f} ms)")
    print("  predicted step time (simulated), ms:")
    for name, b in s["baselines"].items():
        print(f"    {_ms(b['predicted_step_time_s'])}  baseline {name} ({_threads(b['tf_threads'])})")
    for row in s["best"][:5]:
        split = row["plan"].get("placement", {}).get("layers") or {}
        where = f"; {row['plan']['name']} (on cpu1 from that layer)" if split else ""
        print(f"    {_ms(row['predicted_step_time_s'])}  {_threads(row['tf_threads'])}{where}")
    print(f"  run directory {s['run_dir']}  (next: schedlab validate {s['run_dir']})")


def run_tf_validate(args: argparse.Namespace, run_dir: Path, config: Any) -> int:
    from tqdm import tqdm

    from schedlab.machine import detect_host
    from schedlab.search.run_dir import RunPaths, read_search
    from schedlab.search.tf_search import validate_tf
    from schedlab.search.validate import DEFAULT_TOP

    search = read_search(run_dir)
    top = DEFAULT_TOP if args.top is None else args.top
    if top < 0 or args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        raise SchedlabError("--top and --warmup must be >= 0, --repeats and --steps >= 1")
    machine = detect_host()
    with tqdm(desc=f"validate {config.model} (tensorflow)", unit="run", file=sys.stderr,
              disable=True if args.no_progress else None) as bar:
        def note(msg: str) -> None:
            bar.set_postfix_str(msg)
            bar.update(1)

        results = validate_tf(run_dir, config, search, machine, top=top, repeats=args.repeats, steps=args.steps,
                              warmup=args.warmup, progress=note)
    results["paths"] = {"results": str(RunPaths(run_dir).results), **results["traces"]}
    if args.json:
        print_json(results)
        return 0
    from schedlab.cli.validate_cmd import print_results

    print_results(results)
    return 0


def run_tf_simulate(args: argparse.Namespace) -> int:
    """`schedlab simulate MODEL --backend tensorflow --run-dir DIR`: one TF threading setting
    predicted with the graph and cost model a TF search learnt (DIR/graph.json, tf_costs.json)."""
    import dataclasses

    from schedlab.calibrate.tf_fidelity import as_plan
    from schedlab.cli.common import TRACES_DIR, load_plan_arg, slug
    from schedlab.cli.search_cmd import default_run_dir
    from schedlab.cli.trace_tf import tf_threads_from_args
    from schedlab.graph import Graph
    from schedlab.machine import detect_host
    from schedlab.plan import resolve
    from schedlab.search.run_dir import RunPaths, read_run
    from schedlab.search.tf_search import simulate_tf

    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args).with_name(default_run_dir(args).name + "-tf")
    config = read_run(run_dir) if (run_dir / "run.json").exists() else None
    if config is None or config.backend != "tensorflow":
        raise SchedlabError(f"{run_dir} holds no TensorFlow search; simulating TF needs the cost model one learns: run "
                            f"`schedlab search {args.model} --backend tensorflow --run-dir {run_dir}` first, or give "
                            "--run-dir")
    if (config.model, config.size) != (args.model, args.size):
        raise SchedlabError(f"{run_dir} was searched for {config.model}/{config.size}, not {args.model}/{args.size}")
    machine = detect_host()
    threads = tf_threads_from_args(args)
    plan = as_plan(threads, machine.default_device.cores)
    graph = Graph.load(RunPaths(run_dir).graph)
    resolve(graph, plan, machine)  # a setting this machine cannot have fails here, by name
    user = load_plan_arg(args.plan) if args.plan else None
    if user is not None:  # its placement on TF's logical CPU devices (simulate_tf adds the transfers) and order
        plan = dataclasses.replace(plan, device=user.device, layer_devices=user.layer_devices,
                                   op_devices=user.op_devices, order=user.order)
    result, costs, graph = simulate_tf(run_dir, config, graph, machine, plan)
    step_s, session_us = costs.step_time_s(result.step_time_s), costs.session_us
    out = Path(args.out) if args.out else TRACES_DIR / (
        f"{slug(args.model)}-{args.size}-tf-i{threads.intra_op}-e{threads.inter_op}"
        + (f"-d{threads.cpu_devices}" if threads.cpu_devices > 1 else "") + ".sim.json")
    trace = dataclasses.replace(result.trace, meta={**result.trace.meta, "workload": args.model, "backend": "tensorflow",
                                             "threads": {"intra_op": threads.intra_op, "inter_op": threads.inter_op}})
    trace.save(out)
    summary = {"model": args.model, "size": args.size, "backend": "tensorflow", "run_dir": str(run_dir),
               "threads": {"intra_op": threads.intra_op, "inter_op": threads.inter_op}, "devices": threads.cpu_devices,
               "transfers": sum(1 for op in graph.ops if op.target == "tf._Recv"), "ops": len(graph),
               "predicted_step_time_s": step_s, "session_us": session_us, "trace": str(out)}
    if args.json:
        print_json(summary)
    else:
        print(f"{args.model}/{args.size} in TensorFlow ({len(graph)} nodes), {threads.describe()}  [simulated]")
        print(f"  predicted step  {step_s * 1e3:.2f} ms (Session.run's fixed {session_us / 1e3:.2f} ms included)")
        print(f"  trace           {out}")
    return 0
