"""The Profile: calibrated cost-model parameters of one machine, as versioned JSON.

A Profile implements `sim.cost.CostModel`. `kernel_us(op, threads)` looks up, in order:

1. the op's signature (`calibrate.signature`) in the table of measured kernels, from a
   real trace (`with_trace`) or a microbenchmark. A thread count that was not measured
   is interpolated between measured ones (linear in 1/threads) or, outside them,
   extrapolated from the nearest measured one with the shape of the class model;
2. the fitted model of the op's class (`Op.op_class`) on (flops, bytes, threads);
3. for a class never measured, or whose fit is not trusted (`ClassFit.trusted`), the machine's roofline (`calibrate.roofline`: peak FLOP/s
   and memory bandwidth measured in calibration); a Profile without one (version 1
   files) uses the model fitted on every memory-bound point (`fallback`).
   `coverage(graph)` counts the ops of a graph that fell through to it.

Whichever answers, the kernel is as it runs in a step, plus what its data not being in the
caches costs there (`cold_us`, `calibrate.cold`; profiles of `calibrate --cold` only) and,
in a Profile bound to a graph (`for_graph`), the first use of its target (`first_use_us`,
`calibrate.context`).

Views cost no kernel time: only dispatch (`dispatch_us`), the probe view's plus what
the view's own call costs beyond it (`calibrate.views`), and in a co-run plan the wait
for a worker that every op of it pays (`kernel_us`). `dispatch_us` is the executor's
cost per op with one slot; `profile.for_slots(plan.slots)` gives the co-run executor's
(measured with two slots of negligible ops; see `calibrate.dispatch`).

Times are microseconds. Held-out errors are percent. A Profile measured on one machine
and loaded on another still loads: `Profile.load` warns with a `ProfileMachineWarning`
(a `UserWarning`) naming the fields of the machine fingerprint that differ; callers that
want the differences as data use `Profile.machine_mismatch`.

JSON layout (version 2; version 1 files, without "views" and "roofline", still load)::

    {"schema": "schedlab.profile", "version": 2,
     "machine": {"cpu_model": ..., "cores": 2, "torch": ...},   # Machine.fingerprint
     "created_unix_s": ..., "quick": true,
     "dispatch": {"op_us", "view_us", "corun_op_us", "corun_event_floor_us",
                  "call_floor_us", "view_call_floor_us"},
     "classes": {op_class: {"model": "work_threads", "params": {...},
                            "heldout_mape": 12.3, "heldout_wape": ..., "train_mape": ...,
                            "n_points": 40, "n_signatures": 20, "n_heldout": 4}},
     "fallback": {same as a class},
     "signatures": {signature: {"1": kernel_us, "2": kernel_us}},
     "corun": {"model": "linear_busy_fraction", "mem_slowdown", "compute_slowdown",
               "gil_slowdown", "measured", "foreign_cpu_frac"},
     "views": {"signatures": {signature: extra_us}, "classes": {view_class: {"a_us",
               "per_output_us", "n_signatures"}}, "fallback": {...}},
     "roofline": {"model": "roofline", "gflops": {"1": ..., "2": ...}, "gbps": {...}, "a_us": ...},
     "links": null | {"backend": "gloo", "host", "measured_unix_s", "conditions",   # calibrate.links
               "p2p": {"n_ranks", "rank_cores", "sizes", "median_s", ..., "fit": {"latency_s",
                       "bw_bytes_per_s", "mape_pct"}},
               "allreduce": {"2": {sweep..., "fit": {"alpha_s", "bw_bytes_per_s", "mape_pct"}}, "3": ...},
               "allreduce_joint": {"alpha_s", "bw_bytes_per_s", "mape_pct"},
               "host_costs": null | {"model": "table", "parts": {part: {"sizes", "us",
                                                    "per_tensor_us"}}}},  # calibrate.comm_host
     "cuda": null | {"device", "torch", "launch_us", "flops_per_s", "bw_bytes_per_s",   # calibrate.cuda_costs
              "signatures": {signature: kernel_us}, ...},
     "wake": {op_class or "*": {"base_us", "per_work", "threads", "n_points", "share_gated", "cap_us", "floor_us"}},   # calibrate.wake
     "wake_scale": {threads: share},   # the wake below the fits' thread count, calibrate.wake
     "cold": null | {"model": "share_x_class_slope", "share", "slope_us_per_mib": {op_class:
              {threads: us}}, "pooled_us_per_mib": {threads: us}, "n_points", "n_share_ops"},  # calibrate.cold
     "meta": {...}}

"links" (link and collective fits between local ranks, `schedlab calibrate --links`) is
optional and was added within version 2: files without it read as a Profile without link
fits (`links` None); older readers ignore it. `allreduce_us` gives the fitted all-reduce
time for the simulator; `calibrate.links.apply_link_fit` gives a Machine the fitted links.
"cuda" (op costs measured on a CUDA device, `calibrate.cuda_costs`) is optional too, added
within version 2: without it a cuda device is costed by its roofline (`sim.device_cost`).
Within it, a ring fit may be piecewise ("break_bytes", "bw_above_bytes_per_s"; without
them, linear) and "host_costs" (what each communication op costs its rank, `comm_host_us`)
may be absent or null: the simulator then charges those ops the dispatch cost of any op.
"wake" (what an op of a co-run plan pays to wake its throttled OpenMP helpers, `wake_us`)
is optional too, added within version 2: without it the simulator charges no wake cost.
"wake_scale" (added later within version 2) may be absent: every count then pays the fits'.
"cold" (what an op pays in a step for its data not being in the caches, `cold_us`, added
later within version 2) may be absent or null: the simulator then charges nothing for it.
"views_wait" in "corun" (added later within version 2) may be absent: the co-run wait was
then fitted on the non-view ops, and a view of a co-run plan pays none (`kernel_us`).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from schedlab.calibrate.cold import ColdCosts
from schedlab.calibrate.context import NO_CONTEXT, ContextCosts, first_use_objects, first_uses
from schedlab.calibrate.corun import CorunFigures
from schedlab.calibrate.cuda_costs import CudaCosts
from schedlab.calibrate.dispatch import DispatchFigures
from schedlab.calibrate.fit import ClassFit
from schedlab.calibrate.in_turn import in_turn_factor
from schedlab.calibrate.links import LinkFits, collective_s
from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.profile_columns import ProfileColumns
from schedlab.calibrate.roofline import Roofline
from schedlab.calibrate.signature import base_class, graph_signatures, op_fit_class, signature
from schedlab.calibrate.trace_cal import trace_figures, trace_slots
from schedlab.calibrate.views import NO_VIEW_COSTS, ViewCosts
from schedlab.calibrate.wake import POOLED, WakeFit, region_share, wake_share
from schedlab.collectives import sums_by_exchange
from schedlab.distribute import ALL_REDUCE, RECV, SEND
from schedlab.errors import SchedlabError
from schedlab.flops import recounted_since
from schedlab.graph import Graph, Op, OpKind
from schedlab.machine import Machine
from schedlab.paths import default_profile_path
from schedlab.sim.comm import CommOpCost
from schedlab.trace import Trace

PROFILE_SCHEMA = "schedlab.profile"
CPU_COST_SOURCE = "calibrated cpu profile"  # what the simulator says costed a cpu device (sim.device_cost)
PROFILE_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no view costs, no roofline (the fitted fallback stands in)
DEFAULT_PROFILE_PATH = default_profile_path()
_MODEL_NAMES = ("work_threads", "work_threads_scaled")
MAX_KEPT_COLUMNS = 16  # `ProfileColumns` a Profile object keeps, one per cost table that asked it


class ProfileMachineWarning(UserWarning):
    """A Profile is used on a machine other than the one it was measured on."""


class ProfileRecountWarning(UserWarning):
    """A Profile's class fits of some classes were fitted on FLOPs that schedlab now counts
    otherwise (`schedlab.flops.RECOUNTED_CLASSES`): they are left out."""


@dataclass(frozen=True)
class Profile:
    # ATen runs a call below its grain size inline: such a kernel holds one core, not its
    # team (`sim.cost.team_or_inline`)
    inlines_small_calls: ClassVar[bool] = True

    machine: dict[str, Any]  # Machine.fingerprint of where it was measured
    created_unix_s: float
    quick: bool
    dispatch: DispatchFigures
    classes: dict[str, ClassFit]
    fallback: ClassFit
    signatures: dict[str, dict[int, float]]  # signature -> threads -> kernel_us
    corun: CorunFigures
    meta: dict[str, Any] = field(default_factory=dict)
    views: ViewCosts = NO_VIEW_COSTS  # what views cost beyond the probe view (calibrate.views)
    roofline: Roofline | None = None  # the cost of classes never measured (calibrate.roofline)
    context: ContextCosts = NO_CONTEXT  # what ops cost in a step beyond a benchmark (calibrate.context)
    links: LinkFits | None = None  # links and collectives between local ranks (calibrate.links)
    cuda: CudaCosts | None = None  # op costs calibrated on a CUDA device (calibrate.cuda_costs)
    # op class -> the cost of waking throttled OpenMP helpers (calibrate.wake); POOLED: every class
    wake: dict[str, WakeFit] = field(default_factory=dict)
    # threads below the wake fits' own -> the share of their cost paid there (calibrate.wake)
    wake_scale: dict[int, float] = field(default_factory=dict)
    cold: ColdCosts | None = None  # what data not in the caches costs in a step (calibrate.cold); None: nothing
    # the graph this Profile predicts (`for_graph`) and the Python ids of its first-use ops
    bound: tuple[Graph, frozenset[int]] | None = field(default=None, compare=False, repr=False)
    # executor slots the dispatch cost is for (`for_slots`); a use, not part of the JSON
    dispatch_slots: int = field(default=1, compare=False)
    # op identity -> what is looked up of it (`_OpLookup`, its `_alone_us` per thread count
    # among it): the simulator asks often, kernel_us, serial_us and dispatch_us all read it
    _lookups: dict[int, _OpLookup] = field(default_factory=dict, init=False, repr=False, compare=False)
    # id of an op-id array -> its ops' answers as arrays (`calibrate.profile_columns`), for
    # the simulator's cost table, which asks one column of its ops at a time
    _columns: dict[int, ProfileColumns] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ---- CostModel ---------------------------------------------------------------------

    def kernel_us(self, op: Op, threads: int) -> float:
        """Kernel time of `op` alone with `threads` intra-op threads (see module docstring).

        For the one-slot executor, plus what a step's op pays for its team of more than
        one thread (`team_us`). For the co-run executor (`for_slots` > 1): less the part
        charged under the lock (`serial_us`), plus the wait of each of its ops for a
        worker that runs and holds the lock (`CorunFigures.latency`, fitted on real
        graphs: `calibrate.corun_fit`). A view has no kernel, but the co-run executor's
        workers take it from the ready heap like any op, so there it waits as they do
        (where the wait was fitted so: `CorunFigures.views_wait`).
        """
        n = max(1, int(threads))
        if op.is_view:
            return self.corun.latency(n) if self.dispatch_slots > 1 and self.corun.views_wait else 0.0
        alone = self._alone_us(op, n)
        if self.dispatch_slots <= 1:
            return alone + self.team_wait_us(op, n)
        return max(0.0, alone - self.serial_us(op)) + self.corun.latency(n)

    # ---- many ops at once (sim.cost_table.ColumnCostModel) -------------------------------

    def kernel_column(self, graph: Graph, ids: np.ndarray, threads: int) -> np.ndarray:
        """`kernel_us(op, threads)` of the ops `ids` of `graph`, as an array (`calibrate.profile_columns`)."""
        return self._columns_of(graph, ids).kernel_us(threads)

    def dispatch_column(self, graph: Graph, ids: np.ndarray) -> np.ndarray:
        """`dispatch_us(op)` of the ops `ids` of `graph`, as an array."""
        return self._columns_of(graph, ids).dispatch_us()

    def corun_slowdown_column(self, graph: Graph, ids: np.ndarray, busy_cores: int, total_cores: int) -> np.ndarray:
        """`corun_slowdown(op, busy_cores, total_cores)` of the ops `ids` of `graph`, as an array."""
        return self._columns_of(graph, ids).corun_slowdown(busy_cores, total_cores)

    def wake_column(self, graph: Graph, ids: np.ndarray, threads: int) -> np.ndarray:
        """`wake_us(op, threads)` of the ops `ids` of `graph`, as an array."""
        return self._columns_of(graph, ids).wake_us(threads)

    def _columns_of(self, graph: Graph, ids: np.ndarray) -> ProfileColumns:
        """The kept `ProfileColumns` of (`graph`, `ids`): the same array object asked
        again finds its per-op reads done."""
        hit = self._columns.get(id(ids))
        if hit is None or hit.ids is not ids or hit.graph is not graph:
            if len(self._columns) >= MAX_KEPT_COLUMNS:  # a long-lived Profile asked by many tables: keep the latest
                self._columns.pop(next(iter(self._columns)))
            hit = self._columns[id(ids)] = ProfileColumns(self, graph, ids)
        return hit

    def team_basis_us(self, op: Op, threads: int) -> float:
        """What the simulator's demand rule (`sim.cost.team_or_inline`) compares `op`'s
        speedup on: its kernel alone at `threads` (`_alone_us`), without the co-run
        executor's wait per op or the team's. That wait is no part of whether a call opens a
        parallel region, and compared with it a tiny op looked faster at two threads than at
        one whenever the wait fitted at one thread exceeded the wait at two (a quick profile
        of 2026-12-03: 16.9 against 15.8 us), so the 1,300 tiny ops of `dev:gru` held two
        cores each at two slots of two threads and the step was simulated at 35.2 ms, against
        24.3 ms with the one-thread wait 0.2 us lower (measured: 19.9). An op whose class
        `forks_at_any_size` is compared on its one-thread kernel over the threads, so the
        demand rule holds its team."""
        if op.is_view:
            return 0.0
        n = max(1, int(threads))
        alone = self._alone_us(op, n)
        if n > 1 and self.forks_at_any_size(op):
            alone = min(alone, self._alone_us(op, 1) / n)
        return alone

    def forks_at_any_size(self, op: Op) -> bool:
        """Whether `op`'s class opens its parallel regions whatever their size: its wake fit
        charges its small calls too (`WakeFit.forks_at_any_size`: a floor, where calibration
        saw its small calls pay to wake helpers, or a fit not times the region share). Such
        an op holds its team in a co-run plan (`team_basis_us`) and pays its wake, however
        flat its thread scaling: oneDNN's LSTM layer, no faster at two threads than at one,
        forks a region per time step (a quick calibration of 2026-12-06: its 13 cases paid
        316-5,502 us each to wake their helpers, where the share-gated pooled fit charged
        them about 1 us)."""
        found = self._lookup(op)
        return self.class_forks_at_any_size(found.class_key, isinstance(found.model, WorkThreadsModel))

    def class_forks_at_any_size(self, class_key: str, fitted: bool) -> bool:
        """`forks_at_any_size` of an op of `class_key`, whose kernel comes from a class fit
        (`fitted`; the roofline's never forks so)."""
        fit = self.class_wake_fit(class_key, pooled=False) if fitted else None
        return fit is not None and fit.forks_at_any_size

    def class_wake_fit(self, class_key: str, pooled: bool = True) -> WakeFit | None:
        """The wake fit an op of `class_key` pays under: its class's; for a variant without
        one (``convolution_backward[grouped]``: calibration times a dozen or so), its plain
        class's; else, with `pooled`, the fit over every class (None where there is none)."""
        fit = self.wake.get(class_key) or self.wake.get(base_class(class_key))
        return self.wake.get(POOLED) if fit is None and pooled else fit

    def team_basis_column(self, graph: Graph, ids: np.ndarray, threads: int) -> np.ndarray:
        """`team_basis_us(op, threads)` of the ops `ids` of `graph`, as an array."""
        return self._columns_of(graph, ids).team_basis_us(threads)

    def team_us(self, threads: int) -> float:
        """What a non-view op of a one-slot step with `threads` intra-op threads pays beyond
        its kernel as timed back to back: what its team costs between the interpreter's ops
        (which part of the team's work was not isolated; `CorunFigures.team_latency`, fitted
        on real graphs like the co-run wait: `calibrate.corun_fit`). 0 at one thread, and
        for the co-run executor, whose own fitted wait holds it."""
        return 0.0 if self.dispatch_slots > 1 else self.corun.team_latency(threads)  # 0 at one thread

    def team_wait_us(self, op: Op, threads: int) -> float:
        """`team_us` as non-view `op` pays it: times its parallel share under its class
        model where the wait was fitted so (`CorunFigures.team_share`), all of it otherwise."""
        team = self.team_us(threads)
        if team > 0.0 and self.corun.team_share:
            team *= self._lookup(op).shares()[2]
        return team

    def wake_us(self, op: Op, threads: int) -> float:
        """What `op` with `threads` intra-op threads pays, in a co-run plan, to wake its
        OpenMP helpers on idle cores (`calibrate.wake`; the simulator scales it by the idle
        share of the other cores, and charges `region_wake_us` of it beside busy ones,
        `sim.wake`): its class's fit, a variant's plain class's, else the fit over every
        class (`class_wake_fit`), at the share of it measured at `threads` (`wake_scale`); 0
        for a view, one thread, a class the roofline costs, or a Profile calibrated before
        wake costs were measured."""
        if op.is_view or threads < 2 or not self.wake:
            return 0.0
        found = self._lookup(op)
        key, model = found.class_key, found.model
        if not isinstance(model, WorkThreadsModel):
            return 0.0
        fit = self.class_wake_fit(key)
        if fit is None:
            return 0.0
        extra = fit.extra_us(region_share(model, op.flops, op.bytes_moved), model.work_us(op.flops, op.bytes_moved))
        return extra * wake_share(self.wake_scale, fit.threads, threads)

    def region_wake_us(self, threads: int) -> float:
        """What one parallel region of `threads` intra-op threads pays to wake its helpers:
        the fit over every class at a small call (`calibrate.wake`: its floor and base), at
        the share measured at `threads`; a call beside a busy team pays this much of its
        wake (`sim.wake`). 0 at one thread or for a Profile without wake fits."""
        fit = self.wake.get(POOLED) if threads >= 2 and self.wake else None
        if fit is None:
            return 0.0
        return (fit.floor_us + fit.base_us) * wake_share(self.wake_scale, fit.threads, threads)

    def _alone_us(self, op: Op, n: int) -> float:
        found = self._lookup(op)
        out = found.alone_us.get(n)
        if out is None:
            model, row = found.model, found.row
            if row:
                warm = row_kernel_us(row, n, lambda k: model.kernel_us(op.flops, op.bytes_moved, k))
            else:
                warm = max(0.0, model.kernel_us(op.flops, op.bytes_moved, n))
            cold = 0.0 if self.cold is None else self.cold_us(op, n)
            turn = 0.0 if found.in_turn == 1.0 else self._turn_extra_us(warm, found.in_turn)
            out = found.alone_us[n] = max(0.0, warm + turn + found.first_use_us + cold)
        return out

    def cost_keys(self, graph: Graph) -> np.ndarray:
        """Per op of `graph`, an integer key such that ops with equal keys cost the same
        here (`sim.cost_table`): its content key's number (`content_groups`; the content
        key is finer than its `calibrate.signature`, all a Profile reads of an op's
        content), twice, plus one if it pays the first-use extra of the graph this
        Profile is bound to (the only thing it reads of an op's identity). The simulator
        then asks one op per key: a cold `simulate()` costs a few dozen Profile calls per
        column rather than one per op."""
        from schedlab.sim.cost_table import content_groups

        keys = 2 * content_groups(graph)
        if self.bound is not None and self.bound[0] is graph:  # its first uses by op id, without a pass over the ops
            first = first_uses(graph)
            if first:
                keys[np.fromiter(first, dtype=np.int64, count=len(first))] += 1
        elif self.bound is not None and self.bound[1]:
            ids = self.bound[1]
            keys += np.fromiter((id(op) in ids for op in graph.ops), dtype=bool, count=len(graph.ops))
        return keys

    def first_use_us(self, op: Op) -> float:
        """The extra of `op` being the first of its target in the bound graph's step
        (`calibrate.context`); 0 for other ops, and in a Profile bound to no graph."""
        if self.bound is None or id(op) not in self.bound[1]:
            return 0.0
        return self.context.first_use(op.op_class)

    def _turn_extra_us(self, kernel_us: float, factor: float) -> float:
        curve = self.context.in_turn
        return 0.0 if curve is None else curve.extra_us(kernel_us, factor)

    def in_turn_factor(self, op: Op) -> float:
        """The factor on `op`'s kernel of the bound graph's convolutions taking turns in a
        step (`calibrate.in_turn`); 1 for other classes, without a measured curve, and in
        a Profile bound to no graph."""
        if self.bound is None or op.is_view:
            return 1.0
        return in_turn_factor(self.context.in_turn, self.bound[0], op.op_class)

    def cold_us(self, op: Op, threads: int) -> float:
        """What `op` pays, at `threads`, in a step for its data not being in the caches
        (`calibrate.cold`: the in-step share of its class's cold extra per MiB it moves); 0
        for a view, a compute-bound class (`ColdCosts.extra_us`), or a Profile without
        cold costs."""
        if self.cold is None or op.is_view:
            return 0.0
        return self.cold.extra_us(op.op_class, op.bytes_moved, max(1, threads))

    def step_extra_us(self, op: Op, threads: int) -> float:
        """What `op` costs in a step beyond its kernel wherever it runs (a trace's event less
        this, and the executor's floor, is the kernel): the first use of its target in the
        bound graph (`first_use_us`), its data not in the caches (`cold_us`), and in a
        one-slot step its team of more threads (`team_us`; bind `for_slots` to the trace's
        slots)."""
        team = 0.0 if op.is_view else self.team_wait_us(op, threads)
        return self.first_use_us(op) + self.cold_us(op, threads) + team

    def for_graph(self, graph: Graph) -> Profile:
        """This Profile bound to `graph`: the first op of each target in its program order
        pays its class's first-use extra (`calibrate.context`). Bind the graph whose ops
        the simulator is given; `for_slots` keeps the binding."""
        return dataclasses.replace(self, bound=(graph, first_use_objects(graph)))

    def serial_us(self, op: Op) -> float:
        """The part of `op`'s kernel (one thread) that another worker cannot overlap.

        A short op releases the interpreter lock for less time than a waiting worker
        takes to wake up and take it (`CorunFigures.serial_window_us`): two workers of
        tiny ops take turns on the whole call, not on its Python part only. With
        several slots this part is charged under the lock (`dispatch_us`) and taken
        off `kernel_us`; one slot runs one op at a time, so nothing moves.
        """
        if op.is_view or self.dispatch_slots <= 1:
            return 0.0
        return min(self._alone_us(op, 1), self.corun.serial_window_us)

    def dispatch_us(self, op: Op) -> float:
        """Executor time in Python around `op` (holds the interpreter lock).

        One slot: the straight-line step's cost per op. Several (`for_slots`): the co-run
        executor's, whose workers hand the lock and the ready heap over between ops. A
        view adds what its own call costs beyond the probe view's (`calibrate.views`).
        """
        d = self.dispatch
        if not op.is_view:
            return d.op_us if self.dispatch_slots <= 1 else d.corun_op_us + self.serial_us(op)
        base = d.view_us
        if self.dispatch_slots > 1:
            base = d.view_us * d.corun_op_us / d.op_us if d.op_us > 0 else d.corun_op_us
        return base + self.view_extra_us(op)

    def view_extra_us(self, op: Op) -> float:
        """What view `op`'s call costs beyond the probe view's (`calibrate.views`)."""
        return self.views.extra_us(self._signature(op), op.op_class, len(op.outputs))

    def allreduce_us(self, nbytes: float, n_ranks: int) -> float | None:
        """The fitted time (us) of an all-reduce of `nbytes` over `n_ranks` local ranks on
        its links (`calibrate.links.collective_s`: the fit, less the post and wait that
        `comm_host_us` charges on the ranks when the link benchmark measured them); None
        when this Profile has no link fits (the caller then models it from the machine's
        links, `schedlab.collectives.ring_allreduce_s`)."""
        if self.links is None:
            return None
        return collective_s(self.links, nbytes, n_ranks) * 1e6

    def comm_host_us(self, op: Op) -> CommOpCost | None:
        """What COMM op `op` costs its rank (`sim.comm.CommHostCost`), from the host costs
        the link benchmark measured (`calibrate.comm_host`); None without them (the
        simulator then charges `dispatch_us`).

        A send: its call, the fixed part under the lock and the part that grows with the
        bytes (gloo writes the data into the socket in the caller) on the rank's core, the
        transfer in flight meanwhile (its end is still the link fit's). A recv: its post
        (the buffer and the call), and its wait's fixed part once the data is there. An all-reduce of a bucket of k gradients: the flatten's fixed and
        per-gradient part and the post's fixed part under the lock, the flatten's copy on
        the cores; between two ranks, where the executor's post is a send and a receive
        (`exec.reduce`), the post's part that grows with the bytes too, as the caller's
        write of the bucket beside the collective (as a send's); once its collective ended, the wait's fixed part and the average's fixed
        and per-gradient part under the lock, the average's pass on the cores; and the share
        of its collective that keeps a core of its rank busy (`HostCosts.collective_cpu_share`).
        A send's or a recv's transfer keeps a core at its end busy for a while too
        (`HostCosts.transfer_cpu_us`). And the ops after a send, a recv's wait or an
        all-reduce's wait run cold (`HostCosts.cold`; an all-reduce's wait is costed as a
        receive's, both block on gloo's work).
        """
        host = None if self.links is None else self.links.host_costs
        if host is None or op.kind is not OpKind.COMM:
            return None
        t = host.tables
        nbytes = float(op.bytes_moved)
        cold = host.cold  # a wait on gloo's work leaves the next ops cold: a receive's or an all-reduce's
        after_send = cold.after_send_us if cold else 0.0
        after_wait = cold.points() if cold else ()
        if op.target == SEND:
            send = t["send"]
            return CommOpCost(send.fixed_us(), post_kernel_us=max(0.0, send.us_at(nbytes) - send.fixed_us()),
                              transfer_cpu_us=host.transfer_cpu_us(nbytes)[0], after_us=after_send)
        if op.target == RECV:
            return CommOpCost(t["recv_post"].us_at(nbytes), 0.0, t["recv_wait"].fixed_us(),
                              transfer_cpu_us=host.transfer_cpu_us(nbytes)[1], after_wait=after_wait)
        if op.target != ALL_REDUCE:
            return None
        k = max(1, len(op.inputs))
        flatten, average = t["allreduce_flatten"], t["allreduce_average"]
        flat_fixed, avg_fixed = flatten.fixed_us(k), average.fixed_us(k)
        post = t["allreduce_post"]
        exchange = sums_by_exchange(len(op.kwargs.get("group", ())))  # a send and a receive: its post writes
        return CommOpCost(
            post_us=flat_fixed + post.fixed_us(),
            post_kernel_us=max(0.0, flatten.us_at(nbytes, k) - flat_fixed),
            done_us=t["allreduce_wait"].fixed_us() + avg_fixed,
            done_kernel_us=max(0.0, average.us_at(nbytes, k) - avg_fixed),
            collective_cpu_share=host.collective_cpu_share or 0.0,
            write_us=max(0.0, post.us_at(nbytes) - post.fixed_us()) if exchange else 0.0,
            after_wait=after_wait,
        )

    # ---- costs per device kind (sim.device_cost.KindCosts) ------------------------------

    def calibrated_kinds(self) -> dict[str, str]:
        """The device kinds this Profile calibrated: its CPU costs, and a GPU's if it has a
        cuda section (a cuda device without one is costed by its roofline, `sim.device_cost`)."""
        kinds = {"cpu": CPU_COST_SOURCE}
        if self.cuda is not None:
            kinds["cuda"] = self.cuda.label
        return kinds

    def kind_kernel_us(self, op: Op, kind: str) -> float | None:
        """Kernel µs of `op` on one device of `kind` other than "cpu", from the cuda section."""
        return self.cuda.kernel_us(op) if kind == "cuda" and self.cuda is not None else None

    def kind_launch_us(self, kind: str) -> float:
        return self.cuda.launch_us if kind == "cuda" and self.cuda is not None else 0.0

    def kind_issue_us(self, op: Op, kind: str) -> float | None:
        """Host µs to issue `op` to a GPU, from the cuda section (None without one). With
        several slots (`for_slots`), the co-run step on streams adds its cost per op: the
        section's `stream_issue_extra_us`, or where an older section lacks it, what the
        co-run executor adds per op on this profile's CPU (`corun_op_us - op_us`)."""
        if kind != "cuda" or self.cuda is None:
            return None
        t = self.cuda.host_issue_us(op)
        if t is None or self.dispatch_slots <= 1:
            return t
        extra = self.cuda.stream_issue_extra_us
        if extra is None:
            extra = max(0.0, self.dispatch.corun_op_us - self.dispatch.op_us)
        return t + extra

    def kind_contention_us(self, kind: str) -> float:
        """Host µs a GPU op's issue grows while another worker waits to issue (the cuda
        section's `stream_contention_us`; 0 where it has none); the simulator scales it by
        log2(1 + the workers queued)."""
        if kind != "cuda" or self.cuda is None:
            return 0.0
        return self.cuda.stream_contention_us or 0.0

    def for_slots(self, slots: int) -> Profile:
        """This Profile with the dispatch cost of the executor running `slots` workers."""
        return dataclasses.replace(self, dispatch_slots=max(1, int(slots)))

    def corun_slowdown(self, op: Op, busy_cores: int, total_cores: int) -> float:
        """Slowdown (>= 1) of `op` with `busy_cores` other cores busy.

        The measured two-op slowdown of a memory-bound op and of a compute-bound op are
        mixed by the op's memory share (from its class model), and scaled linearly with
        the share of the other cores that are busy (all of them busy: the measured
        factor). Only the op's work slows down, not its fixed cost per call (the class
        model's `a_us`): a tiny op is all fixed cost, interpreter and dispatcher on its
        own core. Measured with one co-runner on this machine; more is extrapolation.
        When the others alone keep every core busy, `op`'s threads oversubscribe the
        cores, and the measured oversubscription factor (the cost beyond processor
        sharing of OpenMP teams descheduled at their barriers) applies to the share of
        the op that runs in a parallel region (the class model's thread scaling at the
        op's size): an op below ATen's grain size runs on its calling thread alone.
        """
        if op.is_view or busy_cores <= 0 or total_cores <= 1:
            return 1.0
        frac = min(1.0, busy_cores / (total_cores - 1))
        mem, work, parallel = self._lookup(op).shares()
        c = self.corun
        factor = c.compute_slowdown + (c.mem_slowdown - c.compute_slowdown) * mem
        out = max(1.0, 1.0 + (factor - 1.0) * frac * work)
        if busy_cores >= total_cores:
            oversub = c.oversub_compute + (c.oversub_mem - c.oversub_compute) * mem
            fade = 1.0 if c.oversub_decay_us is None else float(c.oversub_share(self._alone_us(op, total_cores)))
            out *= max(1.0, 1.0 + (oversub - 1.0) * parallel * fade)
        return out

    # ---- lookups -----------------------------------------------------------------------

    def class_key(self, op: Op) -> str:
        """The class model `op` takes: its op class, or, for an op that reads a permuted
        input (`Op.strided`), that class's strided model (``add[strided]``,
        `calibrate.signature.fit_class`) where calibration timed such cases and its fit is
        trusted: a transposed operand makes a memory-bound kernel several times slower at the
        same bytes. Likewise a 1-D convolution's own model (``convolution[1d]``). Otherwise
        (a profile calibrated before such cases) the class's model."""
        return self.class_key_of(op_fit_class(op), op.op_class)

    def class_key_of(self, fit_key: str, op_class: str) -> str:
        """`class_key` of an op of `op_class` whose `fit_class` is `fit_key`."""
        if fit_key != op_class:
            fit = self.classes.get(fit_key)
            if fit is not None and fit.trusted:
                return fit_key
        return op_class

    def model_of(self, op: Op) -> WorkThreadsModel | Roofline:
        """`class_model` of `op`'s `class_key`."""
        return self._lookup(op).model

    def class_model(self, op_class: str) -> WorkThreadsModel | Roofline:
        """The fitted model of `op_class`; for a class never measured, the roofline (or,
        in a Profile without one, the model fitted on every memory-bound point)."""
        fit = self.classes.get(op_class)
        if fit is not None and (fit.trusted or self.roofline is None):
            return fit.model
        return self.roofline if self.roofline is not None else self.fallback.model

    # ---- coverage ----------------------------------------------------------------------

    def is_fallback(self, op: Op) -> bool:
        """Whether `op`'s kernel time comes from the fallback: a non-view op whose signature
        is not in the table, of a class never measured or whose fit is not trusted
        (`ClassFit.trusted`: it misses its own calibration points by far)."""
        if op.is_view or self._row(op):
            return False
        fit = self.classes.get(self.class_key(op))
        return fit is None or (not fit.trusted and self.roofline is not None)

    def coverage(self, graph: Graph) -> dict[str, Any]:
        """How much of `graph` the Profile measured: its non-view ops, and how many of them
        (and of which classes) fell back on the roofline or the fitted fallback."""
        fell: dict[str, int] = {}
        for op in graph.ops:
            if self.is_fallback(op):
                fell[op.op_class] = fell.get(op.op_class, 0) + 1
        return {
            "ops": sum(1 for op in graph.ops if not op.is_view),
            "fallback_ops": sum(fell.values()),
            "fallback_classes": dict(sorted(fell.items(), key=lambda kv: (-kv[1], kv[0]))),
            "fallback_model": "roofline" if self.roofline is not None else "memory-bound fit",
        }

    def _row(self, op: Op) -> dict[int, float] | None:
        return self._lookup(op).row

    def _lookup(self, op: Op) -> _OpLookup:
        """What this Profile reads of `op` (its class key and model, its signature-table
        row), looked up on the first call for `op` and kept: a cold simulation asks each
        op's kernel, dispatch, co-run slowdown and wake, each of which reads them."""
        hit = self._lookups.get(id(op))
        if hit is not None and hit.op is op:
            return hit
        key = self.class_key(op)
        found = self._lookups[id(op)] = _OpLookup(
            op, key, self.class_model(key), self.signatures.get(self._signature(op)), self.first_use_us(op),
            self.in_turn_factor(op),
        )
        return found

    def _signature(self, op: Op) -> str:
        """`signature(op)`, read from the bound graph's kept signatures when `op` is one of its ops."""
        if self.bound is not None:
            ops = self.bound[0].ops
            if 0 <= op.id < len(ops) and ops[op.id] is op:
                return graph_signatures(self.bound[0])[op.id]
        return signature(op)

    # ---- trace-driven calibration ------------------------------------------------------

    def with_trace(self, trace: Trace, graph: Graph, *, typical_step: bool = True) -> Profile:
        """A new Profile whose signature table also holds the kernels measured in `trace`.

        Each (signature, threads) seen in the trace gets the mean of its event durations,
        stalls dropped (`calibrate.trace_cal.robust_mean`), minus the executor's in-event
        floor and what the op costs in a step beyond its kernel (`step_extra_us`: its
        target's first use, its data not in the caches), which the Profile adds back where
        it applies; trace entries replace microbenchmark ones,
        other thread counts of the signature are kept. With `typical_step` (default) the
        trace's entries are scaled by its step factor, so that they sum to what a median
        step spent in those kernels (`TraceFigures.step_factor`).
        """
        floor_us = self.dispatch.event_floor_us(trace_slots(trace))
        bound = self.for_graph(graph)
        curve = self.context.in_turn
        figs = trace_figures(trace, graph, floor_us, bound.for_slots(trace_slots(trace)).step_extra_us,
                             None if curve is None else lambda op, _threads, us: curve.kernel_of(us, bound.in_turn_factor(op)))
        factor = figs.step_factor if typical_step else 1.0
        merged = {sig: dict(row) for sig, row in self.signatures.items()}
        for sig, row in figs.signatures.items():
            merged.setdefault(sig, {}).update({k: us * factor for k, us in row.items()})
        record = {
            "graph": graph.name,
            "graph_hash": graph.hash,
            "slots": figs.slots,
            "events_used": figs.n_events_used,
            "events_overlapping": figs.n_events_overlapping,
            "signatures": len(figs.signatures),
            "step_factor": round(factor, 4),
            "added_unix_s": time.time(),
        }
        meta = {**self.meta, "traces": [*self.meta.get("traces", []), record]}
        return dataclasses.replace(self, signatures=merged, meta=meta)

    # ---- machine check -----------------------------------------------------------------

    def machine_mismatch(self, machine: Machine | None = None) -> list[str]:
        """The fingerprint fields that differ from `machine` (default: this host)."""
        if machine is None:
            from schedlab.machine import detect_host

            machine = detect_host()
        here = machine.fingerprint
        out = []
        for key in sorted(set(self.machine) | set(here)):
            if self.machine.get(key) != here.get(key):
                out.append(f"{key}: profile has {self.machine.get(key)!r}, this machine has {here.get(key)!r}")
        return out

    # ---- JSON --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PROFILE_SCHEMA,
            "version": PROFILE_VERSION,
            "machine": dict(self.machine),
            "created_unix_s": self.created_unix_s,
            "quick": self.quick,
            "dispatch": self.dispatch.to_json(),
            "classes": {cls: _fit_to_json(fit) for cls, fit in sorted(self.classes.items())},
            "fallback": _fit_to_json(self.fallback),
            "signatures": {
                sig: {str(k): round(v, 4) for k, v in sorted(row.items())} for sig, row in sorted(self.signatures.items())
            },
            "corun": self.corun.to_json(),
            "views": self.views.to_json(),
            "roofline": None if self.roofline is None else self.roofline.to_json(),
            "context": self.context.to_json(),
            "links": None if self.links is None else self.links.to_json(),
            "cuda": None if self.cuda is None else self.cuda.to_json(),
            "wake": {cls: fit.to_json() for cls, fit in sorted(self.wake.items())},
            "wake_scale": {str(k): v for k, v in sorted(self.wake_scale.items())},
            "cold": None if self.cold is None else self.cold.to_json(),
            "meta": self.meta,
        }

    @staticmethod
    def from_json(d: Any, source: str = "profile") -> Profile:
        """Parse a Profile; any problem is one SchedlabError naming `source` and the field."""
        if not isinstance(d, dict) or d.get("schema") != PROFILE_SCHEMA:
            raise SchedlabError(f'{source} is not a schedlab profile (missing "schema": "{PROFILE_SCHEMA}")')
        if d.get("version") not in READABLE_VERSIONS:
            raise SchedlabError(
                f"{source} has profile version {d.get('version')!r}; this schedlab reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))} (re-run `schedlab calibrate`)"
            )
        where = "?"
        try:
            where = "machine"
            machine = dict(_need(d, "machine", dict))
            where = "created_unix_s"
            created = _number(_need(d, "created_unix_s", (int, float)))
            where = "quick"
            quick = _need(d, "quick", bool)
            where = "dispatch"
            dispatch = _dispatch_from_json(_need(d, "dispatch", dict))
            classes = {}
            for cls, fd in _need(d, "classes", dict).items():
                where = f"classes.{cls}"
                classes[str(cls)] = _fit_from_json(fd)
            where = "fallback"
            fallback = _fit_from_json(_need(d, "fallback", dict))
            signatures: dict[str, dict[int, float]] = {}
            for sig, row in _need(d, "signatures", dict).items():
                where = f"signatures[{sig!r}]"
                signatures[str(sig)] = _row_from_json(row)
            where = "corun"
            corun = _corun_from_json(_need(d, "corun", dict))
            where = "views"
            views = ViewCosts.from_json(d["views"]) if d.get("views") is not None else NO_VIEW_COSTS
            where = "roofline"
            roofline = Roofline.from_json(d["roofline"]) if d.get("roofline") is not None else None
            where = "context"
            context = ContextCosts.from_json(d["context"]) if d.get("context") is not None else NO_CONTEXT
            where = "links"
            links = LinkFits.from_json(d["links"]) if d.get("links") is not None else None
            where = "cuda"
            cuda = CudaCosts.from_json(d["cuda"]) if d.get("cuda") is not None else None
            wake = {}
            for cls, wd in dict(d.get("wake") or {}).items():
                where = f"wake.{cls}"
                wake[str(cls)] = WakeFit.from_json(wd)
            where = "wake_scale"
            wake_scale = _wake_scale_from_json(d.get("wake_scale") or {})
            where = "cold"
            cold = ColdCosts.from_json(d["cold"]) if d.get("cold") is not None else None
            where = "meta"
            meta = dict(d.get("meta", {}))
            classes, meta = _without_recounted(classes, meta)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            hint = " (re-run `schedlab calibrate --links`)" if where == "links" else ""
            raise SchedlabError(f"corrupt {source}: bad {where}: {detail}{hint}") from None
        return Profile(
            machine, created, quick, dispatch, classes, fallback, signatures, corun, meta, views, roofline, context,
            links=links, cuda=cuda, wake=wake, wake_scale=wake_scale, cold=cold,
        )

    def save(self, path: str | Path) -> Path:
        """Write atomically (readers never see half a file)."""
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_json(), indent=1)

    @staticmethod
    def load(path: str | Path | None = None, machine: Machine | None = None, check_machine: bool = True) -> Profile:
        """Read a Profile (default: DEFAULT_PROFILE_PATH).

        A missing, unreadable, non-JSON or malformed file raises one SchedlabError. When
        `check_machine`, a fingerprint other than `machine`'s (default: this host) gives
        one ProfileMachineWarning naming the fields that differ.
        """
        from schedlab.io import read_json

        path = Path(path) if path is not None else DEFAULT_PROFILE_PATH
        if not path.exists():
            raise SchedlabError(
                f"profile file not found: {path} (run `make calibrate`, or `schedlab calibrate --quick` "
                "for a short one)"
            )
        profile = Profile.from_json(read_json(path, what="profile"), source=f"profile file {path}")
        if profile.meta.get("recounted_dropped"):
            warnings.warn(
                f"profile {path} was fitted before schedlab counted the FLOPs of "
                f"{', '.join(profile.meta['recounted_dropped'])} anew; their fits are left out and their ops are "
                "costed by the roofline (re-run `schedlab calibrate`)",
                ProfileRecountWarning,
                stacklevel=2,
            )
        if check_machine:
            diffs = profile.machine_mismatch(machine)
            if diffs:
                warnings.warn(
                    f"profile {path} was measured on another machine ({'; '.join(diffs)}); "
                    "its times may not hold here (re-run `schedlab calibrate` on this machine)",
                    ProfileMachineWarning,
                    stacklevel=2,
                )
        return profile


