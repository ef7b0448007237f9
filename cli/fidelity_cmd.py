"""`schedlab fidelity`: simulator vs executor over workloads and a spread of plans.

Two protocols share the measuring loop (`schedlab.calibrate.fidelity`):

- the built-in workloads (the default): trace-calibrated on two one-slot program-order
  runs, every plan predicted. Calibration also fits on these models: a training-set error.
- `--held-out`: models calibration never sees, each plan predicted twice, from the Profile
  alone and trace-calibrated on one plan shape (left out of that error).
- `--dev`: the same protocol on the dev set (`schedlab.workloads.devset`), the models a
  change to the simulator is judged on before the held-out set is measured.

With `--devices N` (N >= 2) the spread is of plans over N local ranks instead
(`schedlab.calibrate.rank_fidelity`: placed, data-parallel, reverse-first-k), run on the
multi-process executor and predicted with the Profile's link fits.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlab.cli.common import TRACES_DIR, print_json
from schedlab.errors import SchedlabError
from schedlab.workloads import BUILTIN_WORKLOADS, devset
from schedlab.workloads import short_name as short
from schedlab.workloads.heldout import HELDOUT_WORKLOADS, PREFIX

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile

DEFAULT_OUT = TRACES_DIR / "fidelity.json"
DEFAULT_HELDOUT_OUT = TRACES_DIR / "fidelity-heldout.json"
DEFAULT_DEV_OUT = TRACES_DIR / "fidelity-dev.json"
DEFAULT_RANKS_OUT = TRACES_DIR / "fidelity-ranks.json"
DEFAULT_HELDOUT_RANKS_OUT = TRACES_DIR / "fidelity-heldout-ranks.json"
DEFAULT_TF_OUT = TRACES_DIR / "fidelity-tf.json"
DEFAULT_TF_HELDOUT_OUT = TRACES_DIR / "fidelity-tf-heldout.json"


@dataclasses.dataclass(frozen=True)
class ModelSet:
    """Models the held-out protocol runs on (`run_held_out`): the held-out set, the test set
    judged once, or the dev set, which changes to the simulator are chosen on."""

    label: str  # the results file's "set"
    flag: str
    prefix: str  # of its MODEL specs
    specs: tuple[str, ...]  # every model, in the order a run measures them
    default_out: Path
    file_tag: str  # in the default results file names: fidelity-<tag>[-ranks]-rescored.json


HELD_OUT_SET = ModelSet("held-out", "--held-out", PREFIX, HELDOUT_WORKLOADS, DEFAULT_HELDOUT_OUT, "heldout")
DEV_SET = ModelSet("dev", "--dev", devset.PREFIX, devset.DEV_WORKLOADS, DEFAULT_DEV_OUT, "dev")
MODEL_SETS = (HELD_OUT_SET, DEV_SET)


def model_set(args: argparse.Namespace) -> ModelSet | None:
    """The set the command line asks the held-out protocol to run on; None: the built-ins."""
    if getattr(args, "dev", False):
        return DEV_SET
    return HELD_OUT_SET if args.held_out else None


def rescored_out(set_name: str, devices: int) -> Path:
    """Where re-scored runs go by default: the measured file's name (fidelity[-heldout|-dev][-ranks])
    with -rescored."""
    tag = next((f"-{s.file_tag}" for s in MODEL_SETS if s.label == set_name), "")
    return TRACES_DIR / f"fidelity{tag}{'-ranks' if devices > 1 else ''}-rescored.json"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fidelity",
        help="how well the simulator predicts the executor (MAPE, worst error, Kendall tau, sim speed)",
        description="For each workload and each plan of a spread (slots 1 and 2, threads 1 and 2, every order "
        "policy; on more than 2 cores slots 1, 2, 4 x threads 1, 2, 4, ... up to the cores, slots x threads <= cores), "
        "measure the step on the executor and predict it in the simulator; report per-plan errors, "
        "per-workload MAPE, worst error, Kendall rank correlation, and the simulator's speed. By default on the "
        "built-in workloads, which calibration also fits on (a training-set error). With --held-out, on models "
        f"calibration never sees ({', '.join(HELDOUT_WORKLOADS)}), each plan predicted twice: from the stored "
        "profile alone (profile-only), and with the profile trace-calibrated on one measured run of the model "
        "under one slot, one thread, program order (trace-calibrated; that plan is left out of its error). "
        "`schedlab report RESULTS.json` draws predicted vs measured from the results file.",
    )
    p.add_argument(
        "models", nargs="*", metavar="MODEL",
        help="workloads (default: all built-in; with --held-out, every held-out model)",
    )
    p.add_argument(
        "--models", dest="model_list", action="append", default=[], metavar="NAME[,NAME...]",
        help="workloads to run, comma-separated (repeatable); with --held-out, held-out names with or "
        f"without the '{PREFIX}' prefix",
    )
    p.add_argument(
        "--held-out", action="store_true",
        help="the held-out models: profile-only and trace-calibrated errors side by side",
    )
    p.add_argument(
        "--dev", action="store_true",
        help="the held-out protocol on the dev set instead "
        f"({', '.join(devset.DEV_WORKLOADS)}; schedlab.workloads.devset): the models to judge a change to the "
        f"simulator on, so that the held-out set stays a test; results in {DEFAULT_DEV_OUT.name}",
    )
    p.add_argument("--size", choices=("tiny", "default", "gpu"), default="default",
                   help="workload size (default: default; gpu, with --cuda: the default models at 16x their batch)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--profile", default=None, metavar="PROFILE", help="profile (default: traces/profile.json)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per plan (default 5)")
    p.add_argument(
        "--no-trace-calibration",
        action="store_true",
        help="predict from the profile alone, without first learning op times from calibration traces "
        "(built-in protocol; --held-out always reports both)",
    )
    p.add_argument(
        "--out", default=None, metavar="PATH",
        help=f"results file (default {DEFAULT_OUT.name}, or {DEFAULT_HELDOUT_OUT.name} with --held-out, in the "
        "traces folder); rewritten after each model (\"complete\": false, the models still \"pending\"), so a run "
        "cut short keeps the models it finished; with --held-out each model's calibration-plan trace goes into "
        "a folder beside it (PATH without .json, plus -traces), for --rescore",
    )
    p.add_argument(
        "--resume", action="store_true",
        help="continue a run cut short: keep the models the results file (--out) already holds and measure only "
        "the others (the file's conditions must match this run's: set, size, optimizer, steps, rounds, cores, "
        "profile; with --devices also the ranks and the plans)",
    )
    p.add_argument(
        "--devices", type=int, default=None, metavar="N",
        help="fidelity on N local ranks (N >= 2; one CPU device and process each, the cores split): a spread of "
        "placed, data-parallel and reverse-first-k plans run on the multi-process executor, predicted with the "
        "profile's link fits (`schedlab calibrate --links`); results in "
        f"{DEFAULT_RANKS_OUT.name} ({DEFAULT_HELDOUT_RANKS_OUT.name} with --held-out)",
    )
    p.add_argument(
        "--plans", dest="plan_list", action="append", default=[], metavar="NAME[,NAME...]",
        help="with --devices: only these plans of the multi-rank spread (repeatable; default all)",
    )
    p.add_argument(
        "--rounds", type=int, default=1, metavar="R",
        help="measure the whole spread (one-device or --devices N) R times, round-robin, and score each plan on the "
        "median of every round's steps (a slow spell of a shared host then falls on all plans alike, not on the "
        "plans measured last; the rounds' medians are in the JSON); default 1",
    )
    p.add_argument(
        "--backend", choices=("torch", "tensorflow"), default="torch",
        help="the runtime predicted: torch (schedlab's executor, default) or tensorflow (TensorFlow's own runtime, "
        "each threading setting, intra-op 1 and all cores x inter-op 1 and all cores, in a fresh process; "
        f"calibrated on its one-inter-op settings; results in {DEFAULT_TF_OUT.name}, or "
        f"{DEFAULT_TF_HELDOUT_OUT.name} with --held-out: the TF held-out models)",
    )
    p.add_argument(
        "--rescore", action="append", default=[], metavar="RESULTS.json",
        help="run nothing; predict the plans of saved results files (repeatable; one-device or --devices N runs, "
        "built-in or held-out, all alike; one-device runs on the cores they were measured on, so a many-core "
        "machine's runs re-score here with the profile calibrated there) from --profile, profile-only (and "
        "trace-calibrated where a held-out run kept its calibration traces beside it), against the median of "
        "their measured times, "
        "so profiles or simulator versions are compared on the same measurements; also prints how far each run is "
        "from that median (the floor under a one-run figure); results in the traces folder, named after the files "
        "re-scored: fidelity[-heldout][-ranks]-rescored.json",
    )
    p.add_argument(
        "--cuda", action="store_true",
        help="on a machine with an NVIDIA GPU: each model's step on the GPU as the executor runs it (one stream; "
        "--slots: several) and as eager PyTorch does, interleaved, against the simulator's prediction from the "
        "profile's cuda section (`schedlab calibrate --cuda`) and from the GPU's datasheet roofline; results in "
        "fidelity-cuda.json",
    )
    p.add_argument(
        "--slots", default=None, metavar="K[,K...]",
        help="with --cuda: the executor's co-run slots on the GPU to measure each model under, one CUDA stream per "
        "slot (default 1: the straight-line step); the results rank them per model, measured against predicted",
    )
    p.add_argument(
        "--refit-issue", action="store_true",
        help="with --cuda --rescore: re-fit the host's issue costs (and, from rows of several slots, the co-run "
        "contention cost) from the built-in models in the files (measured in the same process as the held-out ones) "
        "before predicting; results in fidelity-cuda-rescored.json",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=run)


def named_models(args: argparse.Namespace) -> list[str]:
    """The MODELs named: positional and `--models` together, in order, each once."""
    named = [*args.models, *(m.strip() for item in args.model_list for m in item.split(",") if m.strip())]
    return list(dict.fromkeys(named))


def chosen_models(args: argparse.Namespace) -> list[str]:
    """The MODELs to run: those named, else the protocol's default set."""
    named = named_models(args)
    chosen = model_set(args)
    if chosen is None:
        return named or list(BUILTIN_WORKLOADS)
    if not named:
        return list(chosen.specs)
    out: list[str] = []
    for name in named:
        spec = name if name.startswith(chosen.prefix) else chosen.prefix + name
        if spec not in chosen.specs:
            raise SchedlabError(
                f"{name!r} is not a {chosen.label} model; with {chosen.flag} choose from "
                f"{', '.join(short(h) for h in chosen.specs)} "
                "(the built-in workloads are what calibration fits on)"
            )
        out.append(spec)
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise SchedlabError("--steps must be >= 1")
    if args.rounds < 1:
        raise SchedlabError(f"--rounds must be >= 1, got {args.rounds}")
    if getattr(args, "dev", False):
        if args.held_out:
            raise SchedlabError("--dev and --held-out are two sets of models for one protocol: give one")
        if args.backend != "torch" or getattr(args, "cuda", False) or args.devices is not None:
            raise SchedlabError("--dev runs the one-device protocol on schedlab's executor: drop --backend, --cuda "
                                "and --devices")
    chosen = model_set(args)
    if chosen is not None and args.no_trace_calibration:
        raise SchedlabError(f"{chosen.flag} reports profile-only and trace-calibrated errors both; "
                            "drop --no-trace-calibration")
    if args.backend == "tensorflow":
        from schedlab.cli.fidelity_tf import run_tf

        return run_tf(args, named_models(args))
    if getattr(args, "cuda", False) and args.rescore:
        if named_models(args) or args.rounds != 1 or args.slots is not None:
            raise SchedlabError("--rescore re-scores results files as they are: give no models, --rounds or --slots")
        from schedlab.cli.cuda_cmd import run_rescore_cuda

        return run_rescore_cuda(args)
    if getattr(args, "refit_issue", False):
        raise SchedlabError("--refit-issue goes with --cuda --rescore (GPU results files)")
    if getattr(args, "slots", None) is not None and not getattr(args, "cuda", False):
        raise SchedlabError("--slots goes with --cuda (the GPU's co-run slots); CPU fidelity runs its own plan spread")
    if args.rescore:
        if named_models(args) or args.plan_list or args.rounds != 1:
            raise SchedlabError("--rescore re-scores results files as they are: give no models, --plans or --rounds")
        return run_rescore(args)
    models = chosen_models(args)
    if getattr(args, "cuda", False):
        if args.devices is not None or args.plan_list:
            raise SchedlabError("--cuda measures one GPU (its co-run slots with --slots): drop --devices and "
                                "--plans")
        from schedlab.cli.cuda_cmd import run_fidelity_cuda

        return run_fidelity_cuda(args, models)
    if args.devices is not None:
        from schedlab.cli.fidelity_ranks import run_ranks

        return run_ranks(args, models)
    if args.plan_list:
        raise SchedlabError("--plans chooses plans of the multi-rank spread; give --devices N too")
    return run_held_out(args, models, chosen) if chosen is not None else run_builtin(args, models)


