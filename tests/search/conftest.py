"""Fixtures of the search tests: a small fake Profile file (no calibration), a tiny graph."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

# A plausible small CPU: 10 GFLOP/s and 10 GB/s per thread, a mostly parallel share.
_PARAMS = {"a_us": 2.0, "us_per_gflop": 1e5, "us_per_mb": 100.0, "p_max": 0.9, "h_us": 20.0, "c_us": 1.0}


def fake_profile() -> object:
    """A Profile built with its own API from round numbers (no measurement)."""
    from schedlab.calibrate.corun import CorunFigures
    from schedlab.calibrate.dispatch import DispatchFigures
    from schedlab.calibrate.fit import ClassFit
    from schedlab.calibrate.model import PARAM_NAMES, WorkThreadsModel
    from schedlab.calibrate.profile import Profile
    from schedlab.machine import detect_host

    model = WorkThreadsModel.from_params({k: _PARAMS.get(k, 0.0) for k in PARAM_NAMES})
    fit = ClassFit(
        model_name="work_threads", model=model, heldout_mape=None, heldout_wape=None, train_mape=0.0,
        n_points=1, n_signatures=1, n_heldout=0,
    )
    dispatch = DispatchFigures(**{f.name: 2.0 for f in dataclasses.fields(DispatchFigures)})
    corun = CorunFigures(mem_slowdown=1.5, compute_slowdown=1.2, gil_slowdown=1.5, measured=True)
    return Profile(
        machine=detect_host().fingerprint, created_unix_s=time.time(), quick=True, dispatch=dispatch,
        classes={}, fallback=fit, signatures={}, corun=corun, meta={"fake": True},
    )


@pytest.fixture(scope="session")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    fake_profile().save(path)  # type: ignore[attr-defined]
    return path
