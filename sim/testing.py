"""Small synthetic Graphs and a table-driven cost model, for tests and benchmarks.

Graphs are built directly from `Op`s with aten target strings and made-up TensorMetas: no
torch, no capture. Every op writes one value; `GraphBuilder.op` returns that value's id.

    b = GraphBuilder("tiny")
    x = b.input("x", nbytes=400)
    y = b.op("mm", [x], nbytes=800)
    b.output(y)
    graph = b.build()
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta, kept_on
from schedlab.machine import Device, Link, Machine
from schedlab.plan import Plan, ResolvedPlan

_TARGETS = ("aten.mm.default", "aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor", "aten.sum.dim_IntList")
_VIEW_TARGET = "aten.view.default"


class GraphBuilder:
    """Builds a Graph op by op, in program order."""

    def __init__(self, name: str = "synthetic") -> None:
        self.name = name
        self._values: list[TensorMeta] = []
        self._inputs: list[GraphInput] = []
        self._outputs: list[GraphOutput] = []
        self._ops: list[Op] = []

    def _value(self, nbytes: int, alias_of: int | None = None) -> int:
        self._values.append(TensorMeta(shape=(max(nbytes // 4, 1),), dtype="float32", nbytes=nbytes, alias_of=alias_of))
        return len(self._values) - 1

    def input(self, name: str, nbytes: int = 4096, role: InputRole = InputRole.PARAM) -> int:
        v = self._value(nbytes)
        self._inputs.append(GraphInput(v, name, role))
        return v

    def op(
        self,
        name: str,
        inputs: Sequence[int],
        *,
        nbytes: int = 4096,
        target: str = "aten.mm.default",
        kind: OpKind = OpKind.F,
        flops: float = 0.0,
        view: bool = False,
    ) -> int:
        """Append an op reading `inputs`; returns the id of the value it writes.

        A view op writes a value aliasing its first input (it allocates nothing).
        """
        ins = tuple(dict.fromkeys(inputs))
        if view and not ins:
            raise ValueError("a view op needs an input to alias")
        out = self._value(nbytes, alias_of=ins[0] if view else None)
        self._ops.append(
            Op(
                id=len(self._ops),
                name=name,
                target=_VIEW_TARGET if view else target,
                kind=kind,
                args=tuple({"v": v} for v in ins),
                kwargs={},
                inputs=ins,
                outputs=(out,),
                flops=flops,
                bytes_moved=0 if view else nbytes + sum(self._values[v].nbytes for v in ins),
                is_view=view,
            )
        )
        return out

    def output(self, value: int, name: str = "loss", role: OutputRole = OutputRole.LOSS) -> None:
        self._outputs.append(GraphOutput(value, name, role))

    def build(self) -> Graph:
        g = Graph(
            name=self.name,
            inputs=tuple(self._inputs),
            outputs=tuple(self._outputs),
            ops=tuple(self._ops),
            values=tuple(self._values),
            meta={"synthetic": True},
        )
        g.validate()
        return g


def chain(n: int, nbytes: int = 4096, name: str = "chain") -> Graph:
    """x -> op0 -> op1 -> ... -> op{n-1} (the last value is the output)."""
    b = GraphBuilder(name)
    v = b.input("x", nbytes)
    for i in range(n):
        v = b.op(f"op{i}", [v], nbytes=nbytes)
    b.output(v)
    return b.build()


def independent(*names: str) -> Graph:
    """Ops of the given names, each reading the one input and nothing else, each an output."""
    b = GraphBuilder("independent")
    x = b.input("x", 64)
    for n in names:
        b.output(b.op(n, [x], nbytes=64), n)
    return b.build()


def fork_join(width: int, nbytes: int = 4096, name: str = "fork_join") -> Graph:
    """x -> src -> (b0 .. b{width-1}) -> join: ops "src", "b0".., "join"."""
    b = GraphBuilder(name)
    x = b.input("x", nbytes)
    s = b.op("src", [x], nbytes=nbytes)
    branches = [b.op(f"b{i}", [s], nbytes=nbytes) for i in range(width)]
    b.output(b.op("join", branches, nbytes=nbytes, target="aten.add.Tensor"))
    return b.build()


def random_dag(
    n_ops: int,
    seed: int = 0,
    *,
    n_inputs: int = 8,
    max_reads: int = 3,
    window: int = 16,
    view_share: float = 0.1,
    n_outputs: int = 4,
    name: str = "random",
) -> Graph:
    """A random DAG: each op reads 1..max_reads of the `window` most recent values.

    Ops get random kinds, targets and sizes; `view_share` of them are views. The last value
    is the loss; `n_outputs - 1` random others are gradient outputs.
    """
    rng = random.Random(seed)
    b = GraphBuilder(name)
    vals = [b.input(f"in{i}", rng.choice((256, 1024, 4096, 65536))) for i in range(max(n_inputs, 1))]
    kinds = (OpKind.F, OpKind.B, OpKind.W, OpKind.OPT)
    for i in range(n_ops):
        recent = vals[-window:]
        reads = rng.sample(recent, k=min(len(recent), rng.randint(1, max_reads)))
        view = rng.random() < view_share
        vals.append(
            b.op(
                f"op{i}",
                reads,
                nbytes=rng.choice((256, 1024, 4096, 16384, 65536)),
                target=rng.choice(_TARGETS),
                kind=kinds[min(3, i * 4 // max(n_ops, 1))] if rng.random() < 0.8 else rng.choice(kinds),
                flops=float(rng.randint(1, 100) * 1e6),
                view=view,
            )
        )
    b.output(vals[-1])
    op_values = vals[max(n_inputs, 1) :]
    for j, v in enumerate(rng.sample(op_values[:-1], k=min(max(n_outputs - 1, 0), max(len(op_values) - 1, 0)))):
        b.output(v, f"grad{j}", OutputRole.GRAD)
    return b.build()


def random_plan(graph: Graph, cores: int, seed: int = 0, *, max_slots: int = 4) -> Plan:
    """A random valid plan for one device of `cores` cores: slots, threads and order."""
    rng = random.Random(seed)
    classes = sorted({op.op_class for op in graph.ops})
    return Plan(
        slots=rng.randint(1, max(1, min(max_slots, cores))),
        threads=rng.randint(1, cores),
        class_threads={c: rng.randint(1, cores) for c in classes if rng.random() < 0.5},
        order=rng.choice(("topo", "critical-path", "w-last", f"random:{rng.randint(0, 10**6)}")),
        name=f"random{seed}",
    )


def cpu_machine(cores: int, memory_bytes: int = 2**40, name: str = "test-cpu") -> Machine:
    """A machine of one CPU device "cpu0"."""
    return Machine(name=name, devices=(Device(id="cpu0", kind="cpu", cores=cores, memory_bytes=memory_bytes),))


def two_device_machine(bw_bytes_per_s: float = 1e9, latency_s: float = 0.0, shared: bool = True) -> Machine:
    """Devices "a" and "b" (CPU, 4 cores) with one link a->b (named "wire" when shared)."""
    devs = tuple(Device(id=i, kind="cpu", cores=4, memory_bytes=2**40) for i in ("a", "b"))
    return Machine(
        name="test-2dev",
        devices=devs,
        links=(Link("a", "b", bw_bytes_per_s, latency_s, name="wire" if shared else ""),),
    )


def place(resolved: ResolvedPlan, devices: Sequence[str] | Callable[[int], str]) -> ResolvedPlan:
    """`resolved` with op i on `devices[i]` (or `devices(i)`): placement until Plans carry one."""
    n = len(resolved.device)
    dev = tuple(devices(i) for i in range(n)) if callable(devices) else tuple(devices)
    if len(dev) != n:
        raise ValueError(f"placement names {len(dev)} devices for {n} ops")
    return dataclasses.replace(resolved, device=dev)


KernelTable = Mapping[str, float] | Callable[[Op, int], float]
Floats = TypeVar("Floats", float, np.ndarray)  # one draw, or an array of them


@dataclass
class TableCost:
    """A CostModel from a table: kernel time by op name (or a function), fixed dispatch.

    `kernel`: op name -> µs (threads ignored), or a function (op, threads) -> µs; ops not in
    the table take `default_kernel_us`. `dispatch`: µs for every op, or op name -> µs.
    `corun`: (op, busy cores of others, total cores) -> slowdown; None: no interference.
    """

    kernel: KernelTable = field(default_factory=dict)
    dispatch: float | Mapping[str, float] = 0.0
    corun: Callable[[Op, int, int], float] | None = None
    default_kernel_us: float = 10.0
    default_dispatch_us: float = 0.0

    def kernel_us(self, op: Op, threads: int) -> float:
        if callable(self.kernel):
            return float(self.kernel(op, threads))
        return float(self.kernel.get(op.name, self.default_kernel_us))

    def dispatch_us(self, op: Op) -> float:
        if isinstance(self.dispatch, Mapping):
            return float(self.dispatch.get(op.name, self.default_dispatch_us))
        return float(self.dispatch)

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        return 1.0 if self.corun is None else float(self.corun(op, busy_cores, total_cores))


def random_cost(seed: int = 0, *, integer: bool = False, columns: bool = True) -> RandomCost:
    """Random kernel times (shrinking with threads), dispatch 1-20 µs, mild co-run slowdown.

    `integer`: whole-microsecond times (many exact ties, to test tie-breaking). `columns`:
    the model also answers the cost table a column at a time (`RandomColumnCost`), as a
    Profile does; False: one op at a time. The floats are the same either way.
    """
    return RandomColumnCost(seed, integer) if columns else RandomCost(seed, integer)


_DISPATCH_US = (1.0, 20.0)  # RandomCost's draws: (lo, hi) of dispatch and of a kernel at one thread
_KERNEL_US = (5.0, 400.0)


def _unit_draw(seed: int, key: str) -> float:
    """A deterministic draw in [0, 1) for `key` (exact: a CRC over a power of two)."""
    return zlib.crc32(f"{seed}:{key}".encode()) / 2**32


def _scaled(u: Floats, lo_hi: tuple[float, float], integer: bool) -> Floats:
    """A draw `u` (one, or an array) scaled to [lo, hi), whole when `integer`."""
    lo, hi = lo_hi
    x = lo + (hi - lo) * u
    return np.round(x) if integer else x  # half to even, as Python's round


def _at_threads(base: Floats, threads: int, integer: bool) -> Floats:
    """A one-thread kernel time (or an array of them) at `threads`."""
    return np.round(base / threads) if integer else base / threads**0.8


@dataclass(frozen=True)
class RandomCost:
    """Deterministic pseudo-random costs per op name (see `random_cost`); views cost 0."""

    seed: int = 0
    integer: bool = False

    def _draw(self, key: str, lo: float, hi: float) -> float:
        return float(_scaled(_unit_draw(self.seed, key), (lo, hi), self.integer))

    def kernel_us(self, op: Op, threads: int) -> float:
        if op.is_view:
            return 0.0
        return float(_at_threads(self._draw(op.name, *_KERNEL_US), threads, self.integer))

    def dispatch_us(self, op: Op) -> float:
        return self._draw("dispatch:" + op.name, *_DISPATCH_US)

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        return 1.0 + 0.5 * busy_cores / total_cores


@dataclass(frozen=True)
class RandomColumnCost(RandomCost):
    """RandomCost that also answers whole columns (`sim.cost_table.ColumnCostModel`), the
    same floats as its per-op methods. Each op's two CRCs are drawn once per graph object
    and seed and kept on the graph (`kept_on`), as a Profile keeps what it reads of a
    graph's ops: a cold simulation then costs the simulator's own work, not a CRC per op
    and answer (95% of a cold call at 20k ops when asked op by op, 2026-12-02)."""

    def _unit_draws(self, graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per op: the kernel's and dispatch's draws in [0, 1), and whether it is a view."""
        def build(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            def unit(prefix: str) -> np.ndarray:
                return np.fromiter((_unit_draw(self.seed, prefix + op.name) for op in g.ops), dtype=np.float64,
                                   count=len(g.ops))
            views = np.fromiter((op.is_view for op in g.ops), dtype=bool, count=len(g.ops))
            return unit(""), unit("dispatch:"), views
        return kept_on(graph, f"_random_cost_draws:{self.seed}", build)

    def dispatch_column(self, graph: Graph, ids: np.ndarray) -> np.ndarray:
        return _scaled(self._unit_draws(graph)[1][ids], _DISPATCH_US, self.integer)

    def kernel_column(self, graph: Graph, ids: np.ndarray, threads: int) -> np.ndarray:
        u, _, views = self._unit_draws(graph)
        out = _at_threads(_scaled(u[ids], _KERNEL_US, self.integer), threads, self.integer)
        return np.where(views[ids], 0.0, out)

    def corun_slowdown_column(self, graph: Graph, ids: np.ndarray, busy_cores: int, total_cores: int) -> np.ndarray:
        return np.full(len(ids), 1.0 + 0.5 * busy_cores / total_cores)
