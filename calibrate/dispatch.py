"""The executor's own cost per op: Python around a kernel, serialised by the interpreter lock.

Measured by running the real executor (`exec.run_steps`) on probe Graphs whose kernels
are negligible: chains of arithmetic ops on 1-element tensors, and a chain of views
(`t` of a 2x2 tensor). The executor and the simulator count an op's time the same way
(the event spans dispatch and kernel), so:

- ``op_us``, ``view_us``: median event time of a negligible non-view / view op with one
  slot (the generated straight-line step, where back-to-back events hold every Python
  instruction of the step). This is `dispatch_us`: what the simulator charges under the
  interpreter lock.
- ``corun_op_us``: time per op of the co-run executor (two slots) on ONE chain of
  negligible ops: step wall time / ops. A worker takes the ready heap's lock, pops, calls,
  pushes the successor; the other worker waits for work. This is the simulator's
  dispatch cost for plans with several slots (`Profile.for_slots`): where two workers do
  compete for the interpreter lock, the simulator's lock models the waiting.
- ``corun_contended_op_us``: the same on TWO independent chains, both workers busy:
  what competing for the lock costs beyond taking turns (thread hand-offs). Recorded to
  check the simulator's lock against; `corun_op_us` used to be this figure, and charging
  it to every op of a mostly sequential graph (an unrolled `nn.GRU`) predicted two-slot
  steps at 2.5-3x their measured time.
- ``corun_event_floor_us``: median event time of a negligible op in the co-run step (its
  events hold only the call, not the ready-heap bookkeeping around it).
- ``call_floor_us``, ``view_call_floor_us``: the bare call of a negligible op through the
  same C++ entry point the executor uses. A benchmarked call time minus ``call_floor_us``
  is the op's kernel time.

Step wall times are the fastest of the timed steps, not the median: on a shared machine
a neighbour that takes a core for a scheduler tick (4 ms) lands in most steps of a few
milliseconds, and only ever adds time. Event times are medians (a stall hits few events).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.calibrate.aten_call import fast_callable, resolve_target
from schedlab.calibrate.timing import TimingConfig, time_call
from schedlab.exec.threads import set_intra_op_threads
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.machine import Machine

_ARITH = ("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default")


@dataclass(frozen=True)
class DispatchFigures:
    op_us: float
    view_us: float
    corun_op_us: float
    corun_event_floor_us: float
    call_floor_us: float
    view_call_floor_us: float
    corun_contended_op_us: float = 0.0  # 0: not measured (profiles of version 1)

    def to_json(self) -> dict[str, float]:
        return {k: round(float(v), 4) for k, v in self.__dict__.items()}

    def event_floor_us(self, slots: int) -> float:
        """In-event time of a negligible non-view op in an executor trace with `slots`."""
        return self.op_us if slots <= 1 else self.corun_event_floor_us


def probe_graph(n_ops: int, views: bool = True) -> tuple[Graph, dict[int, torch.Tensor]]:
    """Two independent chains of `n_ops` negligible ops each: arithmetic, and views
    (`views`: False, the arithmetic chain alone).

    Values: 0 = x [1], 1 = c [1] (constant operand), 2 = m [2, 2]; then op outputs.
    """
    scalar, square = TensorMeta((1,), "float32", 4), TensorMeta((2, 2), "float32", 16)
    values: list[TensorMeta | None] = [scalar, scalar, square]
    ops: list[Op] = []
    last_arith, last_view = 0, 2
    for i in range(2 * n_ops):
        if not views and i % 2:
            continue
        out = len(values)
        if i % 2 == 0:  # arithmetic chain
            target = _ARITH[(i // 2) % len(_ARITH)]
            args: tuple[Any, ...] = ({"v": last_arith}, {"v": 1})
            inputs: tuple[int, ...] = (last_arith, 1)
            values.append(scalar)
            last_arith, is_view, flops, nbytes = out, False, 1.0, 12
        else:  # view chain
            target, args, inputs = "aten.t.default", ({"v": last_view},), (last_view,)
            values.append(TensorMeta((2, 2), "float32", 16, alias_of=2))
            last_view, is_view, flops, nbytes = out, True, 0.0, 0
        k = len(ops)
        ops.append(Op(k, f"probe{k}", target, OpKind.F, args, {}, inputs, (out,), flops, nbytes, is_view=is_view))
    graph = Graph(
        name="dispatch-probe",
        inputs=(
            GraphInput(0, "x", InputRole.USER),
            GraphInput(1, "c", InputRole.CONST),
            GraphInput(2, "m", InputRole.USER),
        ),
        outputs=(GraphOutput(last_arith, "loss", OutputRole.LOSS), GraphOutput(last_view, "view", OutputRole.BUFFER)),
        ops=tuple(ops),
        values=tuple(values),
    )
    return graph, {0: torch.ones(1), 1: torch.ones(1), 2: torch.ones(2, 2)}


def chains_graph(n_ops: int, chains: int) -> tuple[Graph, dict[int, torch.Tensor]]:
    """`chains` independent chains of `n_ops` negligible arithmetic ops each, interleaved in
    op order (op k belongs to chain k % chains), from one input x [1] and a constant c [1].

    Values: 0 = x, 1 = c; then op outputs.
    """
    scalar = TensorMeta((1,), "float32", 4)
    values: list[TensorMeta | None] = [scalar, scalar]
    ops: list[Op] = []
    last = [0] * chains
    for k in range(n_ops * chains):
        c, out = k % chains, len(values)
        target = _ARITH[(k // chains) % len(_ARITH)]
        values.append(scalar)
        ops.append(Op(k, f"chain{c}_{k // chains}", target, OpKind.F, ({"v": last[c]}, {"v": 1}), {}, (last[c], 1),
                      (out,), 1.0, 12))
        last[c] = out
    graph = Graph(
        name=f"chains-probe-{chains}",
        inputs=(GraphInput(0, "x", InputRole.USER), GraphInput(1, "c", InputRole.CONST)),
        outputs=tuple(GraphOutput(v, f"chain{c}", OutputRole.LOSS if c == 0 else OutputRole.BUFFER)
                      for c, v in enumerate(last)),
        ops=tuple(ops),
        values=tuple(values),
    )
    return graph, {0: torch.ones(1), 1: torch.ones(1)}


def _executor_figures(
    graph: Graph, inputs: dict[int, torch.Tensor], machine: Machine, slots: int, steps: int
) -> tuple[float, float, float]:
    """Median event us of non-view ops and of view ops (0 if none), and the fastest
    step's wall us per op."""
    from schedlab.exec import run_steps
    from schedlab.plan import Plan

    result = run_steps(graph, inputs, Plan(slots=slots, threads=1), machine, steps=steps, warmup=1)
    is_view = [op.is_view for op in graph.ops]
    arith = [e.dur_ns for e in result.trace.events if not is_view[e.op]]
    views = [e.dur_ns for e in result.trace.events if is_view[e.op]] or [0]
    per_op = min(result.step_times_s) * 1e6 / len(graph.ops)
    return statistics.median(arith) / 1e3, statistics.median(views) / 1e3, per_op


