"""The simulator's fidelity on a GPU, model by model, and re-scoring saved GPU runs.

`cuda_fidelity` runs each model's training step on the GPU as schedlab's executor runs it
(one slot: one stream, the straight-line step in program order; k slots: k workers on a
stream each, `exec.streams`) and as plain eager PyTorch runs it
(`exec.check.eager_step`, on the same GPU), interleaved step by step and round-robin
over the models, and predicts the executor's step in the simulator twice: with the
Profile's cuda section (`calibrate.cuda_calibrate`, from the built-ins), and with the
GPU's datasheet roofline and the CPU profile's dispatch cost (what the simulator does with
no GPU calibration). Held-out models are predicted from what the built-ins calibrated:
their own ops' kernels are not measured, so a signature never seen is costed by the
measured roofline at the share of it that its op class reached in calibration.

`rescore` predicts a saved results file again (no GPU needed), optionally with the host's
issue costs (and the co-run contention cost) re-fitted from the built-in models measured
in the same process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from scipy.optimize import minimize_scalar

from schedlab.calibrate.cuda_calibrate import (
    GPU_ID,
    Prepared,
    Progress,
    device_name,
    gpu_machine,
    machine_for,
    prepare_on,
    refit_issue,
    stepper_for,
)
from schedlab.calibrate.cuda_costs import efficiencies
from schedlab.calibrate.cuda_run import Stepper, failure_text, replay_steps, synchronize, to_device
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.signature import signature
from schedlab.capture import capture
from schedlab.errors import SchedlabError
from schedlab.exec.bench import ratio_stats
from schedlab.exec.check import eager_reference, eager_step
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.rng import random_op_index
from schedlab.sim.engine import Simulator
from schedlab.workloads.heldout import is_heldout
from schedlab.workloads.loader import load_workload


@dataclass(frozen=True)
class CudaFidelityRow:
    model: str
    held_out: bool
    ops: int
    measured_ms: float  # the executor's step on the GPU, median
    eager_ms: float  # plain eager PyTorch's step on the same GPU, median
    ratio_vs_eager: float  # median of per-pair ratios executor / eager
    issue_ms: float  # the executor's host issue time summed over the step's ops (medians)
    predicted_ms: float  # the simulator with the cuda section
    roofline_ms: float  # the simulator with the datasheet roofline, no GPU calibration
    known_signatures: float  # share of the step's compute ops whose kernel was measured
    op_issue_us: tuple[float, ...] = ()  # per op (by id): its measured host issue µs (median over steps)
    step_s: tuple[float, ...] = ()  # every timed executor step, in order
    eager_s: tuple[float, ...] = ()  # every timed eager step, each paired with the executor step above
    slots: int = 1  # the executor's co-run slots on the GPU (one CUDA stream each)
    max_abs_diff: float | None = None  # co-run rows: outputs against the straight line's (None: not compared)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def roofline_error_pct(self) -> float:
        return 100.0 * (self.roofline_ms - self.measured_ms) / self.measured_ms

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["op_issue_us"] = [round(x, 2) for x in self.op_issue_us]
        d["step_s"] = [round(x, 9) for x in self.step_s]
        d["eager_s"] = [round(x, 9) for x in self.eager_s]
        return {**d, "error_pct": self.error_pct, "roofline_error_pct": self.roofline_error_pct}


def cuda_fidelity(
    models: Sequence[str], profile: Profile, *, size: str = "default", optimizer: str = "sgd", device: str = "cuda",
    steps: int = 10, rounds: int = 1, progress: Progress | None = None, failed: dict[str, str] | None = None,
    slots: Sequence[int] = (1,),
) -> list[CudaFidelityRow]:
    """Per model and slot count in `slots`, the executor's and eager's GPU steps measured
    and the simulator's two predictions (module docstring). `profile` must hold a cuda
    section. Every model is set up on the GPU first, then measured `rounds` times
    round-robin, `steps` steps each time per slot count (a slow spell of the shared host
    then falls on all models alike); each figure is the median over all rounds. A model
    that cannot run on the GPU (an op with no CUDA kernel) is left out, its error in
    `failed`."""
    failed = {} if failed is None else failed
    if profile.cuda is None:
        raise SchedlabError("the profile has no cuda section: run `schedlab calibrate --cuda` on this GPU machine first")
    if rounds < 1 or steps < 1:
        raise SchedlabError(f"rounds and steps must be >= 1, got {rounds} and {steps}")
    if not slots or any(k < 1 for k in slots):
        raise SchedlabError(f"slots must be >= 1, got {list(slots)}")
    slots = tuple(dict.fromkeys(slots))
    say = progress or (lambda _m: None)
    machine = gpu_machine(device)
    live: dict[str, _Live] = {}
    for model in models:
        say(f"{model}: set up on {device_name(device)}")
        try:
            live[model] = _Live.start(model, size, optimizer, device, machine, slots)
        except Exception as e:
            failed[model] = failure_text(e)
            say(f"{model}: failed: {failed[model]}")
            synchronize(device)
    for r in range(rounds):
        say(f"round {r + 1} of {rounds}: executor and eager steps, model by model")
        for model in list(live):
            try:
                live[model].measure(steps, warmup=2 if r == 0 else 1)
            except Exception as e:
                failed[model] = failure_text(e)
                del live[model]
                synchronize(device)
    return [score(m, x.p.captured.graph, x.resolved[k], x.measured(k), profile, gpu_machine(device, streams=k))
            for m, x in live.items() for k in slots]


@dataclass(frozen=True)
class GpuMeasurement:
    """One model's measured GPU steps: every timed step of the executor and of eager (paired,
    in order) and the executor's per-op host issue µs (by op id; the median over rounds of
    each round's median)."""

    step_s: tuple[float, ...]
    eager_s: tuple[float, ...]
    op_issue_us: tuple[float, ...]
    max_abs_diff: float | None = None  # a co-run step's outputs against the straight line's (None: not compared)


