"""What an op's kernel costs on each kind of device, and which model said so.

A cost model (`sim.cost.CostModel`; a `Profile`) is calibrated on a kind of device. When it
says which kinds (`KindCosts`), the simulator costs each device by its kind:

- a ``cpu`` device: `cost.kernel_us(op, threads)`, the calibrated CPU costs, exactly as
  in a one-device step ("calibrated cpu profile");
- a ``cuda`` device: the cost model's own calibration of that kind when it has one
  (`KindCosts.kind_kernel_us`; a Profile's "cuda" section, `calibrate.cuda_costs`), else
  the *roofline* of the device's preset figures (`Device.peak_flops`,
  `Device.mem_bw_bytes_per_s`), labelled uncalibrated::

      kernel_us = CUDA_LAUNCH_US + 1e6 * max(flops / (peak_flops * CUDA_COMPUTE_EFFICIENCY),
                                             bytes_moved / (mem_bw * CUDA_MEMORY_EFFICIENCY))

  A view costs nothing (metadata only, as on a CPU); its dispatch stays the Profile's.

A cost model that does not say (the tests' `TableCost`, `RandomCost`) costs every device
alike, as it always has. The intra-op thread count does not enter a GPU kernel's time.

Co-running kernels on a ``cuda`` device costed here share the device: the roofline time is
the whole GPU's, so with ``b`` other kernels running a kernel's work slows by ``1 + b``
(the streams give concurrency, not throughput), while its launch part does not slow:
``slowdown = 1 + b * work_us / kernel_us``.

Constants of the roofline. They are assumptions, not measurements: no GPU was lent when this
was written, so none was calibrated; `schedlab calibrate` on a CUDA machine fills a
Profile's "cuda" section, which then replaces them.

- ``CUDA_LAUNCH_US`` = 5.0 µs: from a kernel's launch to its end for an empty kernel; a few
  microseconds on recent NVIDIA GPUs with the CUDA runtime (launch overhead is the
  usual floor of small PyTorch ops on a GPU).
- ``CUDA_COMPUTE_EFFICIENCY`` = 0.7: the share of the fp32 peak a kernel reaches (cuBLAS
  SGEMM of large matrices reaches 80-90% of it; small and non-GEMM kernels less).
- ``CUDA_MEMORY_EFFICIENCY`` = 0.8: the share of the HBM bandwidth a streaming kernel
  reaches (large copies and elementwise kernels reach about 80-90%).

The graphs are captured in fp32, and PyTorch runs fp32 matmuls in full fp32 by default
(``torch.backends.cuda.matmul.allow_tf32`` is False), so a preset's `peak_flops` is its
fp32 (non-tensor-core) peak (`schedlab.machine` says which GPU each preset is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from schedlab.errors import SchedlabError
from schedlab.graph import Op, OpKind
from schedlab.machine import Device
from schedlab.sim.cost import CostModel

CUDA_LAUNCH_US = 5.0  # µs, launch to end of an empty kernel (assumption; see the docstring)
CUDA_COMPUTE_EFFICIENCY = 0.7  # share of Device.peak_flops a kernel reaches (assumption)
CUDA_MEMORY_EFFICIENCY = 0.8  # share of Device.mem_bw_bytes_per_s a kernel reaches (assumption)


@runtime_checkable
class KindCosts(Protocol):
    """A cost model that says which device kinds it was calibrated on (a Profile)."""

    def calibrated_kinds(self) -> dict[str, str]:
        """Device kind -> what calibrated the costs of that kind, e.g. {"cpu": "calibrated cpu profile"}."""
        ...

    def kind_kernel_us(self, op: Op, kind: str) -> float | None:
        """Kernel µs of `op` on one device of `kind` other than "cpu" (which `kernel_us`
        answers), from that kind's calibration; None where it has none for `op`."""
        ...

    def kind_launch_us(self, kind: str) -> float:
        """The fixed part of every kernel of `kind` in that calibration (what co-running
        kernels do not slow)."""
        ...

    def kind_issue_us(self, op: Op, kind: str) -> float | None:
        """Host µs to issue `op` to one device of `kind` other than "cpu" (the dispatch of
        an asynchronous launch), from that kind's calibration; None: the model's
        `dispatch_us`, as for a CPU op."""
        ...


def roofline_label(device: Device) -> str:
    """The label of a cuda device costed by its preset's roofline."""
    return (
        f"cuda roofline (peak {device.peak_flops / 1e12:g} TFLOP/s, {device.mem_bw_bytes_per_s / 1e12:g} TB/s; "
        "uncalibrated)"
    )


def cost_source(cost: CostModel, device: Device) -> str:
    """Which model costs the kernels of `device` (see the module docstring)."""
    if not isinstance(cost, KindCosts):
        return f"{type(cost).__name__} (same costs on every device kind)"
    label = cost.calibrated_kinds().get(device.kind)
    if label is not None:
        return label
    if device.kind == "cuda":
        _check_roofline(device)
        return roofline_label(device)
    raise SchedlabError(f"device {device.id}: the cost model holds no costs for devices of kind {device.kind!r}")