# ---- JSON helpers ------------------------------------------------------------------------


def _without_recounted(classes: dict[str, ClassFit], meta: dict[str, Any]) -> tuple[dict[str, ClassFit], dict[str, Any]]:
    """The class fits less those of classes whose FLOPs are counted anew since the formulas
    the profile was fitted with (`meta["flop_counting"]`, absent: 1; `schedlab.flops`),
    and the meta naming them under "recounted_dropped"."""
    counting = meta.get("flop_counting", 1)
    if not isinstance(counting, int) or isinstance(counting, bool):
        raise TypeError(f"field 'flop_counting' has type {type(counting).__name__}")
    stale = recounted_since(counting)
    dropped = sorted(cls for cls in classes if base_class(cls) in stale)
    if not dropped:
        return classes, meta
    return {c: f for c, f in classes.items() if c not in dropped}, {**meta, "recounted_dropped": dropped}


def _need(d: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise KeyError(key)
    v = d[key]
    if not isinstance(v, kind) or (kind in ((int, float), float) and isinstance(v, bool)):
        raise TypeError(f"field {key!r} has type {type(v).__name__}")
    return v


def _number(v: Any, minimum: float | None = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x) or (minimum is not None and x < minimum):
        raise ValueError(f"expected a finite number >= {minimum}, got {v!r}")
    return x


def _optional_number(v: Any) -> float | None:
    return None if v is None else _number(v)


def _fit_to_json(fit: ClassFit) -> dict[str, Any]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "model": fit.model_name,
        "params": {k: float(f"{v:.6g}") for k, v in fit.model.to_params().items()},
        "heldout_mape": r(fit.heldout_mape),
        "heldout_wape": r(fit.heldout_wape),
        "train_mape": r(fit.train_mape),
        "n_points": fit.n_points,
        "n_signatures": fit.n_signatures,
        "n_heldout": fit.n_heldout,
    }