RESUMED_KEYS = (
    "set", "size", "optimizer", "steps_per_plan", "rounds", "cores", "profile_created_unix_s", "trace_calibration",
)


def resumed(
    out: Path, fresh: dict[str, Any], args: argparse.Namespace, keys: tuple[str, ...] = RESUMED_KEYS
) -> dict[str, Any] | None:
    """With --resume, the results file of the run cut short that this one continues (None if
    there is none yet), after checking it was measured as this run measures; an error
    names the first condition that differs."""
    from schedlab.io import read_json

    if not getattr(args, "resume", False):
        return None
    if not out.exists():
        print(f"schedlab fidelity: --resume: no results file at {out} yet; measuring every model", file=sys.stderr)
        return None
    d = read_json(out, "fidelity results file")
    if not isinstance(d, dict) or "plans" not in d:
        raise SchedlabError(f"--resume: {out} is not a fidelity results file")
    for key in keys:
        if d.get(key) != fresh.get(key):
            raise SchedlabError(
                f"--resume: {out} was measured with {key} {d.get(key)!r}, this run has {fresh.get(key)!r}; run "
                "with the same options, or without --resume (or another --out) to start afresh"
            )
    return d


def checkpointed(
    out: Path, body: dict[str, Any], before: dict[str, Any], t0: float, done: list[str], models: list[str]
) -> dict[str, Any]:
    """`body` with how complete the run is (`complete`, the models still `pending`) and its
    wall time so far (a resumed run's included), written to `out` atomically."""
    from schedlab.io import write_json_atomic

    pending = [m for m in models if m not in done]
    result = {**body, "complete": not pending, "pending": pending,
              "wall_s": float(before.get("wall_s", 0.0)) + time.perf_counter() - t0}
    write_json_atomic(out, result, indent=1)
    return result