@dataclass
class _Live:
    """A model set up on the GPU: the executor's step under each slot count and eager's
    module, all stepping on from step to step, and what their measured steps took so far."""

    p: Prepared
    device: str
    eager: Callable[[], float]
    inputs: dict[int, torch.Tensor]
    resolved: dict[int, ResolvedPlan]  # slots -> the plan it runs
    steppers: dict[int, Stepper]  # slots -> its executor step
    step_s: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    eager_s: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    issue_rounds: dict[int, list[tuple[float, ...]]] = dataclasses.field(default_factory=dict)
    max_abs_diff: dict[int, float | None] = dataclasses.field(default_factory=dict)  # slots -> vs the straight line

    @staticmethod
    def start(model: str, size: str, optimizer: str, device: str, machine: Machine, slots: Sequence[int] = (1,)) -> _Live:
        p = prepare_on(model, size, optimizer, device, machine)
        ref, user, opt = eager_reference(p.module, p.captured.graph, p.captured.input_values)
        ref.to(device)
        on_device = tuple(t.to(device) for t in user)

        def eager() -> float:
            synchronize(device)
            t0 = time.perf_counter()
            eager_step(ref, on_device, opt)
            synchronize(device)
            return time.perf_counter() - t0

        graph = p.captured.graph
        resolved = {k: p.resolved if k == 1 else resolve(graph, Plan(device=GPU_ID, slots=k), gpu_machine(device, k))
                    for k in slots}
        steppers = {k: p.step if k == 1 else stepper_for(p.program, resolved[k], device) for k in slots}
        diffs = max_diffs_vs_line(p, {k: s for k, s in steppers.items() if k > 1}, device)
        return _Live(p=p, device=device, eager=eager, inputs=p.inputs, resolved=resolved, steppers=steppers,
                     max_abs_diff=diffs)

    def measure(self, steps: int, warmup: int) -> None:
        """`steps` steps under each slot count in turn, each paired with an eager step."""
        for k, step in self.steppers.items():
            eager_s: list[float] = []
            times, self.inputs = replay_steps(self.p.program, step, False, self.inputs, self.device, steps,
                                              warmup=warmup, between=functools.partial(self._eager_into, eager_s))
            self.step_s.setdefault(k, []).extend(times.step_s)
            self.eager_s.setdefault(k, []).extend(eager_s[-len(times.step_s):])
            self.issue_rounds.setdefault(k, []).append(times.issue_us)

    def _eager_into(self, out: list[float]) -> None:
        out.append(self.eager())

    def measured(self, slots: int = 1) -> GpuMeasurement:
        rounds = self.issue_rounds[slots]
        issue = tuple(statistics.median(r[i] for r in rounds) for i in range(len(rounds[0])))
        return GpuMeasurement(step_s=tuple(self.step_s[slots]), eager_s=tuple(self.eager_s[slots]), op_issue_us=issue,
                              max_abs_diff=self.max_abs_diff.get(slots))


def max_diffs_vs_line(p: Prepared, steps: dict[int, Stepper], device: str) -> dict[int, float | None]:
    """Per slot count, the largest absolute difference, over every output of one step from
    the captured inputs, between its step (`steps`: co-run steps on streams) and the straight
    line; None for a graph with random ops (their draws follow the order the ops run in)."""
    graph = p.captured.graph
    if not steps or random_op_index(graph):
        return dict.fromkeys(steps)

    def outputs(run: Stepper) -> list[Any]:
        V: list[Any] = [None] * len(graph.values)
        for v, t in to_device(p.captured.input_values, device).items():
            V[v] = t
        run(V)
        synchronize(device)
        return [V[o.value] for o in graph.outputs]

    line = outputs(p.step)
    return {k: max((float((a.double() - b.double()).abs().max()) for a, b in zip(outputs(s), line, strict=True)
                    if isinstance(a, torch.Tensor) and a.numel()), default=0.0)
            for k, s in steps.items()}


