"""Measuring a GPU: the figures of a Profile's "cuda" section (`calibrate.cuda_costs`).

Every function takes the torch device to measure (``"cuda"`` on a GPU machine). On
``"cpu"`` they run the same code with host clocks instead of CUDA events and no CUDA graph
capture, which is how the tests exercise them on a machine without a GPU; only a "cuda"
run makes figures worth a Profile.

- `roofline_figures`: an empty kernel's device time (from a CUDA graph's replay, as each
  op's kernel is timed below), a large fp32 ``mm``'s FLOP/s
  and a large ``add``'s bytes/s;
- `live_values`: one replay of a step on the device, every value kept (the inputs each op
  is then timed on);
- `signature_kernels_us`: each distinct op (by `calibrate.signature`) timed alone on its
  live inputs: R back-to-back calls captured as one CUDA graph and replayed, so the host's
  launch cost is out of the figure; an op that cannot be captured (it synchronises, or
  reads a host scalar) is timed as R eager calls, which for a tiny kernel is bounded by
  the host's issue rate (the count is reported);
- `replay_steps`: the executor's straight-line step on the device, each op's host issue
  time from its stamps and each step's wall time to a synchronise;
- `issue_costs`: per aten target, the median host issue µs over a set of replays;
- `copy_fit`: host<->device copies of pinned memory over sizes, fitted to latency + bytes/bw.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.cuda_costs import LinkFit
from schedlab.calibrate.signature import signature
from schedlab.exec.program import Program
from schedlab.exec.runner import next_inputs
from schedlab.graph import Graph, OpKind

REPEATS = 10  # back-to-back calls per timed sample of one op
SAMPLES = 5  # samples per op; the median is kept


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: str | torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def elapsed_us(fn: Callable[[], Any], device: str | torch.device) -> float:
    """µs from before `fn()` to the end of the device work it queued (CUDA events on a
    GPU, after a synchronise; the host clock on a CPU)."""
    if is_cuda(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e3
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def median_us(fn: Callable[[], Any], device: str | torch.device, samples: int = SAMPLES, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    return statistics.median(elapsed_us(fn, device) for _ in range(samples))


@dataclass(frozen=True)
class Roofline:
    launch_us: float  # an empty kernel, launch to end
    flops_per_s: float  # a large square fp32 mm
    bw_bytes_per_s: float  # a large add: 3 x 4 bytes per element


def roofline_figures(device: str | torch.device, mm_n: int = 8192, add_elems: int = 1 << 27) -> Roofline:
    """The three figures of a GPU's measured roofline (fp32, PyTorch's defaults: no TF32)."""
    dev = torch.device(device)
    empty = torch.zeros(1, device=dev)
    if dev.type == "cuda":  # device time alone, as the ops' kernels are timed (`signature_kernels_us`)
        launch_us = _graph_us(lambda: empty.add_(0.0), dev)
    else:
        launch_us = median_us(lambda: empty.add_(0.0), dev, samples=50, warmup=10)
    mm_us = _binary_us(torch.mm, (mm_n, mm_n), dev)
    add_us = _binary_us(torch.add, (add_elems,), dev)
    return Roofline(
        launch_us=launch_us,
        flops_per_s=2.0 * mm_n**3 / (mm_us * 1e-6),
        bw_bytes_per_s=3 * 4 * add_elems / (add_us * 1e-6),
    )


def _binary_us(fn: Callable[[torch.Tensor, torch.Tensor], Any], shape: tuple[int, ...], dev: torch.device) -> float:
    """Median µs of `fn` on two fresh random tensors of `shape` (freed on return)."""
    a, b = torch.randn(*shape, device=dev), torch.randn(*shape, device=dev)
    return median_us(lambda: fn(a, b), dev, samples=5, warmup=2)


def failure_text(e: BaseException) -> str:
    """One line naming an exception: its type and its message's first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def to_device(values: dict[int, torch.Tensor], device: str | torch.device) -> dict[int, torch.Tensor]:
    """Copies of a step's input tensors on `device`."""
    return {v: t.detach().clone().to(device) for v, t in values.items()}