def say_resuming(out: Path, done: list[str], todo: list[str]) -> None:
    if done:
        print(f"resuming {out}: {', '.join(done)} kept, {len(todo)} to measure", file=sys.stderr)


def conditions(set_name: str, args: argparse.Namespace, machine: Any) -> dict[str, Any]:
    """What every fidelity results file records of where and how it was measured."""
    from schedlab.trace import library_versions

    return {
        "set": set_name,
        "machine": machine.host,
        "cores": machine.default_device.cores,
        "versions": library_versions(),
        "size": args.size,
        "optimizer": args.optimizer,
        "steps_per_plan": args.steps,
        "rounds": args.rounds,
    }


def scores(rows: list[Any]) -> dict[str, Any]:
    """What a fidelity results file says of its `FidelityRow`s: MAPE over all plans and over
    those calibration never ran, the worst error, per-workload summaries, and every row."""
    from schedlab.calibrate.fidelity import halves_mape, one_round_mape, round_to_round_mape, shape_errors, summarise

    errs = [abs(r.error) for r in rows]
    unseen = [abs(r.error) for r in rows if not r.in_calibration]
    return {
        "mape": sum(errs) / len(errs),
        "mape_unseen_plans": sum(unseen) / len(unseen) if unseen else None,
        "one_round_mape": one_round_mape(rows),
        "round_to_round_mape": round_to_round_mape(rows),
        "halves_mape": halves_mape(rows),
        "worst_error": max((r.error for r in rows), key=abs),
        "workloads": [s.__dict__ for s in summarise(rows)],
        "plan_shapes": shape_errors(rows),
        "plans": [{**r.__dict__, "error": r.error} for r in rows],
    }


