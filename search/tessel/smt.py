"""Solve a `LinearModel` with z3 (the solver Tessel itself uses): continuous variables
as reals, integers as ints, binaries as Booleans; a conditional row is an implication.
z3 is an optional extra (`pip install 'schedlab[tessel]'`), imported only when asked for."""

from __future__ import annotations

import math
import time
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.search.tessel.linear import LinearModel, Solution, Status, VarKind


def _z3() -> Any:
    try:
        import z3
    except ImportError:
        raise SchedlabError(
            "solver 'z3' needs the z3-solver package: pip install 'schedlab[tessel]' (or choose solver='highs')"
        ) from None
    return z3


def solve_z3(model: LinearModel, objective: dict[int, float], time_limit_s: float) -> Solution:
    z3 = _z3()
    ctx = z3.Context()
    opt = z3.Optimize(ctx=ctx)
    opt.set("timeout", max(50, int(time_limit_s * 1000)))
    terms: list[Any] = []
    for i, v in enumerate(model.vars):
        if v.kind is VarKind.BINARY:
            b = z3.Bool(f"v{i}", ctx)
            terms.append(b)
            continue
        x = z3.Int(f"v{i}", ctx) if v.kind is VarKind.INTEGER else z3.Real(f"v{i}", ctx)
        terms.append(x)
        if math.isfinite(v.lb):
            opt.add(x >= _num(z3, ctx, v.lb, v.kind))
        if math.isfinite(v.ub):
            opt.add(x <= _num(z3, ctx, v.ub, v.kind))

    def value_of(i: int) -> Any:
        if model.vars[i].kind is VarKind.BINARY:
            return z3.If(terms[i], z3.RealVal(1, ctx), z3.RealVal(0, ctx))
        return terms[i]

    def linear(coefs: tuple[tuple[int, float], ...] | dict[int, float]) -> Any:
        items = coefs.items() if isinstance(coefs, dict) else coefs
        return z3.Sum([_real(z3, ctx, c) * value_of(v) for v, c in items]) if items else z3.RealVal(0, ctx)

    for row in model.rows:
        expr = linear(row.coefs)
        parts = []
        if math.isfinite(row.lo):
            parts.append(expr >= _real(z3, ctx, row.lo))
        if math.isfinite(row.hi):
            parts.append(expr <= _real(z3, ctx, row.hi))
        body = parts[0] if len(parts) == 1 else z3.And(*parts)
        if row.when is None:
            opt.add(body)
        else:
            b, value = row.when
            opt.add(z3.Implies(terms[b] if value == 1 else z3.Not(terms[b]), body))
    opt.minimize(linear(objective))
    t0 = time.perf_counter()
    result = opt.check()
    took = time.perf_counter() - t0
    if result == z3.unsat:
        return Solution(Status.INFEASIBLE, solve_s=took)
    if result == z3.unknown:
        # on a timeout z3 may still hold the best model it reached
        try:
            m = opt.model()
        except z3.Z3Exception:
            return Solution(Status.NO_SOLUTION, solve_s=took)
        if m is None or len(m) == 0:
            return Solution(Status.NO_SOLUTION, solve_s=took)
        values = _read(z3, m, terms, model)
        return Solution(Status.FEASIBLE, values, sum(c * values[v] for v, c in objective.items()), took)
    values = _read(z3, opt.model(), terms, model)
    return Solution(Status.OPTIMAL, values, sum(c * values[v] for v, c in objective.items()), took)


def _read(z3: Any, m: Any, terms: list[Any], model: LinearModel) -> tuple[float, ...]:
    out = []
    for t, v in zip(terms, model.vars):
        val = m.eval(t, model_completion=True)
        if v.kind is VarKind.BINARY:
            out.append(1.0 if z3.is_true(val) else 0.0)
        elif v.kind is VarKind.INTEGER:
            out.append(float(val.as_long()))
        else:
            out.append(float(val.as_fraction()))
    return tuple(out)


def _real(z3: Any, ctx: Any, x: float) -> Any:
    # exact rationals: 0.1 stays 0.1, not its binary float
    return z3.RealVal(repr(float(x)), ctx) if not float(x).is_integer() else z3.RealVal(int(x), ctx)


def _num(z3: Any, ctx: Any, x: float, kind: VarKind) -> Any:
    # the models here give integer variables integral bounds
    return z3.IntVal(round(x), ctx) if kind is VarKind.INTEGER else _real(z3, ctx, x)
