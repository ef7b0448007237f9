"""A GPU's calibration and the simulator's fidelity on it, model by model.

`calibrate_cuda` writes the figures of a Profile's "cuda" section (`calibrate.cuda_costs`)
from the calibration workloads (the built-ins, never a held-out model): the measured
roofline, each distinct op's kernel time, the host's issue cost per aten target and the
host<->device copy fits.

`cuda_fidelity` runs each model's training step on the GPU as schedlab's executor runs it
(one stream, the straight-line step in program order) and as plain eager PyTorch runs it
(`exec.check.eager_step`, on the same GPU), interleaved step by step, and predicts the
executor's step in the simulator twice: with the Profile's cuda section (calibrated), and
with the GPU's datasheet roofline and the CPU profile's dispatch cost (what the simulator
does with no GPU calibration). Held-out models are predicted from what the built-ins
calibrated: their own ops' kernels are not measured, so a signature never seen is costed
by the measured roofline.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.cuda_costs import CudaCosts
from schedlab.calibrate.cuda_run import (
    copy_fit,
    issue_costs,
    live_values,
    replay_steps,
    roofline_figures,
    signature_kernels_us,
    synchronize,
    to_device,
)
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.signature import signature
from schedlab.capture import Captured, capture
from schedlab.errors import SchedlabError
from schedlab.exec.bench import ratio_stats
from schedlab.exec.check import eager_reference, eager_step
from schedlab.exec.program import compile_graph
from schedlab.machine import Device, Machine, usable_cores
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.sim.engine import Simulator
from schedlab.workloads.heldout import is_heldout
from schedlab.workloads.loader import load_workload

GPU_ID = "gpu0"

# fp32 (no tensor cores: PyTorch's default fp32 matmul uses no TF32) peak FLOP/s and HBM
# bandwidth from NVIDIA's datasheets, by a substring of torch.cuda.get_device_name(): the
# roofline an uncalibrated simulator would cost the GPU by. First match wins.
DATASHEET: tuple[tuple[str, float, float], ...] = (
    ("H200", 67e12, 4.8e12),
    ("H100", 67e12, 3.35e12),
    ("A100", 19.5e12, 2.039e12),
    ("V100", 14e12, 900e9),
)


def datasheet(name: str) -> tuple[float, float]:
    """(peak fp32 FLOP/s, memory bytes/s) of the GPU called `name`; an unknown one gets the
    H100's, and says so in the fidelity file (`roofline_source`)."""
    for key, flops, bw in DATASHEET:
        if key in name:
            return flops, bw
    return DATASHEET[1][1], DATASHEET[1][2]


def device_name(device: str | torch.device) -> str:
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (test run)"


def gpu_machine(device: str | torch.device) -> Machine:
    """This host as the simulator sees it: one process driving one GPU on one stream (the
    executor's straight-line step) and the host's CPU cores."""
    dev = torch.device(device)
    name = device_name(dev)
    flops, bw = datasheet(name)
    mem = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 16 * 2**30
    cores = usable_cores()
    return Machine(
        name="cuda-host",
        devices=(
            Device(id=GPU_ID, kind="cuda", cores=1, memory_bytes=int(mem), streams=1, peak_flops=flops,
                   mem_bw_bytes_per_s=bw),
            Device(id="cpu0", kind="cpu", cores=cores, memory_bytes=64 * 2**30),
        ),
        host={"gpu": name, "cpu_cores": cores},
    )


@dataclass
class _Prepared:
    name: str
    captured: Captured
    resolved: ResolvedPlan
    run: Callable[[list[Any], list[int]], None]
    program: Any
    inputs: dict[int, torch.Tensor]


def _prepare(model: str, size: str, optimizer: str, device: str | torch.device, machine: Machine) -> _Prepared:
    captured = capture(load_workload(model, size), optimizer)
    graph = captured.graph
    program = compile_graph(graph, device=device)
    resolved = resolve(graph, Plan(device=GPU_ID), machine)
    keep = {o.value for o in graph.outputs}
    run = program.straight_line(resolved.sequence, resolved.threads, keep)
    return _Prepared(model, captured, resolved, run, program, to_device(captured.input_values, device))


Progress = Callable[[str], None]