def _fit_from_json(d: Any) -> ClassFit:
    if not isinstance(d, dict):
        raise TypeError(f"expected an object, got {type(d).__name__}")
    name = d["model"]
    if name not in _MODEL_NAMES:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(_MODEL_NAMES)})")
    params = d["params"]
    if not isinstance(params, dict):
        raise TypeError("params must be an object")
    return ClassFit(
        model_name=name,
        model=WorkThreadsModel.from_params(params),
        heldout_mape=_optional_number(d.get("heldout_mape")),
        heldout_wape=_optional_number(d.get("heldout_wape")),
        train_mape=_number(d.get("train_mape", 0.0)),
        n_points=int(d["n_points"]),
        n_signatures=int(d.get("n_signatures", 0)),
        n_heldout=int(d.get("n_heldout", 0)),
    )


class _OpLookup:
    """What a Profile reads of one op, kept per op (`Profile._lookup`). The op itself is
    kept too: the Profile keys its lookups by `id(op)`, which a live op keeps unique."""

    __slots__ = ("_shares", "alone_us", "class_key", "first_use_us", "in_turn", "model", "op", "row")

    def __init__(
        self, op: Op, class_key: str, model: WorkThreadsModel | Roofline, row: dict[int, float] | None,
        first_use_us: float, in_turn: float = 1.0,
    ) -> None:
        self.op = op
        self.class_key = class_key
        self.model = model
        self.row = row
        self.first_use_us = first_use_us  # `Profile.first_use_us`: it reads the op's identity, as the lookup is kept
        self.in_turn = in_turn  # `Profile.in_turn_factor`: it reads the bound graph
        self.alone_us: dict[int, float] = {}  # threads -> `Profile._alone_us`, once asked
        self._shares: tuple[float, float, float] | None = None

    def shares(self) -> tuple[float, float, float]:
        """The op's memory, work and parallel shares under its class model (what its co-run
        slowdown reads), computed on the first call."""
        if self._shares is None:
            self._shares = self.model.shares(self.op.flops, self.op.bytes_moved)
        return self._shares


