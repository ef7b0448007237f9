"""The synthetic graph builders and the table cost model."""

from __future__ import annotations

import numpy as np
import pytest

from schedlab.graph import OpKind
from schedlab.plan import Plan, resolve
from schedlab.sim.engine import simulate
from schedlab.sim.testing import GraphBuilder, TableCost, chain, cpu_machine, fork_join, random_cost, random_dag


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


@pytest.mark.parametrize("integer", [False, True])
def test_the_random_cost_answers_columns_with_its_per_op_floats(integer: bool) -> None:
    g = random_dag(300, seed=4, view_share=0.3)
    by_op, columns = random_cost(7, integer=integer, columns=False), random_cost(7, integer=integer)
    assert not hasattr(by_op, "kernel_column")
    ids = np.arange(len(g.ops))[::-1].copy()  # any order of ops, as a cost table's representatives
    ops = [g.ops[i] for i in ids]
    assert columns.dispatch_column(g, ids).tolist() == [by_op.dispatch_us(op) for op in ops]
    for threads in (1, 2, 3, 4):
        assert columns.kernel_column(g, ids, threads).tolist() == [by_op.kernel_us(op, threads) for op in ops]
    assert columns.corun_slowdown_column(g, ids, 3, 4).tolist() == [by_op.corun_slowdown(op, 3, 4) for op in ops]
    # another seed draws again on the same graph object: nothing of seed 7 kept for it
    assert random_cost(8).dispatch_column(g, ids).tolist() == [random_cost(8, columns=False).dispatch_us(op) for op in ops]


@pytest.mark.parametrize("seed", range(4))
def test_a_simulation_of_the_random_cost_is_the_same_in_columns_or_op_by_op(seed: int) -> None:
    g = random_dag(200, seed=seed, window=12, view_share=0.2)
    m = cpu_machine(4)
    for plan in (Plan(slots=1, threads=4), Plan(slots=2, threads=2), Plan(slots=3, threads=1, order="critical-path")):
        r = resolve(g, plan, m)
        assert (simulate(g, r, m, random_cost(seed, integer=seed % 2 == 1)).step_time_s
                == simulate(g, r, m, random_cost(seed, integer=seed % 2 == 1, columns=False)).step_time_s)
