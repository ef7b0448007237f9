"""A Graph as flat integer arrays, and the one-device Structure built from them, compiled.

`sim.prepare.build_structure` handles any placement in Python; for the placement every
single-device plan has (all ops on one CPU device), `flat_single_device` builds the same
tokens, references and storages as CSR arrays with Numba, so a fresh `simulate()` call
does not spend most of its time in dictionaries. `tests/sim/test_equivalence.py` checks
that it equals `sim.compiled.flatten(build_structure(...))` array for array.

The arrays of a graph (`GraphArrays`: op inputs and outputs as CSR, value sizes, alias
roots, producers) and its one-device structure depend on the graph alone; they are kept
per graph object, as the Graph keeps its own `preds` and `succs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, alias_roots, kept_on
from schedlab.sim.compiled import FlatStructure, csr
from schedlab.sim.prepare import PINNED

I64 = np.int64


@dataclass(frozen=True)
class GraphArrays:
    in_ptr: np.ndarray  # op -> its input value ids, CSR
    in_idx: np.ndarray
    out_ptr: np.ndarray  # op -> its output value ids, CSR
    out_idx: np.ndarray
    nbytes: np.ndarray  # per value (0: no metadata)
    roots: np.ndarray  # per value: the value whose storage it uses
    producer: np.ndarray  # per value: op id, -1 for graph inputs
    graph_inputs: np.ndarray  # value ids
    graph_outputs: np.ndarray  # value ids


def graph_arrays(graph: Graph) -> GraphArrays:
    """The flat arrays of `graph`, computed once per graph object and kept on it."""
    return kept_on(graph, "_sim_flat_arrays", _build_arrays)


def _build_arrays(graph: Graph) -> GraphArrays:
    ops = graph.ops
    in_ptr, in_idx = csr([op.inputs for op in ops])
    out_ptr, out_idx = csr([op.outputs for op in ops])
    n_values = len(graph.values)
    producer = np.full(n_values, -1, dtype=I64)
    for v, o in graph.producer.items():
        producer[v] = o
    return GraphArrays(
        in_ptr=in_ptr,
        in_idx=in_idx,
        out_ptr=out_ptr,
        out_idx=out_idx,
        nbytes=np.fromiter((0 if m is None else m.nbytes for m in graph.values), dtype=I64, count=n_values),
        roots=np.asarray(alias_roots(graph), dtype=I64),
        producer=producer,
        graph_inputs=np.fromiter((i.value for i in graph.inputs), dtype=I64, count=len(graph.inputs)),
        graph_outputs=np.fromiter((o.value for o in graph.outputs), dtype=I64, count=len(graph.outputs)),
    )


def flat_single_device(graph: Graph) -> FlatStructure:
    """The Structure of `graph` with every op on one device, as `sim.compiled.flatten` gives it;
    built once per graph object and kept on it (it depends on the graph alone, and the
    compiled loop copies what it changes)."""
    return kept_on(graph, "_sim_flat_one", _flat_single_device)


def _flat_single_device(graph: Graph) -> FlatStructure:
    a = graph_arrays(graph)
    n = len(graph.ops)
    res = _build(n, len(graph.values), a.in_ptr, a.in_idx, a.out_ptr, a.out_idx, a.nbytes, a.roots, a.producer,
                 a.graph_inputs, a.graph_outputs, PINNED)  # fmt: skip
    pending, succ_ptr, succ_idx, rel_ptr, rel_idx, alloc, refs, sbytes, live, bad_op, bad_value = res
    if bad_op >= 0:
        op = graph.ops[bad_op]
        raise SchedlabError(f"graph op {bad_op} ({op.name}) reads value {bad_value}, which no op writes and is no input")
    return FlatStructure(pending, succ_ptr, succ_idx, rel_ptr, rel_idx, alloc, refs, sbytes, int(live))


@njit(cache=True)
def _add_unique(buf, start, end, x):  # type: ignore[no-untyped-def]
    """Append `x` to buf[start:end] unless it is there already (lists of a few items); the new end."""
    for q in range(start, end):
        if buf[q] == x:
            return end
    buf[end] = x
    return end + 1


@njit(cache=True)
def _build(n, n_values, in_ptr, in_idx, out_ptr, out_idx, nbytes, roots, producer, g_in, g_out, pinned):  # type: ignore[no-untyped-def]
    # Values with a home: graph inputs and op outputs (all on the one device).
    home = np.zeros(n_values, dtype=np.bool_)
    for v in g_in:
        home[v] = True
    for p in range(out_ptr[n]):
        home[out_idx[p]] = True
    # Storages, numbered in the order build_structure creates them.
    sid = np.full(n_values, -1, dtype=np.int64)
    cap_s = n_values + 1
    sbytes = np.zeros(cap_s, dtype=np.int64)
    refs = np.zeros(cap_s, dtype=np.int64)
    n_s = 0
    live = 0
    for v in g_in:
        r = roots[v]
        if sid[r] < 0:
            sid[r] = n_s
            n_s += 1
        s = sid[r]
        refs[s] = pinned
        if r == v:
            sbytes[s] += nbytes[v]
            live += nbytes[v]
    for v in g_out:
        if home[v]:
            r = roots[v]
            if sid[r] < 0:
                sid[r] = n_s
                n_s += 1
            refs[sid[r]] = pinned
    # Per op: references it releases, local producers it waits for, bytes it allocates.
    rel_ptr = np.zeros(n + 1, dtype=np.int64)
    rel_idx = np.empty(in_ptr[n] + out_ptr[n], dtype=np.int64)
    wait_ptr = np.zeros(n + 1, dtype=np.int64)
    wait_idx = np.empty(in_ptr[n], dtype=np.int64)
    alloc = np.zeros(n, dtype=np.int64)
    n_rel = 0
    n_wait = 0
    for o in range(n):
        r0 = n_rel
        w0 = n_wait
        for p in range(in_ptr[o], in_ptr[o + 1]):
            v = in_idx[p]
            if not home[v]:
                return (wait_ptr, wait_ptr, wait_idx, rel_ptr, rel_idx, alloc, refs, sbytes, 0, o, v)
            r = roots[v]
            if sid[r] < 0:
                sid[r] = n_s
                n_s += 1
            n_rel = _add_unique(rel_idx, r0, n_rel, sid[r])
            pr = producer[v]
            if pr >= 0:
                n_wait = _add_unique(wait_idx, w0, n_wait, pr)
        for p in range(out_ptr[o], out_ptr[o + 1]):
            v = out_idx[p]
            if roots[v] == v:
                if sid[v] < 0:
                    sid[v] = n_s
                    n_s += 1
                s = sid[v]
                sbytes[s] += nbytes[v]
                alloc[o] += nbytes[v]
                n_rel = _add_unique(rel_idx, r0, n_rel, s)
        for q in range(r0, n_rel):
            s = rel_idx[q]
            if refs[s] != pinned:
                refs[s] += 1
        rel_ptr[o + 1] = n_rel
        wait_ptr[o + 1] = n_wait
    # Local successors: for o ascending, o joins the list of each op it waits for.
    pending = np.empty(n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    for o in range(n):
        pending[o] = wait_ptr[o + 1] - wait_ptr[o]
        for q in range(wait_ptr[o], wait_ptr[o + 1]):
            counts[wait_idx[q]] += 1
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    for o in range(n):
        succ_ptr[o + 1] = succ_ptr[o] + counts[o]
    fill = succ_ptr[:n].copy()
    succ_idx = np.empty(succ_ptr[n], dtype=np.int64)
    for o in range(n):
        for q in range(wait_ptr[o], wait_ptr[o + 1]):
            p = wait_idx[q]
            succ_idx[fill[p]] = o
            fill[p] += 1
    return (pending, succ_ptr, succ_idx, rel_ptr, rel_idx[:n_rel].copy(), alloc, refs[:n_s].copy(),
            sbytes[:n_s].copy(), live, -1, -1)  # fmt: skip
