"""`schedlab calibrate --cuda` and `schedlab fidelity --cuda`: a GPU's costs and the
simulator's fidelity on it (`calibrate.cuda_fidelity`).

    schedlab calibrate --cuda                 # the built-ins' kernels, issue costs and copies, into the profile
    schedlab fidelity --cuda                  # built-in models: executor vs eager vs simulator on the GPU
    schedlab fidelity --cuda --held-out       # the held-out models, from what the built-ins calibrated
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from schedlab.cli.common import TRACES_DIR
from schedlab.errors import SchedlabError

DEFAULT_CUDA_OUT = TRACES_DIR / "fidelity-cuda.json"
DEFAULT_CUDA_RESCORED = TRACES_DIR / "fidelity-cuda-rescored.json"


def require_cuda() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SchedlabError(
            "--cuda measures a GPU, and torch sees none here (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}): run it on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    return "cuda"


def _say(enabled: bool) -> Any:
    def say(msg: str) -> None:
        if enabled:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return say


def run_calibrate_cuda(args: argparse.Namespace) -> int:
    """Measure the GPU and write the cuda section into the existing Profile at --out."""
    from schedlab.calibrate.cuda_calibrate import calibrate_cuda
    from schedlab.calibrate.profile import Profile
    from schedlab.cli.calibrate_cmd import existing_profile
    from schedlab.workloads import BUILTIN_WORKLOADS

    out = existing_profile(args.out, "a GPU's costs", "on this machine: the host's CPU costs come from it, "
                           "`--cuda` adds the GPU's")
    device = require_cuda()
    t0 = time.perf_counter()
    size = args.size or ("tiny" if args.quick else "default")
    costs, report = calibrate_cuda(list(BUILTIN_WORKLOADS), size=size, device=device,
                                   progress=_say(not getattr(args, "no_progress", False)))
    dataclasses.replace(Profile.load(out, check_machine=False), cuda=costs).save(out)
    wall_s = round(time.perf_counter() - t0, 1)
    s = {"path": str(out), "wall_s": wall_s, "cuda": cuda_summary(costs), "models": report["models"],
         "failed_models": report["failed_models"]}
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        print(f"cuda section written to {out} ({wall_s} s)")
        print_cuda_summary(s["cuda"])
        for m, r in report["models"].items():
            print(f"  {m}: {r['ops']} ops, {r['new_signatures']} new signatures ({r['captured']} from CUDA graphs, "
                  f"{r['eager']} eager, {len(r['failed'])} failed), executor step {r['step_ms']:.2f} ms")
        for m, e in report["failed_models"].items():
            print(f"  {m}: did not run on the GPU: {e}")
    return 0


def cuda_summary(c: Any) -> dict[str, Any]:
    return {
        "device": c.device, "torch": c.torch, "launch_us": c.launch_us, "tflops": c.flops_per_s / 1e12,
        "bw_tb_per_s": c.bw_bytes_per_s / 1e12, "signatures": len(c.signatures), "issue_default_us": c.issue_default_us,
        "h2d": None if c.h2d is None else {"latency_us": c.h2d.latency_us, "gb_per_s": c.h2d.bw_bytes_per_s / 1e9},
        "d2h": None if c.d2h is None else {"latency_us": c.d2h.latency_us, "gb_per_s": c.d2h.bw_bytes_per_s / 1e9},
        "stream_issue_extra_us": c.stream_issue_extra_us, "stream_contention_us": c.stream_contention_us,
    }


def print_cuda_summary(s: dict[str, Any]) -> None:
    print(f"{s['device']} (torch {s['torch']}): empty kernel {s['launch_us']:.2f} us, fp32 mm {s['tflops']:.1f} TFLOP/s, "
          f"add {s['bw_tb_per_s']:.2f} TB/s; {s['signatures']} op signatures; host issue {s['issue_default_us']:.1f} us "
          "per op (median)")
    if s.get("stream_issue_extra_us") is not None:
        contention = s.get("stream_contention_us")
        print(f"  co-run slots on streams: +{s['stream_issue_extra_us']:.1f} us host issue per op"
              + ("" if contention is None else f", +{contention:.1f} us while another worker waits to issue"))
    for k in ("h2d", "d2h"):
        if s[k]:
            print(f"  {k}: {s[k]['latency_us']:.1f} us + bytes / {s[k]['gb_per_s']:.1f} GB/s (pinned)")


def run_fidelity_cuda(args: argparse.Namespace, models: list[str]) -> int:
    """Executor, eager and simulator on the GPU, model by model (`calibrate.cuda_fidelity`)."""
    from schedlab.calibrate.cuda_fidelity import cuda_fidelity, summary
    from schedlab.cli.common import load_profile
    from schedlab.io import check_writable, write_json_atomic
    from schedlab.trace import library_versions

    out = Path(args.out) if args.out else DEFAULT_CUDA_OUT
    check_writable(out)
    profile = load_profile(args.profile)
    slots = parse_slots(args.slots)
    device = require_cuda()
    failed: dict[str, str] = {}
    rows = cuda_fidelity(models, profile, size=args.size, optimizer=args.optimizer, device=device, steps=args.steps,
                         rounds=args.rounds, progress=_say(not args.json), failed=failed, slots=slots)
    scored = summary(rows)
    result: dict[str, Any] = {
        "set": "held-out" if args.held_out else "built-in",
        "conditions": {"versions": library_versions(), "size": args.size, "optimizer": args.optimizer,
                       "steps": args.steps, "rounds": args.rounds, "slots": list(slots),
                       "cuda": cuda_summary(profile.cuda)},
        "summary": scored,
        "models": [r.to_json() for r in rows],
        "failed_models": failed,
    }
    write_json_atomic(out, result, indent=1)
    print_rows(rows, scored, failed, out, as_json=args.json, result=result)
    return 0 if rows else 1


def parse_slots(text: str | None) -> tuple[int, ...]:
    """`--slots 1,2,4` -> (1, 2, 4); None -> (1,)."""
    if text is None:
        return (1,)
    try:
        out = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise SchedlabError(f"--slots takes slot counts separated by commas, like 1,2,4, not {text!r}") from None
    if not out or any(k < 1 for k in out):
        raise SchedlabError(f"--slots: every slot count must be >= 1, got {text!r}")
    return out


def print_rows(rows: list[Any], scored: dict[str, Any], failed: dict[str, str], out: Path, *, as_json: bool,
               result: dict[str, Any]) -> None:
    if as_json:
        print(json.dumps(result, indent=1))
        return
    print(f"{'model':32s} {'slots':>5s} {'ops':>5s} {'executor':>9s} {'eager':>8s} {'x eager':>8s} {'issue':>7s} "
          f"{'predicted':>10s} {'error':>7s} {'roofline':>9s} {'error':>7s} {'known':>6s}")
    for r in rows:
        print(f"{r.model:32s} {r.slots:5d} {r.ops:5d} {r.measured_ms:8.2f}m {r.eager_ms:7.2f}m {r.ratio_vs_eager:8.2f} "
              f"{r.issue_ms:6.2f}m {r.predicted_ms:9.2f}m {r.error_pct:+6.1f}% {r.roofline_ms:8.2f}m "
              f"{r.roofline_error_pct:+6.1f}% {r.known_signatures:6.0%}")
    groups = [("", scored)] + [(f"{k} slots, ", g) for k, g in scored.get("slots", {}).items()]
    for prefix, group in groups:
        for label in ("builtin", "heldout"):
            if label in group:
                s = group[label]
                diff = s.get("max_abs_diff_vs_line")
                same = "" if diff is None else f"; outputs within {diff:.2g} of the one-slot step's"
                print(f"{prefix}{label}: MAPE {s['mape_pct']:.1f}% calibrated, {s['roofline_mape_pct']:.1f}% datasheet "
                      f"roofline; executor/eager {s['ratio_vs_eager_median']:.2f} (median){same}")
    ranking = scored.get("slots_ranking")
    if ranking:
        print(f"fastest slot count predicted right for {ranking['agree']} of {ranking['of']} models")
    for m, e in failed.items():
        print(f"{m}: did not run on the GPU: {e}")
    print(f"results in {out}")


def run_rescore_cuda(args: argparse.Namespace) -> int:
    """Predict saved GPU results files again (no GPU needed): `calibrate.cuda_fidelity.rescore`."""
    from schedlab.calibrate.cuda_fidelity import rescore, summary
    from schedlab.cli.common import load_profile
    from schedlab.io import check_writable, read_json, write_json_atomic

    out = Path(args.out) if args.out else DEFAULT_CUDA_RESCORED
    if any(Path(p).resolve() == out.resolve() for p in args.rescore):
        raise SchedlabError(f"--out {out} is one of the files re-scored: write the results elsewhere")
    check_writable(out)
    profile = load_profile(args.profile, machine_is_host=False)
    saved = [read_json(p, "GPU fidelity results") for p in args.rescore]
    for p, d in zip(args.rescore, saved, strict=True):
        if not isinstance(d, dict) or not isinstance(d.get("models"), list) or "conditions" not in d:
            raise SchedlabError(f"{p} is not a `schedlab fidelity --cuda` results file (no conditions and models)")
    merged = {"conditions": saved[0]["conditions"], "models": [r for d in saved for r in d["models"]]}
    if any(d["conditions"].get(k) != saved[0]["conditions"].get(k) for d in saved for k in ("size", "optimizer")):
        raise SchedlabError("the files were measured at different sizes or optimizers: re-score them one at a time")
    fitted: dict[str, float] = {}
    rows = rescore(merged, profile, refit=args.refit_issue, fitted=fitted)
    scored = summary(rows)
    result: dict[str, Any] = {
        "rescored": [str(p) for p in args.rescore], "refit_issue": args.refit_issue, "fitted": fitted,
        "conditions": {**merged["conditions"], "cuda": cuda_summary(profile.cuda)},
        "summary": scored, "models": [r.to_json() for r in rows],
    }
    write_json_atomic(out, result, indent=1)
    if fitted and not args.json:
        print("re-fitted from the files' built-in models: " + ", ".join(f"{k} {v:.2f}" for k, v in fitted.items()))
    print_rows(rows, scored, {}, out, as_json=args.json, result=result)
    return 0
