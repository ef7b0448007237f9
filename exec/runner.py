"""Run a Graph under a Plan with real torch kernels on the CPU, and record a Trace.

One slot: the order is static (the list schedule of the plan's priorities), so the step
is one generated straight-line function (see `program.py`). Several slots: one worker
thread per slot, each with its own intra-op thread count, taking the ready op of lowest
priority from one shared heap (`workers.py`); values are freed after their last use.

The co-run workers are kept from step to step (`workers.WorkerPool`, started at the first
co-run step, ended by `Executor.close` or when the executor is collected). Threads started
anew each step cost a step a fixed price the simulator has no model of: two threads
started and joined, and each worker's OpenMP team and allocator caches built again. On
the 2-core development VM (Intel Xeon, 2026-12-02, dev models, three alternating rounds
of seven steps, medians) two slots of one thread went from 1.58-1.78 to 1.16-1.48 ms on
`dev:lstm` (51 ops), 1.90-1.94 to 1.49-1.55 ms on `dev:attn` (161) and 31.7-32.9 to
19.1-19.6 ms on `dev:gru` (1,987), whose one-slot step is 0.7, 0.8 and 5.0 ms. On held-out
models (same VM, three rounds alternating the two ways with eager PyTorch's own step, medians
of seven): encoder-classifier 24.4 to 22.5 ms, gru-tagger 74.1 to 64.2, mha-regressor 19.7
to 17.9, lstm-lm 14.5 to 13.3, depthwise-cnn 31.9 to 30.6, against eager at one thread
22.9, 23.6, 18.6, 15.1 and 27.7 ms and at two threads 14.3, 21.0, 11.3, 9.4 and 16.9.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.allocator import ensure_tuned
from schedlab.errors import SchedlabError
from schedlab.exec.program import Program, compile_graph
from schedlab.exec.workers import KeptWorkers, ReadyLoop, freeing
from schedlab.graph import Graph, InputRole, OutputRole
from schedlab.machine import Machine, detect_host
from schedlab.plan import Plan, ResolvedPlan, resolve
from schedlab.trace import Trace, TraceEvent, base_meta


@dataclass(frozen=True)
class StepRecord:
    """One executed step: per-op (start_ns, end_ns, worker), relative to the step start."""

    spans: tuple[tuple[int, int, int], ...]  # indexed by op id
    wall_ns: int


@dataclass(frozen=True)
class ExecResult:
    step_times_s: tuple[float, ...]
    trace: Trace
    outputs: dict[int, torch.Tensor]  # graph output value id -> tensor, of the last step

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_times_s)


class OpFailed(SchedlabError):
    pass


def op_failed(graph: Graph, op_id: int, e: BaseException) -> OpFailed:
    op = graph.ops[op_id]
    return OpFailed(f"op {op.id} ({op.name}, {op.target}) failed: {type(e).__name__}: {e}")


class Executor:
    """A Graph compiled once and bound to one resolved Plan; `step()` runs it."""

    def __init__(self, graph: Graph, resolved: ResolvedPlan, program: Program | None = None) -> None:
        ensure_tuned()  # the allocator the CLI runs under, also for a step timed from Python (schedlab.allocator)
        self.graph = graph
        self.resolved = resolved
        self.program = program or compile_graph(graph)
        self.keep = {o.value for o in graph.outputs}
        self.input_ids = [i.value for i in graph.inputs]
        n_values = len(graph.values)
        self._n_values = n_values
        if resolved.slots == 1:
            self._straight = self.program.straight_line(resolved.sequence, resolved.threads, self.keep)
        self._uses = value_uses(graph)  # remaining-use counts for freeing values in the co-run path
        self._indeg = [len(p) for p in graph.preds]
        self._workers = KeptWorkers(resolved.slots)  # the co-run workers, started at the first co-run step

    def close(self) -> None:
        """End the co-run workers this executor keeps (a no-op for one slot, or before the
        first step). The executor stays usable: its next co-run step starts new ones."""
        self._workers.close()

    def step(self, inputs: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], StepRecord]:
        V: list[Any] = [None] * self._n_values
        for v in self.input_ids:
            V[v] = inputs[v]
        if self.resolved.slots == 1:
            rec = self._step_one(V)
        else:
            rec = self._step_corun(V)
        return {v: V[v] for v in self.keep}, rec

    def _step_one(self, V: list[Any]) -> StepRecord:
        seq = self.resolved.sequence
        T = [0] * (len(seq) + 1)
        prev = torch.get_num_threads()
        try:
            self._straight(V, T)
        except Exception as e:
            k = max(idx for idx, t in enumerate(T) if t) if any(T) else 0
            raise op_failed(self.graph, seq[min(k, len(seq) - 1)], e) from e
        finally:
            torch.set_num_threads(prev)
        t0 = T[0]
        spans: list[tuple[int, int, int]] = [(0, 0, 0)] * len(seq)
        for pos, i in enumerate(seq):
            spans[i] = (T[pos] - t0, T[pos + 1] - t0, 0)
        return StepRecord(spans=tuple(spans), wall_ns=T[-1] - t0)

    def _step_corun(self, V: list[Any]) -> StepRecord:
        op_fns = self.program.op_fns
        loop = whole_step_loop(self.graph, self.resolved, V, self._uses, self._indeg, self.keep,
                               lambda i: op_fns[i](V))
        spans = loop.run(self.resolved.slots, pool=self._workers.pool())
        return StepRecord(spans=tuple(spans), wall_ns=time.perf_counter_ns() - loop.start_ns)


def value_uses(graph: Graph) -> list[int]:
    """Per value, how many op inputs read it."""
    uses = [0] * len(graph.values)
    for op in graph.ops:
        for v in op.inputs:
            uses[v] += 1
    return uses


def whole_step_loop(
    graph: Graph, resolved: ResolvedPlan, V: list[Any], uses: list[int], indeg: list[int], keep: set[int],
    run_op: Callable[[int], None],
) -> ReadyLoop:
    """The co-run loop of every op of `graph` under `resolved`'s priorities and threads,
    freeing each value of `V` after its last use unless kept (`uses` and `indeg`, from
    `value_uses` and the graph's predecessors, are copied, not consumed)."""
    return ReadyLoop(
        ops=range(len(graph.ops)),
        prio=resolved.priority,
        succs=graph.succs,
        indeg=list(indeg),
        threads=resolved.threads,
        run_op=run_op,
        release=freeing([op.inputs for op in graph.ops], list(uses), keep, V),
        fail=lambda i, e: op_failed(graph, i, e),
        n_spans=len(graph.ops),
    )


def next_inputs(graph: Graph, inputs: dict[int, torch.Tensor], outputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """The inputs of the next training step: updated params, buffers and optimizer state.

    Only the inputs in `inputs` are updated: a rank holds (and updates) the inputs homed on
    its device, and `outputs` need only hold the updates of those.
    """
    by_key = {(o.role.value, o.name): o.value for o in graph.outputs if o.role is not OutputRole.GRAD and o.role is not OutputRole.LOSS}
    out = dict(inputs)
    for i in graph.inputs:
        if i.value in inputs and i.role in (InputRole.PARAM, InputRole.BUFFER, InputRole.OPT_STATE):
            v = by_key.get((i.role.value, i.name))
            if v is not None:
                out[i.value] = outputs[v]
    return out


def run_steps(
    graph: Graph,
    input_values: dict[int, torch.Tensor],
    plan: Plan,
    machine: Machine | None = None,
    steps: int = 5,
    warmup: int = 1,
    progress: Callable[[int, int], None] | None = None,
    workload: str = "",
    executor: Executor | None = None,
) -> ExecResult:
    """Run `warmup` + `steps` training steps, feeding each step's updates to the next.

    A plan resolved for steady state (`resolved.steps` > 1, an unrolled graph) runs that
    many steps back to back per call: `steps` counts calls, and each call's time is its
    wall time divided by `resolved.steps`.

    `executor`, if given, must be bound to `plan` already (it saves compiling twice).
    """
    if steps < 1 or warmup < 0:
        raise SchedlabError("steps must be >= 1 and warmup >= 0")
    machine = machine or detect_host()
    own = executor is None
    if executor is None:
        resolved = resolve(graph, plan, machine)
        executor = Executor(resolved.run_graph(graph), resolved)
    ex = executor
    resolved = ex.resolved
    run = ex.graph  # an unrolled graph runs `resolved.steps` steps per call
    inputs = {v: t.clone() for v, t in input_values.items()}
    events: list[TraceEvent] = []
    times: list[float] = []
    outputs: dict[int, torch.Tensor] = {}
    dev = resolved.device
    try:
        for s in range(warmup + steps):
            outputs, rec = ex.step(inputs)
            inputs = next_inputs(run, inputs, outputs)
            if s >= warmup:
                k = s - warmup
                times.append(rec.wall_ns / 1e9 / resolved.steps)
                for op in run.ops:
                    a, b, w = rec.spans[op.id]
                    events.append(TraceEvent(op.id, op.name, op.kind.value, dev[op.id], w, resolved.threads[op.id], a, b, k))
            if progress is not None:
                progress(s + 1, warmup + steps)
    finally:
        if own:  # a caller's executor keeps its workers for its next run
            ex.close()
    meta = base_meta(
        "exec",
        workload=workload or graph.name,
        graph_hash=graph.hash,
        schedule_hash=graph.schedule_hash,
        plan_hash=plan.hash,
        plan=plan.to_json(),
        machine=machine.to_json(),
        step_times_s=times,
        warmup=warmup,
        steps_per_run=resolved.steps,
    )
    return ExecResult(step_times_s=tuple(times), trace=Trace(events=tuple(events), meta=meta), outputs=outputs)