def row_kernel_us(row: dict[int, float], n: int, model_us: Callable[[int], float]) -> float:
    """A kernel's time at `n` threads from its measured `row` (threads -> us): measured, or
    interpolated linearly in 1/threads between measured counts, or, outside them, the
    nearest measured one scaled by the shape of the class model (`model_us(threads)`)."""
    if n in row:
        return row[n]
    lower = max((k for k in row if k < n), default=None)
    upper = min((k for k in row if k > n), default=None)
    if lower is not None and upper is not None:
        w = (1.0 / n - 1.0 / upper) / (1.0 / lower - 1.0 / upper)
        return w * row[lower] + (1.0 - w) * row[upper]
    ref = lower if lower is not None else upper
    assert ref is not None
    at_ref = model_us(ref)
    if at_ref <= 0.0:
        return row[ref]
    return row[ref] * model_us(n) / at_ref


def _row_from_json(row: Any) -> dict[int, float]:
    if not isinstance(row, dict) or not row:
        raise TypeError("expected a non-empty object of threads -> kernel_us")
    return _by_threads(row, least=1)


def _wake_scale_from_json(d: Any) -> dict[int, float]:
    if not isinstance(d, dict):
        raise TypeError("expected an object of threads -> share")
    return _by_threads(d, least=2)  # one thread wakes no helper