def run_builtin(args: argparse.Namespace, models: list[str]) -> int:
    from tqdm import tqdm

    from schedlab.calibrate.fidelity import measure_and_predict, plan_spread, row_from_json, summarise
    from schedlab.calibrate.trace_cal import calibrate_with_traces
    from schedlab.cli.common import capture_spec, load_profile
    from schedlab.io import check_writable
    from schedlab.machine import detect_host

    t0 = time.perf_counter()
    out = Path(args.out) if args.out else DEFAULT_OUT
    check_writable(out)  # before minutes of measuring, not after
    machine = detect_host()
    base_profile = load_profile(args.profile)
    plans = plan_spread(machine.default_device.cores)
    cal_threads = () if args.no_trace_calibration else tuple(sorted({1, machine.default_device.cores}))
    fresh = {**conditions("built-in", args, machine), "profile_created_unix_s": base_profile.created_unix_s,
             "trace_calibration": bool(cal_threads)}
    before = resumed(out, fresh, args) or {}
    rows = [row_from_json(p) for p in before.get("plans", []) if p["workload"] in models]
    drifts: list[dict[str, Any]] = [d for d in before.get("calibration_drift", []) if d["workload"] in models]
    probes = HostProbes(machine.default_device.cores)  # around each model's calibration and plans
    probes.keep(before.get("host_scaling"), models)
    done = list(dict.fromkeys(r.workload for r in rows))
    todo = [m for m in models if m not in done]

    def checkpoint() -> dict[str, Any]:
        body = {**fresh, **scores(rows), "calibration_drift": drifts, "host_scaling": probes.to_json(base_profile)}
        return checkpointed(out, body, before, t0, done, models)

    say_resuming(out, done, todo)
    result: dict[str, Any] | None = None
    with tqdm(total=len(todo) * len(plans) * args.rounds, desc="fidelity", unit="plan", file=sys.stderr, disable=None) as bar:
        for model in todo:
            bar.set_postfix_str(model)
            _, c = capture_spec(model, args.size, args.optimizer)
            cal_steps: dict[int, float] = {}
            with probes.around(model):
                profile = base_profile
                if cal_threads:
                    profile = calibrate_with_traces(profile, c.graph, c.input_values, machine, steps=args.steps,
                                                    step_times_s=cal_steps, rounds=args.rounds)
                mine = measure_and_predict(
                    model, c.graph, c.input_values, plans, profile, machine, steps=args.steps,
                    calibration_threads=cal_threads, progress=lambda: bar.update(1), rounds=args.rounds,
                )
            drifts += calibration_drift(model, cal_steps, mine)
            rows += mine
            done.append(model)
            result = checkpoint()
    if result is None:  # every model came from the resumed file
        result = checkpoint()
    summary = summarise(rows)
    if args.json:
        print_json(result)
        return 0
    print(f"fidelity on {machine.host.get('cpu_model')} ({machine.default_device.cores} cores), size {args.size}, "
          f"{args.steps} steps/plan, trace calibration {'on' if cal_threads else 'off'}")
    print(f"{'workload':<12}{'plan':<24}{'measured ms':>12}{'predicted ms':>13}{'error':>8}")
    for r in rows:
        mark = "*" if r.in_calibration else " "
        print(f"{r.workload:<12}{r.plan:<24}{r.measured_s * 1e3:>12.2f}{r.predicted_s * 1e3:>13.2f}{r.error * 100:>7.1f}%{mark}")
    print()
    print(f"{'workload':<12}{'MAPE':>8}{'worst':>8}{'tau':>7}{'tau*':>7}{'rounds':>8}{'sim ops/s':>12}{'exec/sim':>10}"
          f"{'(cold)':>9}")
    for s in summary:
        print(
            f"{s.workload:<12}{s.mape * 100:>7.1f}%{s.worst_error * 100:>7.1f}%{s.kendall_tau:>7.2f}"
            f"{tau(s.kendall_tau_resolved, 7)}{pct(s.round_spread, 8)}"
            f"{s.sim_ops_per_s:>12.0f}{s.exec_over_sim:>9.1f}x{s.exec_over_sim_cold:>8.1f}x"
        )
    print(f"overall MAPE {result['mape'] * 100:.1f}% (unseen plans {float(result['mape_unseen_plans'] or 0) * 100:.1f}%), "
          f"worst {float(result['worst_error']) * 100:.1f}%   (* = plan shape used in trace calibration)")
    print_one_round({"": result}, args.rounds)
    print("exec/sim: measured step time over simulation time, with the Simulator a search reuses; "
          "(cold): a simulate() call with a new cost model object")
    print(TAU_RESOLVED_NOTE)
    print(ROUNDS_NOTE)
    print_plan_shapes(result["plan_shapes"])
    print_host_scaling(result["host_scaling"], result.get("plans"))
    for d in drifts:
        if abs(d["drift"]) > DRIFT_WARN:
            print(f"warning: {d['workload']}: its trace-calibration run ({d['threads']} thread(s), one slot, program "
                  f"order) measured {d['calibration_step_s'] * 1e3:.1f} ms and the same plan {d['scored_step_s'] * 1e3:.1f} "
                  f"ms when scored ({d['drift'] * 100:+.0f}%): the machine's speed changed between them, so this "
                  "workload's errors mostly measure that")
    print(f"results: {out}")
    return 0


DRIFT_WARN = 0.15  # a scored run this far from its own trace-calibration run: the machine drifted


class HostProbes:
    """The host's two-core scaling (`calibrate.host_scaling`) before and after each model's
    measurements, as the results file keeps them beside the Profile's own probe."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.models: list[dict[str, Any]] = []

    @contextmanager
    def around(self, model: str) -> Iterator[None]:
        from schedlab.calibrate.host_scaling import probe_host_scaling

        before = probe_host_scaling(self.cores)
        yield
        after = probe_host_scaling(self.cores)
        self.models.append({"workload": model, "before": before and before.to_json(), "after": after and after.to_json()})

    def keep(self, saved: dict[str, Any] | None, models: list[str]) -> None:
        """Carry over a resumed results file's probes of `models` (its `host_scaling`)."""
        self.models = [m for m in (saved or {}).get("models", []) if m.get("workload") in models]

    def to_json(self, profile: Profile) -> dict[str, Any]:
        return {"calibration": profile.meta.get("host_scaling"), "models": self.models}


