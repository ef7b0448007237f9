"""search_tessel on Tessel's shapes (F = 1, B = 2): zero-bubble repetends, complete
schedules that pass the validator, memory limits kept or refused with the smallest
feasible one, and V's makespan against 1F1B's."""

from __future__ import annotations

import pytest

from schedlab.errors import SchedlabError
from schedlab.pipeline import check_schedule
from schedlab.pipeline.generators import generate
from schedlab.pipeline.tessel_shapes import tessel_shape
from schedlab.search.tessel import best_1f1b_like, search_tessel
from schedlab.search.tessel import search as search_module
from schedlab.search.tessel.linear import Solution, Status

SOLVERS = [
    "highs",
    pytest.param(
        "z3",
        marks=pytest.mark.skipif(
            __import__("importlib").util.find_spec("z3") is None, reason="z3-solver not installed"
        ),
    ),
    "fast",
]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("name", ["vshape", "xshape"])
def test_zero_bubble_repetends_at_4_devices(name: str, solver: str) -> None:
    shape = tessel_shape(name, 4, f_time=1, b_time=2)
    r = search_tessel(shape, 8, solver=solver, time_limit_s=30)
    assert r.lower_bound == max(shape.work_per_microbatch(split_backward=False)) == {"vshape": 3, "xshape": 6}[name]
    assert r.repetend_time == r.lower_bound
    assert r.length_optimal
    r.repetend.check()
    timeline = check_schedule(r.schedule)
    assert timeline.makespan == r.makespan
    assert r.schedule.n_microbatches == 8 and r.schedule.n_actions() == 2 * shape.n_stages * 8


@pytest.mark.parametrize("n_microbatches", [1, 4, 8, 16])
def test_vshape_makespan_is_no_worse_than_1f1b(n_microbatches: int) -> None:
    p = 4
    shape = tessel_shape("vshape", p)
    r = search_tessel(shape, n_microbatches, memory_limit=p)
    one_f_one_b = check_schedule(generate("1f1b", shape, n_microbatches), memory_limit=p).makespan
    assert one_f_one_b == (n_microbatches + p - 1) * (1 + 2)  # 1F1B's closed form, uniform stages
    assert check_schedule(best_1f1b_like(shape, n_microbatches, p), memory_limit=p).makespan == one_f_one_b
    assert r.makespan <= one_f_one_b
    assert r.peak_memory[0] <= p


def test_a_memory_limit_is_kept_by_repetend_and_schedule() -> None:
    shape = tessel_shape("vshape", 4)
    r = search_tessel(shape, 12, memory_limit=2)
    assert r.repetend_time > r.lower_bound  # 1F1B's zero bubble needs 4 on device 0
    assert max(r.repetend.peak_memory()) <= 2
    assert max(check_schedule(r.schedule, memory_limit=2).peak_memory) <= 2
    assert r.n_repetitions == 12 - r.repetend.max_offset


def test_a_limit_below_the_smallest_feasible_says_which_is() -> None:
    shape = tessel_shape("vshape", 4)
    with pytest.raises(
        SchedlabError, match=r"smallest feasible limit is 1; a zero-bubble repetend \(length 3\) needs 4"
    ):
        search_tessel(shape, 8, memory_limit=0.5)


def test_fast_meets_1f1b_memory_on_the_v_and_refuses_a_limit_it_cannot_meet() -> None:
    r = search_tessel(tessel_shape("vshape", 4), 8, memory_limit=4, solver="fast")
    assert r.repetend_time == 3 and r.peak_memory == (4, 3, 2, 1)  # modulo scheduling gives 1F1B
    with pytest.raises(SchedlabError, match=r"hold at least 1 on some device, over the memory limit 0\.5"):
        search_tessel(tessel_shape("vshape", 4), 8, memory_limit=0.5, solver="fast")


def test_a_shape_whose_zero_bubble_needs_more_memory_gets_a_longer_repetend() -> None:
    # the sharded embedding runs on every device at once, so the V cannot stagger as 1F1B does
    r = search_tessel(tessel_shape("mshape", 4), 16, memory_limit=4)
    assert r.lower_bound == 6 and r.repetend_time == 7 and r.length_optimal
    baseline = check_schedule(best_1f1b_like(r.schedule.shape, 16, 4), memory_limit=4).makespan
    assert r.makespan < baseline


def test_no_solution_within_the_time_limit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_time(model, objective, time_limit_s):  # type: ignore[no-untyped-def]
        return Solution(Status.NO_SOLUTION, solve_s=time_limit_s)

    monkeypatch.setitem(search_module._SOLVE, "highs", out_of_time)
    with pytest.raises(SchedlabError, match="no repetend found for vshape within the time limit"):
        search_tessel(tessel_shape("vshape", 4), 4, time_limit_s=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"solver": "gurobi"}, "unknown Tessel solver 'gurobi'"),
        ({"time_limit_s": 0}, "time_limit_s must be positive"),
        ({"memory_limit": -1}, "memory_limit must be positive"),
    ],
)
def test_bad_arguments_say_what_to_fix(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SchedlabError, match=message):
        search_tessel(tessel_shape("vshape", 2), 4, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vshape", "mshape", "xshape", "nnshape", "kshape"])
def test_every_shape_at_8_devices_has_a_zero_bubble_repetend_without_a_limit(name: str) -> None:
    shape = tessel_shape(name, 8)
    r = search_tessel(shape, 32, time_limit_s=120)
    assert r.repetend_time == r.lower_bound
    baseline = check_schedule(best_1f1b_like(shape, 32)).makespan  # its default cap: P micro-batches
    assert r.makespan <= baseline
