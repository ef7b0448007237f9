"""A GPU's calibration: the figures of a Profile's "cuda" section (`calibrate.cuda_costs`),
measured on the calibration workloads (the built-ins), and the host-plus-GPU machine the
simulator predicts such a GPU's steps on (`calibrate.cuda_fidelity` judges them).

`calibrate_cuda` measures the roofline (`calibrate.cuda_run.roofline_figures`), each
distinct op's kernel alone, the host's issue cost per aten target (from the executor's
straight-line step on the GPU), what the co-run step on streams adds to it per op and
what an op's issue grows while another worker waits to issue (`stream_costs_us`), the share of the roofline each op class reached
(`calibrate.cuda_costs.efficiencies`), and the host<->device copy fits.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.cuda_costs import CudaCosts, efficiencies
from schedlab.calibrate.cuda_run import (
    Stepper,
    copy_fit,
    failure_text,
    issue_costs,
    line_stepper,
    live_values,
    replay_steps,
    roofline_figures,
    signature_kernels_us,
    synchronize,
    to_device,
)
from schedlab.calibrate.dispatch import chains_graph
from schedlab.capture import Captured, capture, cpu_only_ops
from schedlab.errors import SchedlabError
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.streams import StreamStep, issue_spans_us, streams_for
from schedlab.graph import Graph
from schedlab.machine import Device, Machine, usable_cores
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.workloads.loader import BUILTIN_WORKLOADS, load_workload

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
    H100's (the machine's `host["gpu"]` keeps the name it was asked for)."""
    for key, flops, bw in DATASHEET:
        if key in name:
            return flops, bw
    return DATASHEET[1][1], DATASHEET[1][2]


def device_name(device: str | torch.device) -> str:
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (test run)"


def gpu_machine(device: str | torch.device, streams: int = 1) -> Machine:
    """This host as the simulator sees it: one process driving one GPU on `streams` streams
    (the executor's co-run slots; one: its straight-line step) and the host's CPU cores."""
    dev = torch.device(device)
    mem = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 16 * 2**30
    return machine_for(device_name(dev), int(mem), usable_cores(), streams=streams)


def machine_for(gpu_name: str, memory_bytes: int = 80 * 2**30, cores: int = 1, streams: int = 1) -> Machine:
    """A host of `cores` CPU cores driving GPU `gpu_name` (its datasheet figures) on `streams` streams."""
    flops, bw = datasheet(gpu_name)
    return Machine(
        name="cuda-host",
        devices=(
            Device(id=GPU_ID, kind="cuda", cores=1, memory_bytes=memory_bytes, streams=streams, peak_flops=flops,
                   mem_bw_bytes_per_s=bw),
            Device(id="cpu0", kind="cpu", cores=cores, memory_bytes=64 * 2**30),
        ),
        host={"gpu": gpu_name, "cpu_cores": cores},
    )


def stepper_for(program: Program, resolved: ResolvedPlan, device: str | torch.device) -> Stepper:
    """The executor's GPU step of `program` under `resolved`: the straight line with one
    slot, else the co-run step on one stream per slot (`exec.streams`)."""
    if resolved.slots == 1:
        keep = {o.value for o in program.graph.outputs}
        return line_stepper(program.straight_line(resolved.sequence, resolved.threads, keep), resolved.sequence,
                            len(program.graph.ops))
    step = StreamStep(program, resolved, streams_for(device))
    return lambda V: issue_spans_us(step.step(V)[0])


@dataclass
class Prepared:
    """A model captured on the CPU and compiled for the GPU: its executor step (one slot, the
    straight line, in the simulator's resolved order), and its step's inputs copied to the GPU."""

    name: str
    module: torch.nn.Module  # the workload's module as built, before any step (eager's reference copies it)
    captured: Captured
    resolved: ResolvedPlan
    step: Stepper
    program: Program
    inputs: dict[int, torch.Tensor]


def prepare_on(model: str, size: str, optimizer: str, device: str | torch.device, machine: Machine) -> Prepared:
    """`model` captured portable (`schedlab.capture`: its LSTM layers and attention lowered
    to ops a GPU runs too) and compiled for `device`."""
    workload = load_workload(model, size)
    captured = capture(workload, optimizer, portable=True)
    graph = captured.graph
    left = cpu_only_ops(graph)
    if left and torch.device(device).type != "cpu":
        raise SchedlabError(f"{model}: its graph holds ops only a CPU runs ({', '.join(left)}), even captured portable")
    program = compile_graph(graph, device=device)
    resolved = resolve(graph, Plan(device=GPU_ID), machine)
    return Prepared(model, workload.module, captured, resolved, stepper_for(program, resolved, device), program,
                    to_device(captured.input_values, device))


def _per_op_us(program: Program, inputs: dict[int, torch.Tensor], slots: int, device: str | torch.device,
               steps: int) -> float:
    """The fastest step's wall µs per op of `program` under `slots` on `device` (its executor step)."""
    graph = program.graph
    resolved = resolve(graph, Plan(device=GPU_ID, slots=slots), machine_for(device_name(device), streams=slots))
    times, _ = replay_steps(program, stepper_for(program, resolved, device), True, to_device(inputs, device),
                            device, steps)
    return min(times.step_s) * 1e6 / len(graph.ops)


