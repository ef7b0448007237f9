"""The seed papers' algorithms as search strategies beside Optuna's samplers.

Each strategy turns (graph, machine, cost model) into a few candidate Plans; the search
simulates them and records each as a trial of the same study (``user_attrs["strategy"]``),
so they compare with Optuna's trials on the same workload and cost model.

- ``paper-concurrency``: the model-guided scheduler of the concurrency-control paper (Liu,
  Li, Kestor, Vetter, IPDPS 2019). Per op, the thread count the fitted performance model
  says is fastest; ready ops are packed into free cores, critical path first. Here the
  packing is `s` co-run slots that each own ``cores // s`` cores (an op's threads are
  capped at its slot's share, so co-running ops fit in the free cores), for s = 1, 2, 4,
  ... cores; plus, for each s > 1, the unpacked variant where every op takes its best
  thread count over all cores and the cores are shared. The order is the longest
  remaining path first, costed with the model.
- ``ooo``: out-of-order backprop's single-device reordering (Oh et al., EuroSys 2022).
  Weight-gradient (W) work is taken off the critical path: it runs after the input-
  gradient (B) and forward work that is ready, on a second co-run slot beside the main
  one (the paper's sub-stream), with all, half or the last layers' W ops deferred, and
  the cores split between the main work and the W work, or shared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.machine import Machine
from schedlab.order import upward_rank_us
from schedlab.plan import Plan
from schedlab.search.space import OrderParams, cost_fn, parametric_order
from schedlab.sim.cost import CostModel

OPTUNA = "optuna"
PAPER_CONCURRENCY = "paper-concurrency"
OOO = "ooo"
STRATEGY_NAMES = (OPTUNA, PAPER_CONCURRENCY, OOO)
THREAD_TOLERANCE = 0.02  # a thread count within 2% of the fastest counts as fastest (fewer wins)


def best_threads(graph: Graph, cost: CostModel, max_threads: int, tolerance: float = THREAD_TOLERANCE) -> list[int]:
    """Per op, the fewest threads in 1..max_threads whose modelled kernel time is within
    `tolerance` of the fastest (views and ops the model finds flat get 1)."""
    out: list[int] = []
    for op in graph.ops:
        if op.is_view:
            out.append(1)
            continue
        times = [float(cost.kernel_us(op, k)) for k in range(1, max_threads + 1)]
        best = min(times)
        out.append(next(k for k, t in enumerate(times, start=1) if t <= best * (1.0 + tolerance)))
    return out


def compress_threads(graph: Graph, per_op: list[int]) -> tuple[int, dict[str, int], dict[int, int]]:
    """Per-op thread counts as a Plan says them: (default, per class, per op overrides).

    The default is the most common count; a class all of whose ops agree on another count
    gets a class entry; the remaining ops get per-op entries.
    """
    default = Counter(per_op).most_common(1)[0][0] if per_op else 1
    by_class: dict[str, set[int]] = {}
    for op in graph.ops:
        by_class.setdefault(op.op_class, set()).add(per_op[op.id])
    class_threads = {c: next(iter(ks)) for c, ks in by_class.items() if len(ks) == 1 and next(iter(ks)) != default}
    op_threads = {
        op.id: per_op[op.id]
        for op in graph.ops
        if len(by_class[op.op_class]) > 1 and per_op[op.id] != default
    }
    return default, class_threads, op_threads


def slot_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to `cores`, and `cores` itself."""
    out, s = [], 1
    while s <= cores:
        out.append(s)
        s *= 2
    if out[-1] != cores:
        out.append(cores)
    return out


def paper_concurrency(graph: Graph, machine: Machine, cost: CostModel) -> list[Plan]:
    """Candidate plans of the concurrency-control paper's scheduler (see the module docstring)."""
    cores = machine.default_device.cores
    order = parametric_order(graph, OrderParams(cp_weight=1.0), upward_rank_us(graph, cost_fn(cost, cores)))
    unpacked = best_threads(graph, cost, cores)
    plans: list[Plan] = []
    for s in slot_counts(cores):
        variants = [("packed", best_threads(graph, cost, max(1, cores // s)))]
        if s > 1:
            variants.append(("shared", unpacked))
        for how, per_op in variants:
            default, class_threads, op_threads = compress_threads(graph, per_op)
            plans.append(
                Plan(
                    slots=s,
                    threads=default,
                    class_threads=class_threads,
                    op_threads=op_threads,
                    order=order,
                    name=f"{PAPER_CONCURRENCY} slots={s} {how}",
                )
            )
    return plans


def ooo(graph: Graph, machine: Machine, cost: CostModel) -> list[Plan]:
    """Candidate plans of out-of-order backprop on one device (see the module docstring)."""
    cores = machine.default_device.cores
    up = upward_rank_us(graph, cost_fn(cost, cores))
    w_ops = [op.id for op in graph.ops if op.kind is OpKind.W]
    deferrals = (
        ("all W last", OrderParams(w_defer_frac=1.0, w_defer_dist=1.0)),
        ("all W by a quarter step", OrderParams(w_defer_frac=1.0, w_defer_dist=0.25)),
        ("last layers' W last", OrderParams(w_defer_frac=0.5, w_defer_dist=1.0)),
    )
    plans = [Plan(slots=1, threads=cores, order="w-last", name=f"{OOO} one slot, all W last")]
    if cores < 2 or not w_ops:
        return plans
    splits: list[tuple[str, int, int]] = []  # (label, main threads, W threads)
    for w_threads in sorted({1, cores // 4, cores // 2} - {0}):
        splits.append((f"cores {cores - w_threads}+{w_threads}", cores - w_threads, w_threads))
    splits.append(("cores shared", cores, cores))
    for split_label, main_threads, w_threads in splits:
        op_threads = {i: w_threads for i in w_ops} if w_threads != main_threads else {}
        for defer_label, params in deferrals:
            order: str | tuple[int, ...] = "w-last" if params == deferrals[0][1] else parametric_order(graph, params, up)
            plans.append(
                Plan(
                    slots=2,
                    threads=main_threads,
                    op_threads=op_threads,
                    order=order,
                    name=f"{OOO} two slots, {split_label}, {defer_label}",
                )
            )
    return plans


STRATEGIES: dict[str, Callable[[Graph, Machine, CostModel], list[Plan]]] = {
    PAPER_CONCURRENCY: paper_concurrency,
    OOO: ooo,
}


def strategy_plans(name: str, graph: Graph, machine: Machine, cost: CostModel) -> list[Plan]:
    """The candidate plans of seed strategy `name`, distinct, in a fixed order."""
    if name not in STRATEGIES:
        raise SchedlabError(f"unknown seed strategy {name!r}; use one of: {', '.join(STRATEGIES)}")
    seen: set[str] = set()
    out: list[Plan] = []
    for plan in STRATEGIES[name](graph, machine, cost):
        if plan.hash not in seen:
            seen.add(plan.hash)
            out.append(plan)
    return out
