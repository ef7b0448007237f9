"""Calibration: microbenchmarks, executor overhead, co-run slowdowns and traces -> a Profile.

    from schedlab.calibrate import Profile, run_calibration, DEFAULT_PROFILE_PATH
    profile = run_calibration(quick=True, out=DEFAULT_PROFILE_PATH)
    profile = Profile.load()                      # where `simulate` looks by default
    profile = profile.with_trace(trace, graph)    # real-step timings beat microbenchmarks
    cost = profile.for_graph(graph).for_slots(plan.slots)  # first uses in graph; co-run executor
    profile.coverage(graph)                       # which ops fell back on the roofline

`python -m schedlab.calibrate [--quick] [--out PROFILE] [--json]` is what `make calibrate` runs.
"""

from __future__ import annotations

from schedlab.calibrate.profile import (
    DEFAULT_PROFILE_PATH,
    PROFILE_SCHEMA,
    PROFILE_VERSION,
    Profile,
    ProfileMachineWarning,
    ProfileRecountWarning,
)
from schedlab.calibrate.run import CalibrationConfig, full_config, quick_config, run_calibration
from schedlab.calibrate.signature import signature

__all__ = [
    "DEFAULT_PROFILE_PATH",
    "PROFILE_SCHEMA",
    "PROFILE_VERSION",
    "CalibrationConfig",
    "Profile",
    "ProfileMachineWarning",
    "ProfileRecountWarning",
    "full_config",
    "quick_config",
    "run_calibration",
    "signature",
]
