"""A validation set on calibration's side: small models of stock nn layers that calibration
never replays, to check a Profile on models it has not seen without touching the
held-out test set.

The shapes differ from the coverage models' (`coverage.SHAPES`), so none of their ops is
in a Profile's signature table by construction of the shapes alone; a few small ops
(a bias `add`, a `t`) may coincide. Use them while developing the cost model; judge it
on the held-out models once, at the end.

    python -m schedlab.calibrate.devset PROFILE [--steps 8] [--out dev.json]

runs each model under the 16 plans of the fidelity spread on the executor (fastest of
the timed steps) and in the simulator (the Profile bound to the graph), and prints the
absolute error per model and (slots, threads) group.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _GRUTagger(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, tags)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(x))
        return F.cross_entropy(self.out(h).flatten(0, 1), y.flatten())


class _LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 20)
        self.rnn = nn.LSTM(20, 40, 2, batch_first=True)
        self.out = nn.Linear(40, 5)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(x))
        return F.cross_entropy(self.out(h[:, -1]), y)


class _DepthwiseConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )
        self.seq = nn.Sequential(nn.Conv1d(6, 24, 7, padding=3), nn.BatchNorm1d(24), nn.GELU(), nn.Conv1d(24, 24, 5, padding=2, groups=4))
        self.out = nn.Linear(24, 10)

    def forward(self, image: Tensor, seq: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.image(image) + self.out(self.seq(seq).mean(-1)), y)


class _Attention(nn.Module):
    def __init__(self, vocab: int = 200, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.mha = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 3 * width), nn.ReLU(), nn.Linear(3 * width, width))
        self.out = nn.Linear(width, 7)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h = self.embed(x)
        a = self.norm(h)
        h = h + self.mha(a, a, a)[0]
        h = h + self.ff(self.norm2(h))
        return F.cross_entropy(self.out(h.max(1).values), y)


_BUILDERS: dict[str, Callable[[], tuple[nn.Module, tuple[Tensor, ...]]]] = {
    "gru": lambda: (_GRUTagger(300, 48, 80, 2, 12), (torch.randint(300, (6, 20)), torch.randint(12, (6, 20)))),
    "gru-big": lambda: (_GRUTagger(1000, 128, 256, 1, 12), (torch.randint(1000, (16, 16)), torch.randint(12, (16, 16)))),
    "lstm": lambda: (_LSTMClassifier(), (torch.randint(100, (5, 9)), torch.randint(5, (5,)))),
    "dwconv": lambda: (_DepthwiseConv(), (torch.randn(6, 3, 20, 20), torch.randn(6, 6, 50), torch.randint(10, (6,)))),
    "attn": lambda: (_Attention(), (torch.randint(200, (8, 12)), torch.randint(7, (8,)))),
}
DEV_MODELS: tuple[str, ...] = tuple(_BUILDERS)


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Dev model `name` in training mode, with its inputs (seeded)."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown dev model {name!r}; known: {', '.join(DEV_MODELS)}")
    torch.manual_seed(seed)
    module, inputs = _BUILDERS[name]()
    return module.train(), inputs


def dev_check(profile_path: str, models: tuple[str, ...] = DEV_MODELS, steps: int = 8) -> dict[str, dict[str, dict[str, float]]]:
    """model -> plan name -> {"measured_s", "predicted_s"} over the fidelity spread."""
    from schedlab.calibrate.fidelity import measure, plan_spread, predict
    from schedlab.calibrate.profile import Profile
    from schedlab.capture import capture
    from schedlab.machine import detect_host
    from schedlab.plan import resolve
    from schedlab.workloads import Workload

    profile = Profile.load(profile_path, check_machine=False)
    machine = detect_host()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in models:
        module, inputs = build(name)
        c = capture(Workload(f"dev:{name}", "dev", module, inputs), "sgd")
        plans = [resolve(c.graph, plan, machine) for plan in plan_spread(machine.default_device.cores)]
        measured = measure(name, c.graph, c.input_values, plans, machine, steps=steps, warmup=2)
        predicted = predict(c.graph, plans, profile, machine)  # the Profile bound to the graph, per slots
        out[name] = {
            r.plan.name or r.plan.describe(): {"measured_s": min(m.run.step_times_s), "predicted_s": p.step_time_s}
            for r, m, p in zip(plans, measured, predicted, strict=True)
        }
    return out


def _groups(rows: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean absolute error (%) per "s<slots>-t<threads>" group of plans."""
    by: dict[str, list[float]] = {}
    for plan, r in rows.items():
        by.setdefault("-".join(plan.split("-")[:2]), []).append(
            abs(r["predicted_s"] / r["measured_s"] - 1.0) * 100.0
        )
    return {g: statistics.fmean(v) for g, v in sorted(by.items())}


def main(argv: list[str] | None = None) -> int:
    from schedlab.allocator import ensure_tuned
    from schedlab.calibrate.host_load import foreign_cpu_frac, snapshot

    p = argparse.ArgumentParser(prog="python -m schedlab.calibrate.devset", description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("--models", default=",".join(DEV_MODELS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    ensure_tuned()
    start = snapshot()
    results = dev_check(args.profile, tuple(args.models.split(",")), args.steps)
    busy = foreign_cpu_frac(start, snapshot())
    for name, rows in results.items():
        groups = "  ".join(f"{g} {e:4.0f}%" for g, e in _groups(rows).items())
        print(f"{name:8s} {groups}")
    every = [abs(r["predicted_s"] / r["measured_s"] - 1.0) for rows in results.values() for r in rows.values()]
    print(f"MAPE over {len(every)} plans: {statistics.fmean(every) * 100:.0f}%; other processes' CPU share {busy}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "foreign_cpu_frac": busy}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
