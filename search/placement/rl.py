"""RL placement: a grouper and a placer trained jointly with REINFORCE.

The placement paper (Junnan Liu et al., HP3C 2019) places a training step's ops with
the hierarchical planner of Mirhoseini et al. ("A Hierarchical Model for Device
Placement", ICLR 2018): a *grouper* assigns every op to one of G groups, a *placer*
assigns every group to a device, and both learn together from the step time of the
placements they sample. `train_placer` does that over a `PlacementProblem`.

Units. The grouper's units ("atoms") are the problem's co-location groups, not single
ops: ops that must share a device (a layer, or a layer's ops of one kind with
``split_fbw``) would only be split by the grouper to be merged again, and the
hierarchical planner itself merges co-located ops before grouping. So the answer is one
device per co-location group, `PlacementProblem.to_plan`'s input.

Features (`features`, one row per atom, each column in [0, 1]): the share of the atom's
time in each of the graph's top op classes (and "other"), the share of its ops of each
kind F/B/W/OPT, log FLOPs, log bytes moved, log output bytes, the position of its layer
in forward order, the mean longest-path depth of its ops in the op DAG, log time on
each device kind, log resident memory (log columns divided by their largest value).

Networks (`rl_policy`). The grouper is the planner's feed-forward net: a two-layer
perceptron from an atom's features to logits over G groups. The placer is an attentional
sequence model over the G group embeddings (each the mean of its atoms' projected
features, plus a learned group-index embedding and the group's size), a Transformer
encoder layer and a linear head to logits over devices. The planner's placer is an LSTM
encoder-decoder with attention, which decodes groups one after another, each choice
conditioned on the previous ones. What its attention buys -- every group's choice sees
every other group, so it can trade balance against cut edges -- a self-attention encoder
gives in one batched pass; the autoregressive decoder would add a sequential loop of G
steps per sample to every iteration for a conditioning the reward can teach anyway
(groups are re-formed every sample, so a fixed decoding order means little here), so
each group's device is drawn independently given the encoded sequence.

Reward. A placement's reward is ``-sqrt(step_time_s)``, with the time from the
caller's callback (the simulator, or the real executor with ``--reward measured``).

- A placement whose resident memory overflows some device (`PlacementProblem.over_memory`)
  is never run: its reward is ``-sqrt(ref) * (1 + overflow)``, ``overflow`` the bytes
  beyond capacity over all the atoms' resident bytes (so in (0, 1]), and ``ref`` the
  larger of the worst feasible step time seen so far and a pessimistic serial time (every
  atom on its slowest device one after another, every cut edge over the slowest link).
  It is therefore below every feasible placement seen, and less so the less it overflows,
  which leads the policy back to placements that fit. The serial time, usually above any
  simulated one, keeps the reference from jumping when the first feasible placement
  turns up: a jump shifts every reward at once and the moving baseline lags behind it.
- A callback answer of ``inf`` (or NaN), or a `SchedlabError` it raises (an invalid or
  out-of-memory plan), makes the placement infeasible: reward ``-2 * sqrt(ref)``.
- Rewards are cached by placement: a placement sampled again costs no callback.

Training. Each iteration samples `RLConfig.samples` placements and steps Adam on the
REINFORCE loss over the joint log-probability (grouper's per atom plus placer's per
non-empty group), with gradients clipped to norm 1. The advantage is the reward minus a
moving-average baseline (decay `baseline_decay`), divided by the root of a moving average
of the squared advantage: the step time's units (ms or s, a synthetic score) then do not
change how large a step is next to the entropy bonus. The entropy bonus (the decisions'
summed entropies) has the coefficient `RLConfig.entropy` decaying linearly to 0 at the
last iteration: explore first, commit at the end.

Answer, determinism, resume. The answer is the best feasible placement of all sampled
(the earliest among equals), not the policy's last mode. The curve has one row per
iteration. Everything random comes from a `torch.Generator` seeded by `RLConfig.seed`
(the nets are initialised under that seed in a forked global RNG, which is restored), and
torch runs on one thread while training (restored after), so one seed gives one curve and
one answer; only ``wall_s`` (cumulative training seconds) varies between runs. With a
`checkpoint` path the whole state (nets, Adam, baseline, generator, curve, best, reward
cache) is written atomically after every iteration as plain data and tensors (loadable
with ``weights_only=True``), and a run given an existing checkpoint continues from it:
killed after iteration i and resumed, it ends with the curve and answer of an
uninterrupted run. A checkpoint's configuration must match the run's except for
`iterations`, which may grow (the entropy schedule then stretches to the new end).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.io import atomic_file
from schedlab.layer_split import layers_in_order
from schedlab.search.placement.problem import PlacementProblem
from schedlab.search.placement.rl_policy import Policy

TOP_CLASSES = 8  # op classes with their own feature column; the rest share "other"
MAX_GROUPS = 16  # default G: min(MAX_GROUPS, atoms)
GRAD_CLIP = 1.0
CHECKPOINT_FORMAT = "schedlab.rl_checkpoint"
CHECKPOINT_VERSION = 1
_KINDS = (OpKind.F, OpKind.B, OpKind.W, OpKind.OPT)


@dataclass(frozen=True)
class RLConfig:
    groups: int | None = None  # G; None: min(16, atoms)
    iterations: int = 80
    samples: int = 16  # placements per iteration
    lr: float = 0.003
    # Entropy bonus coefficient at the first iteration (0 at the last). The bonus sums the
    # entropies of every decision (one per atom and per group: 10-58 on the built-ins)
    # while the advantage is normalised to about 1 a sample, so a large coefficient drowns
    # the reward: at 0.3 the policy's mean step time did not fall over 80 iterations
    # (transformer on 4 GPUs of dgx-8gpu, 6.20 -> 6.31 ms; its best 5.51-5.63 over three
    # seeds, the expert split 5.48), at 0.02 it fell (6.20 -> 6.01; best 5.38-5.45);
    # 2026-11-28; on cnn and nmt there the same best, on mlp 3.11 or 2.99 over two seeds
    # (2.99 at 0.3). It commits too early on a large graph: `nmt --size paper` (5,043 ops) on
    # cpu-4gpu, best 90.6 ms at 0.02 against 84.7 at 0.3 (the expert split 80.5).
    entropy: float = 0.02
    baseline_decay: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if self.groups is not None and self.groups < 1:
            raise SchedlabError(f"RL placement needs at least one group, not {self.groups}")
        if self.iterations < 0 or self.samples < 1:
            raise SchedlabError(f"RL placement needs iterations >= 0 and samples >= 1, not {self.iterations} and {self.samples}")
        if not (self.lr > 0 and self.entropy >= 0 and 0 <= self.baseline_decay < 1):
            raise SchedlabError(f"RL placement needs lr > 0, entropy >= 0 and 0 <= baseline_decay < 1: {self}")


@dataclass(frozen=True)
class RLResult:
    group_device: list[int]  # the answer: device index per co-location group
    step_time_s: float  # its step time (inf when no sampled placement was feasible)
    curve: list[dict[str, Any]]  # one row per iteration (module docstring)
    evaluations: int  # callback calls (distinct placements that fit in memory)
    config: RLConfig


# ---- features ----------------------------------------------------------------------------


def features(problem: PlacementProblem) -> torch.Tensor:
    """[atoms, F] float32 features of the problem's co-location groups (module docstring)."""
    graph = problem.graph
    n_atoms = problem.n_groups
    if n_atoms == 0:
        raise SchedlabError("RL placement needs a graph with at least one op")
    op_time = [sum(row) / len(row) for row in problem.op_time_us]  # mean over devices
    class_time: dict[str, float] = {}
    for op in graph.ops:
        class_time[op.op_class] = class_time.get(op.op_class, 0.0) + op_time[op.id]
    top = sorted(class_time, key=lambda c: (-class_time[c], c))[:TOP_CLASSES]
    col = {c: i for i, c in enumerate(top)}
    mix = torch.zeros(n_atoms, TOP_CLASSES + 1, dtype=torch.float64)
    kinds = torch.zeros(n_atoms, len(_KINDS), dtype=torch.float64)
    count = torch.zeros(n_atoms, dtype=torch.float64)
    sums = torch.zeros(n_atoms, 4, dtype=torch.float64)  # flops, bytes moved, out bytes, depth
    kind_col = {k: i for i, k in enumerate(_KINDS)}
    depth = _depths(graph)
    for op in graph.ops:
        a = problem.op_group[op.id]
        mix[a, col.get(op.op_class, TOP_CLASSES)] += op_time[op.id]
        if op.kind in kind_col:
            kinds[a, kind_col[op.kind]] += 1.0
        count[a] += 1.0
        sums[a, 0] += op.flops
        sums[a, 1] += op.bytes_moved
        sums[a, 2] += problem.op_out_bytes[op.id]
        sums[a, 3] += depth[op.id]
    mix = mix / mix.sum(dim=1, keepdim=True).clamp(min=1e-30)
    kinds = kinds / count.clamp(min=1.0).unsqueeze(1)
    max_depth = max(depth, default=0)
    mean_depth = sums[:, 3] / count.clamp(min=1.0) / max(1, max_depth)
    layers = {lay: i for i, lay in enumerate(layers_in_order(graph))}
    position = torch.tensor(
        [layers[g.layer] / max(1, len(layers) - 1) if g.layer in layers else 0.0 for g in problem.groups],
        dtype=torch.float64,
    )
    kind_device: dict[str, int] = {}
    for d, dev in enumerate(problem.devices):
        kind_device.setdefault(dev.kind, d)
    times = torch.tensor([[row[d] for d in kind_device.values()] for row in problem.group_time_us], dtype=torch.float64)
    mem = torch.tensor(problem.group_mem_bytes, dtype=torch.float64).unsqueeze(1)
    logs = torch.log1p(torch.cat((sums[:, :3], times.reshape(n_atoms, -1), mem), dim=1))
    logs = logs / logs.max(dim=0).values.clamp(min=1e-30)
    cols = (mix, kinds, logs[:, :3], position.unsqueeze(1), mean_depth.unsqueeze(1), logs[:, 3:])
    return torch.cat(cols, dim=1).to(torch.float32)


