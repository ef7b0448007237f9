"""A Profile's "cuda" section: op costs calibrated on a CUDA device.

Without it the simulator costs a cuda device by the roofline of the machine description's
peak figures, labelled uncalibrated (`sim.device_cost`). With it, a cuda device's kernels
cost what this section measured, and the simulator's output says "calibrated cuda
profile (<GPU name>)".

What a calibration on a CUDA machine writes (one GPU, one stream, fp32, each time the
median of CUDA-event-timed calls after warm-up):

- ``device``: ``torch.cuda.get_device_name()``; ``torch``: the torch version;
- ``launch_us``: an empty kernel (e.g. ``torch.empty(0, device="cuda").add_(1)``), launch
  to end: the fixed part of every kernel;
- ``flops_per_s``: a large square fp32 ``mm`` (8192^3 x 2 FLOP), as PyTorch runs it by
  default (no TF32);
- ``bw_bytes_per_s``: an ``add`` of two tensors far beyond the L2 cache, 3 x 4 bytes per
  element over its time;
- ``signatures``: signature (`calibrate.signature`) -> kernel µs of the ops of the
  calibration workloads (the built-ins, never the held-out models), each timed alone on
  its live inputs from a replay of the step, as a captured CUDA graph of back-to-back calls
  where it captures (so the host's launch cost is out of it), else eagerly;
- ``issue_us``: aten target -> host µs to issue one such op to the GPU from the
  executor's straight-line step (the Python call, the dispatcher, the launch; the kernel
  runs on asynchronously), the median over the calibration workloads' ops of the target;
  ``issue_default_us`` the median over all of them, for a target not seen;
- ``stream_issue_extra_us``: host µs per op that the executor's co-run step on streams
  (several slots, one CUDA stream each: `exec.streams`) adds to the straight line's issue
  cost, on one chain of negligible ops (`calibrate.cuda_calibrate.stream_costs_us`);
  a plan with several slots on the GPU is charged each op's issue cost plus this;
- ``stream_contention_us``: host µs an op's issue grows while another worker waits to issue
  (the interpreter lock passes between the workers' threads at every launch): two
  independent chains on two slots against one chain, per op (`stream_costs_us`); the
  simulator adds it x log2(1 + the workers queued for the lock) as a worker takes it
  (`sim/model.py`);
- ``h2d`` / ``d2h``: a host<->device copy's fit (pinned memory), ``{"latency_us",
  "bw_bytes_per_s"}``: what this GPU's PCIe link measured. Recorded only: the simulator
  still prices a CPU+GPU machine's transfers by its machine description's links;
- ``class_efficiency``: op class -> the share of the measured roofline its measured ops of
  at least `MIN_ROOFLINE_US` of roofline reached, the median over them of ``roofline /
  (kernel - launch_us)``;
  ``default_efficiency`` the same over every measured op (`efficiencies`).

An op whose signature is there costs what was measured; any other costs
``launch_us + max(flops / flops_per_s, bytes / bw_bytes_per_s) / efficiency``: the measured
roofline of this GPU, at the share of it that the calibration's ops of its class reached
(its class unseen: all of them; a section without efficiencies: the roofline itself). On
an H200 at size gpu, the held-out models' unmeasured ops at the bare roofline made their
steps 15-61% short. A view costs nothing on the GPU; its host issue cost stays. JSON::

    "cuda": null | {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                    "measured_unix_s": ..., "launch_us": 5.1, "flops_per_s": 5.1e13,
                    "bw_bytes_per_s": 2.9e12, "signatures": {signature: kernel_us},
                    "issue_us": {target: host_us}, "issue_default_us": 9.0,
                    "h2d": {"latency_us", "bw_bytes_per_s"} | null, "d2h": ... | null,
                    "stream_issue_extra_us": 3.2 | null, "stream_contention_us": 9.0 | null,
                    "class_efficiency": {op_class: share}, "default_efficiency": 0.4 | null}

The section is optional (files without it load with ``cuda`` None); `schedlab calibrate
--cuda` on a CUDA machine writes it (`calibrate.cuda_calibrate`). The issue costs and links are
optional inside it (older sections: the CPU profile's dispatch cost, the preset's links).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schedlab.calibrate.signature import signature
from schedlab.graph import Graph, Op


@dataclass(frozen=True)
class CudaCosts:
    device: str  # torch.cuda.get_device_name() of where it was measured
    torch: str
    measured_unix_s: float
    launch_us: float  # an empty kernel, launch to end
    flops_per_s: float  # a large fp32 mm
    bw_bytes_per_s: float  # a large add
    signatures: dict[str, float] = field(default_factory=dict)  # signature -> kernel µs
    issue_us: dict[str, float] = field(default_factory=dict)  # aten target -> host µs to issue one
    issue_default_us: float | None = None  # host µs to issue a target not in issue_us
    h2d: LinkFit | None = None  # pinned host -> device copies
    d2h: LinkFit | None = None  # device -> pinned host copies
    stream_issue_extra_us: float | None = None  # host µs per op the co-run step on streams adds (several slots)
    stream_contention_us: float | None = None  # host µs an op's issue grows while another worker waits to issue
    class_efficiency: dict[str, float] = field(default_factory=dict)  # op class -> share of the roofline reached
    default_efficiency: float | None = None  # the same over every measured op, for a class not in class_efficiency

    @property
    def label(self) -> str:
        return f"calibrated cuda profile ({self.device})"

    def kernel_us(self, op: Op) -> float:
        """Kernel µs of `op` on this GPU: measured, else the measured roofline (module docstring)."""
        if op.is_view:
            return 0.0
        hit = self.signatures.get(signature(op))
        if hit is not None:
            return hit
        eff = self.class_efficiency.get(op.op_class, self.default_efficiency or 1.0)
        return self.launch_us + self.roofline_us(op) / eff

    def roofline_us(self, op: Op) -> float:
        """`op`'s time at this GPU's measured peaks, beyond the launch: FLOPs or bytes, the larger."""
        return 1e6 * max(op.flops / self.flops_per_s, op.bytes_moved / self.bw_bytes_per_s)

    def host_issue_us(self, op: Op) -> float | None:
        """Host µs the executor spends issuing `op` to this GPU; None when not calibrated."""
        hit = self.issue_us.get(op.target)
        return hit if hit is not None else self.issue_default_us

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "torch": self.torch,
            "measured_unix_s": self.measured_unix_s,
            "launch_us": self.launch_us,
            "flops_per_s": self.flops_per_s,
            "bw_bytes_per_s": self.bw_bytes_per_s,
            "signatures": {sig: round(us, 4) for sig, us in sorted(self.signatures.items())},
            "issue_us": {t: round(us, 4) for t, us in sorted(self.issue_us.items())},
            "issue_default_us": self.issue_default_us,
            "h2d": None if self.h2d is None else self.h2d.to_json(),
            "d2h": None if self.d2h is None else self.d2h.to_json(),
            "stream_issue_extra_us": self.stream_issue_extra_us,
            "stream_contention_us": self.stream_contention_us,
            "class_efficiency": {c: round(e, 4) for c, e in sorted(self.class_efficiency.items())},
            "default_efficiency": self.default_efficiency,
        }

    @staticmethod
    def from_json(d: Any) -> CudaCosts:
        """Parse the section; a problem raises TypeError, KeyError or ValueError (the Profile names the field)."""
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")
        sigs = d.get("signatures", {})
        if not isinstance(sigs, dict):
            raise TypeError("signatures must be an object of signature -> kernel_us")
        issue = d.get("issue_us", {})
        if not isinstance(issue, dict):
            raise TypeError("issue_us must be an object of aten target -> host µs")
        default = d.get("issue_default_us")
        extra = d.get("stream_issue_extra_us")
        contention = d.get("stream_contention_us")
        eff = d.get("class_efficiency", {})
        if not isinstance(eff, dict):
            raise TypeError("class_efficiency must be an object of op class -> share of the roofline")
        default_eff = d.get("default_efficiency")
        return CudaCosts(
            device=str(d["device"]),
            torch=str(d.get("torch", "")),
            measured_unix_s=_number(d.get("measured_unix_s", 0.0), "measured_unix_s"),
            launch_us=_number(d["launch_us"], "launch_us"),
            flops_per_s=_number(d["flops_per_s"], "flops_per_s", positive=True),
            bw_bytes_per_s=_number(d["bw_bytes_per_s"], "bw_bytes_per_s", positive=True),
            signatures={str(k): _number(v, f"signatures[{k!r}]") for k, v in sigs.items()},
            issue_us={str(k): _number(v, f"issue_us[{k!r}]") for k, v in issue.items()},
            issue_default_us=None if default is None else _number(default, "issue_default_us"),
            h2d=LinkFit.from_json(d["h2d"], "h2d") if d.get("h2d") is not None else None,
            d2h=LinkFit.from_json(d["d2h"], "d2h") if d.get("d2h") is not None else None,
            stream_issue_extra_us=None if extra is None else _number(extra, "stream_issue_extra_us"),
            stream_contention_us=None if contention is None else _number(contention, "stream_contention_us"),
            class_efficiency={str(k): _number(v, f"class_efficiency[{k!r}]", positive=True) for k, v in eff.items()},
            default_efficiency=None if default_eff is None else _number(default_eff, "default_efficiency", positive=True),
        )


@dataclass(frozen=True)
class LinkFit:
    """A copy's time, ``latency_us + bytes / bw_bytes_per_s``, fitted over message sizes."""

    latency_us: float
    bw_bytes_per_s: float

    def us(self, nbytes: float) -> float:
        return self.latency_us + 1e6 * nbytes / self.bw_bytes_per_s

    def to_json(self) -> dict[str, float]:
        return {"latency_us": round(self.latency_us, 4), "bw_bytes_per_s": self.bw_bytes_per_s}

    @staticmethod
    def from_json(d: Any, name: str) -> LinkFit:
        if not isinstance(d, dict):
            raise TypeError(f"{name} must be an object {{latency_us, bw_bytes_per_s}}")
        return LinkFit(latency_us=_number(d["latency_us"], f"{name}.latency_us"),
                       bw_bytes_per_s=_number(d["bw_bytes_per_s"], f"{name}.bw_bytes_per_s", positive=True))