def calibration_drift(workload: str, cal_steps: dict[int, float], rows: list[Any]) -> list[dict[str, Any]]:
    """Per trace-calibration run, the same plan's scored run against it: trace calibration
    replays the calibration run's op times, so a scored run far from it means the machine's
    speed changed in between (a neighbour on the host), not a modelling error."""
    scored = {r.plan: r.measured_s for r in rows}
    out = []
    for threads, cal_s in sorted(cal_steps.items()):
        plan = f"s1-t{threads}-topo"  # `plan_spread`'s name of the calibration run's plan
        if plan in scored:
            out.append({"workload": workload, "plan": plan, "threads": threads, "calibration_step_s": cal_s,
                        "scored_step_s": scored[plan], "drift": scored[plan] / cal_s - 1.0})
    return out


# ---- --held-out ------------------------------------------------------------------------------


def run_held_out(args: argparse.Namespace, models: list[str], chosen: ModelSet = HELD_OUT_SET) -> int:
    from tqdm import tqdm

    from schedlab.calibrate import cal_traces
    from schedlab.calibrate.fidelity import (
        CALIBRATION_PLAN,
        held_out_fidelity,
        held_out_from_json,
        held_out_summary,
        plan_spread,
    )
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.cli.common import capture_spec, load_profile
    from schedlab.io import check_writable
    from schedlab.machine import detect_host

    t0 = time.perf_counter()
    out = Path(args.out) if args.out else chosen.default_out
    check_writable(out)  # before minutes of measuring, not after
    check_writable(cal_traces.traces_dir(out) / "trace.json")  # and the calibration traces beside it
    machine = detect_host()
    profile = load_profile(args.profile)
    plans = plan_spread(machine.default_device.cores)
    fresh = {**conditions(chosen.label, args, machine), "profile": str(args.profile or DEFAULT_PROFILE_PATH),
             "profile_created_unix_s": profile.created_unix_s}
    before = resumed(out, fresh, args) or {}
    results = [r for r in (held_out_from_json(before) if before else []) if r.workload in models]
    # the calibration plan's trace of each model, beside the results file (calibrate.cal_traces)
    trace_files = {m["workload"]: m[cal_traces.KEY] for m in before.get("models", []) if m.get(cal_traces.KEY)}
    probes = HostProbes(machine.default_device.cores)
    probes.keep(before.get("host_scaling"), models)
    done = [r.workload for r in results]
    todo = [m for m in models if m not in done]
    cal_name = CALIBRATION_PLAN.name

    def checkpoint() -> dict[str, Any]:
        summary = held_out_summary(results)
        for m in summary["models"]:
            if m["workload"] in trace_files:
                m[cal_traces.KEY] = trace_files[m["workload"]]
        body = {
            **fresh,
            "plans_per_model": len(plans),
            "calibration_plan": cal_name,
            "note": f"profile-only: the stored profile alone, every plan; trace-calibrated: the profile plus the op "
            f"times of the measured run of {cal_name} of the same model, every other plan ({cal_name} is left out "
            "of its errors; 'other_shapes' also leaves out the other one-slot one-thread plans; its trace is the "
            f"file '{cal_traces.KEY}' names). Errors are fractions: predicted / measured - 1.",
            **summary,
            "host_scaling": probes.to_json(profile),
        }
        return checkpointed(out, body, before, t0, done, models)

    say_resuming(out, done, todo)
    result: dict[str, Any] | None = None
    with tqdm(total=len(todo) * len(plans) * args.rounds, desc=f"{chosen.label} fidelity", unit="plan", file=sys.stderr,
              disable=None) as bar:
        for model in todo:
            bar.set_postfix_str(model)
            _, c = capture_spec(model, args.size, args.optimizer)
            with probes.around(model):
                results.append(held_out_fidelity(
                    model, c.graph, c.input_values, plans, profile, machine, steps=args.steps,
                    progress=lambda: bar.update(1), rounds=args.rounds,
                ))
            if results[-1].calibration_trace is not None:
                trace_files[model] = cal_traces.save_trace(out, model, results[-1].calibration_trace)
            done.append(model)
            result = checkpoint()
    if result is None:  # every model came from the resumed file
        result = checkpoint()
    if args.json:
        print_json(result)
        return 0
    print_held_out(result, machine.host.get("cpu_model"), out)
    return 0


