"""The executor's own cost per op: Python around a kernel, serialised by the interpreter lock.

Measured by running the real executor (`exec.run_steps`) on a probe Graph whose kernels
are negligible: a chain of arithmetic ops on 1-element tensors and a chain of views
(`t` of a 2x2 tensor). The executor and the simulator count an op's time the same way
(the event spans dispatch and kernel), so:

- ``op_us``, ``view_us``: median event time of a negligible non-view / view op with one
  slot (the generated straight-line step, where back-to-back events hold every Python
  instruction of the step). This is `dispatch_us`: what the simulator charges under the
  interpreter lock.
- ``corun_op_us``: time per op when two slots run two independent chains of negligible
  ops: step wall time / ops. The workers' Python takes turns on the lock and hands it
  over (a context switch) between ops, so this is more than ``op_us``; it is the
  simulator's dispatch cost for plans with several slots (`Profile.for_slots`).
- ``corun_event_floor_us``: median event time of a negligible op in that co-run step
  (its events hold only the call, not the ready-heap bookkeeping around it).
- ``call_floor_us``, ``view_call_floor_us``: the bare call of a negligible op through the
  same C++ entry point the executor uses. A benchmarked call time minus ``call_floor_us``
  is the op's kernel time.
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

    def to_json(self) -> dict[str, float]:
        return {k: round(float(v), 4) for k, v in self.__dict__.items()}

    def event_floor_us(self, slots: int) -> float:
        """In-event time of a negligible non-view op in an executor trace with `slots`."""
        return self.op_us if slots <= 1 else self.corun_event_floor_us


def probe_graph(n_ops: int) -> tuple[Graph, dict[int, torch.Tensor]]:
    """Two independent chains of `n_ops` negligible ops each: arithmetic, and views.

    Values: 0 = x [1], 1 = c [1] (constant operand), 2 = m [2, 2]; then op outputs.
    """
    scalar, square = TensorMeta((1,), "float32", 4), TensorMeta((2, 2), "float32", 16)
    values: list[TensorMeta | None] = [scalar, scalar, square]
    ops: list[Op] = []
    last_arith, last_view = 0, 2
    for i in range(2 * n_ops):
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
        ops.append(Op(i, f"probe{i}", target, OpKind.F, args, {}, inputs, (out,), flops, nbytes, is_view=is_view))
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


def _executor_figures(
    graph: Graph, inputs: dict[int, torch.Tensor], machine: Machine, slots: int, steps: int
) -> tuple[float, float, float]:
    """Median event us of non-view ops, of view ops, and step wall us per op."""
    from schedlab.exec import run_steps
    from schedlab.plan import Plan

    result = run_steps(graph, inputs, Plan(slots=slots, threads=1), machine, steps=steps, warmup=1)
    is_view = [op.is_view for op in graph.ops]
    arith = [e.dur_ns for e in result.trace.events if not is_view[e.op]]
    views = [e.dur_ns for e in result.trace.events if is_view[e.op]]
    per_op = statistics.median(result.step_times_s) * 1e6 / len(graph.ops)
    return statistics.median(arith) / 1e3, statistics.median(views) / 1e3, per_op


def _bare_floor(target: str, args: tuple[Any, ...]) -> float:
    cfg = TimingConfig(budget_s=0.05, min_reps=500, max_reps=5000, warmup=50)
    fn: Callable[..., Any] = fast_callable(resolve_target(target))
    return min(time_call(fn, args, {}, cfg)[0] for _ in range(3))


def measure_dispatch(machine: Machine, n_ops: int = 1000, steps: int = 5) -> DispatchFigures:
    """Dispatch figures of the executor on `machine` (this host); see the module docstring."""
    graph, inputs = probe_graph(n_ops)
    before = set_intra_op_threads(1)
    try:
        op_us, view_us, _ = _executor_figures(graph, inputs, machine, slots=1, steps=steps)
        if machine.default_device.cores >= 2:
            corun_floor_us, _, corun_op_us = _executor_figures(graph, inputs, machine, slots=2, steps=steps)
        else:  # one core: the executor cannot co-run
            corun_floor_us, corun_op_us = op_us, op_us
        call_floor_us = _bare_floor("aten.add.Tensor", (torch.ones(1), torch.ones(1)))
        view_floor_us = _bare_floor("aten.t.default", (torch.ones(2, 2),))
    finally:
        set_intra_op_threads(before)
    return DispatchFigures(
        op_us=op_us,
        view_us=view_us,
        corun_op_us=corun_op_us,
        corun_event_floor_us=corun_floor_us,
        call_floor_us=call_floor_us,
        view_call_floor_us=view_floor_us,
    )