def _number(v: Any, name: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


MIN_ROOFLINE_US = 5.0  # an op whose roofline time is below this is mostly launch: its share says little


def efficiencies(cuda: CudaCosts, graphs: Iterable[Graph]) -> tuple[dict[str, float], float | None]:
    """(op class -> share of the roofline reached, the share over all) of the ops of `graphs`
    (the calibration workloads) whose kernels `cuda` measured and whose roofline time is at
    least `MIN_ROOFLINE_US`: per distinct signature, ``roofline_us / (kernel_us -
    launch_us)``, clipped to [0.001, 10] (a convolution may beat the fp32 roofline: cuDNN
    uses TF32 by default), the median per class."""
    shares: dict[str, float] = {}
    classes: dict[str, str] = {}
    for graph in graphs:
        for op in graph.ops:
            if op.is_view:
                continue
            sig = signature(op)
            kernel = cuda.signatures.get(sig)
            roof = cuda.roofline_us(op)
            if kernel is None or sig in shares or roof < MIN_ROOFLINE_US:
                continue
            work = kernel - cuda.launch_us
            shares[sig] = min(10.0, max(1e-3, roof / work)) if work > 0.0 else 10.0
            classes[sig] = op.op_class
    if not shares:
        return {}, None
    by_class: dict[str, list[float]] = {}
    for sig, share in shares.items():
        by_class.setdefault(classes[sig], []).append(share)
    return ({c: statistics.median(xs) for c, xs in by_class.items()}, statistics.median(shares.values()))
