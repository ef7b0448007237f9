"""A Profile's columns (`calibrate.profile_columns`) are its per-op answers, float for float.

Every op of the built-in models and of held-out models (tiny), at every thread count and busy
count a 4-core plan can ask, with one slot and with two, on a Profile that takes every
branch: class models and the roofline, signature rows that hold the count asked and rows
that must be interpolated, first uses, cold costs, view costs, wake fits, team and co-run
waits, views that wait or not.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from schedlab.calibrate.cold import ColdCosts
from schedlab.calibrate.context import ContextCosts
from schedlab.calibrate.corun import CorunFigures
from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.profile import MAX_KEPT_COLUMNS, Profile
from schedlab.calibrate.roofline import Roofline
from schedlab.calibrate.signature import signature
from schedlab.calibrate.views import ViewCosts, ViewFit
from schedlab.calibrate.wake import POOLED, WakeFit
from schedlab.graph import Graph
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.cost_table import ColumnCostModel, CostTable
from schedlab.sim.testing import cpu_machine
from tests.calibrate.factories import fit, make_profile
from tests.conftest import captured_workload
from tests.sim.keyed_profile import columnless, unkeyed

MODELS = ("mlp", "cnn", "transformer", "nmt", "heldout:gru-tagger", "heldout:mha-regressor", "heldout:depthwise-cnn")
CORES = 4

ADD_MODEL = WorkThreadsModel(a_us=1.5, us_per_gflop=900.0, us_per_mb=40.0, us_per_mb_dram=25.0, cache_mb=0.002,
                             p_max=0.8, h_us=3.0, c_us=0.4)  # fmt: skip
CONV_MODEL = WorkThreadsModel(a_us=4.0, us_per_gflop=30.0, us_per_mb=8.0, us_per_mb_dram=0.0, cache_mb=1.0,
                              p_max=0.95, h_us=20.0, c_us=1.1)  # fmt: skip
NEGATIVE_A = WorkThreadsModel(a_us=-3.0, us_per_gflop=1.0, us_per_mb=1.0, us_per_mb_dram=0.0, cache_mb=1.0,
                              p_max=0.0, h_us=0.0, c_us=0.0)  # fmt: skip  # a fit below zero on tiny ops: max(0, ...)


def graph_of(model: str) -> Graph:
    _, c = captured_workload(model)
    return c.graph  # type: ignore[attr-defined, no-any-return]


def rich_profile(graph: Graph) -> Profile:
    """A Profile that takes every branch of `kernel_us`, `dispatch_us`, `corun_slowdown`
    and `wake_us` on `graph`'s ops."""
    table: dict[str, dict[int, float]] = {}
    for i, op in enumerate(graph.ops):
        if op.is_view or i % 4 == 3:
            continue
        table[signature(op)] = {1: 9.0 + i % 7, 4: 3.0 + i % 3} if i % 4 == 0 else ({} if i % 4 == 1 else {2: 5.5})
    views = [op for op in graph.ops if op.is_view]
    base = make_profile(signatures=table)
    return dataclasses.replace(
        base,
        classes={
            **base.classes,
            "add": fit(ADD_MODEL),
            "mul": fit(ADD_MODEL, heldout=500.0),  # not trusted: the roofline costs it
            "convolution": fit(CONV_MODEL),
            "addmm": fit(CONV_MODEL),
            "sum": fit(NEGATIVE_A),
        },
        roofline=Roofline(gflops={1: 50.0, 2: 90.0, 4: 150.0}, gbps={1: 8.0, 4: 20.0}, a_us=2.0),
        context=ContextCosts({}, 0.0, {"mm": 30.0, "add": 4.0}, 7.0),
        cold=ColdCosts(share=0.4, slope_us_per_mib={"add": {1: 60.0, 2: 40.0}}, pooled_us_per_mib={1: 30.0}),
        views=ViewCosts(
            {f"{signature(views[0])}|n={len(views[0].outputs)}": 1.25} if views else {},
            {"view": ViewFit(0.5, 0.25, 3)},
            ViewFit(0.2, 0.1, 9),
        ),
        # convolution forks at any size (no share, capped): it holds its team, `team_basis_us`
        wake={"addmm": WakeFit(6.0, 0.05, 4, 10, cap_us=70.0, floor_us=4.0),  # small calls fork: a floor
              "convolution": WakeFit(40.0, 0.5, 2, 8, share_gated=False, cap_us=90.0),
              POOLED: WakeFit(2.0, 0.02, 2, 30)},
        wake_scale={1: 0.0, 2: 0.6},
        corun=CorunFigures(mem_slowdown=1.6, compute_slowdown=1.1, gil_slowdown=2.0, measured=True,
                           oversub_mem=1.3, oversub_compute=1.7, serial_window_us=6.0, oversub_decay_us=40.0,
                           oversub_ref_us=20.0,
                           latency_us={1: 11.0, 2: 17.5}, team_latency_us={2: 3.0, 4: 5.0}, views_wait=True),
    )  # fmt: skip


def per_op(profile: Profile, graph: Graph) -> dict[str, np.ndarray]:
    ops = graph.ops
    out = {"dispatch": np.array([profile.dispatch_us(op) for op in ops])}
    for k in range(1, CORES + 1):
        out[f"kernel{k}"] = np.array([profile.kernel_us(op, k) for op in ops])
        out[f"wake{k}"] = np.array([profile.wake_us(op, k) for op in ops])
        out[f"basis{k}"] = np.array([profile.team_basis_us(op, k) for op in ops])
    for b in range(CORES + 1):
        out[f"slowdown{b}"] = np.array([profile.corun_slowdown(op, b, CORES) for op in ops])
    return out


