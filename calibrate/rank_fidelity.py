"""Fidelity on several ranks: how well the simulator predicts plans that span local ranks.

For each workload, a spread of multi-rank plans (`RANK_PLAN_SPREAD`, one line each) runs
on the real multi-process executor (`exec.launch.run_ranks`: one gloo rank per device of
`host_ranks(N)`, each on its share of the cores) and is predicted by the simulator with
the Profile's link fits (`calibrate.links.apply_link_fit`, `Profile.allreduce_us`) and
what each communication op costs its rank (`Profile.comm_host_us`). Every row carries its
`plan_kind`:

- ``placed``: the step's layers cut into contiguous blocks, one per rank (the expert
  split, balanced by calibrated cost; and other cut points), activations and gradients
  sent between the ranks;
- ``data-parallel``: one replica per rank on its part of the batch, gradients averaged by
  bucketed all-reduces (bucket sizes, orders);
- ``reverse-first-k``: data parallel under the `reverse-first-k:K` order (Oh et al.),
  run for several steps back to back in steady state (`schedlab.steps`; so is one plain
  data-parallel plan, to compare), a step's time being the sequence's over its steps.
- ``pipeline``: the batch split into micro-batches and the layers into one stage per
  rank (equal shares of layers), run under a schedule generator (gpipe, 1f1b, ...;
  `schedlab.pipeline_plan.with_named_schedule`), activations and gradients of every
  micro-batch sent between the ranks.

Two ways to predict, as on one device (`calibrate.fidelity`): trace-calibrated (the
Profile plus the op times of one-process, one-thread runs of the model's full step, of
its per-replica step and of its micro-batch step, none of them a scored plan, each pinned
to a core beside its twin on another: `calibrate.twin`), and profile-only (the Profile alone:
what the held-out protocol reports for models calibration never saw). The measured runs
are shared by both. Measured in several rounds (`measure_ranks`), the calibration runs
too: one per shape at the start of each round, their steps pooled (`with_calibration`),
so that calibration and measurement meet the same spells of a shared host.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from schedlab.calibrate.fidelity import (
    PROFILE_ONLY,
    TRACE_CALIBRATED,
    FidelityRow,
    Measurement,
    error_summary,
    fidelity_rows,
    overall_summary,
    pooled_rounds,
    predict,
    row_from_json,
)
from schedlab.calibrate.host_load import CpuSnapshot, snapshot
from schedlab.calibrate.links import apply_link_fit
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.trace_cal import joined_traces
from schedlab.calibrate.twin import Twin
from schedlab.errors import SchedlabError
from schedlab.exec.launch import RANK_WARMUP
from schedlab.graph import Graph
from schedlab.layer_split import layer_costs_us, layer_split, layers_in_order
from schedlab.machine import Machine, host_ranks
from schedlab.order import OpCostUs
from schedlab.pipeline_plan import with_named_schedule
from schedlab.plan import DEFAULT_STEADY_STEPS, Plan, ResolvedPlan, resolve
from schedlab.trace import Trace

PLACED = "placed"
DATA_PARALLEL = "data-parallel"
REVERSE_FIRST_K = "reverse-first-k"
PIPELINE = "pipeline"
HYBRID = "hybrid"  # pipelines with data-parallel replicas (4 or more ranks)
PLAN_KINDS = (PLACED, DATA_PARALLEL, REVERSE_FIRST_K, PIPELINE, HYBRID)
ONE_DEVICE = "one-device"  # the plan kind of the one-device spread's rows


@dataclass(frozen=True)
class RankPlanSpec:
    """One plan of the multi-rank spread, as data.

    `placement`: "default" (every op of a replica on its first device), "layers" (the
    balanced expert split, `schedlab.layer_split`), or "layers:F" (two blocks of layers
    cut where the first reaches share F of the step's calibrated cost). `replicas` 0 means
    one replica per device. `steps`: steps back to back in steady state (`resolve(...,
    steps=S)`), 1 for one step at a time. `schedule`: a pipeline over a replica's
    devices under that generator, with `micro_batches` (the placement is then the
    schedule's stages).
    """

    kind: str
    name: str
    placement: str = "default"
    replicas: int = 1
    bucket_mb: float = 25.0
    order: str = "topo"
    threads: int | None = 1
    steps: int = 1
    schedule: str | None = None
    micro_batches: int = 1

    def plan(self, graph: Graph, devices: Sequence[str], op_cost_us: OpCostUs | None) -> Plan:
        """The Plan of this spec for `graph` (the per-replica step when `replicas` > 1) on `devices`."""
        replicas = self.n_replicas(len(devices))
        group = list(devices[: max(1, len(devices) // replicas)])
        # Batch norm over each replica's (micro-batch's) part of the batch changes the numbers, not the time.
        base = Plan(threads=self.threads, order=self.order, name=self.name, replicas=replicas,
                    bucket_mb=self.bucket_mb, device=group[0],
                    split_batch_stats=replicas > 1 or self.micro_batches > 1)
        if self.schedule is not None:
            return with_named_schedule(base, tuple(group), self.schedule, self.micro_batches)
        if self.placement == "default":
            return base
        if self.placement == "layers":
            return _with_layers(base, layer_split(graph, group, op_cost_us, threads=1))
        if self.placement.startswith("layers:"):
            if len(group) != 2:
                raise SchedlabError(f"plan {self.name}: placement {self.placement!r} cuts the layers in two; "
                                    f"a replica here has {len(group)} devices")
            share = float(self.placement.split(":", 1)[1])
            return _with_layers(base, layers_cut_at(graph, group, share, op_cost_us))
        raise SchedlabError(f"plan {self.name}: unknown placement {self.placement!r} (default, layers, layers:F)")

    def n_replicas(self, devices: int) -> int:
        return devices if self.replicas == 0 else self.replicas

    def fits(self, devices: int) -> bool:
        """Whether this spec makes sense on `devices` ranks."""
        replicas = self.n_replicas(devices)
        per_replica = devices // replicas if replicas <= devices else 0
        if per_replica < 1 or devices % replicas:
            return False
        if self.schedule is not None:
            return per_replica >= 2
        if self.placement == "default":
            return per_replica == 1
        return per_replica == 2 if self.placement.startswith("layers:") else per_replica >= 2


def _with_layers(plan: Plan, layer_devices: dict[str, str]) -> Plan:
    from dataclasses import replace

    return replace(plan, layer_devices=layer_devices)


def layers_cut_at(graph: Graph, devices: Sequence[str], share: float, op_cost_us: OpCostUs | None) -> dict[str, str]:
    """Layers in forward order, the first block on devices[0] up to the layer where the running
    cost first reaches `share` of the whole, the rest on devices[1] (each block non-empty)."""
    if not 0.0 < share < 1.0:
        raise SchedlabError(f"a layer cut share must be between 0 and 1, got {share}")
    order = layers_in_order(graph)
    if len(order) < 2:
        raise SchedlabError(f"graph {graph.name!r} has fewer than 2 layers to cut")
    cost = layer_costs_us(graph, op_cost_us, threads=1)
    total = sum(cost.get(lay, 0.0) for lay in order) or 1.0
    run, cut = 0.0, len(order) - 1
    for i, lay in enumerate(order[:-1]):
        run += cost.get(lay, 0.0)
        if run >= share * total:
            cut = i + 1
            break
    return {lay: devices[0] if i < cut else devices[1] for i, lay in enumerate(order)}


TRACE_WARMUP = 2  # the one-process calibration runs' (`trace_calibrated`)

# The spread: adding a plan is adding one line.
RANK_PLAN_SPREAD: tuple[RankPlanSpec, ...] = (
    RankPlanSpec(PLACED, "layers", placement="layers"),
    RankPlanSpec(PLACED, "layers-30", placement="layers:0.3"),
    RankPlanSpec(PLACED, "layers-70", placement="layers:0.7"),
    RankPlanSpec(PLACED, "layers-w-last", placement="layers", order="w-last"),
    RankPlanSpec(DATA_PARALLEL, "dp-b25", replicas=0, bucket_mb=25.0),
    RankPlanSpec(DATA_PARALLEL, "dp-b1", replicas=0, bucket_mb=1.0),
    RankPlanSpec(DATA_PARALLEL, "dp-b25-w-last", replicas=0, bucket_mb=25.0, order="w-last"),
    RankPlanSpec(DATA_PARALLEL, "dp-b4-critical-path", replicas=0, bucket_mb=4.0, order="critical-path"),
    RankPlanSpec(DATA_PARALLEL, "dp-b1-steady", replicas=0, bucket_mb=1.0, steps=DEFAULT_STEADY_STEPS),
    RankPlanSpec(REVERSE_FIRST_K, "dp-b1-rfk2", replicas=0, bucket_mb=1.0, order="reverse-first-k:2",
                 steps=DEFAULT_STEADY_STEPS),
    RankPlanSpec(REVERSE_FIRST_K, "dp-b25-rfk1", replicas=0, bucket_mb=25.0, order="reverse-first-k:1",
                 steps=DEFAULT_STEADY_STEPS),
    RankPlanSpec(PIPELINE, "pipe-1f1b-m2", schedule="1f1b", micro_batches=2),
    RankPlanSpec(PIPELINE, "pipe-1f1b-m4", schedule="1f1b", micro_batches=4),
    RankPlanSpec(PIPELINE, "pipe-gpipe-m4", schedule="gpipe", micro_batches=4),
    RankPlanSpec(HYBRID, "pipe-r2-1f1b-m2", schedule="1f1b", micro_batches=2, replicas=2),
)


def rank_plan_spread(devices: int, specs: Sequence[RankPlanSpec] = RANK_PLAN_SPREAD,
                     names: Sequence[str] = ()) -> list[RankPlanSpec]:
    """The specs that fit `devices` ranks (only those in `names`, when given)."""
    if devices < 2:
        raise SchedlabError(f"multi-rank fidelity needs at least 2 devices, got {devices}")
    unknown = set(names) - {s.name for s in specs}
    if unknown:
        raise SchedlabError(f"unknown plans {sorted(unknown)}; the spread has {', '.join(s.name for s in specs)}")
    out = [s for s in specs if s.fits(devices) and (not names or s.name in names)]
    if not out:
        raise SchedlabError(f"no plan of the spread fits {devices} devices")
    return out


# ---- measuring and predicting ------------------------------------------------------------------


@dataclass(frozen=True)
class RankCase:
    """One spec resolved for one workload: the graph both backends take and its inputs."""

    spec: RankPlanSpec
    graph: Graph  # the full step, or replica 0's step marked for the replicas
    resolved: ResolvedPlan
    inputs: dict[int, Any]  # input tensors of the graph the ranks run (`PlanStep.inputs_for`)


@dataclass(frozen=True)
class RankFidelity:
    """One workload over the multi-rank spread, measured once, predicted by each method."""

    workload: str
    rows: dict[str, list[FidelityRow]] = field(default_factory=dict)  # method -> one row per plan


def rank_results_from_json(d: dict[str, Any]) -> list[RankFidelity]:
    """The workloads a multi-rank results file (`rank_summary`) holds, as measured and
    predicted, in file order: what `--resume` carries over."""
    out: dict[str, RankFidelity] = {}
    for p in d["plans"]:
        r = row_from_json(p)
        out.setdefault(r.workload, RankFidelity(r.workload)).rows.setdefault(r.method, []).append(r)
    return list(out.values())


StepOf = Callable[[int, int], Any]  # (replicas, micro-batches) -> `schedlab.data_parallel.PlanStep`


def rank_cases(
    workload: str, step_of: StepOf, specs: Sequence[RankPlanSpec], machine: Machine, op_cost_us: OpCostUs | None
) -> list[RankCase]:
    """Every spec resolved against its graph and `machine` before either backend runs."""
    devices = [d.id for d in machine.devices]
    out: list[RankCase] = []
    for spec in specs:
        step = step_of(spec.n_replicas(len(devices)), spec.micro_batches)
        graph = step.graph
        try:
            plan = spec.plan(graph, devices, op_cost_us)
            resolved = resolve(graph, plan, machine, op_cost_us=op_cost_us, steps=spec.steps)
        except SchedlabError as e:
            raise SchedlabError(f"{workload}, plan {spec.name}: {e}") from None
        out.append(RankCase(spec, graph, resolved, step.inputs_for(resolved.run_graph(graph))))
    return out


def measure_ranks(
    workload: str, cases: Sequence[RankCase], machine: Machine, steps: int, warmup: int,
    progress: Callable[[], None] | None = None, rounds: int = 1, before_round: Callable[[], None] | None = None,
) -> list[Measurement]:
    """Each case on the multi-process executor: `warmup` untimed steps, then `steps` timed;
    in `rounds` rounds over all the cases (round-robin, so a slow spell of the host falls
    on every plan alike rather than on one; `before_round` called at the start of each),
    pooled per case (`pooled_rounds`)."""
    from schedlab.exec import DistBackend

    if rounds < 1:
        raise SchedlabError(f"rounds must be at least 1, got {rounds}")
    per_round: list[list[Measurement]] = [[] for _ in cases]
    for _ in range(rounds):
        if before_round is not None:
            before_round()
        for case, taken in zip(cases, per_round, strict=True):
            before, children0 = snapshot(), _children_s()
            run = DistBackend(case.inputs, warmup=warmup, workload=workload).run(
                case.graph, case.resolved, machine, steps=steps)
            taken.append(Measurement(
                run=run, foreign_cpu_frac=_foreign_frac(before, snapshot(), _children_s() - children0)))
            if progress is not None:
                progress()
    return [pooled_rounds(taken) for taken in per_round]


def _children_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _foreign_frac(start: CpuSnapshot | None, end: CpuSnapshot | None, children_s: float) -> float | None:
    """Share of the CPU used by processes other than this one and its ranks (reaped children)."""
    if start is None or end is None or end.total_s <= start.total_s:
        return None
    foreign = (end.busy_s - start.busy_s) - (end.own_s - start.own_s) - children_s
    return min(1.0, max(0.0, foreign / (end.total_s - start.total_s)))


def step_shapes(specs: Sequence[RankPlanSpec], devices: int) -> list[tuple[int, int]]:
    """The (replicas, micro-batches) of the steps `specs` run on `devices` ranks, each once."""
    return sorted({(s.n_replicas(devices), s.micro_batches) for s in specs})


def trace_calibrated(profile: Profile, step_of: StepOf, shapes: Sequence[tuple[int, int]], steps: int,
                     warmup: int = TRACE_WARMUP) -> Profile:
    """`profile` plus the op times of one-process, one-slot, one-thread, program-order runs
    of the model's step for each (replicas, micro-batches) shape (the full step; the
    per-replica one; one micro-batch's), this
    process pinned to one core as a rank of one core runs (`calibrate.trace_cal`), beside the
    same step on another core (`calibrate.twin`). None of
    them is a scored plan."""
    return with_calibration(profile, calibration_traces(step_of, shapes, steps, warmup))


CalibrationTraces = dict[tuple[int, int], tuple[Graph, list[Trace]]]  # shape -> its graph, its runs' traces


def calibration_traces(step_of: StepOf, shapes: Sequence[tuple[int, int]], steps: int, warmup: int = TRACE_WARMUP,
                       into: CalibrationTraces | None = None, twin: bool = True) -> CalibrationTraces:
    """One calibration run per shape (`trace_calibrated`), its trace added to `into`'s;
    with `twin` (and a second core), beside the same step on another core (`calibrate.twin`)."""
    from schedlab.exec import run_steps
    from schedlab.machine import detect_host

    out: CalibrationTraces = {} if into is None else into
    host = detect_host()
    pin = hasattr(os, "sched_setaffinity")
    before = os.sched_getaffinity(0) if pin else set()
    others = sorted(before - {min(before)}) if pin else []
    try:
        if pin:  # on one core, as a rank of `host_ranks` runs (its share of the cores: one here)
            os.sched_setaffinity(0, {min(before)})
        for r, m in sorted(set(shapes)):
            step = step_of(r, m)
            captured = step.parts[0] if step.parts else step.full
            # beside its twin on another core, as a rank computes beside its neighbours (`calibrate.twin`)
            with Twin(captured.graph, captured.input_values, others[0]) if twin and others else nullcontext():
                res = run_steps(captured.graph, captured.input_values, Plan(threads=1), host, steps=steps,
                                warmup=warmup)
            out.setdefault((r, m), (captured.graph, []))[1].append(res.trace)
    finally:
        if pin:
            os.sched_setaffinity(0, before)
    return out


def with_calibration(profile: Profile, traces: CalibrationTraces) -> Profile:
    """`profile` plus each shape's op times over all its runs' steps (`Profile.with_trace`
    of their events together: the median per signature spans every run)."""
    for _, (graph, runs) in sorted(traces.items()):
        profile = profile.with_trace(joined_traces(runs), graph)
    return profile


def ranks_machine(devices: int, profile: Profile) -> Machine:
    """This host as `devices` local ranks, its links as `profile` fitted them: what the
    spread is measured on and predicted for."""
    return apply_link_fit(host_ranks(devices), profile)


def rank_fidelity(
    workload: str,
    step_of: StepOf,
    specs: Sequence[RankPlanSpec],
    profile: Profile,
    devices: int,
    methods: Sequence[str] = (TRACE_CALIBRATED,),
    steps: int = 3,
    warmup: int = RANK_WARMUP,
    progress: Callable[[], None] | None = None,
    rounds: int = 1,
) -> RankFidelity:
    """Measure every spec on `devices` local ranks (in `rounds` round-robin rounds,
    `measure_ranks`); predict each with every method (`PROFILE_ONLY`: `profile` alone;
    `TRACE_CALIBRATED`: `trace_calibrated`)."""
    from schedlab.sim.cost import op_cost_us

    unknown = set(methods) - {PROFILE_ONLY, TRACE_CALIBRATED}
    if unknown or not methods:
        raise SchedlabError(f"methods must be among {PROFILE_ONLY}, {TRACE_CALIBRATED}; got {list(methods)}")
    machine = ranks_machine(devices, profile)
    cases = rank_cases(workload, step_of, specs, machine, op_cost_us(profile))
    shapes = step_shapes([c.spec for c in cases], devices)
    traces: CalibrationTraces = {}

    def calibrate() -> None:  # each round, so the calibration meets the host as the rounds did
        calibration_traces(step_of, shapes, steps, into=traces)

    measured = measure_ranks(workload, cases, machine, steps, warmup, progress, rounds=rounds,
                             before_round=calibrate if TRACE_CALIBRATED in methods and rounds > 1 else None)
    if TRACE_CALIBRATED in methods and rounds == 1:  # after the measurements, as before rounds existed
        calibrate()
    out = RankFidelity(workload)
    for method in methods:
        cost = profile
        if method == TRACE_CALIBRATED:
            cost = with_calibration(profile, traces)
        rows: list[FidelityRow] = []
        for case, meas in zip(cases, measured, strict=True):
            (pred,) = predict(case.graph, [case.resolved], cost, machine)
            (row,) = fidelity_rows(workload, case.graph, [case.resolved], [meas], [pred], method)
            rows.append(_with_kind(row, case.spec.kind, len(case.resolved.run_graph(case.graph))))
        out.rows[method] = rows
    return out


def _with_kind(row: FidelityRow, kind: str, ops: int) -> FidelityRow:
    from dataclasses import replace

    return replace(row, plan_kind=kind, ops=ops)


# ---- figures ---------------------------------------------------------------------------------


def rank_summary(results: Sequence[RankFidelity], methods: Sequence[str]) -> dict[str, Any]:
    """Per workload ("models") and method: the errors over all its plans and per plan kind;
    "overall" per method and kind; every row ("plans", each scored: no plan of the spread
    is one a prediction was calibrated on). Plain JSON (fractions, not percent)."""
    workloads: list[dict[str, Any]] = []
    for res in results:
        entry: dict[str, Any] = {"workload": res.workload}
        for method in methods:
            rows = res.rows.get(method, [])
            entry[_key(method)] = {
                **error_summary(rows),
                "kinds": {k: error_summary([r for r in rows if r.plan_kind == k])
                          for k in PLAN_KINDS if any(r.plan_kind == k for r in rows)},
            }
        workloads.append(entry)
    overall: dict[str, Any] = {}
    for method in methods:
        rows = [r for res in results for r in res.rows.get(method, [])]
        overall[_key(method)] = {
            **_pooled(rows, [w[_key(method)] for w in workloads]),
            "kinds": {k: _pooled([r for r in rows if r.plan_kind == k],
                                 [w[_key(method)]["kinds"][k] for w in workloads if k in w[_key(method)]["kinds"]])
                      for k in PLAN_KINDS if any(r.plan_kind == k for r in rows)},
        }
    plans = [{**r.__dict__, "error": r.error, "scored": True}
             for res in results for m in methods for r in res.rows.get(m, [])]
    return {"overall": overall, "models": workloads, "plans": plans}


def _key(method: str) -> str:
    return method.replace("-", "_")


def _pooled(rows: Sequence[FidelityRow], per_workload: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return overall_summary([r.error for r in rows], per_workload)
