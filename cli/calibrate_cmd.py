"""`schedlab calibrate`: measure this machine and write the Profile `simulate` reads.

    schedlab calibrate                 # full calibration (what `make calibrate` runs)
    schedlab calibrate --quick         # short version for tests and CI (~1 minute on 2 cores)
    schedlab calibrate --quick --out /tmp/p.json --json
    schedlab calibrate --links         # only the links between local ranks, into the existing profile
    schedlab calibrate --cuda          # a GPU's costs (calibrate.cuda_calibrate), into the existing profile
    schedlab calibrate --refit-waits --out Q.json   # the executor's waits fitted again on Q's own steps
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BUSY_MACHINE_FRAC = 0.10  # other processes' CPU share above which timings are suspect
STEAL_MACHINE_FRAC = 0.10  # the hypervisor's share (steal time) above which two-thread timings are suspect


def add_arguments(p: argparse.ArgumentParser) -> None:
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH

    p.add_argument("--quick", action="store_true", help="short calibration (tiny workloads, small sweep)")
    p.add_argument(
        "--out",
        metavar="PROFILE",
        type=Path,
        default=DEFAULT_PROFILE_PATH,
        help=f"where to write the Profile (default: {DEFAULT_PROFILE_PATH}, where simulate looks)",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="measure only the links between local gloo ranks (ping-pong and all-reduce over message sizes, "
        "about a minute; with --quick, fewer sizes) and write their fits into the existing profile --out",
    )
    p.add_argument(
        "--threads",
        metavar="N[,N...]",
        type=_thread_list,
        default=None,
        help="the intra-op thread counts to benchmark (default every count from 1 to the cores); on a many-core "
        "host, e.g. 1,2,4,8,16, the cost model's thread scaling fills the counts between",
    )
    p.add_argument(
        "--cuda",
        action="store_true",
        help="on a machine with an NVIDIA GPU: measure it (an empty kernel, a large mm and add, each op of the "
        "built-in workloads' steps alone, the host's cost to issue each op, pinned host<->device copies) and write "
        "the profile's cuda section into the existing profile --out; with --quick, the tiny workloads",
    )
    p.add_argument(
        "--size", choices=("tiny", "default", "gpu"), default=None,
        help="with --cuda: the size of the built-in workloads measured (default: default, or tiny with --quick; "
        "gpu: the default models at 16x their batch, steps bound by the GPU rather than the host)",
    )
    cold = p.add_mutually_exclusive_group()
    cold.add_argument(
        "--cold", action="store_true",
        help="measure what a step pays for data not in the caches (memory-bound calls of a MiB or more timed "
        "after an eviction, and the share of that a replayed step pays), which the profile then charges to "
        "memory-bound ops: on by default (15-40 s more of a quick calibration); kept for scripts that name it",
    )
    cold.add_argument(
        "--no-cold", action="store_true",
        help="measure and charge no cold costs (README, \"Cold data\": on the AMD EPYC VM of 2026-11-27 the "
        "held-out steps were predicted worse with them, on the Intel Xeon VM of 2026-12-03 better)",
    )
    p.add_argument(
        "--refit-waits", action="store_true",
        help="measure nothing: fit the co-run executor's waits of the existing profile --out again, on the "
        "calibration steps it kept, with the simulator as it is now (the calibration graphs are captured again, "
        "about 20 s with a quick profile), and write them into it; the waits it had are kept in its meta "
        "(refit_from). Judge a change to the simulator's co-run model on the same measurements with "
        "`schedlab fidelity --rescore RUN.json --profile PROFILE`",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def _thread_list(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected thread counts like 1,2,4,8, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return counts


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "calibrate",
        help="microbenchmark this machine and write a Profile",
        description="Microbenchmark the op classes the workloads use over shapes and thread counts, "
        "measure the executor's dispatch cost and co-run slowdowns, fit a cost model per op class, "
        "time messages and all-reduces between local ranks, and write a Profile (versioned JSON) with "
        "held-out errors. --links re-measures only the links.",
    )
    add_arguments(p)
    p.set_defaults(handler=run)


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def summary(profile: Any, path: Path, wall_s: float) -> dict[str, Any]:
    """What `--json` prints: where the Profile went, held-out errors (percent), figures."""
    classes = {
        cls: {
            "heldout_mape": _r1(fit.heldout_mape),
            "heldout_wape": _r1(fit.heldout_wape),
            "model": fit.model_name,
            "n_signatures": fit.n_signatures,
        }
        for cls, fit in sorted(profile.classes.items())
    }
    return {
        "path": str(path),
        "quick": profile.quick,
        "classes": classes,
        "fallback_heldout_mape": _r1(profile.fallback.heldout_mape),
        "dispatch_us": profile.dispatch.to_json(),
        "corun": profile.corun.to_json(),
        "roofline": None if profile.roofline is None else profile.roofline.to_json(),
        "context_us": {
            "warm_median": round(profile.context.warm_fallback_us, 2),
            "first_use_median": round(profile.context.first_use_fallback_us, 2),
        },
        "coverage_models": profile.meta.get("coverage", []),
        "links": None if profile.links is None else links_summary(profile.links),
        "wake": _wake_summary(profile),
        "thread_wake": profile.meta.get("thread_wake"),
        "team_stall": profile.meta.get("team_stall"),
        "cold": None if profile.cold is None else _cold_summary(profile.cold),
        "signatures": len(profile.signatures),
        "view_signatures": len(profile.views.signatures),
        "foreign_cpu_frac": profile.meta.get("foreign_cpu_frac"),
        "steal_frac": profile.meta.get("steal_frac"),
        "failures": len(profile.meta.get("failures", [])),
        "contended_points": profile.meta.get("contended_points", 0),
        "corun_foreign_readings": profile.meta.get("corun_foreign_readings", []),
        "points": profile.meta.get("n_points", 0),
        "points_under_floor": profile.meta.get("points_under_floor", 0),
        "wall_s": round(wall_s, 1),
    }


def _corun_readings_note(readings: list[float | None]) -> None:
    """A note where the co-run figures were read more than once because other processes
    used the CPU meanwhile (`calibrate.corun.measure_corun_quiet`), and a warning where
    the last reading was still not quiet."""
    from schedlab.calibrate.corun import QUIET_CPU_FRAC

    if len(readings) < 2:
        return
    shares = ", ".join("?" if f is None else f"{100 * f:.1f}%" for f in readings)
    kept = min((f for f in readings if f is not None), default=None)
    quiet = kept is not None and kept <= QUIET_CPU_FRAC
    print(
        f"{'note' if quiet else 'warning'}: the co-run figures were read {len(readings)} times, other processes using "
        f"{shares} of the CPU; the quietest reading is kept"
        + ("" if quiet else " (still above the quiet threshold: calibrate again on an idle machine for two-slot plans)"),
        file=sys.stderr,
    )


UNDER_FLOOR_NOTE_SHARE = 0.1  # above this share of points under the call floor, say so


def _under_floor_note(s: dict[str, Any]) -> None:
    """A note where many op timings ran faster in a step than their benchmark, less the
    executor's dispatch measured at the start: their kernels count as zero (`fit.at_floor`),
    and a dispatch figure read high at a noisy moment is the likely cause."""
    under, total = s["points_under_floor"], s["points"]
    if total and under > UNDER_FLOOR_NOTE_SHARE * total:
        d = s["dispatch_us"]
        print(
            f"note: {under} of {total} op timings ran under the call floor in the step (the executor's dispatch "
            f"read {d['op_us'] - d['call_floor_us']:.2f} us above a bare call at the start); their kernels count "
            "as zero. Calibrating again on a quieter host may read them.",
            file=sys.stderr,
        )


def _wake_summary(profile: Any) -> dict[str, Any] | None:
    """The wake of throttled OpenMP helpers (calibrate.wake): the pooled fit, how many classes
    have their own, and the share paid at fewer threads."""
    from schedlab.calibrate.wake import POOLED

    pooled = profile.wake.get(POOLED)
    if pooled is None:
        return None
    return {
        "pooled": pooled.to_json(),
        "classes": len(profile.wake) - 1,
        # classes that fork at any size: their small calls pay a floor, or their fit is not
        # times the region share (calibrate.wake)
        "any_size": sorted(k for k, f in profile.wake.items() if k != POOLED and f.forks_at_any_size),
        "scale": {str(k): v for k, v in sorted(profile.wake_scale.items())},
    }


def _cold_summary(cold: Any) -> dict[str, Any]:
    """What a step pays for data not in the caches (calibrate.cold): the in-step share, the
    pooled cold extra per MiB moved, and how many calls and replayed ops it was fitted on."""
    return {
        "share": round(cold.share, 3),
        "pooled_us_per_mib": {str(k): round(v, 2) for k, v in sorted(cold.pooled_us_per_mib.items())},
        "classes": len(cold.slope_us_per_mib),
        "n_points": cold.n_points,
        "n_share_ops": cold.n_share_ops,
    }


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.1f}"


def _print_table(s: dict[str, Any]) -> None:
    print(f"profile written to {s['path']} ({'quick' if s['quick'] else 'full'}, {s['wall_s']} s)")
    print(f"{'op class':34s} {'model':20s} {'sigs':>5s} {'MAPE%':>6s} {'WAPE%':>6s}  (held out)")
    for cls, c in s["classes"].items():
        print(f"{cls:34s} {c['model']:20s} {c['n_signatures']:5d} {_fmt(c['heldout_mape'])} {_fmt(c['heldout_wape'])}")
    print(f"{'(fallback, memory-bound pool)':34s} {'':20s} {'':5s} {_fmt(s['fallback_heldout_mape'])}")
    d, c = s["dispatch_us"], s["corun"]
    print(
        f"dispatch: {d['op_us']:.2f} us/op, {d['view_us']:.2f} us/view with one slot; {d['corun_op_us']:.2f} us/op "
        f"with two slots on one chain of tiny ops, {d['corun_contended_op_us']:.2f} on two (bare call floor "
        f"{d['call_floor_us']:.2f} us)"
    )
    print(
        f"co-run slowdown: memory-bound x{c['mem_slowdown']:.2f}, compute-bound x{c['compute_slowdown']:.2f}, "
        f"tiny ops (interpreter lock) x{c['gil_slowdown']:.2f}; kernels up to {c['serial_window_us']:.1f} us run in turn; "
        f"co-run wait per op {', '.join(f'{v:.1f} us ({k} thr)' for k, v in c['latency_us'].items()) or 'not fitted'}; "
        f"one slot's team wait per op {', '.join(f'{v:.1f} us ({k} thr)' for k, v in c['team_latency_us'].items()) or 'not fitted'}"
    )
    print(_oversub_line(c))
    if s["roofline"]:
        r = s["roofline"]
        print(
            "roofline (classes never measured): "
            + ", ".join(f"{k} thr {r['gflops'][k]:.0f} GFLOP/s {r['gbps'][k]:.1f} GB/s" for k in r["gflops"])
            + f", +{r['a_us']:.2f} us per call"
        )
    x = s["context_us"]
    print(f"in a step, beyond a benchmark: +{x['warm_median']:.2f} us per op (median), +{x['first_use_median']:.2f} us "
          f"more for the first op of its kind; {s['view_signatures']} view signatures measured")
    if s.get("wake"):
        w = s["wake"]
        p = w["pooled"]
        scale = ", ".join(f"x{v:.2f} at {k} thr" for k, v in w["scale"].items())
        print(f"waking throttled OpenMP helpers (co-run plans): {p['base_us']:.1f} us + {p['per_work']:.4f} x work at "
              f"{p['threads']} threads (pooled over {p['n_points']} cases; {w['classes']} classes of their own)"
              + (f"; {scale}" if scale else ""))
        if w.get("any_size"):
            print(f"  forking at any size (their small calls pay to wake helpers too): {', '.join(w['any_size'])}")
    if s.get("thread_wake"):
        from schedlab.calibrate.thread_wake import WakeLevel
        from schedlab.calibrate.thread_wake import describe as describe_thread_wake

        t = s["thread_wake"]
        print(describe_thread_wake([WakeLevel(**lv) for lv in t["levels"]], t["idle_state"]))
    if s.get("team_stall"):
        from schedlab.calibrate.team_stall import StallLevel
        from schedlab.calibrate.team_stall import describe as describe_team_stall

        print(describe_team_stall([StallLevel(**lv) for lv in s["team_stall"]]))
    if s.get("cold"):
        c = s["cold"]
        per_mib = ", ".join(f"{v:.1f} us/MiB at {k} thr" for k, v in c["pooled_us_per_mib"].items()) or "none measured"
        print(f"data not in the caches: a step pays {c['share']:.2f} of the cold extra (fitted on {c['n_share_ops']} "
              f"replayed ops); cold extra {per_mib} pooled ({c['n_points']} calls timed cold, {c['classes']} classes)")
    if s["links"]:
        _print_links(s["links"])


def links_summary(fits: Any) -> dict[str, Any]:
    """A LinkFits as `--json` prints it: fits, times per size (us) and conditions."""
    from schedlab.machine import LOOPBACK_BW_BYTES_PER_S, LOOPBACK_LATENCY_S

    p = fits.p2p_fit
    return {
        "backend": fits.backend,
        "p2p": {
            "latency_us": round(p.latency_s * 1e6, 2),
            "bw_gb_per_s": round(p.bw_bytes_per_s / 1e9, 3),
            "mape_pct": round(p.mape_pct, 1),
            "vs_default": {
                "latency": round(p.latency_s / LOOPBACK_LATENCY_S, 2),
                "bw": round(p.bw_bytes_per_s / LOOPBACK_BW_BYTES_PER_S, 2),
            },
        },
        "allreduce": {
            str(n): {
                "alpha_us": round(f.alpha_s * 1e6, 2),
                "bw_gb_per_s": round(f.bw_bytes_per_s / 1e9, 3),
                "mape_pct": round(f.mape_pct, 1),
                "oversubscribed": fits.allreduce[n].oversubscribed,
            }
            for n, f in sorted(fits.allreduce_fits.items())
        },
        "allreduce_joint": {
            "alpha_us": round(fits.allreduce_joint.alpha_s * 1e6, 2),
            "bw_gb_per_s": round(fits.allreduce_joint.bw_bytes_per_s / 1e9, 3),
            "mape_pct": round(fits.allreduce_joint.mape_pct, 1),
        },
        "sizes": [
            {
                "nbytes": nbytes,
                "p2p_us": round(t * 1e6, 2),
                "p2p_fit_us": round(p.time_s(nbytes) * 1e6, 2),
                **{
                    f"allreduce{n}_us": round(sw.typical_s[sw.sizes.index(nbytes)] * 1e6, 2)
                    for n, sw in sorted(fits.allreduce.items())
                    if nbytes in sw.sizes
                },
                **{
                    f"allreduce{n}_fit_us": round(fits.allreduce_s(nbytes, n) * 1e6, 2)
                    for n in sorted(fits.allreduce)
                },
            }
            for nbytes, t in zip(fits.p2p.sizes, fits.p2p.typical_s, strict=True)
        ],
        "conditions": fits.conditions,
    }


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _print_links(s: dict[str, Any]) -> None:
    c, p = s["conditions"], s["p2p"]
    ns = list(s["allreduce"])
    print(
        f"links between local {s['backend']} ranks (1 thread each, {c.get('cores', '?')} cores, load average "
        f"{c.get('loadavg_1m_start', '?')}, other processes {_pct(c.get('foreign_cpu_frac'))} of the CPU):"
    )
    head = f"{'size':>8s} {'p2p us':>9s} {'fit us':>9s}" + "".join(
        f" {'all-red ' + n + 'r us':>14s} {'fit us':>9s}" for n in ns
    )
    print(head)
    for row in s["sizes"]:
        line = f"{_size(row['nbytes']):>8s} {row['p2p_us']:9.1f} {row['p2p_fit_us']:9.1f}"
        for n in ns:
            t = row.get(f"allreduce{n}_us")
            line += f" {'-' if t is None else f'{t:.1f}':>14s} {row[f'allreduce{n}_fit_us']:9.1f}"
        print(line)
    print(
        f"point to point: latency {p['latency_us']:.1f} us, bandwidth {p['bw_gb_per_s']:.2f} GB/s, fit MAPE "
        f"{p['mape_pct']:.1f}% (x{p['vs_default']['latency']:.2f} and x{p['vs_default']['bw']:.2f} the loopback default)"
    )
    for n, f in s["allreduce"].items():
        over = ", oversubscribed" if f["oversubscribed"] else ""
        print(
            f"all-reduce, {n} ranks{over}: ring alpha {f['alpha_us']:.1f} us, bandwidth {f['bw_gb_per_s']:.2f} GB/s, "
            f"fit MAPE {f['mape_pct']:.1f}%"
        )
    j = s["allreduce_joint"]
    print(f"all-reduce, one fit over {', '.join(ns)} ranks: alpha {j['alpha_us']:.1f} us, bandwidth "
          f"{j['bw_gb_per_s']:.2f} GB/s, fit MAPE {j['mape_pct']:.1f}%")


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _busy_warning(busy: float | None, what: str) -> None:
    _share_warning(busy, BUSY_MACHINE_FRAC, f"other processes used {{:.0%}} of the CPU while {what}; timings are "
                   "unreliable: re-run on an idle machine")


def _steal_warning(steal: float | None, what: str) -> None:
    _share_warning(steal, STEAL_MACHINE_FRAC, f"the hypervisor took {{:.0%}} of this virtual machine's CPU while {what} "
                   "(steal time): two-thread and co-run timings read the host's load; calibrate again when it is quieter")


def _share_warning(share: float | None, limit: float, message: str) -> None:
    """A warning on stderr where `share` (of the CPU, 0..1) is over `limit`; `message` has
    one `{}` for the share."""
    if share is not None and share > limit:
        print("warning: " + message.format(share), file=sys.stderr)


def existing_profile(out: Path, what: str, why: str) -> Path:
    """The profile at `out` that a partial calibration adds `what` to: it must exist (else
    one error saying to run `schedlab calibrate` first, `why`), be writable, and load (a
    corrupt one fails now, not after minutes of measuring)."""
    from schedlab.cli.common import load_profile
    from schedlab.errors import SchedlabError
    from schedlab.io import check_writable

    if not out.exists():
        raise SchedlabError(f"no profile at {out} to add {what} to: run `schedlab calibrate` (or `schedlab calibrate "
                            f"--quick`) first, {why}")
    check_writable(out)
    load_profile(str(out))
    return out


def run_links(args: argparse.Namespace) -> int:
    """Measure the links only and write their fits into the existing Profile at --out.

    A Profile holds op costs first: without one there is nothing to add links to, and a
    Profile of links only would leave `simulate` without op costs. So a missing profile
    is an error that says to run `schedlab calibrate` (which measures the links too).
    """
    from dataclasses import replace

    from tqdm import tqdm

    from schedlab.calibrate.links import LinkConfig, measure_links, quick_link_config
    from schedlab.calibrate.profile import Profile

    out = existing_profile(args.out, "link fits", "which measures the links too; `--links` re-measures only them")
    cfg = quick_link_config() if args.quick else LinkConfig()
    t0 = time.perf_counter()
    with tqdm(
        total=cfg.steps(), desc="links", unit="step", file=sys.stderr, disable=getattr(args, "no_progress", False)
    ) as bar:

        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        fits = measure_links(cfg, on_progress=step)
    # re-read: the profile as it is now, should another command have rewritten it meanwhile
    replace(Profile.load(out, check_machine=False), links=fits).save(out)
    wall_s = round(time.perf_counter() - t0, 1)
    summary = links_summary(fits)
    _busy_warning(fits.conditions.get("foreign_cpu_frac"), "measuring the links")
    if args.json:
        print(json.dumps({"path": str(out), "wall_s": wall_s, "links": summary}, indent=1))
    else:
        print(f"link fits written to {out} ({wall_s} s)")
        _print_links(summary)
    return 0


def run_refit_waits(args: argparse.Namespace) -> int:
    """Fit the co-run waits of the existing Profile at --out again on its kept steps."""
    from schedlab.calibrate.profile import Profile
    from schedlab.calibrate.run import refit_waits
    from schedlab.machine import detect_host

    out = existing_profile(args.out, "co-run waits", "which measures the steps they are fitted on")
    t0 = time.perf_counter()
    profile = Profile.load(out, check_machine=False)
    fitted = refit_waits(profile, detect_host(), progress=not getattr(args, "no_progress", False))
    fitted.save(out)
    before, after = fitted.meta["refit_from"], fitted.corun.to_json()
    wall_s = round(time.perf_counter() - t0, 1)
    rows = fitted.meta["corun_fit"]
    if args.json:
        print(json.dumps({"path": str(out), "wall_s": wall_s, "before": before,
                          "after": {k: after[k] for k in before}, "corun_fit": rows}, indent=1))
        return 0
    print(f"co-run waits fitted again in {out} ({wall_s} s, {len(rows)} steps kept by the profile)")
    for key, what in (("latency_us", "co-run wait per op"), ("team_latency_us", "one slot's team wait per op")):
        was = ", ".join(f"{v:.1f} us ({k} thr)" for k, v in before[key].items()) or "none"
        now = ", ".join(f"{v:.1f} us ({k} thr)" for k, v in after[key].items()) or "none"
        print(f"{what}: {was} -> {now}")
    print(f"{'graph':34s} {'slots':>5s} {'thr':>4s} {'target ms':>10s} {'predicted ms':>13s}")
    for r in rows:
        target = r.get("target_ms", r["measured_ms"])
        print(f"{r['source']:34s} {r['slots']:5d} {r['threads']:4d} {target:10.3f} {r['predicted_ms']:13.3f}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the calibration and write the Profile; print a summary."""
    from schedlab.calibrate.run import run_calibration
    from schedlab.errors import SchedlabError
    from schedlab.io import check_writable

    if getattr(args, "links", False) and getattr(args, "cuda", False):
        raise SchedlabError("--links and --cuda each re-measure one part of the profile: give one of them")
    for flag in ("cold", "no_cold"):
        if getattr(args, flag, False) and (getattr(args, "links", False) or getattr(args, "cuda", False)):
            raise SchedlabError(f"--{flag.replace('_', '-')} goes with the CPU calibration: --links and --cuda "
                                "measure other parts of the profile")
    if getattr(args, "refit_waits", False):
        others = [f for f in ("links", "cuda", "cold", "no_cold", "threads") if getattr(args, f, None)]
        if others:
            raise SchedlabError("--refit-waits measures nothing: it goes alone (with --out, --json, --no-progress)")
        return run_refit_waits(args)
    if getattr(args, "links", False):
        return run_links(args)
    if getattr(args, "size", None) is not None and not getattr(args, "cuda", False):
        raise SchedlabError("--size goes with --cuda: the CPU calibration measures its own sweep of op sizes")
    if getattr(args, "cuda", False):
        from schedlab.cli.cuda_cmd import run_calibrate_cuda

        return run_calibrate_cuda(args)

    check_writable(args.out)  # before the measuring, not after
    t0 = time.perf_counter()
    config = None
    if getattr(args, "threads", None) or getattr(args, "no_cold", False):
        from dataclasses import replace

        from schedlab.calibrate.run import full_config, quick_config, without_cold

        config = quick_config() if args.quick else full_config()
        if getattr(args, "threads", None):
            config = replace(config, threads=args.threads)
        if getattr(args, "no_cold", False):
            config = without_cold(config)
    profile = run_calibration(quick=args.quick, out=args.out, progress=not getattr(args, "no_progress", False),
                              config=config)
    s = summary(profile, args.out, time.perf_counter() - t0)
    _busy_warning(s["foreign_cpu_frac"], "calibrating (two-thread and co-run timings above all)")
    _steal_warning(s["steal_frac"], "calibrating")
    if s["contended_points"]:
        print(
            f"note: {s['contended_points']} multi-thread point(s) stayed slow while another process held a core "
            "and were left out (their thread scaling comes from the class model)",
            file=sys.stderr,
        )
    _corun_readings_note(s["corun_foreign_readings"])
    _under_floor_note(s)
    if s["failures"]:
        print(f"warning: {s['failures']} op(s) could not be benchmarked; see meta.failures in the profile", file=sys.stderr)
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        _print_table(s)
    return 0


def _oversub_line(c: dict[str, Any]) -> str:
    """Two teams of all the cores each (`calibrate.corun`): the short and long `add`'s
    factors beyond processor sharing, and the fade read from them."""
    fade = c.get("oversub_decay_us")
    line = f"two teams oversubscribing the cores: an add of {c.get('oversub_ref_us', 0.0):.0f} us x{c['oversub_mem']:.2f}"
    if c.get("oversub_long_us"):
        line += f", one of {c['oversub_long_us']:.0f} us x{c['oversub_long']:.2f}"
    line += f" beyond processor sharing, mm x{c['oversub_compute']:.2f}; "
    return line + ("no fade with kernel time" if fade is None else f"the excess fades with the kernel time, T = {fade:.0f} us")
