"""A small, synthetic but schema-correct run directory (search/RUN_DIR.md) for report tests.

Numbers are made up but shaped like real ones: an MLP-like step of ~40 ops on a 2-core
host, two workers, a ~30-trial Optuna study in sqlite, five validated candidates and two
baselines, and a Profile with fitted class models and measured signature rows.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from schedlab.graph import Graph, OpKind
from schedlab.io import write_json_atomic
from schedlab.machine import Device, Machine
from schedlab.plan import Plan
from schedlab.sim.testing import GraphBuilder
from schedlab.trace import Trace, TraceEvent, base_meta

HOST = Machine(
    name="host",
    devices=(Device(id="cpu0", kind="cpu", cores=2, memory_bytes=16 * 2**30),),
    host={"hostname": "testhost", "cpu_model": "Test CPU @ 2.0GHz", "python": "3.11.7", "torch": "2.13.0+cpu"},
)
VERSIONS = {"python": "3.11.7", "schedlab": "0.1.0", "torch": "2.13.0+cpu", "optuna": "5.0.0"}
STRATEGIES = ("seeds", "tpe", "cmaes")


def mlp_graph(layers: int = 3, name: str = "mlp") -> Graph:
    """Forward addmm+relu per layer, then B (mm, threshold_backward), W (mm, sum) and OPT (add_)."""
    b = GraphBuilder(name)
    x = b.input("x", nbytes=64 * 512 * 4)
    ws = [b.input(f"w{i}", nbytes=512 * 512 * 4) for i in range(layers)]
    h = x
    acts = []
    for i in range(layers):
        h = b.op(f"addmm_{i}", [h, ws[i]], nbytes=64 * 512 * 4, target="aten.addmm.default", flops=2.0 * 64 * 512 * 512)
        acts.append(h)
        h = b.op(f"relu_{i}", [h], nbytes=64 * 512 * 4, target="aten.relu.default", flops=64.0 * 512)
    g = b.op("loss_grad", [h], nbytes=64 * 512 * 4, target="aten.mul.Tensor", kind=OpKind.B, flops=64.0 * 512)
    grads = []
    for i in reversed(range(layers)):
        g = b.op(f"threshold_backward_{i}", [g, acts[i]], nbytes=64 * 512 * 4,
                 target="aten.threshold_backward.default", kind=OpKind.B, flops=64.0 * 512)
        gw = b.op(f"mm_w{i}", [g, acts[i]], nbytes=512 * 512 * 4, target="aten.mm.default", kind=OpKind.W,
                  flops=2.0 * 64 * 512 * 512)
        gb = b.op(f"sum_b{i}", [g], nbytes=512 * 4, target="aten.sum.dim_IntList", kind=OpKind.W, flops=64.0 * 512)
        grads += [gw, gb]
        if i > 0:
            g = b.op(f"mm_x{i}", [g, ws[i]], nbytes=64 * 512 * 4, target="aten.mm.default", kind=OpKind.B,
                     flops=2.0 * 64 * 512 * 512)
    for j, gv in enumerate(grads):
        b.op(f"add_{j}", [gv, ws[j // 2]], nbytes=512 * 512 * 4, target="aten.add.Tensor", kind=OpKind.OPT,
             flops=512.0 * 512)
    b.output(h)
    return b.build()


def _op_us(graph: Graph, op_id: int, threads: int) -> float:
    op = graph.ops[op_id]
    work = op.flops * 1.2e-3 / 1e3 + op.bytes_moved * 0.1e-3  # µs: ~0.8 GFLOP/s/thread, 10 GB/s
    return 8.0 + work * (0.15 + 0.85 / threads)


def list_schedule_trace(
    graph: Graph, plan: Plan, source: str, steps: int = 1, jitter: float = 0.0, gap_us: float = 0.0, seed: int = 0
) -> Trace:
    """Greedy list scheduling of the graph on `plan.slots` workers, as a Trace of `steps` steps."""
    rng = random.Random(seed)
    threads = plan.threads or 2
    events: list[TraceEvent] = []
    step_times: list[float] = []
    for step in range(steps):
        free = [gap_us] * plan.slots
        done: dict[int, float] = {}
        for op in graph.ops:  # program order is topological
            ready = max((done[p] for p in graph.preds[op.id]), default=0.0)
            w = min(range(plan.slots), key=lambda i: free[i])
            start = max(ready, free[w]) + gap_us
            dur = _op_us(graph, op.id, threads) * (1.0 + jitter * rng.uniform(-1, 1))
            end = start + dur
            done[op.id] = end
            free[w] = end
            events.append(TraceEvent(op.id, op.name, op.kind.value, "cpu0", w, threads,
                                     round(start * 1e3), round(end * 1e3), step))
        step_times.append(max(done.values()) / 1e6)
    meta = base_meta(source, workload=graph.name, graph_hash=graph.hash, plan_hash=plan.hash, plan=plan.to_json(),
                     machine=HOST.to_json() if source == "exec" else HOST.name)
    meta["versions"] = VERSIONS
    if source == "exec":
        meta["step_times_s"] = step_times
        meta["warmup"] = 1
    return Trace(events=tuple(events), meta=meta)


def _measured(plan: Plan, predicted_s: float, measured_s: float, rng: random.Random, n: int = 5) -> dict[str, Any]:
    times = sorted(measured_s * (1 + rng.uniform(-0.04, 0.06)) for _ in range(n))
    return {
        "plan": plan.to_json(),
        "predicted_step_time_s": predicted_s,
        "measured_step_time_s": times[n // 2],
        "measured_step_times_s": times,
        "spread_s": [times[1], times[3]],
        "max_rel_diff": 1.2e-7,
        "numeric_ok": True,
        "error": None,
    }


def _build(cls: Any, **known: Any) -> Any:
    """An instance of a calibrate dataclass: the values given, 1.0 for fields added since."""
    import dataclasses

    return cls(**{f.name: known.get(f.name, 1.0) for f in dataclasses.fields(cls) if f.init})


def write_profile(path: Path, graph: Graph) -> bool:
    """A Profile with a fit per class and signature rows; False if the Profile API does not allow it."""
    try:
        from schedlab.calibrate.corun import CorunFigures
        from schedlab.calibrate.dispatch import DispatchFigures
        from schedlab.calibrate.fit import ClassFit
        from schedlab.calibrate.model import PARAM_NAMES, WorkThreadsModel
        from schedlab.calibrate.profile import Profile
        from schedlab.calibrate.signature import signature

        def fit(us_per_gflop: float, us_per_mb: float, p_max: float) -> ClassFit:
            known = {"a_us": 6.0, "us_per_gflop": us_per_gflop, "us_per_mb": us_per_mb, "p_max": p_max,
                     "h_us": 20.0, "c_us": 2.0, "us_per_mb_dram": 0.0, "cache_mb": 1.0}
            model = WorkThreadsModel.from_params({k: known.get(k, 1.0) for k in PARAM_NAMES})
            return ClassFit("work_threads", model, 14.2, 11.0, 9.5, 40, 12, 3)

        classes = {
            "addmm": fit(1200.0, 50.0, 0.9),
            "mm": fit(1250.0, 50.0, 0.88),
            "relu": fit(10.0, 380.0, 0.6),
            "threshold_backward": fit(10.0, 420.0, 0.6),
            "add": fit(10.0, 400.0, 0.7),
            "sum": fit(10.0, 300.0, 0.3),
        }
        rows: dict[str, dict[int, float]] = {}
        for op in graph.ops:
            if op.op_class != "mul":
                rows[signature(op)] = {k: _op_us(graph, op.id, k) * (0.93 if k == 1 else 1.06) for k in (1, 2)}
        profile = Profile(
            machine=HOST.fingerprint,
            created_unix_s=time.time(),
            quick=True,
            dispatch=_build(DispatchFigures, op_us=25.0, view_us=8.0, call_floor_us=3.0, view_call_floor_us=1.5,
                            event_floor_us=0.5),
            classes=classes,
            fallback=fit(100.0, 400.0, 0.6),
            signatures=rows,
            corun=_build(CorunFigures, mem_slowdown=1.3, compute_slowdown=1.1, gil_slowdown=1.5, measured=True),
            meta={"host": {"hostname": "testhost", "cpu_model": HOST.host["cpu_model"]}},
        )
        profile.save(path)
    except (ImportError, TypeError, ValueError, AttributeError):
        return False
    return True


def make_run_dir(
    run_dir: Path,
    *,
    model: str = "mlp",
    layers: int = 3,
    seed: int = 0,
    n_trials: int = 30,
    profile: bool = True,
    scale: float = 1.0,
    baseline_wins: bool = False,
    objectives: tuple[str, ...] = ("time",),
) -> Path:
    """Write a complete run directory; returns it. `scale` multiplies every step time.

    Like `schedlab validate`, results.json lists the baselines among the candidates too, and
    one candidate failed to run. `baseline_wins`: a baseline is faster than every searched
    plan. `objectives`: ("time", "memory") gives a two-objective study.
    """
    import optuna

    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    graph = mlp_graph(layers, name=model)
    graph.save(run_dir / "graph.json")
    best_plan = Plan(slots=2, threads=1, class_threads={"mm": 2, "addmm": 2}, order="w-last", name="best")
    pt_plan = Plan(name="pytorch-default")
    tf_plan = Plan(slots=2, threads=1, name="tensorflow-recommended")
    candidates = [best_plan] + [
        Plan(slots=rng.choice((1, 2)), threads=rng.choice((1, 2)), order=o, name=f"c{i}")
        for i, o in enumerate(("topo", "critical-path", "w-last", "topo"))
    ]
    base_s = 0.020 * scale
    preds = [base_s * f for f in (0.82, 0.86, 0.9, 0.93, 0.97)]
    meas = [base_s * f for f in (0.80, 0.91, 0.88, 0.99, 1.0)]
    cands = []
    for i, (plan, p, m) in enumerate(zip(candidates, preds, meas)):
        c = _measured(plan, p, m, rng)
        c.update({"trial": 3 + 5 * i, "strategy": STRATEGIES[i % len(STRATEGIES)]})
        cands.append(c)
    baselines = {
        "pytorch-default": _measured(pt_plan, base_s * 1.05, base_s * 1.12, rng),
        "tensorflow-recommended": _measured(tf_plan, base_s * 0.98, base_s * 1.03, rng),
    }
    if baseline_wins:
        baselines["tensorflow-recommended"] = _measured(tf_plan, base_s * 0.98, base_s * 0.7, rng)
    failed = {"trial": 40, "strategy": "tpe", "plan": Plan(slots=2, threads=2, name="bad").to_json(),
              "predicted_step_time_s": base_s * 0.99, "measured_step_time_s": None, "measured_step_times_s": [],
              "spread_s": None, "max_rel_diff": None, "numeric_ok": False, "error": "OpFailed: op 3 (addmm_1) raised"}
    cands.append(failed)
    for name, b in baselines.items():
        cands.append({**b, "trial": None, "strategy": "baseline", "baseline": name})
    for c in cands:
        c.setdefault("baseline", None)
        c["speedup"] = {
            n: b["measured_step_time_s"] / c["measured_step_time_s"] if c["measured_step_time_s"] else None
            for n, b in baselines.items()
        }
    usable = [i for i, c in enumerate(cands) if c["measured_step_time_s"]]
    best_i = min(usable, key=lambda i: cands[i]["measured_step_time_s"])
    write_json_atomic(run_dir / "results.json", {
        "schema": "schedlab.results", "version": 1, "candidates": cands, "baselines": baselines, "best": best_i,
        "repeats": 5, "steps_per_repeat": 10, "machine": HOST.to_json(), "versions": VERSIONS,
        "created_unix_s": time.time(),
    })
    storage = f"sqlite:///{run_dir / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=f"{model}-study", storage=storage, directions=["minimize"] * len(objectives))
    for n in range(n_trials):
        strat = STRATEGIES[0] if n < 6 else STRATEGIES[1 + n % 2]
        value = base_s * (0.82 + 0.5 * rng.random() * (1 - n / (n_trials + 5)))
        if n == cands[0]["trial"]:
            value = preds[0]
        state = optuna.trial.TrialState.FAIL if n == 7 else optuna.trial.TrialState.COMPLETE
        values = {"time": value, "memory": float(1 << 20) * (1 + n % 3)}
        complete = state == optuna.trial.TrialState.COMPLETE
        study.add_trial(optuna.trial.create_trial(
            state=state, values=[values[o] for o in objectives] if complete else None, params={},
            distributions={}, user_attrs={"strategy": strat, "plan": best_plan.to_json(), "peak_memory_bytes": 1 << 20},
        ))
    write_json_atomic(run_dir / "search.json", {
        "best": [{"trial": c["trial"], "strategy": c["strategy"], "plan": c["plan"],
                  "predicted_step_time_s": c["predicted_step_time_s"], "predicted_peak_memory_bytes": 1 << 20}
                 for c in cands],
        "baselines": {n: {"plan": b["plan"], "predicted_step_time_s": b["predicted_step_time_s"]}
                      for n, b in baselines.items()},
        "strategies": {s: {"best_predicted_step_time_s": preds[0], "trials": 10, "wall_s": 3.0} for s in STRATEGIES},
        "trials_per_s": 12.5, "n_trials": n_trials, "wall_s": 9.0,
    })
    profile_path = run_dir.parent / f"{run_dir.name}-profile.json"
    has_profile = profile and write_profile(profile_path, graph)
    write_json_atomic(run_dir / "run.json", {
        "schema": "schedlab.run", "version": 1, "model": model, "size": "tiny", "optimizer": "sgd", "seed": seed,
        "space": "threads+order", "strategy": "portfolio", "study": f"{model}-study", "storage": storage,
        "trials": n_trials, "profile": str(profile_path) if has_profile else None, "machine": HOST.to_json(),
        "created_unix_s": time.time(), "objectives": list(objectives),
    })
    traces = run_dir / "traces"
    traced = tf_plan if baseline_wins else best_plan  # validate traces its best plan, baseline or not
    list_schedule_trace(graph, traced, "sim").save(traces / "best.sim.json")
    list_schedule_trace(graph, traced, "exec", steps=3, jitter=0.25, gap_us=12.0, seed=seed).save(
        traces / "best.exec.json")
    list_schedule_trace(graph, tf_plan, "exec", steps=3, jitter=0.25, gap_us=12.0, seed=seed + 1).save(
        traces / "baseline.exec.json")
    return run_dir
