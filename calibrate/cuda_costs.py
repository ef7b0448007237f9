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
- ``signatures``: signature (`calibrate.signature`) -> kernel µs of the ops the CPU
  calibration replays (and of a trace's ops), measured the same way.

An op whose signature is there costs what was measured; any other costs
``launch_us + max(flops / flops_per_s, bytes / bw_bytes_per_s)``, the measured roofline
of this GPU. A view costs nothing. JSON::

    "cuda": null | {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                    "measured_unix_s": ..., "launch_us": 5.1, "flops_per_s": 5.1e13,
                    "bw_bytes_per_s": 2.9e12, "signatures": {signature: kernel_us}}

The section is optional (files without it load with ``cuda`` None). No GPU was lent when
it was designed, so no Profile holds one yet: `schedlab calibrate` does not write it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schedlab.calibrate.signature import signature
from schedlab.graph import Op


@dataclass(frozen=True)
class CudaCosts:
    device: str  # torch.cuda.get_device_name() of where it was measured
    torch: str
    measured_unix_s: float
    launch_us: float  # an empty kernel, launch to end
    flops_per_s: float  # a large fp32 mm
    bw_bytes_per_s: float  # a large add
    signatures: dict[str, float] = field(default_factory=dict)  # signature -> kernel µs

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
        return self.launch_us + 1e6 * max(op.flops / self.flops_per_s, op.bytes_moved / self.bw_bytes_per_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "torch": self.torch,
            "measured_unix_s": self.measured_unix_s,
            "launch_us": self.launch_us,
            "flops_per_s": self.flops_per_s,
            "bw_bytes_per_s": self.bw_bytes_per_s,
            "signatures": {sig: round(us, 4) for sig, us in sorted(self.signatures.items())},
        }

    @staticmethod
    def from_json(d: Any) -> CudaCosts:
        """Parse the section; a problem raises TypeError, KeyError or ValueError (the Profile names the field)."""
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")
        sigs = d.get("signatures", {})
        if not isinstance(sigs, dict):
            raise TypeError("signatures must be an object of signature -> kernel_us")
        return CudaCosts(
            device=str(d["device"]),
            torch=str(d.get("torch", "")),
            measured_unix_s=_number(d.get("measured_unix_s", 0.0), "measured_unix_s"),
            launch_us=_number(d["launch_us"], "launch_us"),
            flops_per_s=_number(d["flops_per_s"], "flops_per_s", positive=True),
            bw_bytes_per_s=_number(d["bw_bytes_per_s"], "bw_bytes_per_s", positive=True),
            signatures={str(k): _number(v, f"signatures[{k!r}]") for k, v in sigs.items()},
        )


def _number(v: Any, name: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)