def stream_costs_us(device: str | torch.device, n_ops: int = 1000, steps: int = 5) -> tuple[float, float]:
    """What the co-run step on streams costs the host per op, from chains of `n_ops`
    negligible ops (`calibrate.dispatch.chains_graph`), each the fastest step's wall per op:

    - *extra*: one chain on two slots against the straight line: the ready heap, the
      hand-over between workers and each op's event, what the simulator adds to a GPU op's
      issue cost under several slots (`Profile.kind_issue_us`);
    - *contention*: two independent chains on two slots (both workers busy) against one
      chain on two slots (the other idle): what an op's issue grows while another worker
      waits to issue, which the simulator scales by log2(1 + workers queued) (`sim/model.py`).
    """
    one, inputs = chains_graph(n_ops, 1)
    two, _ = chains_graph(n_ops, 2)
    line, alone = (_per_op_us(compile_graph(one, device=device), inputs, k, device, steps) for k in (1, 2))
    contended = _per_op_us(compile_graph(two, device=device), inputs, 2, device, steps)
    return max(0.0, alone - line), max(0.0, contended - alone)


Progress = Callable[[str], None]


def calibrate_cuda(
    models: Sequence[str], *, size: str = "default", optimizer: str = "sgd", device: str = "cuda", steps: int = 10,
    progress: Progress | None = None, roofline_sizes: tuple[int, int] = (8192, 1 << 27),
    copy_sizes: Sequence[int] | None = None,
) -> tuple[CudaCosts, dict[str, Any]]:
    """The "cuda" section measured on `device` from `models` (module docstring), and a
    report (per model: ops, signatures measured, captured/eager/failed counts)."""
    say = progress or (lambda _m: None)
    other = [m for m in models if m not in BUILTIN_WORKLOADS]
    if other:
        raise SchedlabError(f"the GPU calibration runs on the built-in workloads ({', '.join(BUILTIN_WORKLOADS)}) "
                            f"only, not {', '.join(other)}: the models it is judged on are never calibrated on "
                            "(`schedlab fidelity --cuda`)")
    machine = gpu_machine(device)
    say("roofline: an empty kernel, a large mm, a large add")
    roof = roofline_figures(device, *roofline_sizes)
    sigs: dict[str, float] = {}
    replays = []
    report: dict[str, Any] = {"models": {}, "failed_models": {}}
    for model in models:
        say(f"{model}: kernels of its ops, then its host issue costs")
        try:
            p = prepare_on(model, size, optimizer, device, machine)
            # its own copy of the inputs: the replay below starts from the step's first inputs
            values = live_values(p.program, to_device(p.captured.input_values, device), device)
            kt = signature_kernels_us(p.program, values, device, skip=sigs)
            del values
            times, _ = replay_steps(p.program, p.step, False, p.inputs, device, steps)
        except Exception as e:
            report["failed_models"][model] = failure_text(e)
            say(f"{model}: failed: {report['failed_models'][model]}")
            synchronize(device)
            continue
        sigs.update(kt.kernel_us)
        replays.append((p.captured.graph, times.issue_us))
        report["models"][model] = {"ops": len(p.captured.graph.ops), "new_signatures": len(kt.kernel_us),
                                   "captured": kt.captured, "eager": kt.eager, "failed": list(kt.failed),
                                   "step_ms": 1e3 * statistics.median(times.step_s),
                                   "op_issue_us": [round(x, 2) for x in times.issue_us]}
    if not replays:
        raise SchedlabError("no calibration model ran on the GPU: " + "; ".join(
            f"{m}: {e}" for m, e in report["failed_models"].items()))
    issue, issue_default = issue_costs(replays)
    say("the co-run step's cost per op on streams, alone and contended")
    stream_extra, contention = stream_costs_us(device)
    say("host<->device copies")
    sizes = {} if copy_sizes is None else {"sizes": copy_sizes}
    h2d, d2h = copy_fit(device, True, **sizes), copy_fit(device, False, **sizes)
    costs = CudaCosts(
        device=device_name(device), torch=torch.__version__, measured_unix_s=time.time(),
        launch_us=roof.launch_us, flops_per_s=roof.flops_per_s, bw_bytes_per_s=roof.bw_bytes_per_s,
        signatures=sigs, issue_us=issue, issue_default_us=issue_default, h2d=h2d, d2h=d2h,
        stream_issue_extra_us=stream_extra, stream_contention_us=contention,
    )
    per_class, default_eff = efficiencies(costs, (g for g, _ in replays))
    costs = dataclasses.replace(costs, class_efficiency=per_class, default_efficiency=default_eff)
    return costs, report


def refit_issue(cuda: CudaCosts, replays: Sequence[tuple[Graph, Sequence[float]]]) -> CudaCosts:
    """`cuda` with its host issue costs re-fitted from `replays` (graph, per-op issue µs)."""
    issue, default = issue_costs(replays)
    return dataclasses.replace(cuda, issue_us=issue, issue_default_us=default)
