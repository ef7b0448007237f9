"""The TensorFlow executor's worker: ``python -m schedlab.exec.tf_worker JOB_DIR``.

One process per threading setting, because TensorFlow fixes its thread pools when its
runtime starts. It reads the request, builds the workload in torch (the weights) and in
TensorFlow (or a user's TF model, `schedlab.tf.user`), runs it (`tf_run.run_tensorflow`) and writes the result; it marks progress
for the launcher's hang watch, and dies with its parent.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.exec.job import DONE, START, Progress, write_error
from schedlab.exec.rankenv import die_with_parent
from schedlab.exec.tf_job import TFRequest, TFResult, read_request, write_result


def torch_loss_and_grads(spec: str, size: str, seed: int) -> tuple[float, dict[str, np.ndarray]]:
    """Eager PyTorch's loss and gradients of one step of the workload (fresh, same seed)."""
    from schedlab.workloads import load_workload

    w = load_workload(spec, size, seed=seed)
    loss = w.module(*w.inputs)
    loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in w.module.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def run(job_dir: Path, progress: Progress) -> TFResult:
    from schedlab.exec.tf_run import run_tensorflow
    from schedlab.plan import Plan
    from schedlab.tf.builtins import from_torch
    from schedlab.tf.runtime import import_tensorflow
    from schedlab.tf.user import is_tf_user_spec, load_tf_model
    from schedlab.workloads import load_workload

    req: TFRequest = read_request(job_dir)
    import_tensorflow(req.threads)
    progress.mark(START)
    user = is_tf_user_spec(req.workload)
    model = load_tf_model(req.workload, req.size) if user else from_torch(
        load_workload(req.workload, req.size, seed=req.seed))
    progress.mark(START)
    plan = None if req.plan is None else Plan.from_json(req.plan)
    run = run_tensorflow(
        model, req.threads, steps=req.steps, warmup=req.warmup, optimizer=req.optimizer, lr=req.lr, plan=plan,
        torch_reference=None if user else lambda: torch_loss_and_grads(req.workload, req.size, req.seed),
        progress=lambda done, total: progress.mark(done - 1),
    )
    return TFResult(run.graph, run.trace, run.step_times_s, run.check.to_json(),
                    None if run.torch_check is None else run.torch_check.to_json())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m schedlab.exec.tf_worker JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(argv[0])
    die_with_parent()
    progress = Progress(job_dir, 0)
    progress.mark(START)
    try:
        write_result(job_dir, run(job_dir, progress))
    except SchedlabError as e:
        write_error(job_dir, 0, "setup", str(e), None)
        return 2
    except Exception as e:  # TensorFlow failing: its message, and the stack in the log
        traceback.print_exc()
        write_error(job_dir, 0, "op", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                    None)
        return 1
    progress.mark(DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
