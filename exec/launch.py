"""Start the ranks of a multi-device plan on this host, watch them, merge what they ran.

`run_ranks` is the whole run: it writes a job folder (`job.py`), starts one process per
rank the way torchrun does (``python -m schedlab.exec.rank JOB_DIR`` with MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set: env:// rendezvous,
gloo), each pinned to its share of the usable cores, waits for them, and merges their
results into one `Trace`. The same entry point runs under torchrun (see `rank.py`);
`prepare_job` and `collect` are the two halves around it.

Failures stop every rank and raise one `SchedlabError`:

- a rank that dies (non-zero exit or a signal): the error names it, how it ended, its
  step and the end of its log; the other ranks are killed at once;
- a hang: when no unfinished rank has begun anything new (start-up, rendezvous, a step)
  for `timeout_s`, the error names the ranks that had not finished, what each was doing
  and where (a Python stack dump), and all are killed. Ranks that all wrote their results
  ("done") and only have the final barrier and exit left are not a hang of the run: after
  `TEARDOWN_GRACE_S` they are stopped, the run keeps its results and a
  `RankTeardownWarning` says so (a rank once hung so on this VM, after writing its
  result: in the final barrier or the process group's teardown). Each rank's collectives and
  receives also time out on their own (`collective_timeout_s`, twice `timeout_s`), for
  torchrun runs where no launcher watches.

Each rank runs in its own session (process group), and dies with its parent
(PR_SET_PDEATHSIG): whatever happens to the launcher, even SIGKILL, no rank is left behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from schedlab.distribute import input_homes
from schedlab.errors import SchedlabError
from schedlab.exec.job import DONE, RankResult, label, prepare_inputs, read_error, read_progress, read_result, write_job
from schedlab.exec.rankenv import CPUS_ENV, PARENT_ENV, core_share
from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import ResolvedPlan
from schedlab.trace import Trace, TraceEvent, base_meta

DEFAULT_TIMEOUT_S = 60.0
# Untimed steps before a multi-rank run's timed ones, where a caller names none (`trace`,
# `validate`, rank fidelity). The first steps of a multi-rank run are slow and vary
# (measured on the 2-core VM, 2026-11-25, 12 steps from the first, `schedlab trace
# --warmup 0`: encoder-classifier's layer split 57-60 ms in the first step, 40-55 from the
# sixth; its data parallel 36.7 ms in the first, 23-28 from the third); with 1-2 untimed
# steps, the median of 3-5 timed ones came out 33-60% above a later run's of 4 untimed.
RANK_WARMUP = 4
PROCESS_WARMUP = 1  # and before one process's


def warmup_for(multi_device: bool, warmup: int | None = None) -> int:
    """Untimed steps before a plan's timed ones: `warmup`, or where none was given
    `RANK_WARMUP` for a plan on several ranks (`multi_device`), `PROCESS_WARMUP` in one process."""
    if warmup is not None:
        return warmup
    return RANK_WARMUP if multi_device else PROCESS_WARMUP


STEP_TIME_DEFINITION = (
    "back-to-back steps on one clock (ranks aligned to rank 0): step k lasts from the moment the last rank "
    "finished step k-1 (for the first timed step: the first rank's start, after a barrier) to the moment the "
    "last rank finished step k; the step times add up to the timed window"
)

SPAN_STEP_TIME_DEFINITION = (
    "one clock (ranks aligned to rank 0): step k lasts from the moment the first rank began it to the moment "
    "the last rank finished it (used for both sides of the DDP side-by-side, whose steps alternate)"
)


def span_step_times_s(
    steps: list[list[tuple[int, int]]], offsets_ns: list[int], per_run: int = 1
) -> tuple[float, ...]:
    """Per step (see SPAN_STEP_TIME_DEFINITION): `steps[rank][k]` = (start_ns, wall_ns) on
    that rank's clock, `offsets_ns[rank]` added to read rank 0's; a run of `per_run` steps
    back to back (steady state) counts as that many steps of equal length."""
    n = len(steps[0])
    out = []
    for k in range(n):
        starts = [st[k][0] + off for st, off in zip(steps, offsets_ns, strict=True)]
        ends = [a + st[k][1] for a, st in zip(starts, steps, strict=True)]
        out.append((max(ends) - min(starts)) / 1e9 / per_run)
    return tuple(out)


@dataclass(frozen=True)
class DistResult:
    step_times_s: tuple[float, ...]  # per timed step: see STEP_TIME_DEFINITION
    rank_step_times_s: tuple[tuple[float, ...], ...]  # per rank, per timed step: its own wall time
    trace: Trace
    outputs: dict[int, torch.Tensor] | None  # graph outputs of the first step (want_outputs), all ranks'
    clock_offsets_ns: tuple[int, ...]  # per rank: added to its clock to read rank 0's
    # With a `ddp` job (the side by side with DistributedDataParallel, steps alternating):
    # per timed step, both under SPAN_STEP_TIME_DEFINITION (step_times_s would count the
    # DDP step between two schedlab steps).
    span_step_times_s: tuple[float, ...] = ()  # schedlab's steps
    ddp_step_times_s: tuple[float, ...] = ()  # DDP's steps
    # the framework side's parameters after step 0 (want_params): DDP's replicas hold the same
    # names, rank 0's kept; torch pipelining's ranks hold their own stages' (`stage{S}.` names)
    ddp_params: dict[str, torch.Tensor] | None = None

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def ranks(self) -> int:
        return len(self.rank_step_times_s)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (as torchrun picks one for a standalone run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def world_of(machine: Machine) -> int:
    return len(machine.processes)


def prepare_job(
    job_dir: Path,
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    input_values: dict[int, torch.Tensor],
    *,
    steps: int,
    warmup: int,
    want_outputs: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    workload: str = "",
    ddp: dict[str, object] | None = None,
) -> Graph:
    """Write the job folder the ranks read; the graph they run (the expanded one)."""
    if steps < 1 or warmup < 0:
        raise SchedlabError("steps must be >= 1 and warmup >= 0")
    run_graph = resolved.run_graph(graph)
    homes = input_homes(run_graph, resolved.device)
    rank_of = {d.id: d.process for d in machine.devices}
    inputs_of_rank = prepare_inputs(run_graph, input_values, {v: rank_of[d] for v, d in homes.items()}, world_of(machine))
    write_job(
        job_dir, run_graph, resolved, machine, inputs_of_rank, steps=steps, warmup=warmup,
        want_outputs=want_outputs, collective_timeout_s=2 * timeout_s, workload=workload, ddp=ddp,
    )
    return run_graph


def run_ranks(
    graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    input_values: dict[int, torch.Tensor],
    *,
    steps: int = 5,
    warmup: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    want_outputs: bool = False,
    workload: str = "",
    job_root: Path | None = None,
    extra_env: dict[str, str] | None = None,
    ddp: dict[str, object] | None = None,
) -> DistResult:
    """Run `warmup` + `steps` steps of `graph` under `resolved`, one process per rank of
    `machine`, and merge their records. `timeout_s`: the longest the ranks may go without
    one of them beginning something new (a step, say). `job_root`: where the temporary job
    folder goes (removed at the end). `extra_env`: added to every rank's environment.
    `ddp`: also run a DistributedDataParallel step after each step, in the same ranks
    (`schedlab.exec.job.check_ddp_spec` says what it holds; `schedlab.exec.ddp` how it runs)."""
    world = world_of(machine)
    job_dir = Path(tempfile.mkdtemp(prefix="schedlab-job-", dir=job_root))
    try:
        run_graph = prepare_job(
            job_dir, graph, resolved, machine, input_values, steps=steps, warmup=warmup,
            want_outputs=want_outputs, timeout_s=timeout_s, workload=workload, ddp=ddp,
        )
        procs = spawn_ranks(job_dir, world, extra_env or {})
        try:
            wait_ranks(procs, job_dir, timeout_s)
        finally:
            kill_ranks(procs)
        return collect(job_dir, run_graph, resolved, machine, workload=workload or graph.name, graph_hash=graph.hash,
                       warmup=warmup)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


# ---- processes -------------------------------------------------------------------------------


def spawn_ranks(job_dir: Path, world: int, extra_env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """Start `world` ranks on this host, each in its own session, logging to rank.<r>.log."""
    port = free_port()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(world):
            share = core_share(cores, r, world)
            env = {
                **os.environ,
                **extra_env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(world),
                "OMP_NUM_THREADS": str(len(share)),
                CPUS_ENV: ",".join(str(c) for c in share),
                PARENT_ENV: str(os.getpid()),
            }
            with open(job_dir / f"rank.{r}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "schedlab.exec.rank", str(job_dir)],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))
    except BaseException:
        kill_ranks(procs)
        raise
    return procs


def kill_ranks(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL the process group of every rank still running, and reap them all."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def _framework_params(results: list[RankResult]) -> dict[str, torch.Tensor] | None:
    """Every rank's framework-side parameters in one map, the lowest rank's where names repeat."""
    if all(r.ddp_params is None for r in results):
        return None
    out: dict[str, torch.Tensor] = {}
    for r in results:
        for name, t in (r.ddp_params or {}).items():
            out.setdefault(name, t)
    return out


TEARDOWN_GRACE_S = 10.0  # how long ranks that wrote their results get to leave the final barrier and exit


class RankTeardownWarning(UserWarning):
    """Ranks that had written their results did not exit; they were stopped."""


def wait_ranks(procs: list[subprocess.Popen[bytes]], job_dir: Path, timeout_s: float) -> None:
    """Return when every rank has exited 0, or every rank left has written its result and
    stayed in its teardown for `TEARDOWN_GRACE_S` (warned; the caller stops them); raise
    (ranks left running) on a death or a hang."""
    started = time.time()
    waiter = _ExitWaiter(procs)
    try:
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                time.sleep(0.3)  # let the peers of a dead rank fail too, to tell cause from effect
                raise _death_error([p.poll() for p in procs], codes, job_dir)
            if all(c == 0 for c in codes):
                return
            unfinished = [r for r, c in enumerate(codes) if c is None]
            marks = [read_progress(job_dir, r) for r in unfinished]
            latest = max([started] + [m[1] for m in marks if m is not None])
            idle_s = time.time() - latest
            grace_s = min(TEARDOWN_GRACE_S, timeout_s)
            if all(m is not None and m[0] == label(DONE) for m in marks) and idle_s > grace_s:
                warnings.warn(RankTeardownWarning(
                    f"rank(s) {', '.join(map(str, unfinished))} wrote their results but did not exit within "
                    f"{grace_s:g} s (stuck in the final barrier or gloo's teardown); "
                    "stopped them, the run's results are complete"
                ), stacklevel=2)
                return
            if idle_s > timeout_s:
                raise _hang_error(procs, unfinished, job_dir, timeout_s)
            waiter.wait(min(1.0, timeout_s - idle_s + 0.05))
    finally:
        waiter.close()


class _ExitWaiter:
    """Sleep until a rank exits or a timeout passes (pidfds on Linux, else short polls)."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.fds: list[int] = []
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.fds = [os.pidfd_open(p.pid) for p in procs]

    def wait(self, timeout_s: float) -> None:
        if self.fds:
            select.select(self.fds, [], [], max(timeout_s, 0.0))
        else:
            time.sleep(min(max(timeout_s, 0.0), 0.05))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def log_tail(job_dir: Path, rank: int, lines: int = 12) -> str:
    try:
        text = (job_dir / f"rank.{rank}.log").read_bytes()[-6000:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in text.rstrip().splitlines()[-lines:])


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _death_error(codes: list[int | None], first_seen: list[int | None], job_dir: Path) -> SchedlabError:
    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
    errors = {r: read_error(job_dir, r) for r in failed}

    def effect(r: int) -> bool:  # failed because a peer did (its communication broke)
        e = errors[r]
        return e is not None and e.get("kind") == "comm"

    # The cause: a rank that did not fail on communication, first-seen ones first.
    order = sorted(failed, key=lambda r: (effect(r), first_seen[r] in (None, 0), r))
    cause = order[0]
    code = codes[cause]
    assert code is not None
    mark = read_progress(job_dir, cause)
    where = f" in {mark[0]}" if mark and mark[0].startswith("step") else f" during {mark[0]}" if mark else ""
    err = errors[cause]
    detail = f": {err['message']}" if err else ""
    msg = f"rank {cause} {_how(code)}{where}{detail}"
    tail = log_tail(job_dir, cause)
    if tail:
        msg += f"\n  its log ends:\n{tail}"
    for r in order[1:]:
        e = errors[r]
        c = codes[r]
        assert c is not None
        msg += f"\n  then rank {r} {_how(c)}" + (f": {e['message']}" if e else "")
    running = [r for r, c in enumerate(codes) if c is None]
    if running:
        msg += f"\n  stopped rank(s) {', '.join(map(str, running))}"
    return SchedlabError(msg)