def run_rescore(args: argparse.Namespace) -> int:
    from schedlab.calibrate.fidelity import CALIBRATION_PLAN
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH
    from schedlab.calibrate.rank_fidelity import ranks_machine
    from schedlab.calibrate.rescore import load_runs, one_device_plans, rank_plans, rescore
    from schedlab.cli.common import capture_spec, load_profile, plan_steps_of
    from schedlab.io import check_writable, write_json_atomic
    from schedlab.machine import detect_host

    runs = load_runs(args.rescore)
    chosen = model_set(args)
    if chosen is not None and runs.set_name != chosen.label:
        raise SchedlabError(f"{chosen.flag}: the results files measured the {runs.set_name} models")
    if args.devices is not None and args.devices != runs.devices:
        raise SchedlabError(f"--devices {args.devices}: the results files were measured on {runs.devices} rank(s)")
    out = Path(args.out) if args.out else rescored_out(runs.set_name, runs.devices)
    if any(Path(p).resolve() == out.resolve() for p in args.rescore):
        raise SchedlabError(f"--out {out} is one of the results files re-scored; choose another path")
    check_writable(out)
    profile = load_profile(args.profile)
    host = detect_host()
    if runs.devices == 1:
        # One device: the host the runs measured, its cores as the files say (16-core runs of a
        # lent machine re-score here too, with the profile calibrated there).
        cpu = dataclasses.replace(host.default_device, cores=runs.cores)
        machine = dataclasses.replace(host, devices=(cpu,), host={**host.host, **runs.conditions.get("machine", {})})
        plans = one_device_plans(lambda w: capture_spec(w, runs.size, runs.optimizer)[1].graph, machine)
    else:
        machine = ranks_machine(runs.devices, profile)
        plans = rank_plans(lambda w: plan_steps_of(w, runs.size, runs.optimizer), machine, profile)
    result = {
        "profile": str(args.profile or DEFAULT_PROFILE_PATH),
        "profile_created_unix_s": profile.created_unix_s,
        **rescore(runs, profile, machine, plans, machine.default_device.cores if runs.devices == 1
                  else host.default_device.cores),
    }
    write_json_atomic(out, result, indent=1)
    if args.json:
        print_json(result)
        return 0
    n = len(runs.paths)
    where = f"{runs.cores} cores" + (f", {runs.devices} ranks" if runs.devices > 1 else "")
    learnt = "trace_calibrated" in result["overall"]
    print(f"{runs.set_name} fidelity re-scored: profile {result['profile']}, profile-only"
          f"{f' and trace-calibrated (on the {CALIBRATION_PLAN.name} traces the results files kept)' if learnt else ''}, "
          f"against the median of {n} run(s) (size {runs.size}, {where})")
    methods = ("profile_only", "trace_calibrated") if learnt else ("profile_only",)
    if learnt:
        print(f"{'':30}{'--- profile-only ---':>23}{'-- trace-calibrated --':>23}")
    print(f"{'workload':<24}{'ops':>6}" + f"{'MAPE':>8}{'worst':>8}{'tau':>7}{'tau*':>7}" * len(methods)
          + "   run spread (MAPE of the median against each run)")

    def cells(a: dict[str, Any] | None, tau_key: str = "kendall_tau") -> str:
        if a is None:
            return f"{'-':>8}{'-':>8}{'-':>7}{'-':>7}"
        return f"{pct(a['mape'], 8)}{pct(a['worst_error'], 8)}{tau(a[tau_key], 7)}{tau(a.get(tau_key + '_resolved'), 7)}"

    for m in result["models"]:
        print(f"{short(m['workload']):<24}{m['ops']:>6}" + "".join(cells(m.get(k)) for k in methods)
              + f"   {' '.join(pct(x, 7) for x in m['run_spread'])}")
    print(f"{'all (tau: median)':<30}" + "".join(cells(result["overall"][k], "median_kendall_tau") for k in methods)
          + f"   {' '.join(pct(x, 7) for x in result['overall']['run_spread'])}")
    print_one_round({k.replace("_", "-"): result["overall"][k] for k in methods}, None)
    for workload, why in result.get("trace_calibration_skipped", {}).items():
        print(f"{workload}: profile-only (its calibration trace left out: {why})")
    print(TAU_RESOLVED_NOTE)
    print_sim_cost(result)
    print_plan_shapes(result.get("plan_shapes", []))
    print(f"results: {out}")
    return 0


def print_one_round(summaries: dict[str, dict[str, Any]], rounds: int | None) -> None:
    """Each labelled summary's MAPE against one round (`one_round_mape`; an empty label for a
    lone figure) beside the machine's own, one round against another (the first summary's
    `round_to_round_mape`) and one half of the rounds' against the other's (`halves_mape`,
    where the file has it); or, for a run of one round per plan, that it cannot know them."""
    values: list[float] = [s["one_round_mape"] for s in summaries.values() if s.get("one_round_mape") is not None]
    if values and len(values) == len(summaries):
        first = next(iter(summaries.values()))
        machine = first["round_to_round_mape"]
        shown = ", ".join(f"{label} {x * 100:.1f}%".strip() for label, x in zip(summaries, values, strict=True))
        print(f"{ONE_ROUND_NOTE}: {shown}; {ROUND_TO_ROUND_NOTE}: {machine * 100:.1f}%")
        if first.get("halves_mape") is not None:
            print(f"{HALVES_NOTE}: {first['halves_mape'] * 100:.1f}%")
    elif rounds == 1:
        print(ONE_ROUND_HINT)