def _by_threads(d: dict[Any, Any], least: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in d.items():
        threads = int(k)
        if threads < least:
            raise ValueError(f"thread count {k!r} must be >= {least}")
        out[threads] = _number(v)
    return out


def _dispatch_from_json(d: dict[str, Any]) -> DispatchFigures:
    """Every field is required but those with a default (added after version 1)."""
    out = {}
    for f in dataclasses.fields(DispatchFigures):
        if f.name in d or f.default is dataclasses.MISSING:
            out[f.name] = _number(d[f.name])
    return DispatchFigures(**out)


def _corun_from_json(d: dict[str, Any]) -> CorunFigures:
    return CorunFigures(
        mem_slowdown=_number(d["mem_slowdown"]),
        compute_slowdown=_number(d["compute_slowdown"]),
        gil_slowdown=_number(d.get("gil_slowdown", 1.0)),
        measured=bool(d.get("measured", True)),
        foreign_cpu_frac=_optional_number(d.get("foreign_cpu_frac")),
        oversub_mem=_number(d.get("oversub_mem", 1.0)),
        oversub_compute=_number(d.get("oversub_compute", 1.0)),
        serial_window_us=_number(d.get("serial_window_us", 0.0)),
        oversub_decay_us=_oversub_decay(d.get("oversub_decay_us")),
        oversub_ref_us=_number(d.get("oversub_ref_us", 0.0)),
        oversub_long_us=_number(d.get("oversub_long_us", 0.0)),
        oversub_long=_number(d.get("oversub_long", 1.0)),
        latency_us={int(k): _number(v) for k, v in dict(d.get("latency_us", {})).items()},
        team_latency_us={int(k): _number(v) for k, v in dict(d.get("team_latency_us", {})).items()},
        views_wait=_flag(d.get("views_wait", False), "views_wait"),
        team_share=_flag(d.get("team_share", False), "team_share"),
    )


def _oversub_decay(v: Any) -> float | None:
    return None if v is None else _number(v)  # `_number` refuses a negative or non-finite time


def _flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{what} must be true or false, not {v!r}")
    return v