def cuda_roofline_us(op: Op, device: Device) -> float:
    """Kernel µs of `op` on cuda `device` by the roofline of its preset figures."""
    if op.is_view:
        return 0.0
    _check_roofline(device)
    return CUDA_LAUNCH_US + _work_us(op, device)


def _work_us(op: Op, device: Device) -> float:
    compute_s = op.flops / (device.peak_flops * CUDA_COMPUTE_EFFICIENCY)
    memory_s = op.bytes_moved / (device.mem_bw_bytes_per_s * CUDA_MEMORY_EFFICIENCY)
    return 1e6 * max(compute_s, memory_s)


def _check_roofline(device: Device) -> None:
    if device.peak_flops <= 0 or device.mem_bw_bytes_per_s <= 0:
        raise SchedlabError(
            f"device {device.id} (cuda) has no peak_flops or mem_bw_bytes_per_s to cost its ops by a roofline; "
            "give both in the machine description, or calibrate on CUDA (a Profile with a cuda section)"
        )


def kind_kernel_us(cost: CostModel, op: Op, threads: int, device: Device) -> float | None:
    """Kernel µs of compute op `op` on `device` when its kind changes it; None where
    `cost.kernel_us(op, threads)` holds (a cpu device, or a model that costs every kind alike)."""
    if device.kind == "cpu" or not isinstance(cost, KindCosts):
        return None
    if op.is_view:
        return 0.0
    calibrated = cost.kind_kernel_us(op, device.kind) if device.kind in cost.calibrated_kinds() else None
    if calibrated is not None:
        return calibrated
    if device.kind == "cuda":
        return cuda_roofline_us(op, device)
    raise SchedlabError(f"device {device.id}: the cost model holds no costs for devices of kind {device.kind!r}")


def device_kernels_us(
    ops: Sequence[Op], op_device: Sequence[int], devices: Sequence[Device], cost: CostModel, threads: Sequence[int],
    kernel_us: list[float],
) -> list[float]:
    """`kernel_us` (the cost model's times, as for a CPU) with every compute op on a device
    whose kind changes it costed for that kind; the list given is returned unchanged when
    no op is (a CPU-only plan pays nothing more)."""
    if not isinstance(cost, KindCosts) or all(devices[d].kind == "cpu" for d in set(op_device)):
        return kernel_us
    out = list(kernel_us)
    for i, op in enumerate(ops):
        if op.kind is OpKind.COMM:
            continue
        t = kind_kernel_us(cost, op, threads[i], devices[op_device[i]])
        if t is not None:
            out[i] = t
    return out


def op_dispatch_us(cost: CostModel, op: Op, device: Device) -> float:
    """Host µs to dispatch `op` on `device`: the issue cost of its kind's calibration where
    there is one (a GPU launch costs the host more than a CPU op's call), else `dispatch_us`."""
    if device.kind != "cpu" and isinstance(cost, KindCosts):
        t = cost.kind_issue_us(op, device.kind)
        if t is not None:
            return t
    return float(cost.dispatch_us(op))


def device_contention_us(cost: CostModel, device: Device) -> float:
    """Host µs a GPU op's issue grows, under several slots, while another worker waits for its
    process's lock (scaled by log2(1 + the workers queued) in `sim/model.py`): the cost
    model's `kind_contention_us(kind)` where it has
    one (a Profile with a cuda section that measured it), else 0 (and always 0 on a CPU)."""
    if device.kind == "cpu":
        return 0.0
    fn = getattr(cost, "kind_contention_us", None)
    return float(fn(device.kind)) if callable(fn) else 0.0


def device_dispatches_us(
    ops: Sequence[Op], op_device: Sequence[int], devices: Sequence[Device], cost: CostModel, dispatch_us: list[float],
) -> list[float]:
    """`dispatch_us` (the model's, as for CPU ops) with every compute op on a device whose
    kind has calibrated issue costs costed by them; the list given when none is."""
    if not isinstance(cost, KindCosts) or all(devices[d].kind == "cpu" for d in set(op_device)):
        return dispatch_us
    out = list(dispatch_us)
    for i, op in enumerate(ops):
        dev = devices[op_device[i]]
        if op.kind is not OpKind.COMM and dev.kind != "cpu":
            out[i] = op_dispatch_us(cost, op, dev)
    return out


def device_corun(cost: CostModel, device: Device) -> Callable[[Op, int, int], float]:
    """The co-run slowdown (op, busy units of the others, capacity) of kernels on `device`:
    the cost model's own where it holds, else the shared-device rule of the module docstring."""
    if device.kind == "cpu" or not isinstance(cost, KindCosts):
        return cost.corun_slowdown
    kinds = cost
    launch_us = kinds.kind_launch_us(device.kind) if device.kind in kinds.calibrated_kinds() else CUDA_LAUNCH_US

    def shared(op: Op, busy_others: int, total: int) -> float:
        if op.kind is OpKind.COMM:
            return float(cost.corun_slowdown(op, busy_others, total))
        if busy_others <= 0:
            return 1.0
        kernel = kind_kernel_us(kinds, op, 1, device) or 0.0
        work_share = max(0.0, min(1.0, (kernel - launch_us) / kernel)) if kernel > 0.0 else 0.0
        return 1.0 + busy_others * work_share

    return shared
