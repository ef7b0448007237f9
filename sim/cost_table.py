"""The cost model's answers for one graph's ops, asked once each and kept as arrays.

The compiled engine reads dispatch µs per op, kernel µs per (op, threads) and co-run
slowdown per (op, busy cores of the others) as NumPy arrays. A fresh `simulate()` call
spends nearly all its time filling them, in calls to the cost model: three or four per op.
A `CostTable` fills a whole column with one comprehension and one array write, and asks
only for the entries a plan reads that are not there yet.

Ops that cost the same are asked once when the cost model says which they are: a cost
model with a `cost_keys(graph)` method (`KeyedCostModel`) returns one key per op
(hashable values, or integers in an array, grouped without hashing each), and promises
that ops with equal keys get equal answers from `kernel_us`, `dispatch_us` and
`corun_slowdown` at every thread and busy count. The table then asks
one op of each key (the lowest id) and gives its answers to the others. A step repeats
its layers, so a real graph has a few dozen keys per few hundred ops. Without the method
every op is asked, as before; the answers are the same floats either way.

`content_keys(graph)` helps a cost model build its keys: per op, everything it carries
but its identity (id, name, layer, the ids of the values it reads and writes), kept on
the graph object, and `content_groups(graph)` numbers them. Two ops with equal content
keys have equal `calibrate.signature`s, so a cost model that reads an op only through its
content can use them as they are; one that also reads its identity (a Profile bound to a
graph charges the first op of each target its first-use extra) adds what it reads.

A cost model that answers a whole column at once (`ColumnCostModel`: a Profile does,
`calibrate.profile_columns`) is asked so: dispatch of every key's op, kernel of every
key's op at one thread count, co-run slowdown at one busy count, one call each, the same
floats as its per-op methods give. A column is then filled whole where a plan misses any
of it; a per-op cost model is asked only for the missing entries.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, Op, kept_on
from schedlab.sim.cost import CostModel
from schedlab.sim.wake import wake_cost

I64 = np.int64
_COLUMN_METHODS = ("dispatch_column", "kernel_column", "corun_slowdown_column")  # ColumnCostModel's


@runtime_checkable
class KeyedCostModel(Protocol):
    def cost_keys(self, graph: Graph) -> Sequence[Hashable] | np.ndarray | None:
        """One key per op of `graph`: ops with equal keys cost the same (see the module
        docstring), as hashable values or as an integer array (grouped without hashing
        each key: `content_groups` helps build one); None: no keys, ask every op."""
        ...


@runtime_checkable
class ColumnCostModel(Protocol):
    """A cost model that answers for many ops of a graph at once (`ids`, an array of op
    ids), as arrays holding the same floats its `dispatch_us`, `kernel_us` and
    `corun_slowdown` give one op at a time. One table passes the same `ids` array object on
    every call, so the model may keep what it reads of those ops. Where the model has
    `wake_us` (`sim.wake`) it may add `wake_column(graph, ids, threads)` likewise."""

    def dispatch_column(self, graph: Graph, ids: np.ndarray) -> np.ndarray: ...

    def kernel_column(self, graph: Graph, ids: np.ndarray, threads: int) -> np.ndarray: ...

    def corun_slowdown_column(self, graph: Graph, ids: np.ndarray, busy_cores: int, total_cores: int) -> np.ndarray: ...


def content_keys(graph: Graph) -> tuple[Hashable, ...]:
    """Per op of `graph`: its target, kind, FLOPs, bytes, view-ness, numbers of inputs and
    outputs, its arguments with every tensor written as one tag (as `calibrate.signature`
    writes them "T"), whether it reads a strided input, a softmax's row length and a grouped convolution's channels per group. Computed once per graph object and kept on it."""
    return kept_on(graph, "_sim_content_keys", _content_keys)


def _content_keys(graph: Graph) -> tuple[Hashable, ...]:
    return tuple(
        (op.target, op.kind.value, repr(float(op.flops)), int(op.bytes_moved), op.is_view, len(op.inputs),
         len(op.outputs), _frozen(op.args), _frozen(op.kwargs) if op.kwargs else None, op.strided,
         op.row_len, op.group_channels)
        for op in graph.ops
    )  # fmt: skip


def content_groups(graph: Graph) -> np.ndarray:
    """Per op of `graph`, the number of its `content_keys` key (numbered by first
    appearance): ops with equal numbers have equal content keys. Computed once per graph
    object and kept on it; a cost model that keys its ops by content and a little more
    builds integer keys from it, which `cost_groups` groups in arrays."""
    return kept_on(graph, "_sim_content_groups", _content_groups)


def _content_groups(graph: Graph) -> np.ndarray:
    groups = _numbered(content_keys(graph))
    groups.flags.writeable = False
    return groups


class _Tag:
    """A marker inside a frozen argument; equal only to itself."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_TENSOR, _LIST, _DICT, _FLOAT, _BOOL = (_Tag(n) for n in ("tensor", "list", "dict", "float", "bool"))


