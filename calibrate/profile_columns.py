"""A Profile's answers for many ops at once: one column (every op at one thread count or
one busy count) as an array.

A cold `simulate()` fills the simulator's cost table (`sim.cost_table.CostTable`) with a
Profile's dispatch, kernel, wake and co-run slowdown of each op the table keys apart: a
few hundred ops on a real graph. Asked one op at a time, each answer is a chain of Python
calls, and they were 90% or more of a cold call (a 369-op encoder on the 2-core VM,
2026-12-02: 0.6-1.8 ms a call, 35-100 us of it the compiled loop). Here what a Profile
reads of the graph alone is kept on the graph (`calibrate.op_features`: each op's fit
class, signature, FLOPs and bytes), each distinct fit class is looked up once (its class
key and model, `Profile.class_key_of`), each op's signature row once, and every column is
a few NumPy operations over the models' parameters gathered per op. In-process A/B on
the held-out models of 299-369 ops, every plan of `schedlab fidelity`: a cold call 1.7-1.9x
faster (median over plans), 1.3x on the 4,675-op GRU, where the compiled loop is more of it.

The floats are the scalar methods' own (`Profile.kernel_us`, `dispatch_us`, `wake_us`,
`corun_slowdown`): the same IEEE operations in the same order on each element, so a cost
table filled either way holds the same numbers (`tests/calibrate/test_profile_columns.py`
checks every op of built-in and held-out graphs for equality, not closeness). Only the
ops whose class model is a `WorkThreadsModel` are computed in arrays; an op the roofline
costs, one whose signature row lacks the thread count asked (interpolated there), and
the cold extra of a Profile that has cold costs are asked of the scalar methods, op by
op, as they are few.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from schedlab.calibrate.cold import MIB
from schedlab.calibrate.in_turn import IN_TURN_CLASSES, distinct_in_turn
from schedlab.calibrate.model import PARAM_NAMES, WorkThreadsModel
from schedlab.calibrate.op_features import op_features
from schedlab.calibrate.wake import WakeFit, wake_share
from schedlab.graph import Graph, Op

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile
    from schedlab.calibrate.roofline import Roofline

F64 = np.float64


class ProfileColumns:
    """`profile`'s answers for the ops `ids` of `graph`, one column at a time (see the
    module docstring).

    Bound to one Profile object (its graph binding and its slots): `Profile.kernel_column`
    and the others keep one per (graph, ids array) they are asked about.
    """

    def __init__(self, profile: Profile, graph: Graph, ids: np.ndarray) -> None:
        self.profile = profile
        self.graph = graph
        self.ids = ids
        feats = op_features(graph)
        self._feats = feats
        ids = np.asarray(ids, dtype=np.int64)
        view = feats.is_view[ids]
        self.view = view
        self.kernel = np.flatnonzero(~view)  # positions (in `ids`) of the ops with a kernel
        kid = ids[self.kernel]
        self._kid = kid.tolist()  # their op ids
        # Each distinct fit class once: its class key and model (`Profile.class_key`, `class_model`).
        fit_codes, inverse = np.unique(feats.fit_code[kid], return_inverse=True)
        keys_u: list[str] = []
        models_u: list[WorkThreadsModel | Roofline] = []
        for code in fit_codes.tolist():
            key = profile.class_key_of(feats.fit_keys[code], feats.fit_op_class[code])
            keys_u.append(key)
            models_u.append(profile.class_model(key))
        fitted_u = np.array([type(m) is WorkThreadsModel for m in models_u], dtype=bool)
        nan = (np.nan,) * len(PARAM_NAMES)
        params_u = np.array([tuple(m.to_params().values()) if type(m) is WorkThreadsModel else nan for m in models_u],
                            dtype=F64)  # in PARAM_NAMES' order
        params = params_u.reshape(len(models_u), len(PARAM_NAMES))[inverse]
        self.params = {name: params[:, j] for j, name in enumerate(PARAM_NAMES)}
        self.fitted = fitted_u[inverse]  # over self.kernel
        self._keys_u, self._inverse, self._fitted_u = keys_u, inverse, fitted_u
        self._op_class_u = [feats.fit_op_class[code] for code in fit_codes.tolist()]  # each fit class's op class
        sigs, row_of = feats.signature, profile.signatures.get
        self.rows = [row_of(sigs[i]) or None for i in self._kid]  # `if row:` in `Profile._alone_us`: an empty row is none
        self.first_use_us = np.zeros(len(kid), dtype=F64)
        bound = profile.bound
        if bound is not None:
            if bound[0] is graph:
                first = np.flatnonzero(feats.first_use[kid])
            else:  # a Profile bound to another graph: its first uses by op identity
                ops, ids_of_first = graph.ops, bound[1]
                first = np.array([j for j, i in enumerate(self._kid) if id(ops[i]) in ids_of_first], dtype=np.int64)
            extra, op_class = profile.context.first_use, feats.op_class
            for j in first.tolist():
                self.first_use_us[j] = extra(op_class[self._kid[j]])
        self.in_turn = np.ones(len(kid), dtype=F64)  # `Profile.in_turn_factor` per kernel op
        if bound is not None and profile.context.in_turn is not None:
            factor = profile.context.in_turn.factor(distinct_in_turn(bound[0]))
            cls = feats.op_class
            self.in_turn[np.fromiter((cls[i] in IN_TURN_CLASSES for i in self._kid), dtype=bool, count=len(kid))] = factor
        self.flops = feats.flops[kid]
        self.nbytes = feats.nbytes[kid]
        self._alone: dict[int, np.ndarray] = {}  # threads -> `Profile._alone_us` over self.kernel
        self._wake_fits: list[WakeFit | None] | None = None  # per kernel op, once a wake is asked
        self._shares: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._mem_work: tuple[np.ndarray, np.ndarray] | None = None

    def _op(self, j: int) -> Op:
        """The kernel op at position `j` of self.kernel."""
        return self.graph.ops[self._kid[j]]

    # ---- the class models, in arrays (`WorkThreadsModel`'s formulas, element by element) ----

    def _mem_and_work(self) -> tuple[np.ndarray, np.ndarray]:
        """`WorkThreadsModel.mem_us` and `work_us` of each kernel op, computed once."""
        if self._mem_work is None:
            p = self.params
            mb = self.nbytes * 1e-6
            mem = mb * p["us_per_mb"] + p["us_per_mb_dram"] * np.maximum(0.0, mb - p["cache_mb"])
            self._mem_work = (mem, self.flops * p["us_per_gflop"] * 1e-9 + mem)
        return self._mem_work

    def _parallel_share(self, work: np.ndarray) -> np.ndarray:
        p = self.params
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(work > 0, p["p_max"] * work / (work + p["h_us"]), 0.0)

    def _model_kernel_us(self, threads: int) -> np.ndarray:
        p = self.params
        _, work = self._mem_and_work()
        share = self._parallel_share(work)
        n = max(1, threads)
        return p["a_us"] + work * ((1.0 - share) + share / n) + p["c_us"] * (n - 1)

    # ---- `Profile._alone_us` over the ops with a kernel -----------------------------------

    def alone_us(self, threads: int) -> np.ndarray:
        """Each kernel op's time alone at `threads` (`Profile._alone_us`), kept per count."""
        n = max(1, int(threads))
        out = self._alone.get(n)
        if out is not None:
            return out
        prof = self.profile
        warm = np.maximum(0.0, self._model_kernel_us(n))
        asked: list[int] = []  # positions the scalar method answers: not fitted, or a row without `n`
        for j, row in enumerate(self.rows):
            if row is not None:
                hit = row.get(n)
                if hit is not None:
                    warm[j] = hit
                    continue
                asked.append(j)
            elif not self.fitted[j]:
                asked.append(j)
        cold: np.ndarray | float = 0.0  # `Profile.cold_us` where the Profile has cold costs
        if prof.cold is not None:
            cold = self._cold_us(n)
        turn: np.ndarray | float = 0.0  # `Profile._turn_extra_us` of each op: the convolutions taking turns
        curve = prof.context.in_turn
        if curve is not None and (self.in_turn != 1.0).any():
            turn = curve.extra_column(warm, self.in_turn)
        out = np.maximum(0.0, warm + turn + self.first_use_us + cold)
        for j in asked:
            out[j] = prof._alone_us(self._op(j), n)
        self._alone[n] = out
        return out

    def _cold_us(self, threads: int) -> np.ndarray:
        """`Profile.cold_us` of each kernel op at `threads` (`ColdCosts.extra_us`, its
        arithmetic in the same order): one `paid_slope` per fit class, not one call per op,
        which was a quarter of a cold simulation of the 308-op heldout:mha-regressor."""
        cold = self.profile.cold
        assert cold is not None
        slope_u = np.array([cold.paid_slope(c, threads) for c in self._op_class_u], dtype=F64)
        return cold.share * (slope_u[self._inverse] * np.maximum(0.0, self.nbytes) / MIB)

    def _serial_us(self) -> np.ndarray:
        """`Profile.serial_us` of each kernel op (several slots)."""
        return np.minimum(self.alone_us(1), self.profile.corun.serial_window_us)

    # ---- the columns -----------------------------------------------------------------------

    def kernel_us(self, threads: int) -> np.ndarray:
        """`Profile.kernel_us(op, threads)` of every op."""
        prof = self.profile
        n = max(1, int(threads))
        out = np.zeros(len(self.ids), dtype=F64)
        if prof.dispatch_slots > 1 and prof.corun.views_wait:
            out[self.view] = prof.corun.latency(n)
        alone = self.alone_us(n)
        if prof.dispatch_slots <= 1:
            team = prof.team_us(n)  # `Profile.team_wait_us`
            out[self.kernel] = alone + (team * self._shares_arrays()[2] if team > 0.0 and prof.corun.team_share else team)
        else:
            out[self.kernel] = np.maximum(0.0, alone - self._serial_us()) + prof.corun.latency(n)
        return out

    def team_basis_us(self, threads: int) -> np.ndarray:
        """`Profile.team_basis_us(op, threads)` of every op."""
        out = np.zeros(len(self.ids), dtype=F64)
        n = max(1, int(threads))
        alone = self.alone_us(n)
        if n > 1 and self.profile.wake:
            forks = self._forks_at_any_size()
            if forks.any():
                alone = np.where(forks, np.minimum(alone, self.alone_us(1) / n), alone)
        out[self.kernel] = alone
        return out

    def _forks_at_any_size(self) -> np.ndarray:
        """`Profile.forks_at_any_size` of each kernel op, from its class key (once per class)."""
        forks = self.profile.class_forks_at_any_size
        forks_u = np.array([forks(key, fitted) for key, fitted in zip(self._keys_u, self._fitted_u.tolist(), strict=True)],
                           dtype=bool)
        return forks_u[self._inverse] if len(forks_u) else np.zeros(len(self.kernel), dtype=bool)

    def dispatch_us(self) -> np.ndarray:
        """`Profile.dispatch_us(op)` of every op."""
        prof = self.profile
        d = prof.dispatch
        out = np.empty(len(self.ids), dtype=F64)
        if prof.dispatch_slots <= 1:
            out[self.kernel] = d.op_us
        else:
            out[self.kernel] = d.corun_op_us + self._serial_us()
        views = np.flatnonzero(self.view).tolist()
        if views:
            base = d.view_us
            if prof.dispatch_slots > 1:
                base = d.view_us * d.corun_op_us / d.op_us if d.op_us > 0 else d.corun_op_us
            extra, f = prof.views.extra_us, self._feats
            sigs, op_class, n_out = f.signature, f.op_class, f.n_outputs
            memo: dict[tuple[str, str, int], float] = {}  # a view's signature holds no shapes: views share it
            col = []
            for i in self.ids[views].tolist():
                key = (sigs[i], op_class[i], int(n_out[i]))
                us = memo.get(key)
                if us is None:
                    us = memo[key] = extra(*key)
                col.append(base + us)
            out[views] = col
        return out

    def _shares_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(memory, work, parallel) shares of each kernel op (`_OpLookup.shares`)."""
        if self._shares is None:
            mem, work = self._mem_and_work()
            a = self.params["a_us"]
            with np.errstate(divide="ignore", invalid="ignore"):
                mem_share = np.where(work > 0, mem / work, 1.0)
                work_share = np.where(work + a > 0, work / (work + a), 0.0)
            parallel = self._parallel_share(work)
            for j in np.flatnonzero(~self.fitted).tolist():
                mem_share[j], work_share[j], parallel[j] = self.profile._lookup(self._op(j)).shares()
            self._shares = (mem_share, work_share, parallel)
        return self._shares

    def wake_us(self, threads: int) -> np.ndarray:
        """`Profile.wake_us(op, threads)` of every op."""
        prof = self.profile
        out = np.zeros(len(self.ids), dtype=F64)
        if threads < 2 or not prof.wake or not len(self.kernel):
            return out
        if self._wake_fits is None:
            get = prof.class_wake_fit
            keys, inverse = self._keys_u, self._inverse.tolist()
            self._wake_fits = [
                get(keys[u]) if fitted else None
                for u, fitted in zip(inverse, self.fitted.tolist(), strict=True)
            ]  # fmt: skip
        fits = self._wake_fits
        pays = np.fromiter((f is not None for f in fits), dtype=bool, count=len(fits))
        if not pays.any():
            return out
        base = np.fromiter((f.base_us if f is not None else 0.0 for f in fits), dtype=F64, count=len(fits))
        per_work = np.fromiter((f.per_work if f is not None else 0.0 for f in fits), dtype=F64, count=len(fits))
        share = {t: wake_share(prof.wake_scale, t, threads) for t in {f.threads for f in fits if f is not None}}
        scale = np.fromiter((share[f.threads] if f is not None else 0.0 for f in fits), dtype=F64, count=len(fits))
        _, work = self._mem_and_work()
        with np.errstate(divide="ignore", invalid="ignore"):
            region = np.where(work > 0.0, work / (work + self.params["h_us"]), 0.0)
        gated = np.fromiter((f.share_gated if f is not None else True for f in fits), dtype=bool, count=len(fits))
        cap = np.fromiter((f.cap_us if f is not None and f.cap_us is not None else np.inf for f in fits), dtype=F64,
                          count=len(fits))
        floor = np.fromiter((f.floor_us if f is not None else 0.0 for f in fits), dtype=F64, count=len(fits))
        extra = np.minimum(floor + np.where(gated, region, 1.0) * (base + per_work * work), cap)
        out[self.kernel] = np.where(pays, extra * scale, 0.0)
        return out

    def corun_slowdown(self, busy_cores: int, total_cores: int) -> np.ndarray:
        """`Profile.corun_slowdown(op, busy_cores, total_cores)` of every op."""
        out = np.ones(len(self.ids), dtype=F64)
        if busy_cores <= 0 or total_cores <= 1 or not len(self.kernel):
            return out
        frac = min(1.0, busy_cores / (total_cores - 1))
        mem, work, parallel = self._shares_arrays()
        c = self.profile.corun
        factor = c.compute_slowdown + (c.mem_slowdown - c.compute_slowdown) * mem
        slowed = np.maximum(1.0, 1.0 + (factor - 1.0) * frac * work)
        if busy_cores >= total_cores:
            oversub = c.oversub_compute + (c.oversub_mem - c.oversub_compute) * mem
            excess = (oversub - 1.0) * parallel
            if c.oversub_decay_us is not None:
                excess = excess * c.oversub_share(self.alone_us(total_cores))
            slowed = slowed * np.maximum(1.0, 1.0 + excess)
        out[self.kernel] = slowed
        return out
