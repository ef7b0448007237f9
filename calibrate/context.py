"""What an op costs inside a training step, beyond what it costs called in a tight loop.

A microbenchmark calls one op back to back: its code, its branch history and its data
stay hot. In a step the op runs between other ops, and pays for that. Running the
calibration graphs on the executor (one slot, one thread) and comparing each op's event,
less the executor's own dispatch, with the benchmark of the same call on the same
tensors showed two regimes (2-core development VM, idle, torch 2.13; the built-in
workloads at size tiny and the coverage models at their small shape):

- an op whose target ran before in the step (an unrolled `nn.GRU` cell, the layers of a
  stack, the optimizer's update of each parameter): 0.6 us more than its benchmark
  (median over classes; sigmoid 0.1 us, addmm 1.9 us, a small convolution 21 us);
- the first op of its target in the step (the one `_log_softmax`, the first `addmm`):
  3.6 us more again (median; 2-12 us for most classes, 24-62 us for small convolutions
  and their backward). Over the forty-odd targets of a small model of 160 ops that is a
  tenth of its 1 ms step; over a GRU of 6,000 ops, under 1%.

A replay of the graph in Python between the calls measured several times these extras:
its own interpreter work between ops evicts more than the executor's generated step.

So calibration stores kernels as they run in a step (`warm`): the benchmark plus the
op's own warm extra (its signature's, else its class's median, else the median of
all), in the signature table and in the points the class models are fitted on.

What an op of megabytes pays for its data not being in the caches grows with its bytes
and is modelled on its own (`calibrate.cold`); it is taken off each replayed op before
the extras here are fitted, so they hold the rest.

A class's median comes from the sizes the calibration graphs replay, and at the default
sizes those move megabytes whose data a step has evicted (a 12.6 MB gelu: +294 us). A
call of the same class on 17 elements cannot pay that: `bounded_warm` caps an extra
borrowed from the class at the median of all plus the time to bring every byte the call
moves from memory at the roofline's one-thread bandwidth (136 bytes: +1.2 us, where the
class median made the Profile's 17-element gelu 294 us; measured, 8 us). The
first-use extra is kept per class (`first_use_us`) and charged by a Profile bound to
the graph it predicts (`Profile.for_graph`), to the ops that are the first of their
target in program order (`first_uses`); an unbound Profile charges none.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from schedlab.calibrate.in_turn import InTurnCurve
from schedlab.graph import Graph, kept_on
from schedlab.io import json_number


def first_uses(graph: Graph) -> frozenset[int]:
    """Ids of the non-view ops that are the first of their target in program order.
    Computed once per graph object and kept on it, as the simulator keeps the graph's other
    derived structure (`sim.cost_table.content_keys`): a Profile binds it in every cold
    simulation (`Profile.for_graph`)."""
    return kept_on(graph, "_cal_first_uses", _first_uses)


def _first_uses(graph: Graph) -> frozenset[int]:
    seen: set[str] = set()
    out: set[int] = set()
    for op in graph.ops:
        if not op.is_view and op.target not in seen:
            seen.add(op.target)
            out.add(op.id)
    return frozenset(out)


def first_use_objects(graph: Graph) -> frozenset[int]:
    """`id()` of each op of `first_uses(graph)`: what a Profile bound to `graph` keys its
    first uses by (`Profile.for_graph`), kept on the graph object (its ops live as long)."""
    return kept_on(graph, "_cal_first_use_objects", lambda g: frozenset(id(g.ops[i]) for i in first_uses(g)))


@dataclass(frozen=True)
class Occurrence:
    """One op of a replayed graph: its signature, class, whether it is its target's first
    use, its call time in sequence (us), and the bytes it reads and writes."""

    signature: str
    op_class: str
    first_use: bool
    in_seq_us: float
    nbytes: int = 0
    in_turn: float = 1.0  # `calibrate.in_turn`: the factor its graph's convolutions taking turns puts on its call


@dataclass(frozen=True)
class ContextCosts:
    """The extra (us) of an op in a step over its benchmark, per op class."""

    warm_us: dict[str, float]  # op class -> median extra of an op whose target ran before
    warm_fallback_us: float  # over every class
    first_use_us: dict[str, float]  # op class -> median extra of its target's first use, over warm
    first_use_fallback_us: float
    # The slowdown of convolutions taking turns in a step (`calibrate.in_turn`), which the
    # extras here were fitted without; None: not measured (the extras hold it, as medians).
    in_turn: InTurnCurve | None = None

    def warm(self, op_class: str) -> float:
        return self.warm_us.get(op_class, self.warm_fallback_us)

    def first_use(self, op_class: str) -> float:
        return self.first_use_us.get(op_class, self.first_use_fallback_us)

    def to_json(self) -> dict[str, Any]:
        return {
            "warm_us": {k: round(v, 4) for k, v in sorted(self.warm_us.items())},
            "warm_fallback_us": round(self.warm_fallback_us, 4),
            "first_use_us": {k: round(v, 4) for k, v in sorted(self.first_use_us.items())},
            "first_use_fallback_us": round(self.first_use_fallback_us, 4),
            "in_turn": None if self.in_turn is None else self.in_turn.to_json(),
        }

    @staticmethod
    def from_json(d: Any) -> ContextCosts:
        if not isinstance(d, dict):
            raise TypeError(f"expected an object, got {type(d).__name__}")

        def table(key: str) -> dict[str, float]:
            raw = d.get(key, {})
            if not isinstance(raw, dict):
                raise TypeError(f"{key} must be an object of op class -> us")
            return {str(k): json_number(v, f"{key}.{k}") for k, v in raw.items()}

        return ContextCosts(
            warm_us=table("warm_us"),
            warm_fallback_us=json_number(d.get("warm_fallback_us", 0.0), "warm_fallback_us"),
            first_use_us=table("first_use_us"),
            first_use_fallback_us=json_number(d.get("first_use_fallback_us", 0.0), "first_use_fallback_us"),
            in_turn=None if d.get("in_turn") is None else InTurnCurve.from_json(d["in_turn"]),
        )


NO_CONTEXT = ContextCosts({}, 0.0, {}, 0.0)  # version 1 profiles: kernels as benchmarked


def bounded_warm(context: ContextCosts, op_class: str, nbytes: float, mem_us: Callable[[float], float]) -> float:
    """The warm extra a call of `op_class` moving `nbytes` borrows from its class, at most
    the median over all classes plus `mem_us(nbytes)`, the time to bring every byte from
    memory (see the module docstring): cold caches cost a call no more than its data."""
    return min(context.warm(op_class), max(0.0, context.warm_fallback_us) + mem_us(nbytes))


def _median(xs: Iterable[float], default: float = 0.0) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else default


def fit_context(
    occurrences: Sequence[Occurrence], hot_us: dict[str, float], cold_us: Callable[[Occurrence], float] | None = None,
    turn_us: Callable[[Occurrence, float], float] | None = None,
) -> tuple[ContextCosts, dict[str, float]]:
    """The per-class context extras, and each replayed signature's own warm extra.

    `hot_us`: the benchmarked one-thread call time of each signature (occurrences of a
    signature not benchmarked are ignored). `cold_us(o)`: what `o` paid in the step for
    data not in the caches (`calibrate.cold`), which the Profile charges on its own and is
    taken off first, and so is `turn_us(o, hot)`, what its graph's convolutions taking
    turns add to a call of `hot` us at its `Occurrence.in_turn` (`calibrate.in_turn`).
    """
    warm_by_sig: dict[str, list[float]] = {}
    classes: dict[str, str] = {}

    def seq_us(o: Occurrence) -> float:
        less = cold_us(o) if cold_us is not None else 0.0
        if turn_us is not None and o.in_turn != 1.0:
            less += turn_us(o, hot_us[o.signature])
        return o.in_seq_us - less

    for o in occurrences:
        if o.signature in hot_us and not o.first_use:
            warm_by_sig.setdefault(o.signature, []).append(seq_us(o) - hot_us[o.signature])
            classes[o.signature] = o.op_class
    sig_warm = {sig: statistics.median(xs) for sig, xs in warm_by_sig.items()}
    by_class: dict[str, list[float]] = {}
    for sig, extra in sig_warm.items():
        by_class.setdefault(classes[sig], []).append(extra)
    warm_us = {cls: statistics.median(xs) for cls, xs in by_class.items()}
    warm_fallback = _median(sig_warm.values())

    def warm_of(o: Occurrence) -> float:
        return sig_warm.get(o.signature, warm_us.get(o.op_class, warm_fallback))

    first: dict[str, list[float]] = {}
    for o in occurrences:
        if o.first_use and o.signature in hot_us:
            first.setdefault(o.op_class, []).append(seq_us(o) - hot_us[o.signature] - warm_of(o))
    first_use_us = {cls: statistics.median(xs) for cls, xs in first.items()}
    first_fallback = _median(x for xs in first.values() for x in xs)
    costs = ContextCosts(warm_us, warm_fallback, first_use_us, first_fallback)
    return costs, sig_warm
