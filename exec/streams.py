"""Co-run slots on a GPU: one CUDA stream per worker.

With one slot the executor's GPU step is the straight line (`program.py`): one host
thread issues every op in order on one stream. With `k` slots it is the co-run loop of
`workers.py` with `k` workers, each issuing on a stream of its own, so kernels of ops
that do not depend on each other may run at once on the device. As in the simulator
(`sim/model.py`, "GPU kernels"), an op is *finished*, for the ready heap, once its kernel
is launched: its successors may be issued while it runs, and the device keeps the order.

- Each op records a CUDA event on its worker's stream once launched.
- An op whose input was made on another stream makes its own stream wait for that event
  first (same stream: FIFO order already keeps it), and records its stream on the input
  (`Tensor.record_stream`), so the caching allocator does not hand that memory to its
  producer's stream while this op's kernel may still read it.
- The step waits for every stream at its end (`StreamStep.step`), so a step's time is
  host issue and device work both.
- The workers are threads kept from step to step (`workers.WorkerPool`), each with its
  stream made current once: on an H200 a new thread per step planned every cuDNN
  convolution again (PyTorch keeps those plans per thread), and the two-slot step of the
  four convolutional models took 7.5-10.3x their one-slot step (1.42-1.58x with kept
  threads, on another H200).

The streams, events and current-stream calls go through `StreamApi`, so the bookkeeping
is tested on the CPU with a recording fake (`tests/exec/test_streams.py`); `HostStreams`
runs the same step on the CPU, streams being no-ops there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from schedlab.errors import SchedlabError
from schedlab.exec.program import Program
from schedlab.exec.runner import value_uses, whole_step_loop
from schedlab.exec.workers import Span, WorkerPool
from schedlab.plan import ResolvedPlan


class StreamApi(Protocol):
    """What the stream step needs of CUDA."""

    def new_stream(self) -> Any: ...

    def new_event(self) -> Any: ...

    def use_stream(self, stream: Any) -> None:
        """Make `stream` the calling thread's current stream."""

    def record(self, event: Any, stream: Any) -> None: ...

    def wait(self, stream: Any, event: Any) -> None:
        """Work issued on `stream` from now on starts after `event`."""

    def keep_alive(self, tensor: torch.Tensor, stream: Any) -> None:
        """`tensor`'s memory is not reused until `stream`'s work issued so far ended."""

    def synchronize(self) -> None:
        """Wait for all work on the device."""


@dataclass(frozen=True)
class CudaStreams:
    """`StreamApi` on a CUDA device."""

    device: torch.device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def use_stream(self, stream: Any) -> None:
        torch.cuda.set_stream(stream)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def keep_alive(self, tensor: torch.Tensor, stream: Any) -> None:
        if tensor.is_cuda:  # a host tensor (a scalar an op left on the CPU) has no stream to keep
            tensor.record_stream(stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class HostStreams:
    """`StreamApi` on the CPU: no streams (an op's kernel has ended when its call returns),
    so the same step runs, and is measured, on a machine without a GPU."""

    def new_stream(self) -> Any:
        return None

    def new_event(self) -> Any:
        return None

    def use_stream(self, stream: Any) -> None:
        pass

    def record(self, event: Any, stream: Any) -> None:
        pass

    def wait(self, stream: Any, event: Any) -> None:
        pass

    def keep_alive(self, tensor: torch.Tensor, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def streams_for(device: str | torch.device) -> StreamApi:
    """CUDA streams on a CUDA device, `HostStreams` on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaStreams(dev)
    if dev.type == "cpu":
        return HostStreams()
    raise SchedlabError(f"co-run slots on {dev}: only cuda (one stream per slot) and cpu devices are supported")


class StreamStep:
    """A graph's step compiled for a GPU (`program`, `compile_graph(..., device=)`) run under
    `resolved`'s slots and priorities, one stream per slot (module docstring)."""

    def __init__(self, program: Program, resolved: ResolvedPlan, api: StreamApi) -> None:
        if resolved.slots < 1:
            raise SchedlabError(f"slots must be >= 1, got {resolved.slots}")
        g = program.graph
        self.program = program
        self.resolved = resolved
        self.api = api
        self.slots = resolved.slots
        self.streams = [api.new_stream() for _ in range(self.slots)]
        self.events = [api.new_event() for _ in g.ops]  # re-recorded every step: the step ends synchronized
        producer = g.producer
        # op -> (input value, its producer op) for inputs made by ops of the step
        self._made_by: tuple[tuple[tuple[int, int], ...], ...] = tuple(
            tuple(dict.fromkeys((v, producer[v]) for v in op.inputs if v in producer)) for op in g.ops
        )
        self.keep = {o.value for o in g.outputs}
        self._uses = value_uses(g)
        self._indeg = [len(p) for p in g.preds]
        self.cross_stream_waits = 0  # of the last step: inputs an op read from another stream
        self._local = threading.local()
        self.pool = WorkerPool(self.slots, self._start, name="schedlab-stream")

    def _start(self, w: int) -> None:
        self._local.w = w
        self.api.use_stream(self.streams[w])

    def close(self) -> None:
        """End the worker threads."""
        self.pool.close()

    def step(self, V: list[Any]) -> tuple[list[Span], int]:
        """Run one step on `V` (the graph's inputs set, on the device; on return it holds
        the graph's outputs); the spans of its ops (host issue, from the step start) and the
        step's wall ns, device work included. An op that fails raises `OpFailed`."""
        g = self.program.graph
        api, streams, events, made_by = self.api, self.streams, self.events, self._made_by
        op_fns = self.program.op_fns
        stream_of = [-1] * len(g.ops)
        local = self._local
        waits = [0] * self.slots  # per worker: each counts its own

        def run_op(i: int) -> None:
            w = local.w
            s = streams[w]
            for v, p in made_by[i]:
                if stream_of[p] != w:
                    api.wait(s, events[p])
                    t = V[v]
                    if isinstance(t, torch.Tensor):
                        api.keep_alive(t, s)
                    waits[w] += 1
            op_fns[i](V)
            api.record(events[i], s)
            stream_of[i] = w

        loop = whole_step_loop(g, self.resolved, V, self._uses, self._indeg, self.keep, run_op)
        spans = loop.run(self.slots, pool=self.pool)
        api.synchronize()
        self.cross_stream_waits = sum(waits)
        return spans, time.perf_counter_ns() - loop.start_ns


def issue_spans_us(spans: Sequence[Span]) -> tuple[float, ...]:
    """Per op, its span's length in µs: what its worker spent issuing it."""
    return tuple((b - a) / 1e3 for a, b, _ in spans)