def score(model: str, graph: Graph, resolved: ResolvedPlan, m: GpuMeasurement, profile: Profile,
          machine: Machine) -> CudaFidelityRow:
    """`m` against the simulator's step of `graph` under `resolved` on `machine` (a stream
    per slot), with the profile's cuda section and without it (the datasheet roofline)."""
    cuda = profile.cuda
    assert cuda is not None
    ratio, _ = ratio_stats(list(m.step_s), list(m.eager_s))
    profile = profile.for_slots(resolved.slots)
    predicted = Simulator(graph, machine, profile).run(resolved, record=False).step_time_s
    roofline = Simulator(graph, machine, dataclasses.replace(profile, cuda=None)).run(resolved, record=False).step_time_s
    compute = [op for op in graph.ops if not op.is_view]
    known = sum(1 for op in compute if signature(op) in cuda.signatures) / max(1, len(compute))
    return CudaFidelityRow(
        model=model, held_out=is_heldout(model), ops=len(graph.ops),
        measured_ms=1e3 * statistics.median(m.step_s), eager_ms=1e3 * statistics.median(m.eager_s),
        ratio_vs_eager=ratio, issue_ms=sum(m.op_issue_us) / 1e3,
        predicted_ms=1e3 * predicted, roofline_ms=1e3 * roofline, known_signatures=known,
        op_issue_us=m.op_issue_us, step_s=m.step_s, eager_s=m.eager_s, slots=resolved.slots,
        max_abs_diff=m.max_abs_diff,
    )


def rescore(saved: dict[str, Any], profile: Profile, *, refit: bool = False,
            graph_of: Callable[[str, str, str], Graph] | None = None,
            fitted: dict[str, float] | None = None) -> list[CudaFidelityRow]:
    """The models of a saved `schedlab fidelity --cuda` results file predicted again from
    `profile` (its cuda section) by this simulator, against the measurements saved. With
    `refit`, the host issue costs are first re-fitted from the file's built-in models (the
    calibration workloads, measured in the same process, so a host that runs faster or
    slower from process to process is not part of the error of the held-out ones): the
    issue cost per aten target from their one-slot rows, and where they have rows of
    several slots, the contention cost (`fit_contention`). `fitted` gets the figures fitted.
    A section written before the roofline's efficiencies were recorded gets them from the
    file's built-in models (the workloads its kernels were measured on, at their size)."""
    cuda = profile.cuda
    if cuda is None:
        raise SchedlabError("the profile has no cuda section: give the profile `schedlab calibrate --cuda` wrote")
    cond = saved.get("conditions", {})
    size, optimizer = str(cond.get("size", "default")), str(cond.get("optimizer", "sgd"))
    gpu = str((cond.get("cuda") or {}).get("device", cuda.device))
    get = graph_of or (lambda m, sz, opt: capture(load_workload(m, sz), opt, portable=True).graph)  # as measured
    runs: list[tuple[str, Graph, GpuMeasurement, int]] = []
    for row in saved.get("models", []):
        graph = get(row["model"], size, optimizer)
        issue = tuple(float(x) for x in row.get("op_issue_us", ()))
        if len(issue) != len(graph.ops):
            raise SchedlabError(
                f"{row['model']}: the file holds {len(issue)} per-op issue times and the model captured here has "
                f"{len(graph.ops)} ops (another torch version captures it differently): re-measure it on the GPU")
        step_s = tuple(row.get("step_s") or (row["measured_ms"] / 1e3,))
        eager_s = tuple(row.get("eager_s") or (row["eager_ms"] / 1e3,))
        slots = int(row.get("slots", 1))
        diff = row.get("max_abs_diff")
        runs.append((row["model"], graph, GpuMeasurement(step_s=step_s, eager_s=eager_s, op_issue_us=issue,
                                                         max_abs_diff=None if diff is None else float(diff)), slots))
    if not cuda.class_efficiency:  # a section written before they were recorded
        graphs = {name: g for name, g, _, _ in runs if not is_heldout(name)}
        per_class, default = efficiencies(cuda, graphs.values())
        cuda = dataclasses.replace(cuda, class_efficiency=per_class, default_efficiency=default)
    if refit:  # from the straight line's issue times: a co-run row's spans hold its waits too
        own = [(g, m.op_issue_us) for name, g, m, k in runs if not is_heldout(name) and k == 1]
        if not own:
            raise SchedlabError("re-fitting the issue costs needs built-in models in the files (the calibration "
                                "workloads, measured in the same run): none is there")
        cuda = refit_issue(cuda, own)
        if fitted is not None and cuda.issue_default_us is not None:
            fitted["issue_default_us"] = cuda.issue_default_us
    profile = dataclasses.replace(profile, cuda=cuda)
    machines = {k: machine_for(gpu, streams=k) for k in {k for *_, k in runs}}
    resolved = [resolve(g, Plan(device=GPU_ID, slots=k), machines[k]) for _, g, _, k in runs]
    if refit:
        corun = [(g, r, m, machines[k]) for (name, g, m, k), r in zip(runs, resolved, strict=True)
                 if not is_heldout(name) and k > 1]
        if corun:
            h = fit_contention(corun, profile)
            if fitted is not None:
                fitted["stream_contention_us"] = h
            profile = dataclasses.replace(profile, cuda=dataclasses.replace(cuda, stream_contention_us=h))
    return [score(name, g, r, m, profile, machines[k]) for (name, g, m, k), r in zip(runs, resolved, strict=True)]