def live_values(program: Program, inputs: dict[int, torch.Tensor], device: str | torch.device) -> list[Any]:
    """Every value of one replay of `program`'s graph (in op order) on `device`."""
    V: list[Any] = [None] * len(program.graph.values)
    for v, t in inputs.items():
        V[v] = t
    for fn in program.op_fns:
        fn(V)
    synchronize(device)
    return V


@dataclass(frozen=True)
class KernelTimes:
    kernel_us: dict[str, float]  # signature -> µs per call
    captured: int  # signatures timed from a CUDA graph's replay
    eager: int  # signatures timed as eager calls (on a GPU: bounded by the host's issue rate)
    failed: tuple[str, ...]  # signatures that could not be re-run alone (a message each)


def _graph_us(call: Callable[[], Any], device: torch.device) -> float:
    """µs per call of `call`, REPEATS calls captured as one CUDA graph and replayed."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPEATS):
            call()
    return median_us(g.replay, device) / REPEATS


def _eager_us(call: Callable[[], Any], device: torch.device) -> float:
    def burst() -> None:
        for _ in range(REPEATS):
            call()

    return median_us(burst, device) / REPEATS


_NO_CAPTURE = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item")


def signature_kernels_us(program: Program, V: list[Any], device: str | torch.device,
                         skip: Iterable[str] = ()) -> KernelTimes:
    """Each compute op's kernel µs, one per distinct signature (module docstring); the
    signatures in `skip` (already measured) are left out."""
    dev = torch.device(device)
    seen = set(skip)
    out: dict[str, float] = {}
    captured = eager = 0
    failed: list[str] = []
    for op in program.graph.ops:
        if op.is_view or op.kind is OpKind.COMM:
            continue
        sig = signature(op)
        if sig in seen:
            continue
        seen.add(sig)
        fn = program.op_fns[op.id]
        scratch = list(V)  # the op writes its outputs here; its inputs stay the live ones

        def call(fn: Callable[[list[Any]], None] = fn, scratch: list[Any] = scratch) -> None:
            fn(scratch)

        try:
            if dev.type == "cuda" and not any(k in op.target for k in _NO_CAPTURE):
                try:
                    out[sig] = _graph_us(call, dev)
                    captured += 1
                    continue
                except Exception:
                    torch.cuda.synchronize(dev)
            out[sig] = _eager_us(call, dev)
            eager += 1
        except Exception as e:
            failed.append(f"{sig}: {failure_text(e)}")
    return KernelTimes(kernel_us=out, captured=captured, eager=eager, failed=tuple(failed))


@dataclass(frozen=True)
class ReplayTimes:
    step_s: tuple[float, ...]  # each timed step, launch of the first op to a synchronise after the last
    issue_us: tuple[float, ...]  # per op (by op id): median host µs its issue took


Stepper = Callable[[list[Any]], Sequence[float]]  # runs one step on V; per op (by id) its host issue µs


def line_stepper(run: Callable[[list[Any], list[int]], None], sequence: Sequence[int], n_ops: int) -> Stepper:
    """A straight line `run(V, T)` of `sequence` (`Program.straight_line`) as a `Stepper`: an
    op's issue is the time between its stamp and the next. The line sets each op's intra-op
    threads; the caller's count comes back after it."""

    def step(V: list[Any]) -> list[float]:
        T = [0] * (len(sequence) + 1)
        threads = torch.get_num_threads()
        try:
            run(V, T)
        finally:
            torch.set_num_threads(threads)
        out = [0.0] * n_ops
        for k, op_id in enumerate(sequence):
            out[op_id] = (T[k + 1] - T[k]) / 1e3
        return out

    return step


