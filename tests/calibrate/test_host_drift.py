"""Profile-only predictions scaled by the host's `mm` probe against calibration."""

from __future__ import annotations

from typing import Any

import pytest

from schedlab.calibrate.host_drift import drift_scaled_mape, mm_drift


def _probe(mm_us: float) -> dict[str, Any]:
    return {"threads": 2, "compute_speedup": 1.8, "memory_speedup": 1.4, "compute_1t_us": mm_us, "memory_1t_us": 900.0}


def _plan(workload: str, predicted_s: float, measured_s: float, method: str = "profile-only",
          scored: bool = True) -> dict[str, Any]:
    return {"workload": workload, "predicted_s": predicted_s, "measured_s": measured_s, "method": method,
            "scored": scored}


def test_the_drift_is_the_median_of_a_models_probes_over_calibrations() -> None:
    scaling = {"calibration": _probe(1000.0), "models": [
        {"workload": "a", "before": _probe(1100.0), "after": _probe(1300.0)},
        {"workload": "b", "before": _probe(900.0), "after": {"threads": 2}},  # a probe cut short
        {"workload": "c", "before": None, "after": None}]}
    assert mm_drift(scaling) == pytest.approx({"a": 1.2, "b": 0.9})
    assert mm_drift({"calibration": None, "models": scaling["models"]}) == {}  # a profile from before the probe
    assert mm_drift(None) == {}


def test_scaled_predictions_read_the_hosts_drift_and_only_profile_only_scored_plans_count() -> None:
    # the host ran 1.2x slower than at calibration, and so did the model: scaled, no error
    plans = [_plan("a", 0.010, 0.012), _plan("a", 0.020, 0.024),
             _plan("a", 0.5, 0.012, method="trace-calibrated"),  # not profile-only: left out
             _plan("a", 0.5, 0.012, scored=False),  # calibration's own plan: left out
             _plan("z", 0.5, 0.012)]  # no probe for it: left out
    mapes = drift_scaled_mape(plans, {"a": 1.2})
    assert mapes is not None
    assert mapes[0] == pytest.approx(1 / 6) and mapes[1] == pytest.approx(0.0)
    assert drift_scaled_mape(plans, {}) is None
