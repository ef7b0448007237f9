"""The repetend as a mixed-integer linear model (blocks.py says what a repetend is).

The pattern is a circle of length L: a block may start near its end and run on into the
next repetition, as 1F1B's steady state needs when F and B differ in length (device d's
phase is d forwards later than device 0's). Variables, per block j: start t_j in [0, L],
offset k_j (integer); per dependency edge i -> j: e1_ij, e2_ij (binaries: the edge
crosses at least one, at least two repetition boundaries); per pair of blocks sharing a
device: o_xy (binary: x starts before y in the pattern); and the length L, the largest
offset K and, when asked for, the memory bound.

    t_j <= L - margin   (a start at L is the next repetition's 0)
    k_j - k_i >= e1_ij + e2_ij,  e2_ij <= e1_ij
    while e1_ij = 0:  t_j >= t_i + d_i          (same repetition)
    while e2_ij = 0:  t_j + L >= t_i + d_i      (at most the next one)
    while o_xy = 1:   t_y >= t_x + d_x  and  t_y + d_y <= t_x + L   (x, then y, on the circle)
    while o_xy = 0:   the same with x and y swapped
    K >= k_j
    per device d, per forward F_j on d (the peak is right after some forward):
      sum over stages s on d of m_s (k_Bs - k_Fs + [F_s at or before F_j] - [B_s before F_j]) <= limit

Writing the dependency t_j + k_j L >= t_i + d_i + k_i L through e1, e2 keeps the model
linear while L is a variable: an edge that crosses two boundaries is met whatever the
times (t_i + d_i < 2L). The brackets are the order binaries (or 1 for F_j itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlab.pipeline import Kind
from schedlab.search.tessel.blocks import BlockProblem, Repetend
from schedlab.search.tessel.linear import LinearModel, VarKind

# How far below L the last start may be, as a share of the lower bound: far above the
# solvers' tolerances (1e-6), far below any duration that matters.
START_MARGIN = 1e-4


@dataclass(frozen=True)
class RepetendModel:
    """The model and where each of its variables is."""

    model: LinearModel
    problem: BlockProblem
    length: int
    starts: tuple[int, ...]
    offsets: tuple[int, ...]
    max_offset: int
    memory: int | None  # the memory bound as a variable, when it is one

    def repetend(self, values: tuple[float, ...]) -> Repetend:
        return Repetend(
            self.problem,
            values[self.length],
            tuple(values[v] for v in self.starts),
            tuple(round(values[v]) for v in self.offsets),
        ).normalized()


def repetend_model(
    problem: BlockProblem,
    *,
    memory_limit: float | None,
    memory_as_variable: bool = False,
    length_range: tuple[float, float] | None = None,
) -> RepetendModel:
    """The model for `problem`; the memory bound is `memory_limit` (None: no bound), or a
    variable to minimise when `memory_as_variable`; L within `length_range` (default:
    from the lower bound to one micro-batch run serially, which always fits).

    The circle's rotation is fixed by starting block 0 at 0 (turning a repetend round
    changes none of its times, orders or peaks), which spares the solver that symmetry."""
    m = LinearModel()
    lb, ub = length_range or (problem.lower_bound, problem.serial_time)
    k_max = max(problem.longest_chain, 1) + problem.n_blocks
    length = m.var("L", VarKind.CONTINUOUS, lb, ub)
    starts = tuple(
        m.var(f"t[{b}]", VarKind.CONTINUOUS, 0.0, 0.0 if j == 0 else ub) for j, b in enumerate(problem.blocks)
    )
    offsets = tuple(m.var(f"k[{b}]", VarKind.INTEGER, 0, k_max) for b in problem.blocks)
    max_offset = m.var("K", VarKind.CONTINUOUS, 0, k_max)
    blocks = problem.blocks
    # a start at L is the next repetition's 0 with one more offset: keeping starts below L
    # keeps K (the objective after L) honest
    below = START_MARGIN * lb
    for j in range(len(blocks)):
        m.row({starts[j]: 1.0, length: -1.0}, hi=-below)
        m.row({max_offset: 1.0, offsets[j]: -1.0}, lo=0.0)
    for i, j in problem.edges:
        e1 = m.var(f"e1[{blocks[i]}->{blocks[j]}]", VarKind.BINARY, 0, 1)
        e2 = m.var(f"e2[{blocks[i]}->{blocks[j]}]", VarKind.BINARY, 0, 1)
        m.row({offsets[j]: 1.0, offsets[i]: -1.0, e1: -1.0, e2: -1.0}, lo=0.0)
        m.row({e2: 1.0, e1: -1.0}, hi=0.0)
        m.row({starts[j]: 1.0, starts[i]: -1.0}, lo=blocks[i].duration, when=(e1, 0))
        m.row({starts[j]: 1.0, starts[i]: -1.0, length: 1.0}, lo=blocks[i].duration, when=(e2, 0))
    order: dict[tuple[int, int], int] = {}
    for x, y in problem.pairs:
        o = m.var(f"o[{blocks[x]}<{blocks[y]}]", VarKind.BINARY, 0, 1)
        order[x, y] = o
        for first, then, value in ((x, y, 1), (y, x, 0)):
            m.row({starts[then]: 1.0, starts[first]: -1.0}, lo=blocks[first].duration, when=(o, value))
            m.row({starts[first]: 1.0, starts[then]: -1.0, length: 1.0}, lo=blocks[then].duration, when=(o, value))
    memory: int | None = None
    if memory_as_variable:
        memory = m.var("memory", VarKind.CONTINUOUS, 0.0, sum(b.mem for b in blocks if b.kind is Kind.F) * k_max)
    if memory is not None or memory_limit is not None:
        for d, on_d in enumerate(problem.on_device):
            for j in on_d:
                if blocks[j].kind is not Kind.F:
                    continue
                coefs, const = _held_after(problem, d, j, offsets, order)
                if memory is not None:
                    coefs[memory] = coefs.get(memory, 0.0) - 1.0
                    m.row(coefs, hi=-const)
                elif memory_limit is not None:
                    m.row(coefs, hi=memory_limit - const)
    return RepetendModel(m, problem, length, starts, offsets, max_offset, memory)


def _held_after(
    problem: BlockProblem, device: int, j: int, offsets: tuple[int, ...], order: dict[tuple[int, int], int]
) -> tuple[dict[int, float], float]:
    """What `device` holds right after forward block j of the pattern, as a linear
    expression (coefficients, constant)."""
    coefs: dict[int, float] = {}
    const = 0.0

    def add(var: int, c: float) -> None:
        coefs[var] = coefs.get(var, 0.0) + c

    def before_or_at(x: int, c: float) -> float:
        """c * [x runs at or before j in the pattern]; returns the constant part."""
        if x == j:
            return c
        if (x, j) in order:
            add(order[x, j], c)
            return 0.0
        add(order[j, x], -c)  # [x before j] = 1 - [j before x]
        return c

    for s in problem.shape.stages_on(device):
        f, b = problem.f(s), problem.b(s)
        mem = problem.blocks[f].mem
        if mem == 0:
            continue
        add(offsets[b], mem)
        add(offsets[f], -mem)
        const += before_or_at(f, mem)
        const += before_or_at(b, -mem)
    return coefs, const
