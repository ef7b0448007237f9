"""`Program.straight_line`: a fixed sequence compiled into one function, with `Extern`
calls (a rank's communication) in place, values freed after their last use."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from schedlab.exec.program import Extern, compile_graph
from schedlab.exec.threads import set_intra_op_threads
from schedlab.graph import Graph
from tests.conftest import captured_workload


def mlp() -> tuple[Graph, dict[int, torch.Tensor]]:
    _, c = captured_workload("mlp")
    return c.graph, c.input_values  # type: ignore[attr-defined]


def run_line(graph: Graph, inputs: dict[int, torch.Tensor], items: list[Any], keep: set[int],
             env: dict[str, Any] | None = None, extra_values: int = 0) -> tuple[list[Any], list[int]]:
    prog = compile_graph(graph)
    line = prog.straight_line(items, [1] * len(graph.ops), keep, env=env)
    V: list[Any] = [None] * (len(graph.values) + extra_values)
    for v, t in inputs.items():
        V[v] = t.clone()
    T = [0] * (len(items) + 1)
    before = set_intra_op_threads(1)
    try:
        line(V, T)  # sets this thread's intra-op threads per op, as a rank's one-slot line does
    finally:
        set_intra_op_threads(before)  # the tests after this one run eager PyTorch at the machine's count
    return V, T


def test_extern_calls_see_the_values_the_ops_made_and_give_theirs_back() -> None:
    g, inputs = mlp()
    keep = {o.value for o in g.outputs}
    plain, _ = run_line(g, inputs, list(range(len(g.ops))), keep)
    # After each op, an extern "send" of its first output; at the end one extern whose two
    # results are new values that only the caller keeps.
    sent: dict[int, torch.Tensor] = {}
    pair = (len(g.values), len(g.values) + 1)
    items: list[Any] = []
    for op in g.ops:
        items.append(op.id)
        items.append(Extern("SEND", op.id, reads=op.outputs[:1]))
    first = g.outputs[0].value
    items.append(Extern("PAIR", 7, reads=(first,), writes=pair))

    def send(key: int, value: torch.Tensor) -> None:
        sent[key] = value.clone()

    def two(key: int, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert key == 7
        return value + 1, value * 2

    V, T = run_line(g, inputs, items, keep | set(pair), env={"SEND": send, "PAIR": two}, extra_values=2)
    for v in keep:
        torch.testing.assert_close(V[v], plain[v], rtol=0, atol=0)
    assert set(sent) == {op.id for op in g.ops}
    for o in g.outputs:  # what each extern saw is what the plain line computed
        maker = next(op for op in g.ops if op.outputs[:1] == (o.value,))
        torch.testing.assert_close(sent[maker.id], plain[o.value], rtol=0, atol=0)
    torch.testing.assert_close(V[pair[0]], plain[first] + 1)
    torch.testing.assert_close(V[pair[1]], plain[first] * 2)
    assert all(a <= b for a, b in itertools.pairwise(T)) and T[0] > 0


def test_a_value_is_freed_after_its_last_reader_even_an_extern_one() -> None:
    g, inputs = mlp()
    keep = {o.value for o in g.outputs}
    op = next(o for o in g.ops if o.outputs and o.outputs[0] not in keep and not o.is_view
              and not o.target.split(".")[1].endswith("_") and any(o.outputs[0] in r.inputs for r in g.ops))
    v = op.outputs[0]
    alive: list[bool] = []
    ref: list[Any] = []

    def tap(key: int, value: torch.Tensor) -> None:
        import weakref

        ref.append(weakref.ref(value))

    def probe(key: int) -> None:
        alive.append(ref[0]() is not None)

    pos = [o.id for o in g.ops].index(op.id)
    readers_after = [o.id for o in g.ops[pos + 1:] if v in o.inputs]
    last_reader = [o.id for o in g.ops].index(readers_after[-1]) if readers_after else pos
    items: list[Any] = list(range(last_reader + 1))
    items.insert(pos + 1, Extern("TAP", 0, reads=(v,)))  # the extern read is not its last
    items.append(Extern("PROBE", 1))  # after the last reader: freed
    items += list(range(last_reader + 1, len(g.ops)))
    run_line(g, inputs, items, keep, env={"TAP": tap, "PROBE": probe})
    assert alive == [False]
