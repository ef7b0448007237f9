"""Tessel's schedule search end to end: a repetend, then warm-up and cool-down around it.

The solvers ("highs", "z3") solve blocks.py's repetend model (formulation.py) in up to
three steps, all within one time budget:

1. L fixed at the lower bound (the largest per-device work per micro-batch), fewest
   offsets K: most shapes have a zero-bubble repetend, and this is the quick way to it.
2. If none fits the memory limit there: the shortest L.
3. With that L fixed: the fewest offsets (a shorter warm-up and cool-down).

"fast" builds the repetend without a solver (fast.py: Tessel-fast's packings, and modulo
scheduling beside them), in milliseconds, at the price of memory or length.

The default is HiGHS, by measured search time. On the five shapes with a memory limit of
P activations and M = 4P (2-core VM under load, time limit 60 s), both solvers found
repetends of the same length, HiGHS in 0.01-8.5 s at 4 devices where z3 took
0.07-29 s, and 0.06-1.4 s at 8 devices where z3 took 0.9-41 s; on nnshape at 8
devices HiGHS had its best (length 10, not proved) at the limit and z3 had none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from schedlab.errors import SchedlabError
from schedlab.pipeline import PipeShape, Schedule, check_schedule
from schedlab.search.tessel.blocks import TIME_TOL, BlockProblem, Repetend
from schedlab.search.tessel.complete import complete, n_repetitions
from schedlab.search.tessel.fast import fast_repetend
from schedlab.search.tessel.formulation import RepetendModel, repetend_model
from schedlab.search.tessel.highs import solve_highs
from schedlab.search.tessel.linear import LinearModel, Solution, Status
from schedlab.search.tessel.smt import solve_z3

SOLVERS = ("highs", "z3", "fast")
DEFAULT_SOLVER = "highs"

Solve = Callable[[LinearModel, dict[int, float], float], Solution]
_SOLVE: dict[str, Solve] = {"highs": solve_highs, "z3": solve_z3}


@dataclass(frozen=True)
class TesselResult:
    """A searched schedule and how it was found.

    `repetend` holds the per-device orders within the pattern (`repetend.orders()`,
    `repetend.to_text()`); `repetend_time` is its length L, `lower_bound` the largest
    per-device work per micro-batch (L == lower_bound: no bubble in the steady state);
    `length_optimal` says L was proved the shortest under the memory limit."""

    schedule: Schedule
    repetend: Repetend
    repetend_time: float
    lower_bound: float
    makespan: float
    search_s: float
    solver: str
    length_optimal: bool
    n_repetitions: int
    peak_memory: tuple[float, ...]


def search_tessel(
    shape: PipeShape,
    n_microbatches: int,
    *,
    memory_limit: float | None = None,
    solver: str = DEFAULT_SOLVER,
    time_limit_s: float = 60,
) -> TesselResult:
    """Search a repetend for `shape` under `memory_limit` (activations per device, in the
    shape's memory unit; None: no limit) and complete it into a schedule of
    `n_microbatches` micro-batches that passes check_schedule. The solvers stop at
    `time_limit_s` with the best repetend found; with none found, an error says so."""
    if solver not in SOLVERS:
        raise SchedlabError(f"unknown Tessel solver {solver!r}; choose one of: {', '.join(SOLVERS)}")
    if n_microbatches < 1:
        raise SchedlabError(f"a schedule needs at least one micro-batch, not {n_microbatches}")
    if time_limit_s <= 0:
        raise SchedlabError(f"time_limit_s must be positive, not {time_limit_s}")
    if memory_limit is not None and memory_limit <= 0:
        raise SchedlabError(f"memory_limit must be positive, not {memory_limit}")
    problem = BlockProblem(shape)
    t0 = time.perf_counter()
    if solver == "fast":
        repetend = fast_repetend(problem, memory_limit)
        length_optimal = repetend.length <= problem.lower_bound + TIME_TOL
    else:
        repetend, length_optimal = _solve_repetend(problem, memory_limit, _SOLVE[solver], t0 + time_limit_s)
    repetend.check(memory_limit)
    schedule = complete(repetend, n_microbatches, memory_limit)
    search_s = time.perf_counter() - t0
    timeline = check_schedule(schedule, memory_limit=memory_limit)
    return TesselResult(
        schedule=schedule,
        repetend=repetend,
        repetend_time=repetend.length,
        lower_bound=problem.lower_bound,
        makespan=timeline.makespan,
        search_s=search_s,
        solver=solver,
        length_optimal=length_optimal,
        n_repetitions=n_repetitions(repetend, n_microbatches),
        peak_memory=timeline.peak_memory,
    )


def _solve_repetend(
    problem: BlockProblem, memory_limit: float | None, solve: Solve, deadline: float
) -> tuple[Repetend, bool]:
    lb = problem.lower_bound
    at_bound = repetend_model(problem, memory_limit=memory_limit, length_range=(lb, lb))
    sol = solve(at_bound.model, {at_bound.max_offset: 1.0}, _left(deadline))
    found = _accepted(at_bound, sol, memory_limit)
    if found is not None:
        return found, True
    free = repetend_model(problem, memory_limit=memory_limit)
    sol = solve(free.model, {free.length: 1.0}, _left(deadline))
    if sol.status is Status.INFEASIBLE:
        raise SchedlabError(_too_tight(problem, memory_limit, solve, deadline))
    best = _accepted(free, sol, memory_limit)
    if best is None:
        raise SchedlabError(
            f"no repetend found for {problem.shape.name or 'this shape'} within the time limit; raise "
            f"time_limit_s, or use solver='fast'"
        )
    proved = sol.status is Status.OPTIMAL
    length = best.length
    fewer = repetend_model(problem, memory_limit=memory_limit, length_range=(length, length))
    fewest = _accepted(fewer, solve(fewer.model, {fewer.max_offset: 1.0}, _left(deadline)), memory_limit)
    if fewest is not None and fewest.max_offset < best.max_offset:
        best = fewest
    return best, proved


def _accepted(model: RepetendModel, sol: Solution, memory_limit: float | None) -> Repetend | None:
    """The solution's repetend if it holds; a solver stopped by its time limit may hand
    back an assignment that does not (z3's last model), which counts as none."""
    if not sol.found:
        return None
    repetend = model.repetend(sol.values)
    try:
        repetend.check(memory_limit)
    except SchedlabError:
        if sol.status is Status.OPTIMAL:
            raise
        return None
    return repetend


def _too_tight(problem: BlockProblem, memory_limit: float | None, solve: Solve, deadline: float) -> str:
    """The message for a memory limit under which no repetend exists: the smallest limit
    that has one, and what a zero-bubble repetend needs."""
    name = problem.shape.name or "this shape"
    grace = max(_left(deadline), 5.0)
    any_length = repetend_model(problem, memory_limit=None, memory_as_variable=True)
    assert any_length.memory is not None
    sol = solve(any_length.model, {any_length.memory: 1.0}, grace)
    if not sol.found:
        return f"memory limit {memory_limit:g} is too tight: no repetend of {name} fits under it; raise the limit"
    smallest = sol.values[any_length.memory]
    exact = "" if sol.status is Status.OPTIMAL else " (or less: the solver ran out of time proving it)"
    lb = problem.lower_bound
    at_bound = repetend_model(problem, memory_limit=None, memory_as_variable=True, length_range=(lb, lb))
    assert at_bound.memory is not None
    zero = solve(at_bound.model, {at_bound.memory: 1.0}, grace)
    no_bubble = f"; a zero-bubble repetend (length {lb:g}) needs {zero.values[at_bound.memory]:g}" if zero.found else ""
    return (
        f"memory limit {memory_limit:g} is too tight for a repetend of {name}: the smallest feasible limit is "
        f"{smallest:g}{exact}{no_bubble}; raise the limit"
    )


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())
