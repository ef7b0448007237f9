"""Simulator speed: simulated ops per second on a random synthetic graph.

    python -m sim.bench [--ops 2000] [--repeats 3] [--slots 4] [--cores 8]

Prints, for each engine and for record=False / record=True, the median over the repeats
of ops / wall time of `simulate` (preparation included), and the same for a `Simulator`
bound once and reused across runs, as a search does.
"""

from __future__ import annotations

import argparse
import statistics
import time

from schedlab.plan import Plan, resolve
from schedlab.sim.engine import Simulator, simulate
from schedlab.sim.testing import cpu_machine, random_cost, random_dag


def measure(
    n_ops: int, repeats: int, slots: int, cores: int, engine: str, record: bool, reuse: bool = False
) -> tuple[float, float]:
    """(median ops/s, simulated step time in ms)."""
    graph = random_dag(n_ops, seed=1, window=24)
    machine = cpu_machine(cores)
    plan = Plan(slots=slots, threads=max(1, cores // slots), order="critical-path")
    resolved = resolve(graph, plan, machine)
    cost = random_cost(1)
    _ = graph.hash  # computed once per graph (cached on it), not part of a simulation
    sim = Simulator(graph, machine, cost)
    if reuse:
        sim.run(resolved, record=False, engine=engine)  # fills its caches
    rates: list[float] = []
    step_ms = 0.0
    for _rep in range(repeats):
        t0 = time.perf_counter()
        if reuse:
            res = sim.run(resolved, record=record, engine=engine)
        else:
            res = simulate(graph, resolved, machine, cost, record=record, engine=engine)
        rates.append(n_ops / (time.perf_counter() - t0))
        step_ms = res.step_time_s * 1e3
    return statistics.median(rates), step_ms


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--cores", type=int, default=8)
    args = ap.parse_args(argv)
    print(f"random DAG of {args.ops} ops, {args.cores} cores, {args.slots} slots, median of {args.repeats}")
    for engine in ("fast", "simpy"):
        for record in (False, True):
            rate, step_ms = measure(args.ops, args.repeats, args.slots, args.cores, engine, record)
            print(f"  simulate()      engine={engine:5s} record={record!s:5s}  {rate:10,.0f} ops/s   (simulated step {step_ms:.3f} ms)")
        rate, _ = measure(args.ops, args.repeats, args.slots, args.cores, engine, False, reuse=True)
        print(f"  Simulator.run() engine={engine:5s} record=False  {rate:10,.0f} ops/s   (bound once, reused)")


if __name__ == "__main__":
    main()