def _depths(graph: Graph) -> list[int]:
    """op id -> ops on the longest path from a source to it (1 for a source)."""
    preds = graph.preds
    pending = [len(p) for p in preds]
    ready = [i for i, n in enumerate(pending) if n == 0]
    depth = [1] * len(preds)
    while ready:
        i = ready.pop()
        for s in graph.succs[i]:
            depth[s] = max(depth[s], depth[i] + 1)
            pending[s] -= 1
            if pending[s] == 0:
                ready.append(s)
    return depth


def _time_weights(problem: PlacementProblem) -> torch.Tensor:
    """[atoms] share of the step's work (mean over devices) in each atom, summing to 1."""
    t = torch.tensor([sum(row) / len(row) for row in problem.group_time_us], dtype=torch.float32)
    total = float(t.sum())
    return t / total if total > 0 else torch.full_like(t, 1.0 / len(t))


def _serial_bound_s(problem: PlacementProblem) -> float:
    """A pessimistic step time: every atom on its slowest device one after another, every
    cut edge over the slowest link (the least reference of the penalties)."""
    compute_us = sum(max(row) for row in problem.group_time_us)
    pairs = [(a, b) for a in range(problem.n_devices) for b in range(problem.n_devices) if a != b]
    comm_us = sum(max((problem.transfer_us(a, b, n) for a, b in pairs), default=0.0) for n in problem.group_edges.values())
    return max(1e-6 * (compute_us + comm_us), 1e-9)


