"""The calibration plan's trace of each held-out model, kept beside its results file.

`schedlab fidelity --held-out` predicts every plan twice: from the Profile alone, and from
the Profile trace-calibrated on the measured run of one slot, one thread, program order
(`calibrate.fidelity.CALIBRATION_PLAN`). To re-score both later against the same
measurements (`--rescore`, `calibrate.rescore`), the run keeps that trace: one schedlab
trace file per model in a folder beside the results file (``fidelity-heldout.json`` ->
``fidelity-heldout-traces/heldout_gru-tagger.json``), named in the model's entry of the
results file (``"calibration_trace"``, relative to the results file's folder). Each file is
written atomically before the results file that names it. A results file written before
traces were kept names none; its models re-score profile-only.
"""

from __future__ import annotations

import re
from pathlib import Path

from schedlab.errors import SchedlabError
from schedlab.trace import Trace

KEY = "calibration_trace"


def traces_dir(results: Path) -> Path:
    """The folder of calibration traces beside the results file `results`."""
    return results.with_name(f"{results.stem}-traces")


def save_trace(results: Path, workload: str, trace: Trace) -> str:
    """Write `workload`'s calibration trace beside `results`; its path relative to the
    results file's folder (what the results file records under `KEY`)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", workload) + ".json"
    path = traces_dir(results) / name
    trace.save(path)
    return path.relative_to(results.parent).as_posix()


def load_trace(results: Path, relative: str) -> Trace:
    """The calibration trace a results file names (`relative` to its folder); one error
    naming the file when it is missing or corrupt."""
    path = results.parent / relative
    try:
        return Trace.load(path)
    except SchedlabError as e:
        raise SchedlabError(f"{results}: its calibration trace {relative}: {e}") from None
