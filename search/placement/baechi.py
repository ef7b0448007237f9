"""Baechi's memory-constrained placement heuristics (Jeon et al., SoCC 2020), over
co-location groups: ``m-topo``, ``m-etf`` and ``m-sct``.

Each takes a `PlacementProblem` and answers one device index per group, never putting on a
device more resident bytes (`group_mem_bytes`) than its capacity. A group is placed whole,
where its first op is placed; its later ops follow it.

- **m-TOPO** walks the ops in program (topological) order and fills the devices one after
  another: each device takes groups while its compute stays within an equal share of the
  step and its memory holds, then the walk moves on to the next device.
- **m-ETF** (earliest task first) list-schedules the op DAG: the ready op that can start
  earliest on some device is scheduled next, a transfer (`transfer_us`) delaying an input
  that comes from another device.
- **m-SCT** (small communication times) solves the linear-programming relaxation of the
  favourite-child problem, then list-schedules as m-ETF does, except that a favourite child
  is urgent on its parent's device (first among the ops that can start there at the same
  time) and goes there when that costs no more than the transfer it saves.

On heterogeneous devices (a CPU beside GPUs) m-ETF and m-SCT generalise the pair rule of
earliest start: the op chosen is still the one that can start earliest (ties: smaller op
id), and it goes to the device where it *finishes* earliest (ties: lower device index). On
devices that run every op equally fast, that is the device where it starts earliest, as in
Baechi; on a machine with a slow CPU it keeps the work off the CPU when the CPU is merely
idle, not fast.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from schedlab.errors import SchedlabError
from schedlab.search.placement.problem import PlacementProblem

# Weight of sum(x) in the LP's objective beside the makespan (in the LP's time unit, the
# largest op time or transfer; see `solve_sct_lp`): among the makespan-optimal
# solutions it picks the one with the most favourite edges, so that edges off the critical
# path (whose x the makespan leaves free) round to favourites rather than at random.
_X_WEIGHT = 1e-4
_FAVOURITE_BELOW = 0.5  # x_ij below this: j is i's favourite child
_SLACK = 1e-9  # relative tolerance of m-TOPO's compute share


def m_topo(problem: PlacementProblem) -> list[int]:
    """Baechi's m-TOPO: contiguous runs of groups in topological order, one device after
    another, each within an equal share of the compute and within its memory.

    Device d's share is the balanced makespan ``H = 1 / sum_d (1 / T_d)`` where ``T_d`` is
    the whole graph's time on d, measured in d's own time: the share each device would run
    if the work were split in proportion to speed. A device takes a group while its load
    plus the group's time on it stays within H (an empty device takes any group) and the
    group's bytes fit; else the walk moves on. The last device takes the rest; a group that
    fits no device from the current one onward goes to the first device with room.
    """
    _check_fits(problem)
    n_dev = problem.n_devices
    if n_dev == 1:
        return [0] * problem.n_groups
    totals = [sum(row[d] for row in problem.op_time_us) for d in range(n_dev)]
    inv = sum(1.0 / t for t in totals if t > 0.0)
    share_us = 1.0 / inv if inv > 0.0 else 0.0
    group_time = problem.group_time_us
    used = [0] * n_dev
    load_us = [0.0] * n_dev
    out = [-1] * problem.n_groups
    cur = 0
    for g in problem.op_group:
        if out[g] >= 0:
            continue
        mem = problem.group_mem_bytes[g]
        d = cur
        while d < n_dev:
            fits_mem = used[d] + mem <= problem.capacity_bytes[d]
            last = d == n_dev - 1
            fits_share = load_us[d] == 0.0 or load_us[d] + group_time[g][d] <= share_us * (1.0 + _SLACK)
            if fits_mem and (fits_share or last):
                break
            d += 1
        if d == n_dev:  # no room from the current device on: the first device with room
            d = next((k for k in range(n_dev) if used[k] + mem <= problem.capacity_bytes[k]), -1)
            if d < 0:
                raise _stuck(problem, g, used)
        else:
            cur = d
        out[g] = d
        used[d] += mem
        load_us[d] += group_time[g][d]
    return out


def m_etf(problem: PlacementProblem) -> list[int]:
    """Baechi's m-ETF: list scheduling by earliest start, memory-constrained (module docstring)."""
    return _list_schedule(problem, None)


