"""The synthetic graph builders and the table cost model."""

from __future__ import annotations

import pytest

from schedlab.graph import OpKind
from schedlab.sim.testing import GraphBuilder, TableCost, chain, fork_join, random_dag


def test_builders_make_valid_graphs() -> None:
    for g in (chain(5), fork_join(3), random_dag(100, seed=1, view_share=0.3)):
        g.validate()
        assert g.outputs and g.inputs
    fj = fork_join(3)
    assert [op.name for op in fj.ops] == ["src", "b0", "b1", "b2", "join"]
    assert fj.preds[4] == (1, 2, 3)
    assert random_dag(50, seed=2).hash == random_dag(50, seed=2).hash
    assert random_dag(50, seed=2).hash != random_dag(50, seed=3).hash


def test_view_ops_alias_their_first_input() -> None:
    b = GraphBuilder()
    x = b.input("x", 40)
    v = b.op("v", [x], view=True)
    g = b.build()
    meta = g.values[v]
    assert meta is not None and meta.alias_of == x
    assert g.ops[0].is_view and g.ops[0].target == "aten.view.default" and g.ops[0].bytes_moved == 0
    with pytest.raises(ValueError):
        b.op("bad", [], view=True)


def test_table_cost() -> None:
    g = chain(2)
    op0, op1 = g.ops
    cost = TableCost(kernel={"op0": 7.0}, dispatch={"op1": 3.0}, default_kernel_us=2.0)
    assert (cost.kernel_us(op0, 4), cost.kernel_us(op1, 4)) == (7.0, 2.0)
    assert (cost.dispatch_us(op0), cost.dispatch_us(op1)) == (0.0, 3.0)
    assert cost.corun_slowdown(op0, 3, 4) == 1.0
    f = TableCost(kernel=lambda op, k: 100.0 / k, dispatch=1.5, corun=lambda op, busy, total: 1 + busy / total)
    assert (f.kernel_us(op0, 4), f.dispatch_us(op0), f.corun_slowdown(op0, 2, 4)) == (25.0, 1.5, 1.5)
    assert op0.kind is OpKind.F
