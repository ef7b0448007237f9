"""The placement strategies of `schedlab search --space placement --strategy S`.

- ``layers``: the human expert's split (`schedlab.layer_split`): contiguous layers in
  forward order, balanced by calibrated cost, one block per device. On a machine with GPUs
  the blocks go to the GPUs only (the expert places a model's layers on its accelerators
  and leaves the host CPU the input pipeline), else to every device.
- ``m-topo``, ``m-etf``, ``m-sct``: Baechi's memory-constrained heuristics
  (`search.placement.baechi`).
- ``rl``: the placement paper's grouper-placer trained with REINFORCE
  (`search.placement.rl`; run by `search.placement.rl_run`).
- ``optuna``: TPE over one device per group (`search.placement.space`).

Each seed strategy answers with one device per co-location group; the Plan is the
problem's `to_plan` of it over `space.base_plan()`.
"""

from __future__ import annotations

from collections.abc import Callable

from schedlab.errors import SchedlabError
from schedlab.layer_split import layer_split
from schedlab.plan import Plan
from schedlab.search.placement.problem import PlacementProblem
from schedlab.search.placement.space import base_plan
from schedlab.sim.cost import CostModel, op_cost_us

LAYERS = "layers"
RL = "rl"
M_TOPO, M_ETF, M_SCT = "m-topo", "m-etf", "m-sct"
HEURISTICS = (M_TOPO, M_ETF, M_SCT)
SEED_PLACEMENTS = (LAYERS, *HEURISTICS)  # one plan each, no training
PLACEMENT_STRATEGIES = (RL, *HEURISTICS, LAYERS)  # beside "optuna", which every space has


def expert_devices(problem: PlacementProblem) -> list[int]:
    """The device indices the expert split uses: the GPUs when there are any, else all."""
    gpus = [i for i, d in enumerate(problem.devices) if d.kind == "cuda"]
    return gpus or list(range(problem.n_devices))


def layers_split(problem: PlacementProblem, cost: CostModel) -> list[int]:
    """The expert split as one device index per group (see the module docstring)."""
    devs = expert_devices(problem)
    ids = [problem.devices[i].id for i in devs]
    layer_dev = layer_split(problem.graph, ids, op_cost_us(cost), threads=1)
    index = {d.id: i for i, d in enumerate(problem.devices)}
    first = index[ids[0]]
    out: list[int] = []
    for g in problem.groups:
        if g.layer is not None and g.layer in layer_dev:
            out.append(index[layer_dev[g.layer]])
        else:  # the default group (and any layer the split did not see): the first block's device
            out.append(first)
    return out


def heuristic(name: str) -> Callable[[PlacementProblem], list[int]]:
    from schedlab.search.placement.baechi import BAECHI

    if name not in BAECHI:
        raise SchedlabError(f"unknown Baechi heuristic {name!r}; use one of: {', '.join(BAECHI)}")
    return BAECHI[name]


def seed_placement_plans(name: str, problem: PlacementProblem, cost: CostModel) -> list[Plan]:
    """The plan of seed placement strategy `name` (``layers`` or a Baechi heuristic)."""
    if name == LAYERS:
        group_device = layers_split(problem, cost)
    elif name in HEURISTICS:
        group_device = heuristic(name)(problem)
    else:
        raise SchedlabError(f"unknown seed placement strategy {name!r}; use one of: {', '.join(SEED_PLACEMENTS)}")
    return [problem.to_plan(group_device, base_plan(), name=name)]
