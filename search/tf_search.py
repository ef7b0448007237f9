"""Search and validation of TensorFlow's threading: `schedlab search|validate --backend tensorflow`.

What TensorFlow lets a user choose on one CPU device is its two pools: intra-op threads
(per kernel) and inter-op threads (kernels side by side), both fixed at start-up. The
search space is every pair of 1..cores each, small enough to simulate all of it
(`strategy` "exhaustive": cores x cores settings, one warm simulation each), so no sampler
is needed:

1. calibration: TensorFlow runs the step at one inter-op thread with 1 and all cores of
   intra-op threads (fresh processes); its traces give the cost model (`calibrate.tf_costs`);
2. search: every setting is simulated on the graph TF executed (`calibrate.tf_fidelity.predict_tf`'s
   model, one Simulator reused), and search.json lists the best, beside TensorFlow's
   recommended threading (intra-op = physical cores, inter-op = sockets) and TF's default;
3. validation: the top settings and both baselines run in TensorFlow, round-robin, one
   fresh process per setting and round; results.json has the torch search's layout.

A setting is stored as the schedlab Plan it is simulated as (slots = inter-op, threads =
intra-op) with its `tf_threads` beside it.

With `--space placement`, every setting is also simulated with each contiguous split of
the layers over two logical CPU devices (`layer_splits`): the graph gets TF's `_Send` /
`_Recv` pair on every edge between the devices (`schedlab.tf.placement.with_transfers`)
and runs on the one physical CPU, the devices' pools sharing its cores. Validation runs a
placed winner placed (`TFRequest.plan`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.calibrate.profile import Profile
from schedlab.calibrate.tf_costs import TFCalibrationRun, TFCosts, tf_costs
from schedlab.calibrate.tf_fidelity import as_plan
from schedlab.errors import SchedlabError
from schedlab.exec.tf_job import TFRequest, TFResult
from schedlab.exec.tf_launch import DEFAULT_TF_TIMEOUT_S, run_tf_worker
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve
from schedlab.search.baselines import TENSORFLOW_RECOMMENDED, tensorflow_recommended
from schedlab.tf.placement import place_for_tf
from schedlab.tf.plan_map import tf_threads_for_plan
from schedlab.tf.runtime import TFThreads

TF_SPACE = "tf-threading"
TF_STRATEGY = "exhaustive"
TF_RECOMMENDED = TENSORFLOW_RECOMMENDED
TF_DEFAULT = "tensorflow-default"
TOP_LISTED = 10
TF_COSTS_FILE = "tf_costs.json"


def tf_settings(cores: int) -> list[TFThreads]:
    """Every (intra-op, inter-op) pair of 1..cores each."""
    return [TFThreads(intra, inter) for intra in range(1, cores + 1) for inter in range(1, cores + 1)]


def tf_baselines(machine: Machine) -> dict[str, TFThreads]:
    """TensorFlow's recommended threading (the torch search's baseline of that name, run in
    TF itself) and its default (0, 0: TF chooses)."""
    return {TF_RECOMMENDED: tf_threads_for_plan(tensorflow_recommended(machine)), TF_DEFAULT: TFThreads(0, 0)}


def threads_json(t: TFThreads) -> dict[str, int]:
    return {"intra_op": t.intra_op, "inter_op": t.inter_op, **({"cpu_devices": t.cpu_devices} if t.cpu_devices > 1 else {})}


def threads_from_json(d: Any) -> TFThreads:
    try:
        return TFThreads(int(d["intra_op"]), int(d["inter_op"]), int(d.get("cpu_devices", 1)))
    except (KeyError, TypeError, ValueError) as e:
        raise SchedlabError(f"corrupt tf_threads in search.json: {type(e).__name__}: {e}") from None


def layer_groups(graph: Graph) -> list[str]:
    """The graph's layers grouped, in forward order (`schedlab.layer_split.layers_in_order`):
    a layer's first name, with its index where the second is one ("blocks.2.attn.qkv" ->
    "blocks.2", "head" -> "head")."""
    from schedlab.layer_split import layers_in_order

    out: dict[str, None] = {}
    for layer in layers_in_order(graph):
        parts = layer.split(".")
        out.setdefault(".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0], None)
    return list(out)


def layer_splits(graph: Graph) -> list[dict[str, str]]:
    """Every cut of the layer groups into a first part on cpu0 and the rest on cpu1: the
    placements a TF search tries on two logical CPU devices (the expert's contiguous split)."""
    groups = layer_groups(graph)
    return [{g: "cpu1" for g in groups[k:]} for k in range(1, len(groups))]


def _tf_plan(t: TFThreads, cores: int, name: str | None = None) -> Plan:
    """The Plan a setting is simulated as; TF's own default intra-op count stays unnamed
    (threads None: all cores), so it is measured as TF's default, not as a searched pair."""
    plan = as_plan(t, cores)
    return Plan(slots=plan.slots, threads=None if t.intra_op == 0 else plan.threads, name=name or plan.name)


@dataclass(frozen=True)
class TFSearch:
    summary: dict[str, Any]  # search.json
    graph: Graph  # what TF executed at all cores of intra-op threads
    costs: TFCosts


def search_tf(
    model: str,
    size: str,
    machine: Machine,
    base: Profile | None,
    *,
    optimizer: str = "sgd",
    steps: int = 5,
    placement: bool = False,
    timeout_s: float = DEFAULT_TF_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> TFSearch:
    """Calibrate on TensorFlow's own traces, then simulate every setting (module docstring);
    with `placement`, every setting also with each `layer_splits` cut on two CPU devices."""
    from schedlab.sim import Simulator

    t0 = time.perf_counter()
    cores = machine.default_device.cores
    runs: list[TFCalibrationRun] = []
    calibration: list[dict[str, Any]] = []
    for intra in sorted({1, cores}):
        t = TFThreads(intra, 1)
        if progress is not None:
            progress(f"calibrating: {model} in TensorFlow at {t.describe()}")
        res = run_tf_worker(TFRequest(workload=model, size=size, threads=t, steps=steps, warmup=1, optimizer=optimizer),
                            timeout_s=timeout_s)
        runs.append(TFCalibrationRun(res.graph, res.trace, res.step_times_s, intra, 1))
        calibration.append({"tf_threads": threads_json(t), "step_times_s": list(res.step_times_s),
                            "numerics_ok": bool(res.check.get("numerics_ok"))})
    costs = tf_costs(runs, base)
    graph = runs[-1].graph
    if progress is not None:
        progress(f"simulating {cores * cores} settings" + (" with and without placement" if placement else ""))
    t_sim = time.perf_counter()
    simulator = Simulator(graph, machine, costs)

    def predict(t: TFThreads) -> float:
        return costs.step_time_s(simulator.run(resolve(graph, as_plan(t, cores), machine), record=False).step_time_s)

    rows: list[dict[str, Any]] = []
    for t in tf_settings(cores):
        rows.append({"trial": len(rows), "strategy": TF_STRATEGY, "plan": _tf_plan(t, cores).to_json(),
                     "tf_threads": threads_json(t), "predicted_step_time_s": predict(t)})
    for k, split in enumerate(layer_splits(graph) if placement else []):
        first = next(iter(split))
        split_plan = Plan(layer_devices=split)
        placed = place_for_tf(graph, split_plan)
        placed_sim = Simulator(placed, machine, costs)
        for t in tf_settings(cores):
            unplaced = _tf_plan(t, cores)
            plan = dataclasses.replace(unplaced, layer_devices=split, name=f"{unplaced.name}-split{k + 1}-{first}")
            step_s = placed_sim.run(resolve(placed, as_plan(t, cores), machine), record=False).step_time_s
            rows.append({"trial": len(rows), "strategy": TF_STRATEGY, "plan": plan.to_json(),
                         "tf_threads": threads_json(dataclasses.replace(t, cpu_devices=2)),
                         "predicted_step_time_s": costs.step_time_s(step_s)})
    sim_wall_s = time.perf_counter() - t_sim
    rows.sort(key=lambda r: (r["predicted_step_time_s"], r["trial"]))
    baselines = {
        name: {"plan": _tf_plan(t, cores, name).to_json(), "tf_threads": threads_json(t),
               "predicted_step_time_s": predict(t)}
        for name, t in tf_baselines(machine).items()
    }
    summary = {
        "backend": "tensorflow",
        "best": rows[:TOP_LISTED],
        "baselines": baselines,
        "strategies": {TF_STRATEGY: {"best_predicted_step_time_s": rows[0]["predicted_step_time_s"],
                                     "trials": len(rows), "wall_s": sim_wall_s}},
        "trials_per_s": len(rows) / sim_wall_s if sim_wall_s > 0 else None,
        "n_trials": len(rows),
        "new_trials": len(rows),
        "strategy": TF_STRATEGY,
        "calibration": calibration,
        "cost_model": {"node_us": costs.node_us, "session_us": costs.session_us,
                       "signatures": len(costs.signatures), "ops_from_torch_profile": costs.unseen(graph)},
        "wall_s": time.perf_counter() - t0,
    }
    return TFSearch(summary, graph, costs)


# ---- validation ----------------------------------------------------------------------------


def validate_tf(
    run_dir: Path,
    config: Any,
    search: dict[str, Any],
    machine: Machine,
    *,
    top: int,
    repeats: int,
    steps: int,
    warmup: int,
    timeout_s: float = DEFAULT_TF_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The top settings of search.json and its baselines, measured in TensorFlow round-robin
    (each round a fresh process per setting); writes results.json and traces/ together (as
    the torch validation does) and returns results.json's content."""
    from schedlab.io import staging_dir, swap_dir
    from schedlab.search.run_dir import RESULTS_SCHEMA, RESULTS_VERSION, RunPaths, write_results
    from schedlab.search.validate import Measurement, _beyond_noise, _write_traces, contenders_of, results_of
    from schedlab.trace import library_versions

    t0 = time.perf_counter()
    paths = RunPaths(run_dir)
    graph = Graph.load(paths.graph)
    notes = ["each round runs every setting in a fresh TensorFlow process (TF fixes its pools at start-up)"]
    contenders = contenders_of(search, top)
    threads_of: dict[str, TFThreads] = {}
    # a baseline runs as TF names it (TF's default: 0, 0), a searched setting as its pair
    plan_of: dict[str, dict[str, Any] | None] = {}
    for row in [*search.get("baselines", {}).values(), *search.get("best", [])]:
        plan = Plan.from_json(row["plan"])
        threads_of.setdefault(plan.hash, threads_from_json(row["tf_threads"]))
        plan_of.setdefault(plan.hash, plan.to_json() if plan.multi_device else None)
    measured: dict[str, Measurement] = {}
    for c in contenders:
        measured.setdefault(c.plan.hash, Measurement(plan=c.plan, numeric_ok=True))
    for r in range(repeats):
        for key, m in measured.items():
            if m.error is not None:
                continue
            t = threads_of[key]
            if progress is not None:
                progress(f"round {r + 1}/{repeats}: {t.describe()}")
            try:
                res: TFResult = run_tf_worker(
                    TFRequest(workload=config.model, size=config.size, threads=t, steps=steps, warmup=warmup,
                              seed=config.seed, optimizer=config.optimizer, plan=plan_of[key]),
                    timeout_s=timeout_s,
                )
            except SchedlabError as err:
                m.error, m.numeric_ok = str(err).splitlines()[0], False
                continue
            m.step_times_s += list(res.step_times_s)
            ok = bool(res.check.get("numerics_ok")) and (res.torch_check is None or bool(res.torch_check.get("numerics_ok")))
            m.numeric_ok = m.numeric_ok and ok
            if res.torch_check is not None:
                m.max_rel_diff = float(res.torch_check.get("max_rel_norm_grad_diff", 0.0))
            m.numerics = dict(res.check)
            m.trace = res.trace
    candidates, baselines, best = results_of(contenders, measured)
    for c, entry in zip(contenders, candidates, strict=True):
        entry["tf_threads"] = threads_json(threads_of[c.plan.hash])
    for name, b in baselines.items():
        b["tf_threads"] = search["baselines"][name]["tf_threads"]
    better = min((n for n, b in baselines.items() if b["measured_step_time_s"] is not None),
                 key=lambda n: baselines[n]["measured_step_time_s"], default=None)
    if best is not None:
        trace = measured[contenders[best].plan.hash].trace
        if trace is not None and trace.meta.get("graph_hash") != graph.hash:
            notes.append("TensorFlow executed another graph under the best setting than graph.json holds "
                         "(Grappler rewrites by threading); its Gantt chart pairs ops by id across the two")
    with staging_dir(paths.traces) as staged:
        trace_paths = _write_traces(staged, paths, config, graph, machine, contenders, measured, best, better, notes,
                                    sim_trace_of=lambda plan: _simulated_tf_trace(run_dir, config, graph, machine,
                                                                                  plan, notes))
        results: dict[str, Any] = {
            "schema": RESULTS_SCHEMA, "version": RESULTS_VERSION, "backend": "tensorflow",
            "model": config.model, "size": config.size, "optimizer": config.optimizer,
            "candidates": candidates, "baselines": baselines, "best": best,
            "searched_plan_won": best is not None and candidates[best]["baseline"] is None,
            "beyond_noise": _beyond_noise(candidates, best, baselines.get(better) if better else None),
            "better_baseline": better,
            "best_speedup_over_better_baseline": (
                candidates[best]["speedup"].get(better) if best is not None and better else None),
            "repeats": repeats, "steps_per_repeat": steps, "warmup": warmup,
            "machine": machine.to_json(), "versions": library_versions(), "created_unix_s": time.time(),
            "wall_s": time.perf_counter() - t0, "traces": trace_paths, "notes": notes,
        }
        swap_dir(staged, paths.traces, then=lambda: write_results(run_dir, results))
    return results


def simulate_tf(
    run_dir: Path, config: Any, graph: Graph, machine: Machine, plan: Plan
) -> tuple[Any, TFCosts, Graph]:
    """(the simulated step with its trace, the cost model, the graph simulated: placed, with
    TF's transfers, when `plan` places ops) of `plan` on the cost model a TF search learnt
    (its tf_costs.json and profile); `TFCosts.step_time_s` gives the step."""
    from schedlab.calibrate.tf_costs import tf_costs_from_json
    from schedlab.io import read_json
    from schedlab.sim import simulate

    base = Profile.load(config.profile, machine=machine, check_machine=False) if config.profile else None
    costs = tf_costs_from_json(read_json(run_dir / TF_COSTS_FILE, what="TensorFlow cost model"), base)
    if plan.multi_device:  # TF's transfers between its logical CPU devices as ops, on the one physical CPU
        graph = place_for_tf(graph, plan)
        plan = dataclasses.replace(plan, layer_devices={}, op_devices={}, device=None)
    return simulate(graph, resolve(graph, plan, machine), machine, costs, record=True), costs, graph


def _simulated_tf_trace(run_dir: Path, config: Any, graph: Graph, machine: Machine, plan: Plan,
                        notes: list[str]) -> Any:
    """The best setting simulated with the cost model the search used, or None (said in `notes`)."""
    try:
        return simulate_tf(run_dir, config, graph, machine, plan)[0].trace
    except SchedlabError as e:
        notes.append(f"no simulated trace of the best setting: {e}")
        return None
