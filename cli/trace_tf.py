"""`schedlab trace --backend tensorflow`: the training step run in TensorFlow's own runtime.

The workload is built in torch (its weights and inputs) and in TensorFlow from them; a
fresh TensorFlow process runs it under the threading the plan asks for (TensorFlow fixes
its pools at start-up), checks the first step against TF eager and eager PyTorch, captures
the graph TensorFlow executed and times the steps. Written: the trace, its Chrome form,
and the captured graph (what `simulate` reads to predict TensorFlow).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from schedlab.cli.common import TRACES_DIR, load_plan_arg, print_json, slug
from schedlab.errors import SchedlabError
from schedlab.tf.runtime import TFThreads


def add_tf_args(p: argparse.ArgumentParser) -> None:
    """The flags of the TensorFlow backend, for `trace` (and the commands to come)."""
    p.add_argument(
        "--backend", choices=("torch", "tensorflow"), default="torch",
        help="the framework that runs the step: torch (schedlab's executor, default) or tensorflow (TensorFlow's own "
        "runtime, in a fresh process per threading setting)",
    )
    p.add_argument("--intra-op", type=int, default=None, metavar="N",
                   help="tensorflow: threads per kernel (default: the plan's threads, else TF's default)")
    p.add_argument("--inter-op", type=int, default=None, metavar="N",
                   help="tensorflow: kernels run side by side (default: the plan's slots, else TF's default)")
    p.add_argument("--tf-recommended", action="store_true",
                   help="tensorflow: TensorFlow's recommended threading, intra-op = physical cores, inter-op = sockets")


def tf_threads_from_args(args: argparse.Namespace) -> TFThreads:
    """The TFThreads that `--plan`, `--intra-op`, `--inter-op` and `--tf-recommended` ask for."""
    from schedlab.machine import detect_host
    from schedlab.search.baselines import tensorflow_recommended
    from schedlab.tf.plan_map import tf_threads_for_plan

    if args.tf_recommended:
        if args.plan or args.intra_op is not None or args.inter_op is not None:
            raise SchedlabError("--tf-recommended sets the threading itself; drop --plan, --intra-op and --inter-op")
        return tf_threads_for_plan(tensorflow_recommended(detect_host()))
    base = tf_threads_for_plan(load_plan_arg(args.plan)) if args.plan else TFThreads(0, 0)
    return TFThreads(
        intra_op=base.intra_op if args.intra_op is None else args.intra_op,
        inter_op=base.inter_op if args.inter_op is None else args.inter_op,
        cpu_devices=base.cpu_devices,
    )


def tf_plan_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `--plan` as a TFRequest's plan, if it places ops on several devices or orders them
    (its threading travels as the request's TFThreads)."""
    if not args.plan:
        return None
    plan = load_plan_arg(args.plan)
    return plan.to_json() if plan.multi_device or plan.order != "topo" else None