def columns(profile: Profile, graph: Graph, ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    ids = np.arange(len(graph.ops)) if ids is None else ids
    out = {"dispatch": profile.dispatch_column(graph, ids)}
    for k in range(1, CORES + 1):
        out[f"kernel{k}"] = profile.kernel_column(graph, ids, k)
        out[f"wake{k}"] = profile.wake_column(graph, ids, k)
        out[f"basis{k}"] = profile.team_basis_column(graph, ids, k)
    for b in range(CORES + 1):
        out[f"slowdown{b}"] = profile.corun_slowdown_column(graph, ids, b, CORES)
    return out


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("views_wait", "team_share"), [(True, True), (False, False)])
def test_columns_equal_the_per_op_answers_on_every_op(model: str, views_wait: bool, team_share: bool) -> None:
    g = graph_of(model)
    prof = rich_profile(g)
    prof = dataclasses.replace(prof, corun=dataclasses.replace(prof.corun, views_wait=views_wait, team_share=team_share))
    assert isinstance(prof, ColumnCostModel)
    for slots in (1, 2):
        bound = prof.for_graph(g).for_slots(slots)
        want, got = per_op(bound, g), columns(bound.for_slots(slots), g)  # a fresh copy: nothing read before
        for name, ref in want.items():
            assert got[name].dtype == np.float64
            np.testing.assert_array_equal(got[name], ref, err_msg=f"{model} slots={slots} {name}")
        some = np.random.default_rng(slots).permutation(len(g.ops))[: len(g.ops) // 3]  # a subset, out of order
        sub = columns(bound.for_slots(slots), g, some)
        for name, ref in want.items():
            np.testing.assert_array_equal(sub[name], ref[some], err_msg=f"{model} slots={slots} {name}, a subset")
        elsewhere = prof.for_graph(graph_of("mlp")).for_slots(slots)  # bound to another graph: no first uses here
        other = per_op(elsewhere, g)
        for name, got_other in columns(elsewhere, g).items():
            np.testing.assert_array_equal(got_other, other[name], err_msg=f"{model} slots={slots} {name}, bound elsewhere")


def test_the_rich_profile_takes_the_branches_it_claims() -> None:
    """The equality above means something only if the scalar methods ran every path."""
    g = graph_of("transformer")
    bound = rich_profile(g).for_graph(g).for_slots(2)
    kernels = [op for op in g.ops if not op.is_view]
    assert any(bound.first_use_us(op) > 0 for op in kernels)
    assert any(bound.cold_us(op, 1) > 0 for op in kernels)
    assert any(bound.wake_us(op, 2) > 0 for op in kernels)
    assert any(bound.is_fallback(op) for op in kernels)  # the roofline
    rows = [bound._row(op) for op in kernels]
    assert any(r and 2 not in r for r in rows) and any(r and 1 in r for r in rows)  # interpolated and measured
    every = np.arange(len(g.ops))
    assert bound.dispatch_column(g, every)[[op.is_view for op in g.ops]].std() > 0  # view costs differ per view


def test_a_profile_reads_each_ids_array_once_and_keys_by_identity() -> None:
    g = graph_of("mlp")
    bound = rich_profile(g).for_graph(g).for_slots(2)
    ids = np.arange(len(g.ops))
    first = bound._columns_of(g, ids)
    assert bound._columns_of(g, ids) is first
    assert bound._columns_of(g, ids.copy()) is not first  # another array object: read again
    assert bound._columns_of(graph_of("cnn"), ids[:5]) is not first
    kept = [np.arange(3) for _ in range(MAX_KEPT_COLUMNS + 4)]  # many tables asking one long-lived Profile
    for k in kept:
        bound._columns_of(g, k)
    assert len(bound._columns) == MAX_KEPT_COLUMNS and bound._columns_of(g, kept[-1]) is bound._columns[id(kept[-1])]


@pytest.mark.parametrize("model", ("cnn", "heldout:gru-tagger"))
def test_a_cold_simulate_asks_columns_and_gives_the_per_op_step(model: str) -> None:
    """The cost table of a ColumnCostModel fills whole columns; a cold simulate() of every
    plan shape gives the step a Profile asked op by op gives (`columnless`), and one that
    asks every op's column (`unkeyed`)."""
    g = graph_of(model)
    machine = cpu_machine(CORES)
    prof = rich_profile(g)

    for slots, threads in ((1, 1), (1, 4), (2, 1), (2, 2), (4, 1)):
        resolved = resolve(g, Plan(slots=slots, threads=threads), machine)
        cost = prof.for_graph(g).for_slots(slots)
        table = CostTable(g, cost, CORES)
        assert table._columns
        a = simulate(g, resolved, machine, cost, record=False)
        for plain in (columnless(cost), unkeyed(cost)):
            b = simulate(g, resolved, machine, plain, record=False)
            assert (a.step_time_s, a.busy_core_s) == (b.step_time_s, b.busy_core_s), (slots, threads, type(plain))
        assert not CostTable(g, columnless(cost), CORES)._columns
