"""What a view op costs beyond the executor's probe view.

Views move no data, but they are not free: in a model made of small ops (an unrolled
`nn.GRU` is one third views) they are a large share of the step. Their cost is the
interpreter's and the dispatcher's, and it depends on the op: `t` of a 2-d tensor (the
dispatch probe's view, `calibrate.dispatch`) is the cheapest; `view` parses a size list,
`split` and `unbind` build a list of output tensors. Measured on the 2-core development
VM: `t` 1.8 us, `view` 2.8 us, `slice` 3.2 us, `split` into 4 outputs 8 us per event of
the one-slot executor.

Calibration benchmarks every distinct view signature of the replayed graphs like any
other op (one intra-op thread: views have no parallel part); the extra over the probe
view's bare call (`DispatchFigures.view_call_floor_us`) is stored per signature, and a
per-class model is fitted on it:

    extra_us(op) = a_us + per_output_us * (outputs - 1)

A class never measured takes the model fitted on all views (`fit_views`' fallback).
The Profile adds the extra to the view's dispatch cost (`Profile.dispatch_us`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_SPREAD_FOR_SLOPE = 2  # distinct output counts a class needs to fit its own slope


@dataclass(frozen=True)
class ViewPoint:
    """One measured view signature: its class, output count and extra call time."""

    signature: str
    op_class: str
    outputs: int
    extra_us: float


@dataclass(frozen=True)
class ViewFit:
    """extra_us = a_us + per_output_us * (outputs - 1), never below 0."""

    a_us: float
    per_output_us: float
    n_signatures: int

    def extra_us(self, outputs: int) -> float:
        return max(0.0, self.a_us + self.per_output_us * max(0, outputs - 1))

    def to_json(self) -> dict[str, Any]:
        return {"a_us": round(self.a_us, 4), "per_output_us": round(self.per_output_us, 4), "n_signatures": self.n_signatures}

    @staticmethod
    def from_json(d: Any) -> ViewFit:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")
        a, b = float(d["a_us"]), float(d["per_output_us"])
        for name, v in (("a_us", a), ("per_output_us", b)):
            if not v == v or v in (float("inf"), float("-inf")):
                raise ValueError(f"{name} must be a finite number, not {v}")
        if b < 0:
            raise ValueError(f"per_output_us must be >= 0, not {b}")
        return ViewFit(a, b, int(d.get("n_signatures", 0)))


NO_VIEW_FIT = ViewFit(0.0, 0.0, 0)


def view_key(signature: str, outputs: int) -> str:
    """A view's key in the table: a view's signature holds no shapes, so `unbind` of a
    [3, ...] and of a [20, ...] tensor share one; the output count tells them apart."""
    return f"{signature}|n={outputs}"  # no view was measured: views cost the probe's dispatch


def _slope(points: Sequence[ViewPoint]) -> float | None:
    """Median cost of one more output (Theil-Sen over pairs with different output counts)."""
    slopes = [
        (q.extra_us - p.extra_us) / (q.outputs - p.outputs)
        for i, p in enumerate(points)
        for q in points[i + 1 :]
        if q.outputs != p.outputs
    ]
    return max(0.0, statistics.median(slopes)) if slopes else None


def _fit(points: Sequence[ViewPoint], default_slope: float) -> ViewFit:
    spread = len({p.outputs for p in points})
    slope = _slope(points) if spread >= MIN_SPREAD_FOR_SLOPE else None
    b = default_slope if slope is None else slope
    a = statistics.median(p.extra_us - b * (p.outputs - 1) for p in points)
    return ViewFit(a, b, len({p.signature for p in points}))


def fit_views(points: Sequence[ViewPoint]) -> tuple[ViewFit, dict[str, ViewFit]]:
    """The model over all views (the fallback) and one per view class."""
    if not points:
        return NO_VIEW_FIT, {}
    pooled = _fit(points, 0.0)
    by_class: dict[str, list[ViewPoint]] = {}
    for p in points:
        by_class.setdefault(p.op_class, []).append(p)
    return pooled, {cls: _fit(pts, pooled.per_output_us) for cls, pts in sorted(by_class.items())}


@dataclass(frozen=True)
class ViewCosts:
    """Every view cost a Profile holds: per signature, per class, and over all views."""

    signatures: dict[str, float]  # view_key(signature, outputs) -> extra us
    classes: dict[str, ViewFit]
    fallback: ViewFit

    def extra_us(self, signature: str, op_class: str, outputs: int) -> float:
        hit = self.signatures.get(view_key(signature, outputs))
        if hit is not None:
            return hit
        return self.classes.get(op_class, self.fallback).extra_us(outputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "signatures": {key: round(v, 4) for key, v in sorted(self.signatures.items())},
            "classes": {cls: fit.to_json() for cls, fit in sorted(self.classes.items())},
            "fallback": self.fallback.to_json(),
        }

    @staticmethod
    def from_json(d: Any) -> ViewCosts:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")
        sigs = {}
        for sig, v in d.get("signatures", {}).items():
            x = float(v)
            if not x >= 0 or x == float("inf"):
                raise ValueError(f"view signature {sig!r}: extra_us must be a finite number >= 0, not {v!r}")
            sigs[str(sig)] = x
        classes = {str(cls): ViewFit.from_json(f) for cls, f in d.get("classes", {}).items()}
        return ViewCosts(sigs, classes, ViewFit.from_json(d["fallback"]))


NO_VIEW_COSTS = ViewCosts({}, {}, NO_VIEW_FIT)  # profiles that measured no views
