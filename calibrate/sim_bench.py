"""The simulator's speed over graph sizes with a calibrated Profile as the cost model.

    python -m schedlab.calibrate.sim_bench --profile PROFILE [--sizes 1000,5000,20000,100000] [--repeats 5]
                                           [--slots 1,2] [--cores 2]

The random DAGs of `python -m schedlab.sim.bench`, each simulated with a new Profile
object bound to it per cold call (`Profile.for_graph(graph).for_slots(slots)`): reused,
cold and first simulated ops per second (`sim.bench.measure_cold`). A Profile answers the
simulator's cost table a column at a time (`calibrate.profile_columns`), as `sim.bench`'s
random cost model does with its draws kept on the graph; a Profile computes its answers
from the op's features on every cold call, so these rows are what a cold `simulate()`
costs with the cost model users run.
"""

from __future__ import annotations

import argparse

from schedlab.calibrate.profile import Profile
from schedlab.sim.bench import measure, print_cost_model_rows, size_args


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m schedlab.calibrate.sim_bench", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--profile", required=True, metavar="PROFILE", help="the calibrated Profile to cost the graphs with")
    size_args(ap)
    args = ap.parse_args(argv)
    profile = Profile.load(args.profile, check_machine=False)
    slots = [int(s) for s in args.slots.split(",")]
    for k in slots:
        measure(24, k, args.cores, "compiled", 1)  # load the compiled engine: once per process, not per graph
    print(f"random DAGs, {args.cores} cores, record=False, median of {args.repeats}; cost model: the Profile "
          f"{args.profile} (a new Profile object per cold call); simulated ops per second")
    print_cost_model_rows([int(s) for s in args.sizes.split(",")], slots, args.cores, args.repeats,
                          lambda g, k: profile.for_graph(g).for_slots(k))


if __name__ == "__main__":
    main()
