"""`schedlab fidelity --backend tensorflow`: the simulator against TensorFlow's own runtime.

Per built-in workload, each threading setting of `calibrate.tf_fidelity.tf_plan_spread`
runs in a fresh TensorFlow process (`--rounds R`: the whole spread R times, round-robin);
the cost model is calibrated on the one-inter-op settings and predicts all. `--held-out`
runs the TF held-out models (`schedlab.tf.heldout`) instead. The results file has the
layout of the torch protocol's (rows under "plans", summaries under "workloads"), so
`schedlab report` draws it the same way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from schedlab.cli.common import print_json
from schedlab.cli.fidelity_cmd import DEFAULT_TF_HELDOUT_OUT, DEFAULT_TF_OUT, conditions, pct, scores, tau
from schedlab.errors import SchedlabError


def tf_models(args: argparse.Namespace, named: list[str]) -> list[str]:
    """The TF models to run: the built-ins by default, the TF held-out models with
    `--held-out` (by name with or without `schedlab.tf.heldout:`), or as named; anything
    TensorFlow has no version of is refused by name."""
    from schedlab.tf.builtins import TF_BUILTINS
    from schedlab.tf.heldout import SPEC_PREFIX, TF_HELDOUT
    from schedlab.tf.user import require_tf_model

    for flag, given in (("--devices", args.devices is not None), ("--plans", bool(args.plan_list)),
                        ("--no-trace-calibration", args.no_trace_calibration)):
        if given:
            raise SchedlabError(f"{flag} is not available with --backend tensorflow yet: TensorFlow fidelity runs "
                                "on one device, trace-calibrated on its one-inter-op runs")
    if args.held_out:
        unknown = [m for m in named if m.removeprefix(SPEC_PREFIX) not in TF_HELDOUT]
        if unknown:
            raise SchedlabError(f"{', '.join(unknown)}: not a TensorFlow held-out model; they are "
                                f"{', '.join(TF_HELDOUT)}")
        models = [SPEC_PREFIX + m.removeprefix(SPEC_PREFIX) for m in named or TF_HELDOUT]
    else:
        models = named or list(TF_BUILTINS)
    for m in models:
        require_tf_model(m, args.optimizer)
    return models


def run_tf(args: argparse.Namespace, named: list[str]) -> int:
    from tqdm import tqdm

    from schedlab.calibrate.fidelity import summarise
    from schedlab.calibrate.tf_fidelity import tf_fidelity, tf_plan_spread
    from schedlab.cli.common import load_profile
    from schedlab.exec.tf_launch import DEFAULT_TF_TIMEOUT_S
    from schedlab.io import check_writable, write_json_atomic
    from schedlab.machine import detect_host
    from schedlab.tf.runtime import INSTALL_HINT, tensorflow_available

    models = tf_models(args, named)
    if not tensorflow_available():
        raise SchedlabError(f"--backend tensorflow needs tensorflow; {INSTALL_HINT}")
    t0 = time.perf_counter()
    out = Path(args.out) if args.out else (DEFAULT_TF_HELDOUT_OUT if args.held_out else DEFAULT_TF_OUT)
    check_writable(out)  # before minutes of measuring, not after
    machine = detect_host()
    base = load_profile(args.profile)
    plans = tf_plan_spread(machine.default_device.cores)
    timeout_s = DEFAULT_TF_TIMEOUT_S + 2.0 * args.steps  # a step of the default sizes takes under a second here
    per_model: list[dict[str, Any]] = []
    rows = []
    with tqdm(total=len(models) * len(plans) * args.rounds, desc="tensorflow fidelity", unit="plan", file=sys.stderr,
              disable=None) as bar:
        for model in models:
            bar.set_postfix_str(model)
            fid = tf_fidelity(model, args.size, plans, base, machine, optimizer=args.optimizer, steps=args.steps, warmup=1,
                              rounds=args.rounds, timeout_s=timeout_s, progress=lambda _name: bar.update(1))
            rows += fid.rows
            first = next(iter(fid.results.values()))
            per_model.append({
                "workload": model, "node_us": fid.costs.node_us, "session_us": fid.costs.session_us,
                "signatures": len(fid.costs.signatures), "ops_from_torch_profile": fid.costs.unseen(first.graph),
                "numerics_ok": fid.numerics_ok,
            })
    unseen = [r for r in rows if not r.in_calibration]
    result = {
        **conditions(_set_name(models), args, machine),
        "backend": "tensorflow",
        "tensorflow": _tf_version(),
        "calibration": "trace-calibrated on the one-inter-op settings of each workload (in_calibration: true)",
        **scores(rows),
        "workloads_unseen_plans": [s.__dict__ for s in summarise(unseen)],
        "costs": per_model,
        "wall_s": time.perf_counter() - t0,
    }
    write_json_atomic(out, result, indent=1)
    if args.json:
        print_json(result)
        return 0
    _print(result, machine.host.get("cpu_model"), machine.default_device.cores, out)
    return 0


def _short(model: str) -> str:
    """A model's name for a table: a factory's function name."""
    return model.rpartition(":")[2]


def _set_name(models: list[str]) -> str:
    """"built-in", "held-out" (`schedlab.tf.heldout`: never used to develop the TF cost model), or "user"."""
    from schedlab.tf.builtins import TF_BUILTINS
    from schedlab.tf.heldout import SPEC_PREFIX

    if all(m in TF_BUILTINS for m in models):
        return "built-in"
    return "held-out" if all(m.startswith(SPEC_PREFIX) for m in models) else "user"


def _tf_version() -> str:
    """The installed TensorFlow's version, read without importing it into this (torch) process."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def _print(result: dict[str, Any], cpu: Any, cores: int, out: Path) -> None:
    rounds = result.get("rounds", 1)
    print(f"tensorflow {result['tensorflow']} fidelity on {cpu} ({cores} cores), size {result['size']}, "
          f"{result['steps_per_plan']} steps/plan" + (f" in each of {rounds} rounds" if rounds > 1 else ""))
    print(f"{'workload':<18}{'threading':<20}{'measured ms':>12}{'(min-max)':>16}{'predicted ms':>13}{'error':>8}"
          f"{'others':>8}")
    for r in result["plans"]:
        lo, hi = r["measured_spread_s"]
        mark = "*" if r["in_calibration"] else " "
        print(f"{_short(r['workload']):<18}{r['plan']:<20}{r['measured_s'] * 1e3:>12.1f}"
              f"{f'{lo * 1e3:.0f}-{hi * 1e3:.0f}':>16}{r['predicted_s'] * 1e3:>13.1f}{pct(r['error'], 8)}{mark}"
              f"{pct(r.get('foreign_cpu_frac'), 7)}")
    print()
    print(f"{'':<18}{'--- all settings ---':>23}   {'--- not calibrated on ---':>26}")
    print(f"{'workload':<18}{'MAPE':>8}{'worst':>8}{'tau':>7}   {'MAPE':>8}{'worst':>8}{'tau':>7}"
          f"{'node us':>9}{'session ms':>11}")
    unseen = {s["workload"]: s for s in result["workloads_unseen_plans"]}
    costs = {c["workload"]: c for c in result["costs"]}
    for s in result["workloads"]:
        u, c = unseen.get(s["workload"]), costs[s["workload"]]
        print(f"{_short(s['workload']):<18}{pct(s['mape'], 8)}{pct(s['worst_error'], 8)}{tau(s['kendall_tau'], 7)}   "
              f"{pct(u and u['mape'], 8)}{pct(u and u['worst_error'], 8)}{tau(u and u['kendall_tau'], 7)}"
              f"{c['node_us']:>9.1f}{c['session_us'] / 1e3:>11.2f}")
    print(f"overall MAPE {result['mape'] * 100:.1f}% (not calibrated on: "
          f"{float(result['mape_unseen_plans'] or 0) * 100:.1f}%), worst {result['worst_error'] * 100:.1f}%   "
          "(* = setting calibration ran: one inter-op thread)")
    print("node us: TensorFlow's executor cost per node outside its kernel; session ms: each Session.run's fixed "
          "cost, added to every prediction; others: share of the CPU other processes used meanwhile")
    print(f"results: {out}   (draw them: schedlab report {out})")