def print_host_scaling(scaling: dict[str, Any] | None, plans: list[dict[str, Any]] | None = None) -> None:
    """The host's one-thread over all-threads speedup of a compute-bound and a memory-bound
    probe (`calibrate.host_scaling`) when the Profile was calibrated and around each model;
    and, where both were taken, the compute probe's one-thread time and one tiny call's
    against calibration's: the host's own drift since the Profile (the same quick profile
    scored 9.8% and 19.7% profile-only on the held-out set ten minutes apart, 2026-11-28,
    while the `mm` ratio's median over the probes went from 1.02x to 1.13x). The tiny call
    is the interpreter's and dispatcher's share, which a small model's step is made of."""
    from schedlab.calibrate.host_drift import probe_ratios
    from schedlab.calibrate.host_scaling import HostScaling

    if not scaling or not any(m.get("before") for m in scaling.get("models", [])):
        return
    cal = HostScaling.from_json(scaling.get("calibration"))
    # the probe figures taken against calibration's: none without its probe, the tiny call
    # only where calibration timed it
    against_cal = {} if cal is None else {"compute_1t_us": "one-thread mm", **({"call_us": "one tiny call"} if cal.call_us > 0 else {})}

    def pair(d: Any) -> str:
        p = HostScaling.from_json(d)
        return "   -  /   - " if p is None else f"{p.compute_speedup:5.2f} / {p.memory_speedup:4.2f}"

    def ratio(x: float | None) -> str:
        return "  -  " if x is None else f"{x:4.2f}x"

    heading = ":" if not against_cal else (
        ", and its one-thread mm time" + (" and one tiny call" if "call_us" in against_cal else "") + " against calibration's:")
    print("\nthe host's speedup from one thread to all cores (compute mm / memory add; calibrate/host_scaling.py)" + heading)
    print(f"  {'at calibration':<26}{pair(scaling.get('calibration'))}")
    per_field = {field: probe_ratios(scaling, field) for field in against_cal}
    ratios: dict[str, list[float]] = {field: [] for field in against_cal}
    for m in scaling["models"]:
        line = f"  {short(m['workload']):<26}{pair(m.get('before'))}  ->  {pair(m.get('after'))}"
        for field in against_cal:
            here = per_field[field][str(m["workload"])]
            ratios[field] += [x for x in here if x is not None]
            line += f"    {ratio(here[0])} -> {ratio(here[1])}"
        print(line)
    for field, what in against_cal.items():
        if ratios[field]:
            r = ratios[field]
            print(f"  {what} against calibration: {min(r):.2f}-{max(r):.2f}x, median {statistics.median(r):.2f}x "
                  "(above 1: the host ran it slower than when the profile was calibrated)")
    print_drift_scaled(scaling, plans or [])


def print_drift_scaled(scaling: dict[str, Any], plans: list[dict[str, Any]]) -> None:
    """The profile-only MAPE with each model's predictions scaled by its `mm` probe against
    calibration (`calibrate.host_drift`), beside the MAPE as predicted."""
    from schedlab.calibrate.host_drift import drift_scaled_mape, mm_drift

    mapes = drift_scaled_mape(plans, mm_drift(scaling))
    if mapes is not None:
        print(f"  profile-only MAPE {mapes[0] * 100:.1f}% as predicted, {mapes[1] * 100:.1f}% with each model's "
              "predictions times its one-thread mm against calibration (the host's drift, calibrate/host_drift.py)")


def print_plan_shapes(shapes: list[dict[str, Any]]) -> None:
    """Errors per plan shape (`calibrate.fidelity.shape_errors`): where the model leans one way."""
    if not shapes:
        return
    methods = list(dict.fromkeys(s["method"] for s in shapes))
    by = {(s["method"], s["shape"]): s for s in shapes}
    print()
    print("by plan shape (all models; mean error: negative is predicted fast):")
    print(f"{'':<10}" + "".join(f"{'--- ' + m + ' ---':>25}" for m in methods))
    print(f"{'shape':<10}" + f"{'plans':>9}{'mean':>8}{'MAPE':>8}" * len(methods))
    for shape in dict.fromkeys(s["shape"] for s in shapes):
        cells = []
        for m in methods:
            s = by.get((m, shape))
            cells.append(f"{'-':>25}" if s is None else f"{s['n_plans']:>9}{pct(s['mean_error'], 8)}{pct(s['mape'], 8)}")
        print(f"{shape:<10}" + "".join(cells))


def pct(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x * 100:>{width - 1}.1f}%"


def tau(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.2f}"


TAU_RESOLVED_NOTE = ("tau*: Kendall tau over the pairs of plans the measurement tells apart (their rounds' medians "
                     "do not overlap); '-' where it tells none apart")
ONE_ROUND_NOTE = ("MAPE of the same predictions against a single round's medians, mean over the rounds "
                  "(what a run of one round would report; the gap to the MAPE above is the machine's noise)")
ROUND_TO_ROUND_NOTE = "one round's medians as a prediction of another's, the machine against itself"
HALVES_NOTE = ("the first half of the rounds' medians against the second half's, both ways (the plans measured "
               "again minutes later: an error near it is within what this run can tell)")
ONE_ROUND_HINT = ("one round per plan: this run cannot tell the machine's noise from the simulator's error; "
                  "--rounds 3 measures it (rounds, and the MAPE against one round beside one round's against another)")
ROUNDS_NOTE = ("rounds: the machine's own noise, the mean |deviation| of each plan's round medians from its median "
               "(the MAPE an exact prediction scores against one round); '-' with one round")


OP_CLASS_ROWS = 8  # classes printed; the JSON holds them all


def print_op_classes(classes: list[dict[str, Any]], cal: str) -> None:
    """The pooled per-class table of `calibrate.op_errors`: the cost model alone on unseen ops."""
    if not classes:
        return
    print()
    print(f"the profile's kernels against the {cal} traces, ops whose signature it never measured "
          f"(all models, per step; the {min(OP_CLASS_ROWS, len(classes))} largest classes of {len(classes)}):")
    print(f"{'op class':<36}{'ops':>6}{'measured ms':>13}{'predicted ms':>14}{'ratio':>7}{'mean |log|':>11}")
    for c in classes[:OP_CLASS_ROWS]:
        ratio = f"{c['ratio']:>7.2f}" if c["ratio"] is not None else f"{'-':>7}"
        print(f"{c['op_class'][:35]:<36}{c['n_ops']:>6}{c['measured_us'] / 1e3:>13.2f}{c['predicted_us'] / 1e3:>14.2f}"
              f"{ratio}{c['mean_abs_log']:>11.2f}")