def fit_contention(runs: Sequence[tuple[Graph, ResolvedPlan, GpuMeasurement, Machine]], profile: Profile,
                   hi_us: float = 50.0, xatol_us: float = 0.05) -> float:
    """The cuda section's `stream_contention_us` that best predicts `runs` (co-run steps of
    the built-ins: graph, plan, measurement, machine): the least mean |log(predicted /
    measured)| over [0, `hi_us`] (scipy's bounded scalar minimiser). The prediction grows
    with it (more contention, longer dispatches, more workers queued)."""
    assert profile.cuda is not None
    cuda = profile.cuda

    def loss(h: float) -> float:
        p = dataclasses.replace(profile, cuda=dataclasses.replace(cuda, stream_contention_us=h))
        return statistics.fmean(
            abs(math.log(Simulator(g, machine, p.for_slots(r.slots)).run(r, record=False).step_time_s
                         / statistics.median(m.step_s)))
            for g, r, m, machine in runs)

    fit = minimize_scalar(loss, bounds=(0.0, hi_us), method="bounded", options={"xatol": xatol_us})
    return float(fit.x)


def summary(rows: Sequence[CudaFidelityRow]) -> dict[str, Any]:
    """MAPE of both predictions over the built-in and the held-out rows of one slot (the
    straight line); with rows of several slot counts, the same per slot count under
    "slots", and per model how the slot counts rank (`slots_ranking`)."""
    out = _mape_groups([r for r in rows if r.slots == 1])
    counts = sorted({r.slots for r in rows})
    if len(counts) > 1:
        out["slots"] = {str(k): _mape_groups([r for r in rows if r.slots == k]) for k in counts}
        out["slots_ranking"] = slots_ranking(rows)
    return out


def _mape_groups(rows: Sequence[CudaFidelityRow]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, sel in (("builtin", [r for r in rows if not r.held_out]), ("heldout", [r for r in rows if r.held_out])):
        if sel:
            out[label] = {
                "models": len(sel),
                "mape_pct": statistics.fmean(abs(r.error_pct) for r in sel),
                "roofline_mape_pct": statistics.fmean(abs(r.roofline_error_pct) for r in sel),
                "ratio_vs_eager_median": statistics.median(r.ratio_vs_eager for r in sel),
            }
            diffs = [r.max_abs_diff for r in sel if r.max_abs_diff is not None and r.slots > 1]
            if diffs:
                out[label]["max_abs_diff_vs_line"] = max(diffs)
    return out


def slots_ranking(rows: Sequence[CudaFidelityRow]) -> dict[str, Any]:
    """Per model measured under several slot counts: each count's step over one slot's,
    measured and predicted, and whether the simulator picks the count that measured
    fastest; "agree": over how many models it did."""
    by_model: dict[str, dict[int, CudaFidelityRow]] = {}
    for r in rows:
        by_model.setdefault(r.model, {})[r.slots] = r
    models: dict[str, Any] = {}
    for model, rs in by_model.items():
        if len(rs) < 2:
            continue
        base = rs.get(1) or rs[min(rs)]
        best_measured = min(rs, key=lambda k: rs[k].measured_ms)
        best_predicted = min(rs, key=lambda k: rs[k].predicted_ms)
        models[model] = {
            "held_out": base.held_out,
            "measured_vs_base": {str(k): r.measured_ms / base.measured_ms for k, r in sorted(rs.items())},
            "predicted_vs_base": {str(k): r.predicted_ms / base.predicted_ms for k, r in sorted(rs.items())},
            "best_measured": best_measured, "best_predicted": best_predicted,
        }
    agree = sum(1 for m in models.values() if m["best_measured"] == m["best_predicted"])
    return {"models": models, "agree": agree, "of": len(models)}
