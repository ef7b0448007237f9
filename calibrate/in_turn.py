"""What a convolution costs when other convolutions run between its calls.

A microbenchmark calls one convolution back to back: the library's state for that shape
(oneDNN's primitive, its JIT kernel, the reordered weights' buffers) stays in the caches.
A step calls a dozen convolutions of different shapes in turn, forward and backward, and
each finds its state evicted by the others. Measured on the 2-core Intel dev VM (torch
2.13, one thread) with `dev:dwconv`'s ten convolution calls on their real arguments
(five forward, five backward; 1d and 2d, depthwise and grouped): back to back 53-218 us,
called in turn 83-286 us, 1.27-1.57x (median 1.37); in the executor's step 1.31-2.4x
(median 1.5). The extra is not the data's (each call's tensors are the ones the step
hands it, a few hundred KiB) nor the traffic between calls (`calibrate.context`'s
first-use extra): calling three convolutions in turn cost their sum, and ten cost
a third more each.

A context extra fitted per class on the calibration graphs (`calibrate.context`) is a
number of microseconds, the median over their convolutions; it cannot follow a model
whose convolutions are several times larger. Here the slowdown is a factor on the call,
measured as a function of how many distinct convolution calls take turns
(`measure_in_turn`: `PROBE_CONVS`, grouped as `IN_TURN_SIZES`); a Profile bound to a
graph charges each of its convolution ops the factor at the number of distinct
convolution signatures the graph has (`InTurnCurve.factor`, `distinct_in_turn`), on at
most the longest probe call's time (`InTurnCurve.extra_us`: as a factor on the whole call,
`dev:conv-bn`'s 1-20 ms convolutions were predicted 19.2% off, too slow, where the profile without
it read 2.0%). Calibration takes the same extra off the replayed graphs' events before it
fits the context extras, so the two do not count the same microseconds twice, and trace
calibration reads it back out of a trace's events (`InTurnCurve.kernel_of`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.calibrate.timing import back_to_back_median_us
from schedlab.graph import Graph, kept_on
from schedlab.io import json_number

# The op classes whose calls take turns (oneDNN convolutions, forward and backward).
IN_TURN_CLASSES: frozenset[str] = frozenset({"convolution", "convolution_backward"})
IN_TURN_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16)  # how many distinct calls take turns
IN_TURN_ROUNDS = 30  # timed rounds of the group called in turn (and back to back per call)
IN_TURN_REPEATS = 3  # the whole measurement, each size's median kept (one read 1.12-1.85x at 4 calls)

# (dims, batch, in channels, out channels, length/side, kernel, groups): 1d and 2d, dense,
# grouped and depthwise, as users' models and the held-out set have them; each probed
# forward and backward. Small enough that the data stays in the L2 of a core.
PROBE_CONVS: tuple[tuple[int, int, int, int, int, int, int], ...] = (
    (2, 6, 3, 32, 20, 3, 1),
    (2, 6, 32, 32, 20, 3, 32),
    (1, 6, 6, 24, 50, 7, 1),
    (2, 4, 32, 64, 16, 1, 1),
    (1, 6, 24, 24, 50, 5, 4),
    (2, 4, 16, 16, 24, 3, 4),
    (1, 8, 32, 32, 64, 3, 32),
    (2, 4, 8, 16, 28, 5, 1),
)


@dataclass(frozen=True)
class InTurnCurve:
    """The slowdown of a convolution call when `n` distinct ones take turns: `points` of
    (n, factor), n increasing, factors at least 1 and not decreasing. One call alone (n 1)
    runs at its benchmark; between points the factor is interpolated in log n; beyond the
    last it stays at the last."""

    points: tuple[tuple[int, float], ...]
    # The largest probe call's time back to back: the curve was measured on calls up to it,
    # and a longer call pays the extra of one this long (`extra_us`), not its own share.
    cap_us: float = math.inf

    def factor(self, n: int) -> float:
        pts = self.points
        if n <= 1 or not pts:
            return 1.0
        if n >= pts[-1][0]:
            return pts[-1][1]
        lo_n, lo_f = 1, 1.0
        for p_n, p_f in pts:
            if n < p_n:
                w = math.log(n / lo_n) / math.log(p_n / lo_n)
                return lo_f + w * (p_f - lo_f)
            lo_n, lo_f = p_n, p_f
        return pts[-1][1]  # unreachable: n < pts[-1][0]

    def extra_us(self, kernel_us: float, factor: float) -> float:
        """What a call of `kernel_us` back to back costs more at `factor`: its share of the
        factor up to `cap_us`, that of a `cap_us` call beyond."""
        return (factor - 1.0) * min(max(0.0, kernel_us), self.cap_us)

    def extra_column(self, kernel_us: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """`extra_us` of each call of a column (`calibrate.profile_columns`)."""
        return (factor - 1.0) * np.minimum(np.maximum(kernel_us, 0.0), self.cap_us)

    def kernel_of(self, in_step_us: float, factor: float) -> float:
        """The inverse of `kernel + extra_us(kernel, factor)`: the back-to-back time of a call
        that took `in_step_us` at `factor` (trace calibration)."""
        if factor <= 1.0:
            return in_step_us
        if in_step_us <= factor * self.cap_us:
            return in_step_us / factor
        return in_step_us - (factor - 1.0) * self.cap_us

    def to_json(self) -> dict[str, Any]:
        return {"points": [[n, round(f, 4)] for n, f in self.points],
                "cap_us": None if math.isinf(self.cap_us) else round(self.cap_us, 1)}

    @staticmethod
    def from_json(d: Any) -> InTurnCurve:
        if not isinstance(d, dict) or not isinstance(d.get("points"), list):
            raise TypeError("expected an object with points, a list of [calls, factor] pairs")
        pts: list[tuple[int, float]] = []
        for i, p in enumerate(d["points"]):
            if not isinstance(p, list) or len(p) != 2:
                raise TypeError(f"in_turn.points[{i}] must be a [calls, factor] pair")
            pts.append((int(json_number(p[0], f"in_turn.points[{i}][0]")), json_number(p[1], f"in_turn.points[{i}][1]")))
        cap = d.get("cap_us")
        return curve_of(pts, math.inf if cap is None else max(0.0, json_number(cap, "in_turn.cap_us")))


def curve_of(points: Sequence[tuple[int, float]], cap_us: float = math.inf) -> InTurnCurve:
    """A curve through `points` made valid: sorted by calls, factors at least 1 and made
    non-decreasing (more calls taking turns never leave more state in the caches)."""
    out: list[tuple[int, float]] = []
    top = 1.0
    for n, f in sorted((int(n), float(f)) for n, f in points if n >= 1):
        top = max(top, f)
        out.append((n, top))
    return InTurnCurve(tuple(out), cap_us)


def distinct_in_turn(graph: Graph) -> int:
    """How many distinct convolution calls (signatures of `IN_TURN_CLASSES` ops) `graph`'s
    step makes: the calls that take turns. Kept on the graph object."""
    from schedlab.calibrate.signature import graph_signatures

    def count(g: Graph) -> int:
        sigs = graph_signatures(g)
        return len({sigs[op.id] for op in g.ops if not op.is_view and op.op_class in IN_TURN_CLASSES})

    return kept_on(graph, "_cal_distinct_in_turn", count)


def in_turn_factor(curve: InTurnCurve | None, graph: Graph, op_class: str) -> float:
    """The factor on a kernel of `op_class` in a step of `graph` (1 outside the classes, or without a curve)."""
    if curve is None or op_class not in IN_TURN_CLASSES:
        return 1.0
    return curve.factor(distinct_in_turn(graph))


def _probe_calls(torch: Any) -> list[Callable[[], Any]]:
    """`PROBE_CONVS` as aten calls, forward and backward interleaved so that any group of
    the first n mixes kinds."""
    aten = torch.ops.aten
    gen = torch.Generator().manual_seed(0)
    fwd: list[Callable[[], Any]] = []
    bwd: list[Callable[[], Any]] = []
    for dims, batch, cin, cout, side, k, groups in PROBE_CONVS:
        x = torch.randn(batch, cin, *([side] * dims), generator=gen)
        w = torch.randn(cout, cin // groups, *([k] * dims), generator=gen)
        b = torch.randn(cout, generator=gen)
        one, pad = [1] * dims, [k // 2] * dims
        y = aten.convolution.default(x, w, b, one, pad, one, False, [0] * dims, groups)
        gy = torch.randn(y.shape, generator=gen)

        def f(x: Any = x, w: Any = w, b: Any = b, one: list[int] = one, pad: list[int] = pad, g: int = groups,
              d: int = dims) -> Any:
            return aten.convolution.default(x, w, b, one, pad, one, False, [0] * d, g)

        def bw(x: Any = x, w: Any = w, gy: Any = gy, one: list[int] = one, pad: list[int] = pad, g: int = groups,
               d: int = dims, cout: int = cout) -> Any:
            return aten.convolution_backward.default(gy, x, w, [cout], one, pad, one, False, [0] * d, g,
                                                     [True, True, True])

        fwd.append(f)
        bwd.append(bw)
    out: list[Callable[[], Any]] = []
    for pair in zip(fwd, bwd, strict=True):
        out += pair
    return out


def _in_turn_us(calls: Sequence[Callable[[], Any]], rounds: int) -> list[float]:
    times: list[list[int]] = [[] for _ in calls]
    for r in range(rounds + 2):
        for i, call in enumerate(calls):
            t0 = time.perf_counter_ns()
            call()
            if r >= 2:
                times[i].append(time.perf_counter_ns() - t0)
    return [statistics.median(t) / 1e3 for t in times]


def measure_in_turn(
    torch: Any, sizes: Sequence[int] = IN_TURN_SIZES, rounds: int = IN_TURN_ROUNDS, repeats: int = IN_TURN_REPEATS,
) -> InTurnCurve:
    """This machine's in-turn curve at the calling thread's intra-op threads (calibration
    calls it at one): per group size n, the median over the first n probe calls of their
    time called in turn over their time back to back; the median of `repeats` such. Its
    cap is the longest probe call's time back to back."""
    calls = _probe_calls(torch)
    per_n: dict[int, list[float]] = {}
    longest: list[float] = []
    for _ in range(max(1, repeats)):
        alone = [back_to_back_median_us(c, rounds, warmup=3) for c in calls]
        longest.append(max(alone))
        for n in sizes:
            n = min(n, len(calls))
            if n <= 1:
                continue
            turn = _in_turn_us(calls[:n], rounds)
            ratios = [t / a for t, a in zip(turn, alone[:n], strict=True) if a > 0]
            per_n.setdefault(n, []).append(statistics.median(ratios))
    return curve_of([(n, statistics.median(fs)) for n, fs in per_n.items()], statistics.median(longest))