def _bare_floor(target: str, args: tuple[Any, ...], at_most_us: float) -> float:
    """The fastest of a few medians of the bare call, and never above `at_most_us` (the
    executor's event of the same call, which holds the call and more: a slower floor is
    a disturbed measurement, and would be taken off every kernel)."""
    cfg = TimingConfig(budget_s=0.05, min_reps=500, max_reps=5000, warmup=50)
    fn: Callable[..., Any] = fast_callable(resolve_target(target))
    return min(at_most_us, *(time_call(fn, args, {}, cfg)[0] for _ in range(5)))


def measure_dispatch(machine: Machine, n_ops: int = 1000, steps: int = 8) -> DispatchFigures:
    """Dispatch figures of the executor on `machine` (this host); see the module docstring."""
    graph, inputs = probe_graph(n_ops)
    chain, chain_inputs = probe_graph(n_ops, views=False)
    before = set_intra_op_threads(1)
    try:
        op_us, view_us, _ = _executor_figures(graph, inputs, machine, slots=1, steps=steps)
        if machine.default_device.cores >= 2:
            corun_floor_us, _, corun_op_us = _executor_figures(chain, chain_inputs, machine, slots=2, steps=steps)
            _, _, contended_op_us = _executor_figures(graph, inputs, machine, slots=2, steps=steps)
        else:  # one core: the executor cannot co-run
            corun_floor_us, corun_op_us, contended_op_us = op_us, op_us, op_us
        call_floor_us = _bare_floor("aten.add.Tensor", (torch.ones(1), torch.ones(1)), op_us)
        view_floor_us = _bare_floor("aten.t.default", (torch.ones(2, 2),), view_us)
    finally:
        set_intra_op_threads(before)
    return DispatchFigures(
        op_us=op_us,
        view_us=view_us,
        corun_op_us=corun_op_us,
        corun_event_floor_us=corun_floor_us,
        call_floor_us=call_floor_us,
        view_call_floor_us=view_floor_us,
        corun_contended_op_us=contended_op_us,
    )
