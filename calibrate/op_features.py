"""What a Profile reads of a graph's ops that depends on the graph alone, as arrays.

Per op: its op class, the class it is fitted under (`signature.fit_class`, numbered), its
signature (`signature.graph_signatures`), whether it is a view, the first of its target
(`context.first_uses`), its FLOPs, bytes and outputs. Computed once per graph object and
kept on it, as the simulator keeps the graph's other derived structure
(`sim.cost_table.content_keys`): `calibrate.profile_columns` then reads a Profile's tables
for a few hundred ops with array indexing instead of a pass over the ops per cold call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedlab.calibrate.context import first_uses
from schedlab.calibrate.signature import graph_signatures, op_fit_class
from schedlab.graph import Graph, kept_on


@dataclass(frozen=True)
class OpFeatures:
    op_class: tuple[str, ...]  # per op
    fit_code: np.ndarray  # per op: its `fit_class` as an index into fit_keys
    fit_keys: tuple[str, ...]  # each distinct `fit_class`, numbered by first appearance
    fit_op_class: tuple[str, ...]  # the op class of each fit key
    signature: tuple[str, ...]  # per op
    is_view: np.ndarray  # per op, bool
    first_use: np.ndarray  # per op, bool: the first non-view op of its target
    flops: np.ndarray  # per op, float64
    nbytes: np.ndarray  # per op, float64 (bytes moved)
    n_outputs: np.ndarray  # per op, int64


def op_features(graph: Graph) -> OpFeatures:
    """`graph`'s `OpFeatures`, computed on the first call and kept on the graph object."""
    return kept_on(graph, "_cal_op_features", _build)


def _build(graph: Graph) -> OpFeatures:
    ops = graph.ops
    n = len(ops)
    numbers: dict[str, int] = {}
    fit_op_class: list[str] = []
    codes = np.empty(n, dtype=np.int64)
    for i, op in enumerate(ops):
        fk = op_fit_class(op)
        code = numbers.get(fk)
        if code is None:
            code = numbers[fk] = len(numbers)
            fit_op_class.append(op.op_class)
        codes[i] = code
    first = np.zeros(n, dtype=bool)
    first[list(first_uses(graph))] = True
    return OpFeatures(
        op_class=tuple(op.op_class for op in ops),
        fit_code=codes,
        fit_keys=tuple(numbers),
        fit_op_class=tuple(fit_op_class),
        signature=graph_signatures(graph),
        is_view=np.fromiter((op.is_view for op in ops), dtype=bool, count=n),
        first_use=first,
        flops=np.fromiter((float(op.flops) for op in ops), dtype=np.float64, count=n),
        nbytes=np.fromiter((float(op.bytes_moved) for op in ops), dtype=np.float64, count=n),
        n_outputs=np.fromiter((len(op.outputs) for op in ops), dtype=np.int64, count=n),
    )