def _hang_error(
    procs: list[subprocess.Popen[bytes]], unfinished: list[int], job_dir: Path, timeout_s: float
) -> SchedlabError:
    for r in unfinished:  # each dumps its threads' Python stacks into its log (faulthandler)
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[r].pid, signal.SIGUSR1)
    time.sleep(0.5)
    states = []
    for r in unfinished:
        mark = read_progress(job_dir, r)
        states.append(f"rank {r}: {mark[0] if mark else 'not started'}")
    msg = (
        f"rank(s) {', '.join(map(str, unfinished))} had not finished, and none began anything new for "
        f"{timeout_s:g} s ({'; '.join(states)}); stopped all ranks (raise --timeout-s if steps are that long)"
    )
    for r in unfinished:
        tail = log_tail(job_dir, r, lines=8)
        if tail:
            msg += f"\n  rank {r}'s log ends:\n{tail}"
    return SchedlabError(msg)


# ---- merging ---------------------------------------------------------------------------------


def collect(
    job_dir: Path,
    run_graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    *,
    workload: str,
    graph_hash: str,
    warmup: int,
) -> DistResult:
    """Merge the ranks' result files into one Trace on rank 0's clock (see STEP_TIME_DEFINITION)."""
    world = world_of(machine)
    results = [read_result(job_dir, r) for r in range(world)]
    return merge(results, run_graph, resolved, machine, workload=workload, graph_hash=graph_hash, warmup=warmup)


