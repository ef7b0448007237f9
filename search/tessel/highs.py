"""Solve a `LinearModel` with HiGHS through scipy.optimize.milp: conditional rows become
big-M rows whose M is the row's own slack over the variables' bounds (as tight as the
bounds allow, which keeps the LP relaxation useful)."""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from schedlab.search.tessel.linear import LinearModel, Solution, Status, VarKind


def solve_highs(model: LinearModel, objective: dict[int, float], time_limit_s: float) -> Solution:
    n = len(model.vars)
    rows_i: list[int] = []
    cols: list[int] = []
    data: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for row in model.rows:
        coefs = dict(row.coefs)
        row_lo, row_hi = row.lo, row.hi
        if row.when is not None:
            b, value = row.when
            e_lo, e_hi = model.expression_range(row.coefs)
            # one-sided rows only: a two-sided conditional row is split in two
            if math.isfinite(row_lo):
                big = max(0.0, row_lo - e_lo)
                shifted = row_lo - big if value == 1 else row_lo
                _emit(rows_i, cols, data, lo, hi, _relax(coefs, b, value, big, lower=True), shifted, math.inf)
            if math.isfinite(row_hi):
                big = max(0.0, e_hi - row_hi)
                shifted = row_hi + big if value == 1 else row_hi
                _emit(rows_i, cols, data, lo, hi, _relax(coefs, b, value, big, lower=False), -math.inf, shifted)
            continue
        _emit(rows_i, cols, data, lo, hi, coefs, row_lo, row_hi)
    a = coo_array((data, (rows_i, cols)), shape=(len(lo), n)).tocsr()
    c = np.zeros(n)
    for v, w in objective.items():
        c[v] = w
    integrality = np.array([0 if v.kind is VarKind.CONTINUOUS else 1 for v in model.vars])
    bounds = Bounds([v.lb for v in model.vars], [v.ub for v in model.vars])
    t0 = time.perf_counter()
    res = milp(
        c,
        integrality=integrality,
        bounds=bounds,
        constraints=LinearConstraint(a, lo, hi) if lo else None,
        options={"time_limit": max(0.05, time_limit_s), "disp": False},
    )
    took = time.perf_counter() - t0
    if res.status == 0:
        return Solution(Status.OPTIMAL, tuple(float(x) for x in res.x), float(res.fun), took)
    if res.status == 2:
        return Solution(Status.INFEASIBLE, solve_s=took)
    if res.x is not None:
        return Solution(Status.FEASIBLE, tuple(float(x) for x in res.x), float(res.fun), took)
    return Solution(Status.NO_SOLUTION, solve_s=took)


def _relax(coefs: dict[int, float], b: int, value: int, big: float, *, lower: bool) -> dict[int, float]:
    """The row's coefficients plus the binary's big-M term.

    lower (expr >= lo): holds when b == value, relaxed by `big` otherwise:
      value 1: expr + big (1 - b) >= lo  ->  expr - big b >= lo - big
      value 0: expr + big b >= lo
    upper (expr <= hi), mirrored:
      value 1: expr + big b <= hi + big
      value 0: expr - big b <= hi
    The constant moves to the row's bound, which the caller shifts."""
    out = dict(coefs)
    sign = (-1.0 if value == 1 else 1.0) * (1.0 if lower else -1.0)
    out[b] = out.get(b, 0.0) + sign * big
    return out


def _emit(
    rows_i: list[int],
    cols: list[int],
    data: list[float],
    lo: list[float],
    hi: list[float],
    coefs: dict[int, float],
    row_lo: float,
    row_hi: float,
) -> None:
    r = len(lo)
    for v, w in coefs.items():
        rows_i.append(r)
        cols.append(v)
        data.append(w)
    lo.append(row_lo)
    hi.append(row_hi)