def m_sct(problem: PlacementProblem) -> list[int]:
    """Baechi's m-SCT: m-ETF that keeps each op with its favourite parent (`solve_sct_lp`)
    when that costs no more than the transfer it saves."""
    _check_fits(problem)
    if problem.n_devices == 1:
        return [0] * problem.n_groups
    lp = solve_sct_lp(problem)
    return _list_schedule(problem, favourite_parents(lp, len(problem.graph.ops)))


BAECHI: dict[str, Callable[[PlacementProblem], list[int]]] = {"m-topo": m_topo, "m-etf": m_etf, "m-sct": m_sct}


# ---- m-SCT's linear program ---------------------------------------------------------------


@dataclass(frozen=True)
class SctLp:
    """The solved LP relaxation of the favourite-child problem.

    Variables: start time ``s_i`` (µs) per op, ``x_e`` in [0, 1] per edge ``e = (i, j)`` of
    the op DAG (0: j is i's favourite child and the edge costs nothing; 1: it pays the
    transfer ``c_e``), and the makespan ``w``. Minimises ``w`` (plus `_X_WEIGHT * sum x`)
    subject to ``s_j >= s_i + p_i + c_e x_e``, ``s_i + p_i <= w``, and at most one favourite
    child per op and one favourite parent per op (``sum_j x_ij >= outdeg(i) - 1``,
    ``sum_i x_ij >= indeg(j) - 1``).

    ``p_i`` is the op's time on its fastest device (where a good placement runs it);
    ``c_e`` the transfer of op i's output bytes averaged over every ordered pair of devices
    (the typical link).
    """

    edges: tuple[tuple[int, int], ...]
    x: tuple[float, ...]  # per edge
    start_us: tuple[float, ...]  # per op
    makespan_us: float
    op_time_us: tuple[float, ...]  # p_i
    edge_cost_us: tuple[float, ...]  # c_e