def replay_steps(
    program: Program, step: Stepper, keep_inputs: bool, inputs: dict[int, torch.Tensor], device: str | torch.device,
    steps: int, warmup: int = 2, between: Callable[[], None] | None = None,
) -> tuple[ReplayTimes, dict[int, torch.Tensor]]:
    """`steps` timed steps of `step` (`line_stepper`, or a co-run step on streams) after
    `warmup`; each step's inputs are the last one's updates unless `keep_inputs`.
    `between()` runs before each step (the eager step it is interleaved with). Returns the
    times and the last step's inputs."""
    threads = torch.get_num_threads()  # the steps set each op's; the caller's comes back after
    try:
        return _replay_steps(program, step, keep_inputs, inputs, device, steps, warmup, between)
    finally:
        torch.set_num_threads(threads)


def _replay_steps(
    program: Program, step: Stepper, keep_inputs: bool, inputs: dict[int, torch.Tensor], device: str | torch.device,
    steps: int, warmup: int, between: Callable[[], None] | None,
) -> tuple[ReplayTimes, dict[int, torch.Tensor]]:
    graph = program.graph
    per_op: list[list[float]] = [[] for _ in graph.ops]
    step_s: list[float] = []
    cur = inputs
    for s in range(warmup + steps):
        if between is not None:
            between()
        V: list[Any] = [None] * len(graph.values)
        for v, t in cur.items():
            V[v] = t
        synchronize(device)
        t0 = time.perf_counter()
        issue = step(V)
        synchronize(device)
        t1 = time.perf_counter()
        if s >= warmup:
            step_s.append(t1 - t0)
            for op_id, us in enumerate(issue):
                per_op[op_id].append(us)
        if not keep_inputs:
            cur = next_inputs(graph, cur, {v: V[v] for v in range(len(V)) if V[v] is not None})
    issue_us = tuple(statistics.median(x) if x else 0.0 for x in per_op)
    return ReplayTimes(step_s=tuple(step_s), issue_us=issue_us), cur


def issue_costs(replays: Iterable[tuple[Graph, Sequence[float]]]) -> tuple[dict[str, float], float]:
    """(aten target -> median host issue µs, the median over every op) of replays' ops."""
    by_target: dict[str, list[float]] = defaultdict(list)
    for graph, issue_us in replays:
        for op in graph.ops:
            if op.kind is not OpKind.COMM:
                by_target[op.target].append(float(issue_us[op.id]))
    every = [x for xs in by_target.values() for x in xs]
    if not every:
        raise ValueError("no ops were replayed to measure issue costs on")
    return {t: statistics.median(xs) for t, xs in by_target.items()}, statistics.median(every)


COPY_SIZES = tuple(1 << k for k in range(12, 29, 2))  # 4 KiB .. 256 MiB


def copy_fit(device: str | torch.device, to_device: bool, sizes: Sequence[int] = COPY_SIZES) -> LinkFit:
    """Host->device (`to_device`) or device->host copies of pinned memory, fitted by least
    squares to ``latency_us + bytes / bw`` over `sizes` (bytes)."""
    dev = torch.device(device)
    pts: list[tuple[float, float]] = []
    for nbytes in sizes:
        host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=is_cuda(dev)).uniform_()
        on_dev = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)
        src, dst = (host, on_dev) if to_device else (on_dev, host)
        pts.append((float(nbytes), median_us(lambda: dst.copy_(src, non_blocking=True), dev)))  # noqa: B023 - used at once
    return fit_latency_bw(pts)


def fit_latency_bw(points: Sequence[tuple[float, float]]) -> LinkFit:
    """Least-squares ``us = latency_us + bytes / bw`` (µs) through (bytes, µs) points; the
    latency is kept >= 0 and the bandwidth finite and > 0."""
    if len(points) < 2:
        raise ValueError("a latency-bandwidth fit needs at least two message sizes")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
    if slope <= 0:  # flat or noisy: the largest copy's rate
        slope = max(ys) / max(xs)
    latency = max(0.0, my - slope * mx)
    return LinkFit(latency_us=latency, bw_bytes_per_s=1e6 / slope)