def merge(
    results: list[RankResult],
    run_graph: Graph,
    resolved: ResolvedPlan,
    machine: Machine,
    *,
    workload: str,
    graph_hash: str,
    warmup: int,
) -> DistResult:
    n_steps = len(results[0].steps)
    per_run = resolved.steps  # steps back to back in one run of an unrolled graph
    if any(len(r.steps) != n_steps for r in results):
        raise SchedlabError(f"ranks ran different numbers of steps: {[len(r.steps) for r in results]}")
    ops = run_graph.ops
    events: list[TraceEvent] = []
    step_times: list[float] = []
    prev_end = 0
    for k in range(n_steps):
        starts = [r.steps[k].start_ns + r.clock_offset_ns for r in results]
        ends = [s + r.steps[k].wall_ns for s, r in zip(starts, results, strict=True)]
        zero = min(starts)
        step_times.append((max(ends) - (zero if k == 0 else prev_end)) / 1e9 / per_run)
        prev_end = max(ends)
        for r, s0 in zip(results, starts, strict=True):
            shift = s0 - zero
            for i, (a, b, w) in zip(r.ops, r.steps[k].spans, strict=True):
                op = ops[i]
                events.append(TraceEvent(i, op.name, op.kind.value, r.device, w, resolved.threads[i], a + shift,
                                         b + shift, k, r.rank))
    events.sort(key=lambda e: (e.step, e.start_ns, e.rank))
    rank_times = tuple(tuple(s.wall_ns / 1e9 / per_run for s in r.steps) for r in results)
    outputs: dict[int, torch.Tensor] | None = None
    if any(r.outputs is not None for r in results):
        outputs = {}
        for r in results:
            outputs.update(r.outputs or {})
    meta = base_meta(
        "exec",
        workload=workload,
        graph_hash=graph_hash,
        run_graph_hash=run_graph.hash,
        plan_hash=resolved.plan.hash,
        plan=resolved.plan.to_json(),
        machine=machine.to_json(),
        step_times_s=step_times,
        warmup=warmup,
        ranks=len(results),
        rank_step_times_s=[list(t) for t in rank_times],
        clock_offsets_ns=[r.clock_offset_ns for r in results],
        clock_rtt_ns=[r.clock_rtt_ns for r in results],
        step_time=STEP_TIME_DEFINITION,
        steps_per_run=per_run,
    )
    offsets = [r.clock_offset_ns for r in results]
    span_times: tuple[float, ...] = ()
    ddp_times: tuple[float, ...] = ()
    if any(r.ddp_steps for r in results):
        if any(len(r.ddp_steps) != n_steps for r in results):
            raise SchedlabError(f"ranks ran different numbers of DDP steps: {[len(r.ddp_steps) for r in results]}")
        span_times = span_step_times_s([[(s.start_ns, s.wall_ns) for s in r.steps] for r in results], offsets, per_run)
        ddp_times = span_step_times_s([list(r.ddp_steps) for r in results], offsets, per_run)
        meta.update(span_step_times_s=list(span_times), ddp_step_times_s=list(ddp_times),
                    span_step_time=SPAN_STEP_TIME_DEFINITION)
    return DistResult(
        step_times_s=tuple(step_times),
        rank_step_times_s=rank_times,
        trace=Trace(events=tuple(events), meta=meta),
        outputs=outputs,
        clock_offsets_ns=tuple(offsets),
        span_step_times_s=span_times,
        ddp_step_times_s=ddp_times,
        ddp_params=_framework_params(results),
    )
