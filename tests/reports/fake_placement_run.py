"""A synthetic but schema-correct placement run directory (search/RUN_DIR.md, plus the
placement additions: run.json "space": "placement", search.json "strategies", rl/curve.json)
for the placement figures' tests.

The graph is real (the tiny MLP captured once per process), the machine is two GPUs of the
dgx-8gpu preset, and every strategy's plan is a real layer placement on it; the step
times, wall times and the RL curve are made up but shaped like real ones.
"""

from __future__ import annotations

import functools
import math
import random
import time
from pathlib import Path
from typing import Any

from schedlab.graph import Graph, OpKind
from schedlab.io import write_json_atomic
from schedlab.machine import Machine, load_machine
from schedlab.plan import Plan

VERSIONS = {"python": "3.11.7", "schedlab": "0.1.0", "torch": "2.13.0+cpu"}
STRATEGIES = ("layers", "m-topo", "m-etf", "m-sct", "rl", "optuna")
# Simulated step time of each strategy's best placement (s), and its search wall time (s).
PREDICTED_S = {"layers": 0.0062, "m-topo": 0.0058, "m-etf": 0.0055, "m-sct": 0.0051, "rl": 0.0047, "optuna": 0.0049}
WALL_S = {"layers": 0.02, "m-topo": 0.4, "m-etf": 0.6, "m-sct": 3.5, "rl": 95.0, "optuna": 40.0}
TRIALS = {"layers": 1, "m-topo": 1, "m-etf": 1, "m-sct": 1, "rl": 1600, "optuna": 200}
MEASURED_STRATEGIES = ("layers", "m-sct", "rl")  # the strategies whose plans validate measured
BASELINE_S = {"one-device-gpu0": 0.0071, "one-device-gpu1": 0.0073}


@functools.lru_cache(maxsize=1)
def tiny_mlp_graph() -> Graph:
    """The tiny MLP workload's captured graph (captured once per process: ~2 s)."""
    from schedlab.capture import capture
    from schedlab.workloads.loader import load_workload

    return capture(load_workload("mlp", size="tiny")).graph


def two_gpus() -> Machine:
    return load_machine("dgx-8gpu", 2)


def strategy_plans(graph: Graph) -> dict[str, Plan]:
    """A distinct layer placement on gpu0/gpu1 per strategy; "optuna" also moves one of the
    head's optimizer ops to gpu0 by op id, so that layer's ops run on two devices."""
    layers = ("body.0", "body.2", "head")
    assignments = {
        "layers": ("gpu0", "gpu1", "gpu1"),
        "m-topo": ("gpu0", "gpu0", "gpu1"),
        "m-etf": ("gpu1", "gpu0", "gpu0"),
        "m-sct": ("gpu0", "gpu1", "gpu0"),
        "rl": ("gpu1", "gpu1", "gpu0"),
        "optuna": ("gpu0", "gpu1", "gpu1"),
    }
    head_opt = {next(op.id for op in graph.ops if op.layer == "head" and op.kind is OpKind.OPT): "gpu0"}
    return {
        name: Plan(device="gpu0", layer_devices=dict(zip(layers, devs, strict=True)),
                   op_devices=head_opt if name == "optuna" else {}, name=name)
        for name, devs in assignments.items()
    }