def run_tf_trace(args: argparse.Namespace) -> int:
    from schedlab.exec.launch import warmup_for
    from schedlab.exec.tf_job import TFRequest
    from schedlab.exec.tf_launch import DEFAULT_TF_TIMEOUT_S, run_tf_worker
    from schedlab.tf.runtime import tensorflow_available

    if not tensorflow_available():
        from schedlab.tf.runtime import INSTALL_HINT

        raise SchedlabError(f"--backend tensorflow needs tensorflow; {INSTALL_HINT}")
    from schedlab.tf.user import require_tf_model

    require_tf_model(args.model, args.optimizer)
    threads = tf_threads_from_args(args)
    if args.devices not in (None, threads.cpu_devices):
        raise SchedlabError(f"--devices {args.devices}: on the TensorFlow backend the plan's placement sets the logical "
                            f"CPU devices ({threads.cpu_devices} here); drop --devices")
    timeout_s = DEFAULT_TF_TIMEOUT_S if args.timeout_s is None else args.timeout_s
    request = TFRequest(workload=args.model, size=args.size, threads=threads, steps=args.steps,
                        warmup=warmup_for(False, args.warmup),
                        optimizer=args.optimizer, seed=args.seed, plan=tf_plan_from_args(args))
    print(f"trace {args.model} on TensorFlow ({threads.describe()}) ...", file=sys.stderr)
    result = run_tf_worker(request, timeout_s=timeout_s)
    tag = f"tf-i{threads.intra_op}-e{threads.inter_op}" + (f"-d{threads.cpu_devices}" if threads.cpu_devices > 1 else "")
    out = Path(args.out) if args.out else TRACES_DIR / f"{slug(args.model)}-{args.size}-{args.optimizer}-{tag}.json"
    stem = out.name.removesuffix(".json")
    chrome = out.with_name(f"{stem}.chrome.json")
    graph_path = out.with_name(f"{stem}.graph.json")
    result.trace.save(out)
    result.trace.save_chrome(chrome)
    result.graph.save(graph_path)
    check, torch_check = result.check, result.torch_check
    summary = {
        "model": args.model,
        "size": args.size,
        "optimizer": args.optimizer,
        "backend": "tensorflow",
        "threads": {"intra_op": threads.intra_op, "inter_op": threads.inter_op},
        "devices": threads.cpu_devices,
        "placement_honoured": result.graph.meta.get("placement_honoured"),  # share of planned nodes on their device
        "order_honoured": result.graph.meta.get("order_honoured"),  # share of planned consecutive pairs run in order
        "ops": len(result.graph),
        "step_time_s": result.step_time_s,
        "step_times_s": list(result.step_times_s),
        "ranks": 1,
        "rank_step_times_s": [list(result.step_times_s)],
        "max_abs_grad_diff": check["max_abs_grad_diff"],
        "numerics_ok": check["numerics_ok"],
        "numeric_check": check,  # the TF graph step against TF eager
        "torch_max_abs_grad_diff": None if torch_check is None else torch_check["max_abs_grad_diff"],
        "torch_check": torch_check,  # the TF step against eager PyTorch on the same weights
        "trace": str(out),
        "chrome_trace": str(chrome),
        "graph": str(graph_path),
        "tensorflow": result.graph.meta.get("tensorflow", ""),
    }
    ok = bool(check["numerics_ok"]) and (torch_check is None or bool(torch_check["numerics_ok"]))
    if args.json:
        print_json(summary)
    else:
        print(f"{args.model}/{args.size} on TensorFlow {summary['tensorflow']} ({len(result.graph)} executed nodes), "
              f"{threads.describe()}")
        print(f"  step time   {result.step_time_s * 1e3:.2f} ms (median of {len(result.step_times_s)})")
        if summary["order_honoured"] is not None:
            print(f"  order       {summary['order_honoured']:.0%} of the plan's consecutive nodes ran in its order")
        if summary["placement_honoured"] is not None:
            comm = sum(1 for op in result.graph.ops if op.target in ("tf._Send", "tf._Recv"))
            print(f"  placement   {summary['placement_honoured']:.0%} of planned nodes on their device; "
                  f"{comm // 2} transfers between devices (_Send/_Recv)")
        print(f"  numerics    vs TF eager: max abs grad diff {check['max_abs_grad_diff']:.2e} "
              f"({'ok' if check['numerics_ok'] else 'DIFFERS'})")
        if torch_check is not None:
            print(f"              vs PyTorch: max abs grad diff {torch_check['max_abs_grad_diff']:.2e}, worst gradient "
                  f"{torch_check['max_rel_norm_grad_diff']:.1e} of its norm ({torch_check['worst_tensor']}; "
                  f"{'ok' if torch_check['numerics_ok'] else 'DIFFERS'}, tolerance "
                  f"{torch_check['grad_rel_norm_tolerance']:g})")
        print(f"  trace       {out}")
        print(f"  graph       {graph_path}")
        print(f"  chrome      {chrome}  (open in https://ui.perfetto.dev)")
    return 0 if ok else 3