# ---- training state ----------------------------------------------------------------------


@dataclass
class _State:
    iteration: int = 0
    baseline: float | None = None
    sq_adv: float | None = None  # moving average of the squared advantage
    curve: list[dict[str, Any]] = field(default_factory=list)
    best_time_s: float = math.inf
    best: list[int] | None = None
    fallback_reward: float = -math.inf  # highest reward seen: the answer if nothing was feasible
    fallback: list[int] | None = None
    worst_feasible_s: float | None = None
    cache: dict[tuple[int, ...], float] = field(default_factory=dict)  # placement -> step time (inf: infeasible)
    evaluations: int = 0
    elapsed_s: float = 0.0


def _config_key(config: RLConfig) -> dict[str, Any]:
    return asdict(replace(config, iterations=0))


def _save(path: Path, config: RLConfig, shape: tuple[int, int, int, int], policy: Policy, opt: torch.optim.Adam,
          gen: torch.Generator, st: _State) -> None:
    data = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": _config_key(config),
        "shape": list(shape),
        "policy": policy.state_dict(),
        "optimizer": opt.state_dict(),
        "generator": gen.get_state(),
        "iteration": st.iteration,
        "baseline": st.baseline,
        "sq_adv": st.sq_adv,
        "curve": st.curve,
        "best_time_s": st.best_time_s,
        "best": st.best,
        "fallback_reward": st.fallback_reward,
        "fallback": st.fallback,
        "worst_feasible_s": st.worst_feasible_s,
        "cache_placements": torch.tensor(list(st.cache), dtype=torch.int32).reshape(len(st.cache), shape[0]),
        "cache_step_time_s": torch.tensor(list(st.cache.values()), dtype=torch.float64),
        "evaluations": st.evaluations,
        "elapsed_s": st.elapsed_s,
    }
    with atomic_file(path, "wb") as f:
        torch.save(data, f)