def _measured(plan: Plan, predicted_s: float, measured_s: float, rng: random.Random, n: int = 5) -> dict[str, Any]:
    times = sorted(measured_s * (1 + rng.uniform(-0.05, 0.07)) for _ in range(n))
    return {
        "plan": plan.to_json(), "predicted_step_time_s": predicted_s, "measured_step_time_s": times[n // 2],
        "measured_step_times_s": times, "spread_s": [times[1], times[3]], "max_rel_diff": 2e-7, "numeric_ok": True,
        "error": None,
    }


def rl_curve_json(iterations: int = 40, reward: str = "simulated", seed: int = 0) -> dict[str, Any]:
    """An rl/curve.json as search/placement/rl_run.py writes it: iterations from 1, best so far
    falling from ~7 ms to PREDICTED_S["rl"], entropy per decision from ln 2 towards 0. The
    first iteration has no feasible sample (mean and best null)."""
    rng = random.Random(seed)
    groups = 3
    curve = []
    best = math.inf
    for it in range(1, iterations + 1):
        frac = (it - 1) / max(iterations - 1, 1)
        mean = PREDICTED_S["rl"] * (1.55 - 0.5 * frac) * (1 + rng.uniform(-0.04, 0.04))
        sample_best = PREDICTED_S["rl"] + (0.0072 - PREDICTED_S["rl"]) * (1 - frac) ** 2
        feasible = it > 1
        if feasible:
            best = min(best, sample_best)
        curve.append({
            "iteration": it, "mean_reward": -mean * 1e3, "mean_step_time_s": mean if feasible else None,
            "best_step_time_s": best if feasible else None, "entropy": math.log(2) * (1 - 0.9 * frac),
            "feasible_share": min(1.0, 0.6 + 0.4 * frac) if feasible else 0.0, "wall_s": 2.4 * it,
        })
    return {
        "schema": "schedlab.rl_curve", "version": 1,
        "config": {"groups": groups, "iterations": iterations, "samples": 40, "lr": 0.05, "entropy": 0.01,
                   "baseline_decay": 0.9, "seed": seed},
        "reward": reward, "curve": curve, "best_step_time_s": best, "evaluations": 37 * iterations,
    }


def make_placement_run_dir(
    run_dir: Path,
    *,
    strategies: tuple[str, ...] = STRATEGIES,
    rl_curve: bool = True,
    reward: str = "simulated",
    validated: bool = True,
) -> Path:
    """Write a placement run directory; returns it. `strategies`: those run into it (a
    subset of STRATEGIES); `rl_curve`: write rl/curve.json; `validated`: results.json holds
    measured candidates of the MEASURED_STRATEGIES (else none) and measured baselines."""
    rng = random.Random(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    graph = tiny_mlp_graph()
    graph.save(run_dir / "graph.json")
    machine = two_gpus()
    plans = strategy_plans(graph)
    # search.json "best": each strategy's best, and a second, slower rl plan; fastest first.
    best = [{"trial": i, "strategy": s, "plan": plans[s].to_json(), "predicted_step_time_s": PREDICTED_S[s]}
            for i, s in enumerate(strategies)]
    if "rl" in strategies:
        best.append({"trial": 99, "strategy": "rl", "plan": plans["m-topo"].to_json(),
                     "predicted_step_time_s": PREDICTED_S["rl"] * 1.2})
    best.sort(key=lambda b: b["predicted_step_time_s"])
    baseline_plans = {"one-device-gpu0": Plan(device="gpu0", name="one-device-gpu0"),
                      "one-device-gpu1": Plan(device="gpu1", name="one-device-gpu1")}
    write_json_atomic(run_dir / "search.json", {
        "best": best,
        "baselines": {n: {"plan": p.to_json(), "predicted_step_time_s": BASELINE_S[n]} for n, p in baseline_plans.items()},
        "strategies": {s: {"best_predicted_step_time_s": PREDICTED_S[s], "trials": TRIALS[s], "wall_s": WALL_S[s]}
                       for s in strategies},
        "trials_per_s": 20.0, "n_trials": sum(TRIALS[s] for s in strategies), "wall_s": sum(WALL_S[s] for s in strategies),
    })
    cands = []
    if validated:
        for s in (s for s in MEASURED_STRATEGIES if s in strategies):
            c = _measured(plans[s], PREDICTED_S[s], PREDICTED_S[s] * 1.3, rng)
            c.update({"trial": strategies.index(s), "strategy": s, "baseline": None})
            cands.append(c)
        if "rl" in strategies:  # rl's second plan: ranked lower by the search, measured faster
            c = _measured(plans["m-topo"], PREDICTED_S["rl"] * 1.2, PREDICTED_S["rl"] * 1.1, rng)
            c.update({"trial": 99, "strategy": "rl", "baseline": None})
            cands.append(c)
    baselines = {n: _measured(p, BASELINE_S[n], BASELINE_S[n] * 1.25, rng) for n, p in baseline_plans.items()}
    for name, b in baselines.items():
        cands.append({**b, "trial": None, "strategy": "baseline", "baseline": name})
    best_i = min(range(len(cands)), key=lambda i: cands[i]["measured_step_time_s"])
    host = Machine(name=machine.name, devices=machine.devices, links=machine.links,
                   host={"hostname": "gpuhost", "cpu_model": "Test CPU @ 2.0GHz", "torch": VERSIONS["torch"]})
    write_json_atomic(run_dir / "results.json", {
        "schema": "schedlab.results", "version": 1, "candidates": cands, "baselines": baselines, "best": best_i,
        "repeats": 5, "steps_per_repeat": 10, "machine": host.to_json(), "versions": VERSIONS,
        "created_unix_s": time.time(),
    })
    if rl_curve and "rl" in strategies:
        write_json_atomic(run_dir / "rl" / "curve.json", rl_curve_json(reward=reward))
    write_json_atomic(run_dir / "run.json", {
        "schema": "schedlab.run", "version": 1, "model": "mlp", "size": "tiny", "optimizer": "sgd", "seed": 0,
        "space": "placement", "strategy": strategies[-1], "study": None, "storage": None,
        "trials": sum(TRIALS[s] for s in strategies), "profile": None, "machine": machine.to_json(),
        "created_unix_s": time.time(), "devices": len(machine.devices),
    })
    return run_dir