def _frozen(a: object) -> Hashable:
    """An argument in the Graph's JSON encoding as a hashable value; two are equal only if
    their JSON texts, tensors written "T", are (1, 1.0 and True apart; -0.0 and 0.0 apart)."""
    t = type(a)
    if t is int or t is str or a is None:
        return a  # type: ignore[return-value]
    if t is dict:
        d: dict[str, object] = a  # type: ignore[assignment]
        if len(d) == 1 and "v" in d:
            return _TENSOR
        return (_DICT, *((k, _frozen(d[k])) for k in sorted(d)))
    if t is list or t is tuple:
        return (_LIST, *(_frozen(x) for x in a))  # type: ignore[attr-defined]
    if t is float:
        return (_FLOAT, repr(a))
    if t is bool:
        return (_BOOL, a)
    return (t, repr(a))


def cost_groups(graph: Graph, cost: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(group of each op, representative op of each group): ops the cost model keys alike
    share a group, numbered by first appearance; without keys each op is its own group."""
    n = len(graph.ops)
    ask = getattr(cost, "cost_keys", None)  # a KeyedCostModel (getattr: a runtime Protocol check costs µs)
    keys = ask(graph) if callable(ask) else None
    if keys is None:
        ident = np.arange(n, dtype=I64)
        return ident, ident
    if len(keys) != n:
        raise SchedlabError(f"cost model gave {len(keys)} cost keys for graph {graph.name!r} of {n} ops")
    if not isinstance(keys, np.ndarray):
        keys = _numbered(keys)  # hashable keys as integers, numbered by first appearance
    elif keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise SchedlabError(f"cost model gave cost keys of dtype {keys.dtype}, shape {keys.shape}; "
                            "integer keys must be a 1-D integer array")
    # The grouping is a function of the keys alone: kept on the graph per key array, as a
    # Profile bound to the graph gives the same keys to every cold call
    kept: dict[bytes, tuple[np.ndarray, np.ndarray]] = kept_on(graph, "_sim_cost_groups", lambda _: {})
    tag = keys.dtype.str.encode() + keys.tobytes()
    hit = kept.get(tag)
    if hit is not None:
        return hit
    _, reps, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(reps, kind="stable")  # groups numbered by their first op
    number = np.empty_like(order)
    number[order] = np.arange(len(order), dtype=order.dtype)
    out = (number[inverse].astype(I64), reps[order].astype(I64))
    for a in out:
        a.flags.writeable = False
    if len(kept) >= 8:
        kept.pop(next(iter(kept)))
    kept[tag] = out
    return out


def _numbered(keys: Sequence[Hashable]) -> np.ndarray:
    """Each key's number, keys numbered by first appearance (equal keys, equal numbers)."""
    first: dict[Hashable, int] = {}
    setdefault = first.setdefault
    return np.fromiter((setdefault(k, len(first)) for k in keys), dtype=I64, count=len(keys))  # a new key: the next number


class CostTable:
    """Dispatch, kernel and co-run slowdown of every op of `graph` under `cost`, as arrays.

    `max_threads`: the largest thread count a plan may give an op (the machine's most
    cores). The cost model must be a pure function of its arguments.
    """

    def __init__(self, graph: Graph, cost: CostModel, max_threads: int) -> None:
        self.graph = graph
        self.cost = cost
        self.max_threads = max_threads
        self.group, self.reps = cost_groups(graph, cost)
        n_groups = len(self.reps)
        self.keyed = n_groups < len(graph.ops)  # some ops share their answers
        self._dispatch_us: np.ndarray | None = None  # per op
        self._kernel_us = np.full((n_groups, max_threads + 1), np.nan)  # [group, threads]
        self._wake_us: np.ndarray | None = None  # [group, threads], once asked
        self._basis_us: np.ndarray | None = None  # [group, threads], once asked (a cost model with `team_basis_us`)
        self._slowdown: dict[int, np.ndarray] = {}  # total cores -> [group, busy cores of the others]
        self._slowdown_ops: dict[int, np.ndarray] = {}  # the same per op (keyed: expanded when filled)
        # a ColumnCostModel is asked whole columns of the groups' ops (`reps`); else op by op
        self._columns = all(callable(getattr(cost, m, None)) for m in _COLUMN_METHODS)

    def dispatch_us(self) -> np.ndarray:
        """Dispatch µs of every op."""
        if self._dispatch_us is None:
            if self._columns:
                per_group = np.asarray(self.cost.dispatch_column(self.graph, self.reps), dtype=np.float64)  # type: ignore[attr-defined]
            else:
                ops, ask = self.graph.ops, self.cost.dispatch_us
                per_group = np.fromiter((ask(ops[r]) for r in self.reps.tolist()), dtype=np.float64, count=len(self.reps))
            self._dispatch_us = per_group[self.group]
        return self._dispatch_us

    def kernel_us(self, threads: np.ndarray, ops: np.ndarray | None = None) -> np.ndarray:
        """Kernel µs of every op at its thread count (`threads[op]`, 1..max_threads); with
        `ops`, of op `ops[i]` at `threads[i]` for each i."""
        column = self.cost.kernel_column if self._columns else None  # type: ignore[attr-defined]
        return self._by_threads(self._kernel_us, self.cost.kernel_us, threads, ops, column)

    def wake_us(self, threads: np.ndarray, ops: np.ndarray | None = None) -> np.ndarray:
        """What each op pays to wake throttled OpenMP helpers (`sim.wake`), as `kernel_us`
        indexes it; zeros for a cost model without `wake_us`."""
        ask = wake_cost(self.cost)
        if ask is None:
            return np.zeros(len(threads), dtype=np.float64)
        if self._wake_us is None:
            self._wake_us = np.full_like(self._kernel_us, np.nan)
        column = getattr(self.cost, "wake_column", None) if self._columns else None
        return self._by_threads(self._wake_us, ask, threads, ops, column if callable(column) else None)

    def team_basis_us(self, threads: np.ndarray, ops: np.ndarray | None = None) -> np.ndarray:
        """What the demand rule compares each op's speedup on (`sim.cost.team_basis`), as
        `kernel_us` indexes it: the kernel times themselves for a cost model without
        `team_basis_us`."""
        ask = getattr(self.cost, "team_basis_us", None)
        if not callable(ask):
            return self.kernel_us(threads, ops)
        if self._basis_us is None:
            self._basis_us = np.full_like(self._kernel_us, np.nan)
        column = getattr(self.cost, "team_basis_column", None) if self._columns else None
        return self._by_threads(self._basis_us, ask, threads, ops, column if callable(column) else None)

    def _by_threads(
        self, table: np.ndarray, ask: Callable[[Op, int], float], threads: np.ndarray, ops: np.ndarray | None,
        column: Callable[[Graph, np.ndarray, int], np.ndarray] | None = None,
    ) -> np.ndarray:
        """`ask(op, threads)` of each op (or of `ops[i]` at `threads[i]`), filling the
        [group, threads] `table` where it has no answer yet; with `column`, the whole
        thread-count column of each missing entry at once."""
        if threads.size and (threads.min() < 1 or threads.max() > self.max_threads):
            raise SchedlabError(f"thread counts must be 1..{self.max_threads}, got {threads.min()}..{threads.max()}")
        group = self.group if ops is None else self.group[ops]
        out = table[group, threads]
        missing = np.flatnonzero(np.isnan(out))
        if missing.size and column is not None:
            for k in np.unique(threads[missing]).tolist():
                table[:, k] = column(self.graph, self.reps, k)
            out = table[group, threads]
        elif missing.size:
            # Each missing (group, threads) pair once.
            stride = self.max_threads + 1
            g_of, k_of = np.divmod(np.unique(group[missing] * stride + threads[missing]), stride)
            graph_ops = self.graph.ops
            table[g_of, k_of] = np.fromiter(
                (ask(graph_ops[r], k) for r, k in zip(self.reps[g_of].tolist(), k_of.tolist(), strict=True)),
                dtype=np.float64, count=len(g_of),
            )  # fmt: skip
            out = table[group, threads]
        return out

    def slowdown(self, total_cores: int, busy_cols: int) -> np.ndarray:
        """slowdown[op, b] for b < `busy_cols` busy cores of the others, on a device of
        `total_cores` cores (columns beyond are not filled: NaN)."""
        table = self._slowdown.get(total_cores)
        if table is None:
            table = self._slowdown[total_cores] = np.full((len(self.reps), total_cores + 1), np.nan)
        ops, ask, reps = self.graph.ops, self.cost.corun_slowdown, self.reps.tolist()
        filled = False
        for b in range(min(busy_cols, total_cores + 1)):
            if reps and np.isnan(table[0, b]):
                if self._columns:
                    table[:, b] = self.cost.corun_slowdown_column(self.graph, self.reps, b, total_cores)  # type: ignore[attr-defined]
                else:
                    table[:, b] = np.fromiter((ask(ops[r], b, total_cores) for r in reps), dtype=np.float64, count=len(reps))
                filled = True
        if not self.keyed:
            return table
        per_op = self._slowdown_ops.get(total_cores)
        if per_op is None or filled:
            per_op = self._slowdown_ops[total_cores] = table[self.group]
        return per_op