def calibrate_cuda(
    models: Sequence[str], *, size: str = "default", optimizer: str = "sgd", device: str = "cuda", steps: int = 10,
    progress: Progress | None = None, roofline_sizes: tuple[int, int] = (8192, 1 << 27),
    copy_sizes: Sequence[int] | None = None,
) -> tuple[CudaCosts, dict[str, Any]]:
    """The "cuda" section measured on `device` from `models` (module docstring), and a
    report (per model: ops, signatures measured, captured/eager/failed counts)."""
    say = progress or (lambda _m: None)
    held = [m for m in models if is_heldout(m)]
    if held:
        raise SchedlabError(f"the GPU calibration never sees held-out models ({', '.join(held)}): "
                            "calibrate on the built-ins and judge on the held-out set with `schedlab fidelity --cuda`")
    machine = gpu_machine(device)
    say("roofline: an empty kernel, a large mm, a large add")
    roof = roofline_figures(device, *roofline_sizes)
    sigs: dict[str, float] = {}
    replays = []
    report: dict[str, Any] = {"models": {}}
    report["failed_models"] = {}
    for model in models:
        say(f"{model}: kernels of its ops, then its host issue costs")
        try:
            p = _prepare(model, size, optimizer, device, machine)
            values = live_values(p.program, to_device(p.captured.input_values, device), device)
            kt = signature_kernels_us(p.program, values, device, skip=sigs)
            del values
            times, _ = replay_steps(p.program, p.run, p.resolved.sequence, False, p.inputs, device, steps)
        except Exception as e:
            report["failed_models"][model] = _failure(e)
            say(f"{model}: failed: {report['failed_models'][model]}")
            synchronize(device)
            continue
        sigs.update(kt.kernel_us)
        replays.append((p.captured.graph, times.issue_us))
        report["models"][model] = {"ops": len(p.captured.graph.ops), "new_signatures": len(kt.kernel_us),
                                   "captured": kt.captured, "eager": kt.eager, "failed": list(kt.failed),
                                   "step_ms": 1e3 * statistics.median(times.step_s)}
    if not replays:
        raise SchedlabError("no calibration model ran on the GPU: " + "; ".join(
            f"{m}: {e}" for m, e in report["failed_models"].items()))
    issue, issue_default = issue_costs(replays)
    say("host<->device copies")
    sizes = {} if copy_sizes is None else {"sizes": copy_sizes}
    h2d, d2h = copy_fit(device, True, **sizes), copy_fit(device, False, **sizes)
    costs = CudaCosts(
        device=device_name(device), torch=torch.__version__, measured_unix_s=time.time(),
        launch_us=roof.launch_us, flops_per_s=roof.flops_per_s, bw_bytes_per_s=roof.bw_bytes_per_s,
        signatures=sigs, issue_us=issue, issue_default_us=issue_default, h2d=h2d, d2h=d2h,
    )
    return costs, report


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

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def roofline_error_pct(self) -> float:
        return 100.0 * (self.roofline_ms - self.measured_ms) / self.measured_ms

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "error_pct": self.error_pct, "roofline_error_pct": self.roofline_error_pct}


def cuda_fidelity(
    models: Sequence[str], profile: Profile, *, size: str = "default", optimizer: str = "sgd", device: str = "cuda",
    steps: int = 10, progress: Progress | None = None, failed: dict[str, str] | None = None,
) -> list[CudaFidelityRow]:
    """Per model, the executor's and eager's GPU steps measured and the simulator's two
    predictions (module docstring). `profile` must hold a cuda section. A model that
    cannot run on the GPU (an op with no CUDA kernel) is left out, its error in `failed`."""
    failed = {} if failed is None else failed
    if profile.cuda is None:
        raise SchedlabError("the profile has no cuda section: run `schedlab calibrate --cuda` on this GPU machine first")
    say = progress or (lambda _m: None)
    machine = gpu_machine(device)
    uncalibrated = dataclasses.replace(profile, cuda=None)
    rows = []
    for model in models:
        say(f"{model}: executor and eager steps on {device_name(device)}")
        try:
            rows.append(_fidelity_row(model, profile, uncalibrated, machine, size, optimizer, device, steps))
        except Exception as e:
            failed[model] = _failure(e)
            say(f"{model}: failed: {failed[model]}")
            synchronize(device)
    return rows


def _failure(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _fidelity_row(model: str, profile: Profile, uncalibrated: Profile, machine: Machine, size: str, optimizer: str,
                  device: str, steps: int) -> CudaFidelityRow:
    assert profile.cuda is not None
    p = _prepare(model, size, optimizer, device, machine)
    graph = p.captured.graph
    ref, user, opt = eager_reference(load_workload(model, size).module, graph, p.captured.input_values)
    ref.to(device)
    user = tuple(t.to(device) for t in user)
    eager_s: list[float] = []

    def eager() -> None:
        synchronize(device)
        t0 = time.perf_counter()
        eager_step(ref, user, opt)
        synchronize(device)
        eager_s.append(time.perf_counter() - t0)

    times, _ = replay_steps(p.program, p.run, p.resolved.sequence, False, p.inputs, device, steps, between=eager)
    eager_timed = eager_s[-len(times.step_s):]
    ratio, _ = ratio_stats(list(times.step_s), eager_timed)
    predicted = Simulator(graph, machine, profile).run(p.resolved, record=False).step_time_s
    roofline = Simulator(graph, machine, uncalibrated).run(p.resolved, record=False).step_time_s
    compute = [op for op in graph.ops if not op.is_view]
    known = sum(1 for op in compute if signature(op) in profile.cuda.signatures) / max(1, len(compute))
    return CudaFidelityRow(
        model=model, held_out=is_heldout(model), ops=len(graph.ops),
        measured_ms=1e3 * statistics.median(times.step_s), eager_ms=1e3 * statistics.median(eager_timed),
        ratio_vs_eager=ratio, issue_ms=sum(times.issue_us) / 1e3,
        predicted_ms=1e3 * predicted, roofline_ms=1e3 * roofline, known_signatures=known,
    )


def summary(rows: Sequence[CudaFidelityRow]) -> dict[str, Any]:
    """MAPE of both predictions over the built-in and the held-out rows."""
    out: dict[str, Any] = {}
    for label, sel in (("builtin", [r for r in rows if not r.held_out]), ("heldout", [r for r in rows if r.held_out])):
        if sel:
            out[label] = {
                "models": len(sel),
                "mape_pct": statistics.fmean(abs(r.error_pct) for r in sel),
                "roofline_mape_pct": statistics.fmean(abs(r.roofline_error_pct) for r in sel),
                "ratio_vs_eager_median": statistics.median(r.ratio_vs_eager for r in sel),
            }
    return out
