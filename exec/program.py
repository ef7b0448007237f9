"""Compile a Graph into Python callables once, so a step pays no per-op preparation.

Two forms are generated from the same per-op call expressions:

- `Program.op_fns[i](V)`: one small function per op reading and writing the shared value
  list `V` (used by co-running workers, which pick ops dynamically);
- `Program.straight_line(sequence, threads, keep)`: one function running a fixed op
  sequence with values in local variables, freeing each after its last use, and stamping
  `perf_counter_ns()` between ops (used with one slot, where the order is static; a rank's
  sequence also calls its communication, `Extern`).

Arguments are decoded from the Graph's JSON encoding (see `schedlab/graph.py`) at compile
time; aten ops are resolved from their names, so a Graph loaded from JSON runs too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import torch

from schedlab.aten import decode_enum, fast_callable, resolve_overload
from schedlab.graph import Graph
from schedlab.rng import random_op_index, seeded


def resolve_target(target: str) -> tuple[Callable[..., Any], bool]:
    """"aten.addmm.default" -> (the op's C++ callable, whether it returns a sequence).

    The callable skips `OpOverload.__call__`'s Python frame.
    """
    op = resolve_overload(target)
    returns = op._schema.returns
    unpack = len(returns) > 1 or (len(returns) == 1 and isinstance(returns[0].type, torch.ListType))
    return fast_callable(op), unpack


def _decode_const(a: Any) -> Any:
    return decode_enum(a) if isinstance(a, dict) else a


class _Emitter:
    """Turns encoded args into Python source, with constants in a shared table. With a
    `device`, every device argument (a factory op's ``device=cpu``) names that device."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.consts: list[Any] = []
        self.device = device

    def const(self, x: Any) -> str:
        self.consts.append(x)
        return f"K[{len(self.consts) - 1}]"

    def expr(self, a: Any, ref: Callable[[int], str]) -> str:
        if isinstance(a, dict) and "v" in a:
            return ref(int(a["v"]))
        if isinstance(a, list):
            return "[" + ", ".join(self.expr(x, ref) for x in a) + "]"
        if a is None or isinstance(a, bool):
            return repr(a)
        if isinstance(a, int):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else self.const(a)
        if isinstance(a, str):
            return repr(a)
        if self.device is not None and isinstance(a, dict) and "device" in a:
            return self.const(self.device)
        return self.const(_decode_const(a))


@dataclass(frozen=True)
class Extern:
    """An item of a straight line that is not one of the program's ops: `call(key, *reads)`,
    `call` a name in the line's namespace, returning the values `writes` (one value, a
    tuple of several, or nothing)."""

    call: str
    key: int
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()

    def source(self, ref: Callable[[int], str]) -> str:
        call = f"{self.call}({', '.join([str(self.key), *(ref(v) for v in self.reads)])})"
        return " = ".join([", ".join(ref(v) for v in self.writes), call]) if self.writes else call


@dataclass(frozen=True)
class Program:
    graph: Graph
    fns: tuple[Callable[..., Any], ...]  # per op: the resolved aten callable
    unpack: tuple[bool, ...]  # per op: whether it returns a sequence of tensors
    call_src: tuple[str, ...]  # per op: "F[i](args...)" with refs left as {v} placeholders
    consts: tuple[Any, ...]
    op_fns: tuple[Callable[[list[Any]], None], ...]

    def straight_line(
        self,
        sequence: Sequence[int | Extern],
        threads: Sequence[int],
        keep: Set[int],
        *,
        inputs: Sequence[int] | None = None,
        env: Mapping[str, Callable[..., Any]] | None = None,
    ) -> Callable[[list[Any], list[int]], None]:
        """A function `run(V, T)` that runs `sequence` in order.

        An item is one of the program's ops (its index), or an `Extern` call into `env`
        (a rank's communication). `V` holds the `inputs` (default: the graph's) on entry
        and the values in `keep` on return; every other value lives in a local variable,
        deleted after its last use. `T[k]` gets the `perf_counter_ns()` taken before the
        k-th item (and `T[n]` after the last). `threads[i]`: op i's intra-op threads.
        """
        g = self.graph
        reads_of = [item.reads if isinstance(item, Extern) else g.ops[item].inputs for item in sequence]
        last_use: dict[int, int] = {}
        for pos, reads in enumerate(reads_of):
            for v in reads:
                last_use[v] = pos
        input_ids = [inp.value for inp in g.inputs] if inputs is None else list(inputs)
        held = set(input_ids)
        lines = ["def run(V, T):"]
        lines += [f"    v{v} = V[{v}]" for v in input_ids]
        cur = -1
        for pos, item in enumerate(sequence):
            lines.append(f"    T[{pos}] = ns()")
            if isinstance(item, Extern):
                lines.append("    " + item.source(lambda v: f"v{v}"))
                writes = item.writes
            else:
                if threads[item] != cur:
                    lines.insert(len(lines) - 1, f"    S({threads[item]})")
                    cur = threads[item]
                lines.append("    " + self._assign(item, lambda v: f"v{v}"))
                writes = g.ops[item].outputs
            dead = [v for v in reads_of[pos] if last_use.get(v) == pos and v not in keep and v not in held]
            dead += [v for v in writes if v not in last_use and v not in keep]
            if dead:
                lines.append("    del " + ", ".join(f"v{v}" for v in dict.fromkeys(dead)))
        lines.append(f"    T[{len(sequence)}] = ns()")
        lines += [f"    V[{v}] = v{v}" for v in sorted(keep) if v not in held]
        namespace = {"F": self.fns, "K": self.consts, "S": torch.set_num_threads, "ns": time.perf_counter_ns,
                     **(env or {})}
        exec(compile("\n".join(lines), f"<schedlab step {g.name}>", "exec"), namespace)
        run: Callable[[list[Any], list[int]], None] = namespace["run"]  # type: ignore[assignment]
        return run

    def _assign(self, i: int, ref: Callable[[int], str]) -> str:
        op = self.graph.ops[i]
        call = self.call_src[i].format(**{f"v{v}": ref(v) for v in op.inputs})
        outs = [ref(v) for v in op.outputs]
        if not self.unpack[i]:
            return f"{outs[0]} = {call}"
        return ", ".join(outs) + (", = " if len(outs) == 1 else " = ") + call


def compile_graph(
    graph: Graph, random_index: Mapping[int, int] | None = None, device: str | torch.device | None = None,
) -> Program:
    """`graph` compiled (module docstring). Its seeded random ops draw the numbers eager
    PyTorch draws while `schedlab.rng.seeded_random` is active; `random_index` (op id ->
    its k, `rng.random_op_index`) is given where `graph` is part of a larger one whose ops
    it renumbered (a rank's), else taken from `graph`. `device` ("cuda"): the tensors the
    graph's ops create are made there (its inputs must be there too); default as captured."""
    index = random_op_index(graph) if random_index is None else random_index
    em = _Emitter(None if device is None else torch.device(device))
    fns: list[Callable[..., Any]] = []
    unpack: list[bool] = []
    call_src: list[str] = []
    for op in graph.ops:
        fn, multi = resolve_target(op.target)
        if op.id in index:
            fn = seeded(fn, index[op.id], op.target)
        fns.append(fn)
        unpack.append(multi)

        def ref(v: int) -> str:
            return f"{{v{v}}}"

        args = [em.expr(a, ref) for a in op.args]
        kwargs = [f"{k}={em.expr(a, ref)}" for k, a in op.kwargs.items()]
        call_src.append(f"F[{op.id}](" + ", ".join(args + kwargs) + ")")
    consts = tuple(em.consts)
    prog = Program(graph=graph, fns=tuple(fns), unpack=tuple(unpack), call_src=tuple(call_src), consts=consts, op_fns=())
    # Per-op functions over the shared value list, compiled together in one module.
    src = []
    for op in graph.ops:
        src.append(f"def op{op.id}(V):")
        src.append("    " + prog._assign(op.id, lambda v: f"V[{v}]"))
    namespace: dict[str, Any] = {"F": prog.fns, "K": consts}
    exec(compile("\n".join(src) or "pass", f"<schedlab ops {graph.name}>", "exec"), namespace)
    op_fns = tuple(namespace[f"op{op.id}"] for op in graph.ops)
    return Program(graph=graph, fns=prog.fns, unpack=prog.unpack, call_src=prog.call_src, consts=consts, op_fns=op_fns)
