"""The search's parts on small cases: the repetend's own check, the linear model in both
solvers, the completion, Tessel-fast and the baseline."""

from __future__ import annotations

import importlib.util

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import Action, Kind, check_schedule
from schedlab.pipeline.tessel_shapes import tessel_shape
from schedlab.search.tessel.baseline import best_1f1b_like, greedy_1f1b
from schedlab.search.tessel.blocks import BlockProblem, Repetend
from schedlab.search.tessel.complete import complete, n_repetitions, unroll
from schedlab.search.tessel.fast import FLIPS, fast_repetend, pack_repetend
from schedlab.search.tessel.highs import solve_highs
from schedlab.search.tessel.linear import LinearModel, Status, VarKind
from schedlab.search.tessel.smt import solve_z3

HAS_Z3 = importlib.util.find_spec("z3") is not None


def one_f_one_b_repetend() -> Repetend:
    """1F1B's steady state on 2 devices, F = 1, B = 2: device 1 is one forward behind."""
    problem = BlockProblem(tessel_shape("vshape", 2))
    # blocks: 0F 0B 1F 1B; device 0: 0F@0 0B@1 (B of the micro-batch before), device 1: 1F@1 1B@2 (wraps)
    return Repetend(problem, 3.0, starts=(0.0, 1.0, 1.0, 2.0), offsets=(0, 1, 0, 0))


def test_the_problem_lists_blocks_edges_and_shared_devices() -> None:
    p = BlockProblem(tessel_shape("mshape", 2))
    assert [str(b) for b in p.blocks] == ["0F", "0B", "1F", "1B", "2F", "2B"]
    # embed F -> v0 F -> v1 F -> v1 B -> v0 B -> embed B
    assert sorted(p.edges) == [(0, 1), (0, 2), (2, 3), (2, 4), (3, 1), (4, 5), (5, 3)]
    assert p.lower_bound == 6 and p.serial_time == 9
    assert (0, 4) in p.pairs and (2, 4) not in p.pairs  # the embedding shares every device


def test_a_repetend_checks_itself() -> None:
    r = one_f_one_b_repetend()
    r.check(memory_limit=2)
    assert r.peak_memory() == (2.0, 1.0)
    assert r.to_text() == "0: 0F-0@0 0B-1@1\n1: 1F-0@1 1B-0@2\n"
    with pytest.raises(SchedlabError, match="device 0 holds 2, over the limit 1"):
        r.check(memory_limit=1)
    late = Repetend(r.problem, 3.0, (0.0, 1.0, 1.0, 2.0), (0, 0, 0, 0))  # 0B before 1B ends
    with pytest.raises(SchedlabError, match="0B starts before 1B of its micro-batch ends"):
        late.check()
    clash = Repetend(r.problem, 3.0, (0.0, 0.5, 1.0, 2.0), (0, 2, 0, 0))
    with pytest.raises(SchedlabError, match="0F and 0B overlap"):
        clash.check()


def test_unrolling_runs_every_action_once_and_keeps_the_steady_state_memory() -> None:
    r = one_f_one_b_repetend()
    s = unroll(r, 5)
    assert s.orders[0][:4] == (Action(0, Kind.F, 0), Action(0, Kind.F, 1), Action(0, Kind.B, 0), Action(0, Kind.F, 2))
    t = check_schedule(s, memory_limit=2)
    assert t.makespan == (5 + 2 - 1) * 3  # 1F1B's
    assert n_repetitions(r, 5) == 4 and n_repetitions(r, 1) == 0
    assert check_schedule(complete(r, 5, None)).makespan <= t.makespan


def _tiny_model() -> tuple[LinearModel, dict[int, float]]:
    """Two jobs of length 2 and 3 on one machine, ordered by a binary; minimise the end."""
    m = LinearModel()
    a = m.var("a", VarKind.CONTINUOUS, 0, 10)
    b = m.var("b", VarKind.CONTINUOUS, 1, 10)  # b cannot start before 1
    end = m.var("end", VarKind.CONTINUOUS, 0, 20)
    o = m.var("a_first", VarKind.BINARY, 0, 1)
    m.row({b: 1, a: -1}, lo=2, when=(o, 1))
    m.row({a: 1, b: -1}, lo=3, when=(o, 0))
    m.row({end: 1, a: -1}, lo=2)
    m.row({end: 1, b: -1}, lo=3)
    return m, {end: 1.0}


@pytest.mark.parametrize(
    "solve", [solve_highs, pytest.param(solve_z3, marks=pytest.mark.skipif(not HAS_Z3, reason="no z3"))]
)
def test_both_solvers_solve_the_same_model(solve) -> None:  # type: ignore[no-untyped-def]
    model, objective = _tiny_model()
    sol = solve(model, objective, 10)
    assert sol.status is Status.OPTIMAL
    assert sol.objective == pytest.approx(5.0)  # a at 0, b at 2: 5 (b first would end at 1 + 3 + 2 = 6)
    assert sol.values[3] == 1.0
    tight = model.bound(2, 0, 4.5)
    assert solve(tight, objective, 10).status is Status.INFEASIBLE


def test_tessel_fast_builds_a_zero_bubble_repetend_without_a_solver() -> None:
    problem = BlockProblem(tessel_shape("kshape", 4))
    r = fast_repetend(problem, memory_limit=None)
    r.check()
    assert r.length == problem.lower_bound == 6
    assert max(r.peak_memory()) <= 4
    with pytest.raises(SchedlabError, match=r"hold at least 1 on some device, over the memory limit 0\.5"):
        fast_repetend(problem, memory_limit=0.5)
    # Tessel's own packings hold 4 at best here; modulo scheduling trades length for memory
    assert min(max(pack_repetend(problem, f).peak_memory()) for f in FLIPS) == 4
    tight = fast_repetend(problem, memory_limit=2)
    assert tight.length > 6 and max(tight.peak_memory()) <= 2


def test_the_baseline_keeps_its_memory_cap_and_reports_running_out() -> None:
    shape = tessel_shape("kshape", 4)
    s = best_1f1b_like(shape, 8, memory_limit=2)
    assert max(check_schedule(s, memory_limit=2).peak_memory) <= 2
    with pytest.raises(SchedlabError, match="unknown baseline priority"):
        greedy_1f1b(shape, 4, priority="newest")
    # xshape's two chains each fill the device the other needs: only 1F1B's own order gets through
    x = tessel_shape("xshape", 4)
    with pytest.raises(SchedlabError, match="ran out of memory"):
        greedy_1f1b(x, 8, memory_limit=4, priority="shallowest")
    assert best_1f1b_like(x, 8, memory_limit=4).name == "1f1b-like-oldest"