def print_sim_cost(result: dict[str, Any]) -> None:
    """Per model, the measured step over the simulation time (`calibrate.fidelity.sim_cost`):
    the search's reused Simulator and a cold `simulate()` call, median over the plans, and
    the cold call's least over them."""
    models = [m for m in result["models"] if m.get("sim_cost", {}).get("plans")]
    if not models:
        return
    print("simulating a step against running it (measured step / simulation time, profile-only predictions):")
    print(f"{'workload':<24}{'reused':>9}{'cold':>8}{'cold, least (its plan)':>25}")
    for m in models:
        c = m["sim_cost"]
        print(f"{short(m['workload']):<24}{c['exec_over_sim']:>8.0f}x{c['exec_over_sim_cold']:>7.0f}x"
              f"{c['exec_over_sim_cold_min']:>8.0f}x ({c['least_plan']})")
    least = result.get("sim_cost") or {}
    if least.get("least_model"):
        print(f"least: the reused simulator {least['exec_over_sim_min']:.0f}x, a cold call "
              f"{least['exec_over_sim_cold_min']:.0f}x ({short(least['least_model'])}) cheaper than running")


def _flag_warning(plans: list[str], of: int, why: str) -> None:
    """One warning naming the first five of the `plans` (of `of`) measured while `why`."""
    if plans:
        named = ", ".join(plans[:5]) + (f" and {len(plans) - 5} more" if len(plans) > 5 else "")
        print(f"warning: {len(plans)} of {of} plans measured while {why}: {named}")


def print_held_out(result: dict[str, Any], cpu: Any, out: Path) -> None:
    cal = result["calibration_plan"]
    print(f"{result['set']} fidelity on {cpu} ({result['cores']} cores), size {result['size']}, "
          f"{result['steps_per_plan']} steps/plan, profile {result['profile']}")
    print(f"{'workload':<30}{'plan':<22}{'measured ms':>12}{'profile-only ms':>16}{'error':>8}"
          f"{'trace-cal ms':>13}{'error':>8}{'others':>8}{'steal':>7}")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for r in result["plans"]:
        by_key.setdefault((r["workload"], r["plan"]), {})[r["method"]] = r
    for (workload, plan), pair in by_key.items():
        alone, learnt = pair["profile-only"], pair["trace-calibrated"]
        mark = "*" if learnt["in_calibration"] else " "
        print(f"{workload:<30}{plan:<22}{alone['measured_s'] * 1e3:>12.2f}{alone['predicted_s'] * 1e3:>16.2f}"
              f"{pct(alone['error'], 8)}{learnt['predicted_s'] * 1e3:>13.2f}{pct(learnt['error'], 8)}{mark}"
              f"{pct(alone.get('foreign_cpu_frac'), 7)}{pct(alone.get('steal_frac'), 7)}")
    print()
    print(f"{'':<30}{'--- profile-only ---':>24}   {'--- trace-calibrated ---':>36}")
    print(f"{'workload':<24}{'ops':>6}{'MAPE':>8}{'worst':>8}{'tau':>7}{'tau*':>7}   {'MAPE':>8}{'worst':>8}{'tau':>7}"
          f"{'tau*':>7}{'other shapes':>13}{'seen ops':>10}{'rounds':>8}")
    for m in result["models"]:
        a, t = m["profile_only"], m["trace_calibrated"]
        print(f"{short(m['workload']):<24}{m['ops']:>6}{pct(a['mape'], 8)}{pct(a['worst_error'], 8)}"
              f"{tau(a['kendall_tau'], 7)}{tau(a.get('kendall_tau_resolved'), 7)}   {pct(t['mape'], 8)}"
              f"{pct(t['worst_error'], 8)}{tau(t['kendall_tau'], 7)}{tau(t.get('kendall_tau_resolved'), 7)}"
              f"{pct(t['other_shapes']['mape'], 13)}{pct(m['profile_seen_ops'], 10)}{pct(a.get('round_spread'), 8)}")
    a, t = result["overall"]["profile_only"], result["overall"]["trace_calibrated"]
    print(f"{'all (tau: median)':<30}{pct(a['mape'], 8)}{pct(a['worst_error'], 8)}{tau(a['median_kendall_tau'], 7)}"
          f"{tau(a.get('median_kendall_tau_resolved'), 7)}   {pct(t['mape'], 8)}{pct(t['worst_error'], 8)}"
          f"{tau(t['median_kendall_tau'], 7)}{tau(t.get('median_kendall_tau_resolved'), 7)}{'':>23}"
          f"{pct(a.get('round_spread'), 8)}")
    print_one_round({"profile-only": a, "trace-calibrated": t}, result.get("rounds"))
    print(f"profile-only: the stored profile alone, over all {result['plans_per_model']} plans of each model. "
          f"trace-calibrated: calibrated on the measured run of {cal} (*) of the same model, errors over the "
          f"other {result['plans_per_model'] - 1} plans; other shapes: only plans with 2 slots or 2 threads.")
    print("seen ops: share of the model's kernel ops whose exact signature the profile measured in calibration")
    print(TAU_RESOLVED_NOTE)
    print(ROUNDS_NOTE)
    print("others: share of the CPU other processes used while the plan was measured; steal: share the hypervisor "
          "gave to something else (a virtual machine's /proc/stat steal)")
    print_sim_cost(result)
    print_op_classes(result.get("op_classes", []), cal)
    print_plan_shapes(result.get("plan_shapes", []))
    print_host_scaling(result.get("host_scaling"), result.get("plans"))
    _flag_warning(result["busy_plans"], len(by_key), f"other processes used over {result['busy_frac']:.0%} of the CPU "
                  "(column 'others'); their times are unreliable")
    _flag_warning(result.get("steal_plans") or [], len(by_key), "the hypervisor took over "
                  f"{result.get('steal_frac', 0.0):.0%} of the CPU (column 'steal'); their times are the host's")
    print(f"results: {out}   (draw them: schedlab report {out})")
