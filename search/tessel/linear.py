"""A small mixed-integer linear model, written once and handed to either solver: HiGHS
(through scipy.optimize.milp) or z3. Rows may be conditional ("this holds when binary b
takes value v"): HiGHS gets them as big-M rows with the big M computed from the
variables' bounds, z3 as implications, so both solve the same model in their own form."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class VarKind(StrEnum):
    CONTINUOUS = "continuous"
    INTEGER = "integer"
    BINARY = "binary"


class Status(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a solution, not proved optimal (the time limit ran out)
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no solution"  # the time limit ran out before any solution


@dataclass(frozen=True)
class Var:
    name: str
    kind: VarKind
    lb: float
    ub: float


@dataclass(frozen=True)
class Row:
    """lo <= sum(coef * var) <= hi, or, with `when` = (b, v), only while binary b == v."""

    coefs: tuple[tuple[int, float], ...]
    lo: float
    hi: float
    when: tuple[int, int] | None = None


@dataclass
class LinearModel:
    vars: list[Var] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def var(self, name: str, kind: VarKind, lb: float, ub: float) -> int:
        if kind is VarKind.BINARY:
            lb, ub = 0.0, 1.0
        self.vars.append(Var(name, kind, lb, ub))
        return len(self.vars) - 1

    def row(
        self, coefs: dict[int, float], lo: float = -math.inf, hi: float = math.inf, when: tuple[int, int] | None = None
    ) -> None:
        terms = tuple((v, c) for v, c in coefs.items() if c != 0)
        self.rows.append(Row(terms, lo, hi, when))

    def bound(self, var: int, lb: float, ub: float) -> LinearModel:
        """A copy with `var` between `lb` and `ub`."""
        out = LinearModel(list(self.vars), list(self.rows))
        v = out.vars[var]
        out.vars[var] = Var(v.name, v.kind, lb, ub)
        return out

    def expression_range(self, coefs: tuple[tuple[int, float], ...]) -> tuple[float, float]:
        """The least and most a row's expression can be within the variables' bounds."""
        lo = hi = 0.0
        for v, c in coefs:
            a, b = self.vars[v].lb * c, self.vars[v].ub * c
            lo += min(a, b)
            hi += max(a, b)
        return lo, hi


@dataclass(frozen=True)
class Solution:
    status: Status
    values: tuple[float, ...] = ()
    objective: float = math.nan
    solve_s: float = 0.0

    @property
    def found(self) -> bool:
        return self.status in (Status.OPTIMAL, Status.FEASIBLE)