def _load(path: Path, config: RLConfig, shape: tuple[int, int, int, int], policy: Policy, opt: torch.optim.Adam,
          gen: torch.Generator) -> _State:
    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # a truncated or foreign file: the user's to remove
        raise SchedlabError(f"cannot read RL checkpoint {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT or data.get("version") != CHECKPOINT_VERSION:
        raise SchedlabError(f"{path} is not an RL checkpoint of version {CHECKPOINT_VERSION}")
    if data["config"] != _config_key(config) or tuple(data["shape"]) != shape:
        raise SchedlabError(
            f"RL checkpoint {path} holds another training ({data['config']}, atoms/groups/devices/features "
            f"{data['shape']}) than this one ({_config_key(config)}, {list(shape)}): remove it or use another path"
        )
    policy.load_state_dict(data["policy"])
    opt.load_state_dict(data["optimizer"])
    gen.set_state(data["generator"])
    return _State(
        iteration=int(data["iteration"]),
        baseline=data["baseline"],
        sq_adv=data["sq_adv"],
        curve=list(data["curve"]),
        best_time_s=float(data["best_time_s"]),
        best=data["best"],
        fallback_reward=float(data["fallback_reward"]),
        fallback=data["fallback"],
        worst_feasible_s=data["worst_feasible_s"],
        cache=dict(zip(map(tuple, data["cache_placements"].tolist()), data["cache_step_time_s"].tolist())),
        evaluations=int(data["evaluations"]),
        elapsed_s=float(data["elapsed_s"]),
    )


# ---- training ----------------------------------------------------------------------------


def train_placer(
    problem: PlacementProblem,
    step_time_s: Callable[[list[int]], float],
    config: RLConfig,
    *,
    checkpoint: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RLResult:
    """Train the grouper and placer on `problem` for `config.iterations` iterations and
    answer with the best placement sampled (module docstring).

    `step_time_s(group_device)` gives a placement's step time in seconds (inf, or a
    `SchedlabError`, for an infeasible one). With `checkpoint`, training resumes from that
    file when it exists and writes it after every iteration. `progress(done, total)` is
    called after each iteration (and once at the start of a resumed run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(problem, step_time_s, config, checkpoint, progress)
    finally:
        torch.set_num_threads(threads)


def _train(
    problem: PlacementProblem,
    step_time_s: Callable[[list[int]], float],
    config: RLConfig,
    checkpoint: Path | None,
    progress: Callable[[int, int], None] | None,
) -> RLResult:
    feats = features(problem)
    weight = _time_weights(problem)
    n_atoms, n_devices = problem.n_groups, problem.n_devices
    n_groups = config.groups if config.groups is not None else min(MAX_GROUPS, n_atoms)
    shape = (n_atoms, n_groups, n_devices, feats.shape[1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = Policy(feats.shape[1], n_groups, n_devices)
    opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed)
    st = _State()
    if checkpoint is not None and checkpoint.exists():
        st = _load(checkpoint, config, shape, policy, opt, gen)
        if progress is not None and st.iteration > 0:
            progress(min(st.iteration, config.iterations), config.iterations)

    mem = torch.tensor(problem.group_mem_bytes, dtype=torch.int64)
    cap = torch.tensor(problem.capacity_bytes, dtype=torch.int64)
    total_mem = max(1, sum(problem.group_mem_bytes))
    serial_s = _serial_bound_s(problem)

    def evaluate(gd: list[int]) -> float:
        key = tuple(gd)
        t = st.cache.get(key)
        if t is None:
            try:
                t = float(step_time_s(gd))
            except SchedlabError:
                t = math.inf
            if math.isnan(t) or t < 0:
                t = math.inf
            st.cache[key] = t
            st.evaluations += 1
        return t

    while st.iteration < config.iterations:
        t0 = time.perf_counter()
        sample = policy.sample(feats, weight, config.samples, gen)
        rows: list[list[int]] = sample.atom_device.tolist()
        used = torch.zeros(config.samples, n_devices, dtype=torch.int64).scatter_add_(
            1, sample.atom_device, mem.expand(config.samples, -1)
        )
        overflow: list[int] = (used - cap).clamp(min=0).sum(dim=1).tolist()

        times = [evaluate(gd) if over == 0 else None for gd, over in zip(rows, overflow)]
        feasible = [t for t in times if t is not None and math.isfinite(t)]
        for gd, t in zip(rows, times):
            if t is not None and t < st.best_time_s:
                st.best_time_s, st.best = t, gd
        if feasible:
            st.worst_feasible_s = max(st.worst_feasible_s or 0.0, *feasible)
        ref = math.sqrt(max(st.worst_feasible_s or 0.0, serial_s))
        rewards = [
            -ref * (1.0 + over / total_mem) if t is None else (-math.sqrt(t) if math.isfinite(t) else -2.0 * ref)
            for t, over in zip(times, overflow)
        ]
        for gd, r in zip(rows, rewards):
            if r > st.fallback_reward:
                st.fallback_reward, st.fallback = r, gd

        mean_r = sum(rewards) / len(rewards)
        if st.baseline is None:
            st.baseline = mean_r
        msq = sum((r - st.baseline) ** 2 for r in rewards) / len(rewards)
        st.sq_adv = msq if st.sq_adv is None else config.baseline_decay * st.sq_adv + (1 - config.baseline_decay) * msq
        scale = math.sqrt(st.sq_adv + (1e-6 * abs(st.baseline)) ** 2 + 1e-24)
        adv = torch.tensor([(r - st.baseline) / scale for r in rewards], dtype=torch.float32)
        st.baseline = config.baseline_decay * st.baseline + (1 - config.baseline_decay) * mean_r

        coeff = config.entropy * max(0.0, 1.0 - st.iteration / max(1, config.iterations))
        loss = -(adv * sample.log_prob).mean() - coeff * sample.entropy.mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(policy.parameters(), GRAD_CLIP)
        opt.step()

        st.iteration += 1
        st.elapsed_s += time.perf_counter() - t0
        st.curve.append(
            {
                "iteration": st.iteration,
                "mean_reward": mean_r,
                "mean_step_time_s": sum(feasible) / len(feasible) if feasible else None,
                "best_step_time_s": st.best_time_s if math.isfinite(st.best_time_s) else None,
                "entropy": float((sample.entropy.detach() / sample.decisions).mean()),
                "feasible_share": len(feasible) / len(rows),
                "wall_s": st.elapsed_s,
            }
        )
        if checkpoint is not None:
            _save(checkpoint, config, shape, policy, opt, gen, st)
        if progress is not None:
            progress(st.iteration, config.iterations)

    answer = st.best if st.best is not None else st.fallback
    if answer is None:  # no iteration ran: everything on the first device, not evaluated
        answer = [0] * n_atoms
    return RLResult(
        group_device=list(answer), step_time_s=st.best_time_s, curve=list(st.curve), evaluations=st.evaluations,
        config=config,
    )
