"""Simulator speed over graph sizes: simulated ops per second, cold and reused.

    python -m schedlab.sim.bench [--sizes 1000,5000,20000,100000] [--repeats 5] [--slots 1,2] [--cores 2]

For each size, a random synthetic DAG (views included) is simulated under a plan of
`--slots` co-run slots on `--cores` cores, with record=False (the search's call):

- reused: a `Simulator` bound once and run again, as a search runs thousands of plans;
- cold: a new `simulate()` call per run, the simulator's set-up and the cost model's
  per-op lookups included (the graph object's flat arrays and one-device structure, kept
  on the graph, are warm);
- first: a graph object never simulated before, so nothing of the graph is warm. The
  compiled engine's machine code is loaded once per process (a fraction of a second,
  `sim.compiled`), before the first row: timed inside it, the 1,000-op one-slot row's
  first call read 3.9 thousand ops/s (2026-11-29 02:25, 2-core VM; loaded first, 363
  thousand).

The Python reference engine ("fast") is timed too on sizes up to 20k ops, for the ratio.

The random cost model answers the cost table a column at a time, as a Profile does
(`sim.testing.RandomColumnCost`: its per-op draws, a CRC of each op's name, kept on the
graph object as a Profile keeps what it reads of a graph), so a cold row is the
simulator's own cost; `--per-op-cost` asks it one op at a time instead (4 CRCs per op in
Python: 95% of a cold call at 20k ops, 2026-12-02). `python -m schedlab.calibrate.sim_bench
--profile PROFILE` times the same graphs with a calibrated Profile as the cost model, the
one users run (`calibrate.profile_columns`; `print_cost_model_rows`).

`measure_cold` times the same three on a real graph with a real cost model (a Profile;
`tests/bench`), where the cost model's own answers, not the loop, are most of a cold call.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from schedlab.graph import Graph
from schedlab.machine import Machine
from schedlab.plan import Plan, resolve
from schedlab.sim.cost import CostModel
from schedlab.sim.engine import Simulator, simulate
from schedlab.sim.testing import cpu_machine, random_cost, random_dag

HEADER = f"{'ops':>8} {'slots':>5} {'engine':>9} {'reused':>12} {'cold':>12} {'first':>12} {'step ms':>10}"


@dataclass(frozen=True)
class SpeedRow:
    ops: int
    slots: int
    engine: str
    reused_ops_per_s: float
    cold_ops_per_s: float
    first_ops_per_s: float
    step_ms: float  # the simulated step, a check that every engine simulated the same thing


def measure(n_ops: int, slots: int, cores: int, engine: str, repeats: int, *, columns: bool = True) -> SpeedRow:
    machine = cpu_machine(cores)
    cost = random_cost(1, columns=columns)
    plan = Plan(slots=slots, threads=max(1, cores // slots), order="critical-path")

    def fresh_graph() -> object:
        g = random_dag(n_ops, seed=1, window=24, view_share=0.2)
        _ = g.hash, g.succs  # the graph's own derived structure, not the simulator's work
        return g

    first: list[float] = []
    for _ in range(max(1, repeats // 2)):
        g = fresh_graph()
        r = resolve(g, plan, machine)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        simulate(g, r, machine, cost, record=False, engine=engine)  # type: ignore[arg-type]
        first.append(time.perf_counter() - t0)
    cold: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = simulate(g, r, machine, cost, record=False, engine=engine)  # type: ignore[arg-type]
        cold.append(time.perf_counter() - t0)
    sim = Simulator(g, machine, cost)  # type: ignore[arg-type]
    sim.run(r, record=False, engine=engine)
    reused: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.run(r, record=False, engine=engine)
        reused.append(time.perf_counter() - t0)
    return SpeedRow(
        ops=n_ops,
        slots=slots,
        engine=engine,
        reused_ops_per_s=n_ops / statistics.median(reused),
        cold_ops_per_s=n_ops / statistics.median(cold),
        first_ops_per_s=n_ops / statistics.median(first),
        step_ms=res.step_time_s * 1e3,
    )


@dataclass(frozen=True)
class ColdRow:
    ops: int
    plan: str
    first_ops_per_s: float  # a graph object and a cost model never used before: nothing warm
    cold_ops_per_s: float  # a new cost model object, on a graph object simulated before (its own structure warm)
    reused_ops_per_s: float  # one Simulator, run again (the search's path)
    step_s: float


def measure_cold(
    graph: Graph, machine: Machine, plan: Plan, cost_for: Callable[[Graph], CostModel], repeats: int = 7
) -> ColdRow:
    """Simulated ops per second of `plan` on `graph`, record=False; `cost_for(graph)` must
    return a new cost model object each call (as `Profile.for_graph(graph).for_slots(k)` does),
    so that a cold call finds none of its answers kept."""

    def timed(g: Graph, cost: CostModel) -> tuple[float, float]:
        r = resolve(g, plan, machine)
        t0 = time.perf_counter()
        res = simulate(g, r, machine, cost, record=False)
        return time.perf_counter() - t0, res.step_time_s

    first: list[float] = []
    steps: set[float] = set()
    for _ in range(max(1, repeats // 2)):
        fresh = dataclasses.replace(graph)  # the same ops in a new Graph object: nothing kept on it
        wall_s, step_s = timed(fresh, cost_for(fresh))
        first.append(wall_s)
        steps.add(step_s)
    timed(graph, cost_for(graph))  # the graph's own structure (not the cost model's answers) is kept
    cold: list[float] = []
    for _ in range(repeats):
        wall_s, step_s = timed(graph, cost_for(graph))
        cold.append(wall_s)
        steps.add(step_s)
    resolved = resolve(graph, plan, machine)
    sim = Simulator(graph, machine, cost_for(graph))
    sim.run(resolved, record=False)
    reused: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.run(resolved, record=False)
        reused.append(time.perf_counter() - t0)
    if len(steps) != 1:  # pragma: no cover - a simulation is deterministic
        raise AssertionError(f"the same plan simulated to different steps: {sorted(steps)}")
    n = len(graph.ops)
    return ColdRow(
        ops=n,
        plan=plan.describe(),
        first_ops_per_s=n / statistics.median(first),
        cold_ops_per_s=n / statistics.median(cold),
        reused_ops_per_s=n / statistics.median(reused),
        step_s=steps.pop(),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m schedlab.sim.bench", description=(__doc__ or "").split("\n")[0])
    size_args(ap)
    ap.add_argument("--python-up-to", type=int, default=20000, help="largest size the Python reference engine runs")
    ap.add_argument("--per-op-cost", action="store_true",
                    help="ask the random cost model one op at a time, not in columns (its own Python then dominates a cold call)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    for slots in (int(s) for s in args.slots.split(",")):
        measure(24, slots, args.cores, "compiled", 1)  # load the compiled engine: once per process, not per graph
    asked = "one op at a time" if args.per_op_cost else "in columns"
    print(f"random DAGs, {args.cores} cores, record=False, median of {args.repeats}, the cost model asked {asked}; "
          "simulated ops per second")
    print(HEADER)
    for n in sizes:
        for slots in (int(s) for s in args.slots.split(",")):
            engines = ["compiled"] + (["fast"] if n <= args.python_up_to else [])
            for engine in engines:
                r = measure(n, slots, args.cores, engine, args.repeats, columns=not args.per_op_cost)
                print(f"{r.ops:>8} {r.slots:>5} {r.engine:>9} {r.reused_ops_per_s:>12,.0f} {r.cold_ops_per_s:>12,.0f} "
                      f"{r.first_ops_per_s:>12,.0f} {r.step_ms:>10.3f}", flush=True)


def print_cost_model_rows(
    sizes: list[int], slots: list[int], cores: int, repeats: int, cost_for: Callable[[Graph, int], CostModel]
) -> None:
    """The random DAGs of `main`, timed with `cost_for(graph, slots)` as the cost model (a
    new object per call: `measure_cold`): reused, cold and first simulated ops per second."""
    print(HEADER)
    for n in sizes:
        for k in slots:
            plan = Plan(slots=k, threads=max(1, cores // k), order="critical-path")
            g = random_dag(n, seed=1, window=24, view_share=0.2)
            c = measure_cold(g, cpu_machine(cores), plan, lambda g, k=k: cost_for(g, k), repeats=repeats)  # type: ignore[misc]
            print(f"{c.ops:>8} {k:>5} {'compiled':>9} {c.reused_ops_per_s:>12,.0f} {c.cold_ops_per_s:>12,.0f} "
                  f"{c.first_ops_per_s:>12,.0f} {c.step_s * 1e3:>10.3f}", flush=True)


def size_args(ap: argparse.ArgumentParser) -> None:
    """The flags `main` and `calibrate.sim_bench` share."""
    ap.add_argument("--sizes", default="1000,5000,20000,100000", help="graph sizes in ops, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slots", default="1,2", help="co-run slots, comma-separated")
    ap.add_argument("--cores", type=int, default=2)


if __name__ == "__main__":
    main()
