"""What the TensorFlow executor's parent and its worker process exchange: a request and a
result, as JSON files in a job folder (beside the progress file the launcher watches)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.io import read_json, write_json_atomic
from schedlab.tf.runtime import TFThreads
from schedlab.trace import Trace

REQUEST_FILE = "tf_request.json"
RESULT_FILE = "tf_result.json"


@dataclass(frozen=True)
class TFRequest:
    """One TensorFlow run: a workload, its threading (fixed for the worker's life), steps,
    and the plan's placement on the threading's CPU devices and op order, if any."""

    workload: str
    size: str
    threads: TFThreads
    steps: int
    warmup: int
    optimizer: str = "sgd"
    lr: float | None = None
    seed: int = 0
    plan: dict[str, Any] | None = None  # a plan placing or ordering ops (Plan.to_json); threading is `threads`

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "size": self.size, "steps": self.steps, "warmup": self.warmup,
            "optimizer": self.optimizer, "lr": self.lr, "seed": self.seed, "plan": self.plan,
            "threads": {"intra_op": self.threads.intra_op, "inter_op": self.threads.inter_op,
                        "cpu_devices": self.threads.cpu_devices},
        }

    @staticmethod
    def from_json(d: Any) -> TFRequest:
        try:
            t = d["threads"]
            return TFRequest(
                workload=str(d["workload"]), size=str(d["size"]), steps=int(d["steps"]), warmup=int(d["warmup"]),
                optimizer=str(d["optimizer"]), lr=None if d["lr"] is None else float(d["lr"]), seed=int(d["seed"]),
                threads=TFThreads(int(t["intra_op"]), int(t["inter_op"]), int(t["cpu_devices"])),
                plan=None if d.get("plan") is None else dict(d["plan"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SchedlabError(f"corrupt TensorFlow request: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class TFResult:
    """What the worker measured (`schedlab.exec.tf_run.TFRun`, as files)."""

    graph: Graph
    trace: Trace
    step_times_s: tuple[float, ...]
    check: dict[str, Any]  # NumericCheck.to_json() against TF eager
    torch_check: dict[str, Any] | None  # against eager PyTorch

    @property
    def step_time_s(self) -> float:
        import statistics

        return statistics.median(self.step_times_s)

    def to_json(self) -> dict[str, Any]:
        return {"graph": self.graph.to_json(), "trace": self.trace.to_json(), "step_times_s": list(self.step_times_s),
                "numeric_check": self.check, "torch_check": self.torch_check}

    @staticmethod
    def from_json(d: Any) -> TFResult:
        try:
            return TFResult(
                graph=Graph.from_json(d["graph"]), trace=Trace.from_json(d["trace"]),
                step_times_s=tuple(float(t) for t in d["step_times_s"]), check=dict(d["numeric_check"]),
                torch_check=None if d["torch_check"] is None else dict(d["torch_check"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SchedlabError(f"corrupt TensorFlow result: {type(e).__name__}: {e}") from None


def write_request(job_dir: Path, request: TFRequest) -> None:
    write_json_atomic(job_dir / REQUEST_FILE, request.to_json())


def read_request(job_dir: Path) -> TFRequest:
    return TFRequest.from_json(read_json(job_dir / REQUEST_FILE, what="TensorFlow request"))


def write_result(job_dir: Path, result: TFResult) -> None:
    write_json_atomic(job_dir / RESULT_FILE, result.to_json())


def read_result(job_dir: Path) -> TFResult:
    return TFResult.from_json(read_json(job_dir / RESULT_FILE, what="TensorFlow result"))
