"""Profile-only predictions scaled by how much slower the host ran its `mm` probe than at
calibration: what the simulator would score if it knew the host's drift and nothing else.

`schedlab fidelity` times the host probe (`calibrate.host_scaling`) before and after each
model; its one-thread `mm` (about 1 GFLOP, into a kept output) against the same probe at
calibration is the host's compute speed now against then. Each model's profile-only
predictions times the median of its two ratios is a prediction that reads the host and no
measurement of the model. On the 2-core Intel Xeon VM, six quick profiles of 2026-12-07
(runs BE-BJ), each scored at once on both sets, as predicted against scaled: held-out 9.3
/ 11.2 / 13.2 / 13.7 / 11.4 / 11.5% against 9.3 / 10.1 / 12.8 / 12.4 / 11.2 / 11.6%; dev
11.5 / 18.5 / 17.5 / 16.8 / 13.5 / 14.8% against 11.5 / 16.8 / 14.9 / 15.1 / 14.8 / 15.2%.
The tiny call (`call_us`) as the factor read worse on both runs scored so. A figure printed
beside the unscaled one, not folded into the predictions: it helped in three dev runs of
six and hurt in two, and the probe misses drift the steps see (`calibrate.host_scaling`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from schedlab.calibrate.fidelity import PROFILE_ONLY
from schedlab.calibrate.host_scaling import HostScaling


def probe_ratios(scaling: Mapping[str, Any] | None, field: str) -> dict[str, tuple[float | None, float | None]]:
    """Per workload of a results file's `host_scaling`: its probes' (before it, after it)
    `field` (a `HostScaling` figure) over calibration's, None for a probe missing or cut
    short or a figure not timed; empty where calibration kept no probe."""
    cal = HostScaling.from_json((scaling or {}).get("calibration"))
    if cal is None:
        return {}
    base = float(getattr(cal, field))

    def over_cal(d: Any) -> float | None:
        p = HostScaling.from_json(d)
        here = 0.0 if p is None else float(getattr(p, field))
        return here / base if here > 0 and base > 0 else None

    return {str(m["workload"]): (over_cal(m.get("before")), over_cal(m.get("after")))
            for m in (scaling or {}).get("models") or []}


def mm_drift(scaling: Mapping[str, Any] | None) -> dict[str, float]:
    """Per workload: the median over its probes (before and after it) of their one-thread
    `mm` time over calibration's (`probe_ratios`). Workloads with no probe, and every
    workload where calibration kept none, are left out."""
    drift: dict[str, float] = {}
    for workload, pair in probe_ratios(scaling, "compute_1t_us").items():
        here = [x for x in pair if x is not None]
        if here:
            drift[workload] = statistics.median(here)
    return drift


def drift_scaled_mape(plans: Sequence[Mapping[str, Any]], drift: Mapping[str, float]) -> tuple[float, float] | None:
    """(MAPE as predicted, MAPE with each prediction times its workload's `drift`) over the
    scored profile-only plans whose workload has a drift; None where none has."""
    pairs = [(float(p["predicted_s"]), float(p["measured_s"]), drift[p["workload"]]) for p in plans
             if p.get("method", PROFILE_ONLY) == PROFILE_ONLY and p.get("scored", True)
             and p.get("workload") in drift and float(p.get("measured_s") or 0.0) > 0]
    if not pairs:
        return None
    as_predicted = statistics.fmean(abs(pred / meas - 1.0) for pred, meas, _ in pairs)
    scaled = statistics.fmean(abs(pred * f / meas - 1.0) for pred, meas, f in pairs)
    return as_predicted, scaled