def solve_sct_lp(problem: PlacementProblem) -> SctLp:
    """Build and solve the LP of `SctLp` (sparse, HiGHS); SchedlabError if HiGHS fails."""
    graph = problem.graph
    n = len(graph.ops)
    p = [min(row) if row else 0.0 for row in problem.op_time_us]
    edges = tuple((i, j) for j in range(n) for i in graph.preds[j])
    lat_us, us_per_byte = _mean_link(problem)
    cost = tuple(lat_us + us_per_byte * max(0, problem.op_out_bytes[i]) for i, _ in edges)
    n_e = len(edges)
    if n == 0:
        return SctLp((), (), (), 0.0, (), ())
    if n_e == 0:  # no edges: nothing to choose; every op starts at 0
        return SctLp((), (), tuple(0.0 for _ in p), max(p), tuple(p), ())
    # Times enter in units of the largest op time or transfer: coefficients of order 1 keep
    # HiGHS accurate and fast (in µs, a 100 ms step put its interior-point method off).
    unit = max(max(p), max(cost), 1e-9)
    pu = [t / unit for t in p]
    cu = [t / unit for t in cost]
    w_col = n + n_e
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []
    r = 0
    for e, (i, j) in enumerate(edges):  # s_i - s_j + c_e x_e <= -p_i
        rows += [r, r, r]
        cols += [i, j, n + e]
        vals += [1.0, -1.0, cu[e]]
        rhs.append(-pu[i])
        r += 1
    out_edges: list[list[int]] = [[] for _ in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (i, j) in enumerate(edges):
        out_edges[i].append(e)
        in_edges[j].append(e)
    for i in range(n):
        if not out_edges[i]:  # a sink: s_i - w <= -p_i
            rows += [r, r]
            cols += [i, w_col]
            vals += [1.0, -1.0]
            rhs.append(-pu[i])
            r += 1
    for group in (out_edges, in_edges):  # -sum x_e <= -(deg - 1)
        for es in group:
            if len(es) < 2:
                continue
            rows += [r] * len(es)
            cols += [n + e for e in es]
            vals += [-1.0] * len(es)
            rhs.append(-(len(es) - 1.0))
            r += 1
    a_ub = sp.csr_matrix((np.array(vals), (np.array(rows), np.array(cols))), shape=(r, w_col + 1))
    c = np.zeros(w_col + 1)
    c[n:w_col] = _X_WEIGHT
    c[w_col] = 1.0
    bounds = np.zeros((w_col + 1, 2))
    bounds[:, 1] = np.inf
    bounds[n:w_col, 1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.array(rhs), bounds=bounds, method="highs")
    if res.status != 0 or res.x is None:
        raise SchedlabError(
            f"m-sct: HiGHS could not solve the favourite-child LP of {n} ops and {n_e} edges "
            f"(status {res.status}: {res.message})"
        )
    sol = res.x
    return SctLp(
        edges=edges,
        x=tuple(float(v) for v in sol[n:w_col]),
        start_us=tuple(float(v) * unit for v in sol[:n]),
        makespan_us=float(sol[w_col]) * unit,
        op_time_us=tuple(p),
        edge_cost_us=cost,
    )


def favourite_children(lp: SctLp, n_ops: int) -> tuple[int, ...]:
    """op -> its favourite child (-1: none): the edges with x below 0.5, kept as a matching
    (each op at most one favourite child and one favourite parent) by ascending x, then
    parent id, then child id. The LP's constraints already allow at most one such edge per
    op; the matching only guards against its rounding tolerance."""
    child = [-1] * n_ops
    parent = [-1] * n_ops
    cands = sorted((x, i, j) for (i, j), x in zip(lp.edges, lp.x) if x < _FAVOURITE_BELOW)
    for _, i, j in cands:
        if child[i] < 0 and parent[j] < 0:
            child[i] = j
            parent[j] = i
    return tuple(child)


def favourite_parents(lp: SctLp, n_ops: int) -> tuple[int, ...]:
    """op -> its favourite parent (-1: none); the inverse of `favourite_children`."""
    parent = [-1] * n_ops
    for i, j in enumerate(favourite_children(lp, n_ops)):
        if j >= 0:
            parent[j] = i
    return tuple(parent)


def _mean_link(problem: PlacementProblem) -> tuple[float, float]:
    """(latency µs, µs per byte) of `transfer_us` averaged over ordered device pairs."""
    n_dev = problem.n_devices
    pairs = [(a, b) for a in range(n_dev) for b in range(n_dev) if a != b]
    if not pairs:
        return 0.0, 0.0
    lat = sum(problem.transfer_us(a, b, 0) for a, b in pairs) / len(pairs)
    per_byte = sum(problem.transfer_us(a, b, 1e6) - problem.transfer_us(a, b, 0) for a, b in pairs) / len(pairs) / 1e6
    return lat, per_byte


# ---- list scheduling (m-ETF, m-SCT) -------------------------------------------------------


def _list_schedule(problem: PlacementProblem, fav_parent: Sequence[int] | None) -> list[int]:
    """ETF list scheduling of the op DAG over the devices, a group placed with its first op.

    Per device: ``free[d]``, when its last scheduled op finishes. A ready op's data is on
    device d at ``ready[j][d] = max over preds p (finish[p] + transfer(dev[p], d, out[p]))``,
    fixed once its preds are scheduled; it can start there at ``max(free[d], ready[j][d])``.
    Each device keeps the ready ops it may take (its group is on d, or unplaced and its
    bytes fit d) in two heaps: those whose data is there by ``free[d]`` (they start at
    ``free[d]``: by op id) and the later ones (by data time, op id). Entries made stale by a
    placement or by d filling up are dropped when they reach the top (both only ever happen
    once and for good), so each step costs O(devices) plus heap work.

    With `fav_parent` (m-SCT), SCT's urgent rule: an op whose favourite parent ran on d is
    *urgent* on d, and goes first among the ops that can start at the same time there (ETF's
    tie-break by op id comes after); and the chosen op goes to its favourite parent's device
    instead of the best one when it finishes there no later than on the best device plus the
    transfer that this avoids.
    """
    _check_fits(problem)
    n_dev = problem.n_devices
    if n_dev == 1:
        return [0] * problem.n_groups
    graph = problem.graph
    n = len(graph.ops)
    preds = graph.preds
    succs = graph.succs
    times = problem.op_time_us
    out_bytes = problem.op_out_bytes
    op_group = problem.op_group
    gmem = problem.group_mem_bytes
    cap = problem.capacity_bytes
    lat = [[problem.transfer_us(a, b, 0) for b in range(n_dev)] for a in range(n_dev)]
    per_byte = [[(problem.transfer_us(a, b, 1e6) - lat[a][b]) / 1e6 for b in range(n_dev)] for a in range(n_dev)]

    gdev = [-1] * problem.n_groups
    used = [0] * n_dev
    free = [0.0] * n_dev
    op_dev = [-1] * n
    finish = [0.0] * n
    done = [False] * n
    ready_at: list[list[float]] = [[] for _ in range(n)]
    missing = [len(preds[j]) for j in range(n)]
    avail: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]  # (not urgent, op)
    pending: list[list[tuple[float, int, int]]] = [[] for _ in range(n_dev)]  # (data ready, not urgent, op)

    def allowed(j: int, d: int) -> bool:
        g = op_group[j]
        home = gdev[g]
        return home == d if home >= 0 else used[d] + gmem[g] <= cap[d]

    def make_ready(j: int) -> None:
        row = [0.0] * n_dev
        for p in preds[j]:
            src = op_dev[p]
            f = finish[p]
            nbytes = max(0, out_bytes[p])
            for d in range(n_dev):
                t = f if d == src else f + lat[src][d] + per_byte[src][d] * nbytes
                if t > row[d]:
                    row[d] = t
        ready_at[j] = row
        urgent_on = op_dev[fav_parent[j]] if fav_parent is not None and fav_parent[j] >= 0 else -1
        for d in range(n_dev):
            if allowed(j, d):
                rank = 0 if d == urgent_on else 1
                if row[d] <= free[d]:
                    heapq.heappush(avail[d], (rank, j))
                else:
                    heapq.heappush(pending[d], (row[d], rank, j))

    def peek(d: int) -> tuple[float, int, int] | None:
        """(earliest start, not urgent, op) of the best op device d may take now."""
        av = avail[d]
        while av and (done[av[0][1]] or not allowed(av[0][1], d)):
            heapq.heappop(av)
        if av:
            return free[d], av[0][0], av[0][1]
        pe = pending[d]
        while pe and (done[pe[0][2]] or not allowed(pe[0][2], d)):
            heapq.heappop(pe)
        return pe[0] if pe else None

    for j in range(n):
        if missing[j] == 0:
            make_ready(j)
    for _ in range(n):
        best: tuple[float, int, int] | None = None
        for d in range(n_dev):
            cand = peek(d)
            if cand is not None and (best is None or cand < best):
                best = cand
        if best is None:
            break
        j = best[2]
        row = ready_at[j]
        tj = times[j]
        fin = [max(free[d], row[d]) + tj[d] if allowed(j, d) else float("inf") for d in range(n_dev)]
        dev = min(range(n_dev), key=lambda d: (fin[d], d))
        if fav_parent is not None and fav_parent[j] >= 0:
            fp = fav_parent[j]
            home = op_dev[fp]
            if home != dev and fin[home] != float("inf"):
                saved = lat[home][dev] + per_byte[home][dev] * max(0, out_bytes[fp])
                if fin[home] <= fin[dev] + saved:
                    dev = home
        g = op_group[j]
        if gdev[g] < 0:
            gdev[g] = dev
            used[dev] += gmem[g]
        done[j] = True
        op_dev[j] = dev
        finish[j] = fin[dev]
        free[dev] = fin[dev]
        pe, av = pending[dev], avail[dev]
        while pe and pe[0][0] <= free[dev]:
            _, rank, k = heapq.heappop(pe)
            heapq.heappush(av, (rank, k))
        for k in succs[j]:
            missing[k] -= 1
            if missing[k] == 0:
                make_ready(k)
    if not all(done):
        j = done.index(False)
        raise _stuck(problem, op_group[j], used)
    return gdev


