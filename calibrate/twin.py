"""A twin: the same one-thread training step, run over and over on another core while a
calibration times its own copy of it.

A rank plan's ranks compute side by side, each on its own cores of one processor, and a
kernel runs slower while the other cores are busy (shared caches and memory bandwidth).
Measured on the 2-core development VM (2026-11-28, quiet; a scratch script: the per-replica
step of each held-out model pinned to core 0, alone and with the same step pinned to core 1,
two alternations each): lstm-lm +7%, mha-regressor +4 to +7%, dropout-encoder +4 to +7%,
encoder-classifier -1 to +2%, gru-tagger +1%, bilstm-classifier 0%, conv1d-two-branch and
depthwise-cnn none. The co-run rule calibrated inside one process (two kernels of one
process on two cores) says +4 to +11% for the same steps, and most for the two that showed
none, so it does not carry over to processes; the twin measures it per model instead. The
rank calibration (`calibrate.rank_fidelity.calibration_traces`: what `schedlab search` on
several local ranks, `validate` and `fidelity --devices N` calibrate with) runs its steps
beside a twin, so the op times it keeps are those of a rank whose neighbours compute.

`Twin` is a context manager: it writes the graph and inputs to a temporary folder, starts
`python -m schedlab.calibrate.twin DIR CORE`, and waits (at most `timeout_s`) until the twin
has run its first step; leaving it stops the twin (a stop file, then a signal) and removes
the folder. The twin dies with its parent, as a rank does (`exec.rankenv.die_with_parent`).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.exec.rankenv import PARENT_ENV, die_with_parent, pin_process
from schedlab.graph import Graph

READY = "ready"
STOP_FILE = "stop"
STEPS_PER_CHECK = 5  # steps between looks at the stop file


class Twin:
    """The step of `graph` on `input_values`, one thread, run over and over pinned to `core`
    while the `with` block runs."""

    def __init__(self, graph: Graph, input_values: dict[int, Any], core: int, timeout_s: float = 120.0) -> None:
        self.graph, self.input_values, self.core, self.timeout_s = graph, input_values, core, timeout_s
        self._dir: Path | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Twin:
        import torch

        self._dir = Path(tempfile.mkdtemp(prefix="schedlab-twin-"))
        try:
            self.graph.save(self._dir / "graph.json")
            torch.save({int(k): v for k, v in self.input_values.items()}, self._dir / "inputs.pt")
            with open(self._dir / "stderr.txt", "w") as err:  # a file: a pipe nobody reads could fill
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "schedlab.calibrate.twin", str(self._dir), str(self.core)],
                    stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, PARENT_ENV: str(os.getpid())},
                )
            self._wait_ready()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SchedlabError(f"the calibration's twin step did not start within {self.timeout_s:g} s")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = proc.stdout.readline()
                if line.strip() == READY:
                    return
                if not line:  # it exited
                    assert self._dir is not None
                    err = (self._dir / "stderr.txt").read_text(errors="replace").strip()
                    raise SchedlabError(f"the calibration's twin step failed: {err[-500:] or 'no output'}")

    def _stop(self) -> None:
        proc, folder = self._proc, self._dir
        self._proc = self._dir = None
        if proc is not None:
            if folder is not None:
                (folder / STOP_FILE).touch()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    """The twin process: `DIR CORE`."""
    folder, core = Path(argv[0]), int(argv[1])
    die_with_parent()
    if hasattr(os, "sched_setaffinity"):
        pin_process([core])  # before torch starts its thread pools, as a rank
    import torch

    from schedlab.allocator import ensure_tuned
    from schedlab.exec import Executor, run_steps
    from schedlab.machine import detect_host
    from schedlab.plan import Plan, resolve

    ensure_tuned()
    torch.set_num_threads(1)
    graph = Graph.load(folder / "graph.json")
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    host, plan = detect_host(), Plan(threads=1)
    resolved = resolve(graph, plan, host)
    ex = Executor(resolved.run_graph(graph), resolved)
    run_steps(graph, inputs, plan, host, steps=1, warmup=1, executor=ex)
    print(READY, flush=True)
    while not (folder / STOP_FILE).exists():
        run_steps(graph, inputs, plan, host, steps=STEPS_PER_CHECK, warmup=0, executor=ex)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
