"""Run TensorFlow steps in a fresh worker process, watched like a rank.

TensorFlow sizes its intra-op and inter-op pools once, when its runtime starts (DESIGN.md,
facts), so each threading setting runs in its own process (``python -m
schedlab.exec.tf_worker JOB_DIR``). The launcher watches it the way it watches ranks
(`launch.wait_ranks`): a worker that dies is one error with the end of its log; one that
begins nothing new for `timeout_s` is stopped. It runs in its own session and dies with
its parent, so nothing is left behind; the job folder is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from schedlab.errors import SchedlabError
from schedlab.exec.job import make_progress_file, read_error
from schedlab.exec.launch import kill_ranks, wait_ranks
from schedlab.exec.rankenv import PARENT_ENV
from schedlab.exec.tf_job import TFRequest, TFResult, read_result, write_request

DEFAULT_TF_TIMEOUT_S = 120.0  # between progress marks: import, model build, numerics, capture, each step


def run_tf_worker(request: TFRequest, timeout_s: float = DEFAULT_TF_TIMEOUT_S) -> TFResult:
    """Run `request` in a fresh TensorFlow process and return what it measured."""
    job_dir = Path(tempfile.mkdtemp(prefix="schedlab-tf-"))
    try:
        write_request(job_dir, request)
        make_progress_file(job_dir, 1)
        env = {**os.environ, PARENT_ENV: str(os.getpid()), "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        with open(job_dir / "rank.0.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "schedlab.exec.tf_worker", str(job_dir)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        who = f"TensorFlow worker ({request.threads.describe()})"
        try:
            wait_ranks([proc], job_dir, timeout_s)
        except SchedlabError as e:
            said = read_error(job_dir, 0)
            if said is not None and said.get("kind") == "setup":  # a clear error of its own: just that
                raise SchedlabError(f"{who}: {said['message']}") from None
            raise SchedlabError(f"{who}: {e}".replace("rank 0 ", "the worker ")) from None
        finally:
            kill_ranks([proc])
        return read_result(job_dir)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