# ---- memory -------------------------------------------------------------------------------


def _check_fits(problem: PlacementProblem) -> None:
    """SchedlabError when no placement can hold the groups' bytes: more in all than the
    devices hold together, or a group larger than the largest device."""
    total = sum(problem.group_mem_bytes)
    room = sum(problem.capacity_bytes)
    if total > room:
        raise SchedlabError(
            f"the {problem.n_groups} groups hold {total} bytes; the {problem.n_devices} devices hold "
            f"{room} bytes together: no placement fits in memory"
        )
    biggest = max(range(problem.n_groups), key=lambda g: problem.group_mem_bytes[g], default=None)
    if biggest is not None and problem.group_mem_bytes[biggest] > max(problem.capacity_bytes):
        raise SchedlabError(
            f"group {problem.groups[biggest].key!r} holds {problem.group_mem_bytes[biggest]} bytes, more than any "
            f"device's capacity (largest {max(problem.capacity_bytes)} bytes): no placement fits in memory"
        )


def _stuck(problem: PlacementProblem, g: int, used: Sequence[int]) -> SchedlabError:
    left = ", ".join(f"{problem.devices[d].id}: {problem.capacity_bytes[d] - used[d]}" for d in range(problem.n_devices))
    return SchedlabError(
        f"group {problem.groups[g].key!r} ({problem.group_mem_bytes[g]} bytes) fits no device's memory left "
        f"({left} bytes) after the groups placed before it: the devices hold the groups in total, but this "
        "greedy packing does not; give the devices more memory or use fewer, larger ones"
    )
