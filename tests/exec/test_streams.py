"""`exec.streams`: co-run slots on a GPU, one stream per worker. The stream calls go to a
recording fake here (no GPU on this machine); what a GPU measured with it is quoted in
the README. These check the bookkeeping: which waits an op's stream makes, on which
stream each op is issued, that the step's results are the straight line's, and that a
failure stops the step."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from schedlab.exec.program import compile_graph
from schedlab.exec.runner import OpFailed
from schedlab.exec.streams import HostStreams, StreamStep, issue_spans_us, streams_for
from schedlab.exec.threads import set_intra_op_threads
from schedlab.graph import Graph
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload


class Recording:
    """A StreamApi that logs every call, with the thread that made it."""

    def __init__(self, fail_on_start: bool = False) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.current: dict[int, int] = {}  # thread id -> its current stream
        self.streams = 0
        self.events = 0
        self.fail_on_start = fail_on_start

    def _note(self, *entry: Any) -> None:
        with self.lock:
            self.log.append(entry)

    def new_stream(self) -> int:
        self.streams += 1
        return self.streams - 1

    def new_event(self) -> int:
        self.events += 1
        return self.events - 1

    def use_stream(self, stream: int) -> None:
        if self.fail_on_start:
            raise RuntimeError("no stream for you")
        self.current[threading.get_ident()] = stream

    def record(self, event: int, stream: int) -> None:
        assert self.current[threading.get_ident()] == stream  # issued on the thread's own stream
        self._note("record", event, stream)
        time.sleep(2e-4)  # an issue that takes a while: the other worker takes the ops made ready meanwhile

    def wait(self, stream: int, event: int) -> None:
        assert self.current[threading.get_ident()] == stream
        self._note("wait", stream, event)

    def keep_alive(self, tensor: torch.Tensor, stream: int) -> None:
        self._note("keep", id(tensor), stream)

    def synchronize(self) -> None:
        self._note("sync")


def mlp() -> tuple[Graph, dict[int, torch.Tensor]]:
    _, c = captured_workload("mlp")
    return c.graph, c.input_values  # type: ignore[attr-defined]


def step_values(graph: Graph, inputs: dict[int, torch.Tensor], slots: int, api: Any) -> tuple[list[Any], StreamStep]:
    resolved = resolve(graph, Plan(slots=slots, threads=1), detect_host())
    step = StreamStep(compile_graph(graph), resolved, api)
    V: list[Any] = [None] * len(graph.values)
    for v, t in inputs.items():
        V[v] = t.clone()
    before = set_intra_op_threads(1)
    try:
        step.step(V)
    finally:
        set_intra_op_threads(before)
    return V, step


def test_an_op_waits_for_each_input_made_on_another_stream_and_for_no_other() -> None:
    g, inputs = mlp()
    crossed = 0
    for _ in range(5):  # the workers race for ops: several steps see several interleavings
        api = Recording()
        _, step = step_values(g, inputs, 2, api)
        assert api.streams == 2 and api.events == len(g.ops)
        stream_of = {e[1]: e[2] for e in api.log if e[0] == "record"}
        assert set(stream_of) == set(range(len(g.ops)))  # every op recorded its event once launched
        pos = {("record", e[1]): k for k, e in enumerate(api.log) if e[0] == "record"}
        waits = [(k, e[1], e[2]) for k, e in enumerate(api.log) if e[0] == "wait"]
        expected = {(i, p) for i, op in enumerate(g.ops) for p in {g.producer[v] for v in op.inputs if v in g.producer}
                    if stream_of[p] != stream_of[i]}
        # a wait is made on the consumer's stream, for the producer's event, before the consumer's own record
        seen = set()
        for k, stream, event in waits:
            consumers = [i for i, p in expected if p == event and stream_of[i] == stream and pos[("record", i)] > k]
            assert consumers, f"a wait for op {event} on stream {stream} that no consumer needed"
            seen.update((i, event) for i in consumers)
        assert seen == expected
        keeps = sum(1 for e in api.log if e[0] == "keep")
        assert keeps == step.cross_stream_waits == len(waits)
        assert api.log[-1] == ("sync",)  # the step ends with the device idle
        crossed += len(waits)
    assert crossed > 0  # the two workers did share the step's ops


def test_the_step_on_streams_gives_the_straight_lines_results() -> None:
    g, inputs = mlp()
    one, _ = step_values(g, inputs, 1, HostStreams())
    two, _ = step_values(g, inputs, 2, HostStreams())
    for o in g.outputs:
        torch.testing.assert_close(two[o.value], one[o.value], rtol=0, atol=0)


def test_a_failing_op_or_stream_stops_the_step_with_one_error() -> None:
    g, inputs = mlp()
    bad = dict(inputs)
    first = g.inputs[0].value
    bad[first] = torch.ones(3, 3, 3)  # the wrong shape: its first consumer fails
    with pytest.raises(OpFailed, match=r"op \d+ \("):
        step_values(g, bad, 2, HostStreams())
    with pytest.raises(RuntimeError, match="no stream for you"):
        step_values(g, inputs, 2, Recording(fail_on_start=True))


def test_the_workers_and_their_streams_are_kept_from_step_to_step() -> None:
    g, inputs = mlp()
    api = Recording()
    resolved = resolve(g, Plan(slots=2, threads=1), detect_host())
    step = StreamStep(compile_graph(g), resolved, api)
    before = set_intra_op_threads(1)
    try:
        for _ in range(3):
            V: list[Any] = [None] * len(g.values)
            for v, t in inputs.items():
                V[v] = t.clone()
            step.step(V)
    finally:
        set_intra_op_threads(before)
    assert len(api.current) == 2  # two threads in all, each made its stream current once
    assert sorted(api.current.values()) == [0, 1]
    assert sum(1 for e in api.log if e[0] == "sync") == 3
    threads = [t for t in step.pool._threads if t.is_alive()]
    assert len(threads) == 2
    step.close()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()


def test_issue_spans_and_the_api_per_device() -> None:
    assert issue_spans_us([(1000, 3000, 0), (0, 500, 1)]) == (2.0, 0.5)
    assert isinstance(streams_for("cpu"), HostStreams)
    with pytest.raises(Exception, match="only cuda"):
        streams_for("meta")
