"""`schedlab bench --backend tensorflow`: TensorFlow's step against eager PyTorch's, same run.

Per workload, the same model with the same weights runs in TensorFlow (a fresh worker
process under the asked threading: `--tf-recommended`, `--intra-op`/`--inter-op`, or a
plan's slots and threads) and in PyTorch, eager and on schedlab's executor, with TF's
intra-op thread count as torch's intra-op threads. The two frameworks cannot share a
process, so their steps cannot alternate one by one: rounds alternate instead (TF's block
of steps, then torch's), and the figure is the ratio of the medians over all rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from schedlab.cli.common import capture_model, print_json
from schedlab.cli.trace_tf import tf_plan_from_args, tf_threads_from_args
from schedlab.errors import SchedlabError

DEFAULT_ROUNDS = 2


def run_tf_bench(args: argparse.Namespace) -> int:
    from schedlab.exec.bench import compare_with_eager
    from schedlab.exec.tf_job import TFRequest
    from schedlab.exec.tf_launch import DEFAULT_TF_TIMEOUT_S, run_tf_worker
    from schedlab.machine import detect_host
    from schedlab.plan import Plan
    from schedlab.tf.builtins import TF_BUILTINS
    from schedlab.tf.runtime import INSTALL_HINT, tensorflow_available
    from schedlab.tf.user import require_tf_model

    if not tensorflow_available():
        raise SchedlabError(f"--backend tensorflow needs tensorflow; {INSTALL_HINT}")
    if args.ddp or args.pipelining:
        raise SchedlabError("--ddp and --pipelining compare torch's own multi-rank steps; drop --backend tensorflow")
    bad = [m for m in args.models if m not in TF_BUILTINS]
    if bad:
        raise SchedlabError(f"no TensorFlow version of {', '.join(map(repr, bad))} beside a torch one; bench compares "
                            f"the two frameworks on the built-in workloads {', '.join(TF_BUILTINS)}")
    for model in args.models:
        require_tf_model(model, args.optimizer)
    threads = tf_threads_from_args(args)
    tf_plan = tf_plan_from_args(args)
    machine = detect_host()
    cores = machine.default_device.cores
    intra = threads.intra_op or cores
    torch_plan = Plan(slots=1, threads=intra, name=f"torch-intra{intra}")
    rows: dict[str, dict[str, Any]] = {}
    for model in args.models:
        ns = argparse.Namespace(model=model, size=args.size, optimizer=args.optimizer, seed=0)
        workload, captured = capture_model(ns)
        tf_s: list[float] = []
        eager_s: list[float] = []
        exec_s: list[float] = []
        numerics_ok = True
        for r in range(args.rounds):
            print(f"bench {model}: round {r + 1}/{args.rounds}, TensorFlow ({threads.describe()}) ...", file=sys.stderr)
            req = TFRequest(workload=model, size=args.size, threads=threads, steps=args.repeats, warmup=2,
                            optimizer=args.optimizer, plan=tf_plan)
            res = run_tf_worker(req, timeout_s=DEFAULT_TF_TIMEOUT_S + 2.0 * args.repeats)
            tf_s += res.step_times_s
            numerics_ok = numerics_ok and bool(res.check.get("numerics_ok")) and (
                res.torch_check is None or bool(res.torch_check.get("numerics_ok")))
            print(f"bench {model}: round {r + 1}/{args.rounds}, PyTorch eager and executor ...", file=sys.stderr)
            torch_res = compare_with_eager(workload.module, captured.graph, captured.input_values, torch_plan, machine,
                                           repeats=args.repeats)
            eager_s += torch_res.eager_times_s
            exec_s += torch_res.exec_times_s
        tf_med, eager_med, exec_med = (statistics.median(x) for x in (tf_s, eager_s, exec_s))
        rows[model] = {
            "tf_step_s": tf_med, "tf_step_times_s": tf_s, "eager_step_s": eager_med, "eager_step_times_s": eager_s,
            "exec_step_s": exec_med, "exec_step_times_s": exec_s,
            "ratio_tf_vs_eager": tf_med / eager_med, "ratio_tf_vs_exec": tf_med / exec_med,
            "tf_nodes": len(res.graph), "torch_ops": len(captured.graph), "numerics_ok": numerics_ok,
            "tf_optimizer": res.graph.meta.get("optimizer"), "torch_optimizer": captured.graph.meta.get("optimizer"),
        }
    summary = {
        "machine": machine.host, "size": args.size, "optimizer": args.optimizer, "rounds": args.rounds,
        "repeats": args.repeats,
        "tf_threads": {"intra_op": threads.intra_op, "inter_op": threads.inter_op},
        "tf_devices": threads.cpu_devices,
        "tf_plan": tf_plan,  # the plan's placement and order, if it sets them
        "torch_plan": torch_plan.to_json(), "results": rows,
    }
    if args.json:
        print_json(summary)
        return 0
    print(f"machine: {machine.host.get('cpu_model')} ({cores} cores); TensorFlow {threads.describe()}; PyTorch "
          f"{intra} intra-op threads; {args.rounds} rounds x {args.repeats} steps each side")
    print(f"{'model':<14}{'TF ms':>9}{'eager ms':>10}{'exec ms':>10}{'TF/eager':>10}{'TF/exec':>9}{'numerics':>10}")
    for model, row in rows.items():
        print(f"{model:<14}{row['tf_step_s'] * 1e3:>9.1f}{row['eager_step_s'] * 1e3:>10.1f}"
              f"{row['exec_step_s'] * 1e3:>10.1f}{row['ratio_tf_vs_eager']:>10.3f}{row['ratio_tf_vs_exec']:>9.3f}"
              f"{'ok' if row['numerics_ok'] else 'FAILED':>10}")
    print("medians over all rounds; TF's steps timed by its worker (Session.run), torch's in this process")
    return 0 if all(row["numerics_ok"] for row in rows.values()) else 1
