"""Context extras (an op in a step vs in a benchmark) and the Profile bound to a graph."""

from __future__ import annotations

import dataclasses

import pytest

from schedlab.calibrate import Profile
from schedlab.calibrate.context import NO_CONTEXT, ContextCosts, Occurrence, first_uses, fit_context
from schedlab.graph import Graph, Op, OpKind
from schedlab.trace import Trace, TraceEvent
from tests.calibrate.factories import DISPATCH, make_graph, make_profile


def test_first_uses_are_the_first_non_view_op_of_each_target() -> None:
    g = make_graph()  # mm, t (view), relu
    more = Op(3, "relu2", "aten.relu.default", OpKind.F, ({"v": 4},), {}, (4,), (5,), 32.0, 256)
    g2 = dataclasses.replace(g, ops=(*g.ops, more), values=(*g.values, g.values[4]))
    assert first_uses(g) == {0, 2}
    assert first_uses(g2) == {0, 2}  # the second relu is warm


def test_fit_context_separates_warm_repeats_from_first_uses() -> None:
    hot = {"add/a": 2.0, "add/b": 3.0, "mm/a": 10.0}
    occ = [
        Occurrence("add/a", "add", True, 12.0),  # first add: 10 over hot
        Occurrence("add/a", "add", False, 3.0),  # warm: +1
        Occurrence("add/a", "add", False, 3.0),
        Occurrence("add/b", "add", False, 5.0),  # warm: +2
        Occurrence("mm/a", "mm", True, 25.0),  # mm only ever first: its warm is the median of all
        Occurrence("gone", "mm", False, 99.0),  # never benchmarked: ignored
    ]
    costs, sig_warm = fit_context(occ, hot)
    assert sig_warm == {"add/a": 1.0, "add/b": 2.0}
    assert costs.warm("add") == pytest.approx(1.5) and costs.warm_fallback_us == pytest.approx(1.5)
    assert costs.warm("mm") == pytest.approx(1.5)  # no warm mm: the median over all
    assert costs.first_use("add") == pytest.approx(12.0 - 2.0 - 1.0)  # beyond the op's own warm extra
    assert costs.first_use("mm") == pytest.approx(25.0 - 10.0 - 1.5)
    assert costs.first_use("relu") == costs.first_use_fallback_us
    assert ContextCosts.from_json(costs.to_json()) == costs


def with_context(first_use_us: float) -> Profile:
    return dataclasses.replace(make_profile(), context=ContextCosts({}, 0.0, {"mm": first_use_us}, 0.0))


def test_a_bound_profile_charges_the_first_use_extra_to_first_uses_only() -> None:
    g = make_graph()
    p = with_context(7.0)
    mm = g.ops[0]
    unbound = p.kernel_us(mm, 1)
    assert p.for_graph(g).kernel_us(mm, 1) == pytest.approx(unbound + 7.0)
    assert p.for_graph(g).for_slots(2).first_use_us(mm) == 7.0  # for_slots keeps the binding
    copy = Graph.from_json(g.to_json())  # the same op in another graph object: not bound
    assert p.for_graph(g).kernel_us(copy.ops[0], 1) == pytest.approx(unbound)
    assert dataclasses.replace(make_profile(), context=NO_CONTEXT).for_graph(g).kernel_us(mm, 1) == pytest.approx(unbound)


def test_with_trace_keeps_the_kernel_without_the_first_use_extra() -> None:
    g = make_graph()
    p = with_context(7.0)
    events = tuple(
        TraceEvent(op.id, op.name, "F", "cpu0", 0, 1, 0, int(1e3 * (DISPATCH.op_us + 50.0)), step)
        for step in range(3)
        for op in g.ops[:1]
    )
    trace = Trace(events=events, meta={"source": "exec", "graph_hash": g.hash, "plan": {"slots": 1}})
    traced = p.with_trace(trace, g)
    assert traced.kernel_us(g.ops[0], 1) == pytest.approx(43.0)
    assert traced.for_graph(g).kernel_us(g.ops[0], 1) == pytest.approx(50.0)  # the event, given back


def test_a_borrowed_warm_extra_is_no_more_than_moving_the_calls_bytes_from_memory() -> None:
    """The class median of gelu came from a 12.6 MB call (+294 us): a 17-element gelu must
    not borrow it, a call as large as the replayed one keeps it."""
    from schedlab.calibrate.context import bounded_warm

    costs = ContextCosts({"gelu": 294.0, "add": -0.5}, 1.2, {}, 0.0)
    per_byte_us = 1 / 20e3  # 20 GB/s
    mem_us = lambda nbytes: nbytes * per_byte_us  # noqa: E731
    assert bounded_warm(costs, "gelu", 136, mem_us) == pytest.approx(1.2 + 136 * per_byte_us)
    assert bounded_warm(costs, "gelu", 524288, mem_us) == pytest.approx(1.2 + 524288 * per_byte_us)  # 27.4 us
    assert bounded_warm(costs, "gelu", 12.6e6, mem_us) == 294.0  # the replayed size: its own class's extra
    assert bounded_warm(costs, "add", 136, mem_us) == -0.5  # a class below the bound keeps its own
    assert bounded_warm(costs, "mm", 1e9, mem_us) == 1.2  # a class never replayed: the median of all
