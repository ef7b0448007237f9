"""The torch networks of RL placement (`search.placement.rl`): a grouper and a placer.

- `Grouper`: a two-layer perceptron from an atom's features to logits over G groups, one
  independent choice per atom (the hierarchical planner's feed-forward grouper).
- `Placer`: each group's embedding is the mean of its atoms' projected features, plus a
  learned embedding of the group's index and a projection of its size (share of atoms,
  share of time: a mean alone cannot tell a group of one small atom from one of twenty
  heavy ones, and balance is what a placer trades against communication); one or two
  Transformer encoder layers let every group attend to every other, and a linear head
  gives logits over devices, one independent choice per group.

`Policy.sample` draws a batch of placements with a caller's `torch.Generator` (nothing
here touches torch's global random state: dropout is off) and returns the joint
log-probability and entropy that REINFORCE needs, all in batched tensor operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

HIDDEN = 64  # width of the grouper's hidden layer and of the placer's model
HEADS = 4
# The grouper's output layer starts at 25 times torch's default scale, which spreads its
# first logits to a standard deviation of about 2: the first groupings already follow
# feature similarity (ops of one kind, of neighbouring layers) instead of being uniform
# mixtures, so the placer sees groups it can tell apart from the first iteration. With
# the default scale the placer faces 16 look-alike groups, the cheapest gain is to move
# them all to one device, and the policy stalls there: on a synthetic task (10 layers, a
# known best split over 2 devices, 16 samples, 40 iterations) 3 seeds of 4 ended where
# they started with the default scale, while with this gain 3 of 4 ended at a third of
# their first step time, at the optimum. (It makes memory-bound problems, where only
# groups spread evenly fit, no easier: a coherent group of heavy atoms overflows.)
GROUPER_INIT_GAIN = 25.0


class Grouper(nn.Module):
    def __init__(self, n_features: int, n_groups: int, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_groups))
        head = self.net[2]
        assert isinstance(head, nn.Linear)
        with torch.no_grad():
            head.weight.mul_(GROUPER_INIT_GAIN)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[atoms, F] -> [atoms, G] logits."""
        out: torch.Tensor = self.net(feats)
        return out


class Placer(nn.Module):
    def __init__(self, n_features: int, n_groups: int, n_devices: int, d_model: int = HIDDEN, layers: int = 1) -> None:
        super().__init__()
        self.n_groups = n_groups
        self.proj = nn.Linear(n_features, d_model)
        self.size = nn.Linear(2, d_model)
        self.index = nn.Embedding(n_groups, d_model)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, HEADS, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(d_model, n_devices)

    def forward(self, feats: torch.Tensor, weight: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
        """Device logits [S, G, D] for S groupings `assign` [S, atoms] of atoms with
        features `feats` [atoms, F] and time shares `weight` [atoms] (summing to 1)."""
        member = nn.functional.one_hot(assign, self.n_groups).to(feats.dtype)  # [S, A, G]
        count = member.sum(dim=1)  # [S, G]
        mean = torch.einsum("sag,ad->sgd", member, self.proj(feats)) / count.clamp(min=1.0).unsqueeze(-1)
        size = torch.stack((count / assign.shape[1], torch.einsum("sag,a->sg", member, weight)), dim=-1)
        h = mean + self.size(size) + self.index.weight.unsqueeze(0)
        for layer in self.encoder:
            h = layer(h)
        out: torch.Tensor = self.head(h)
        return out


@dataclass(frozen=True)
class Sample:
    """A batch of S placements of A atoms over G groups."""

    assign: torch.Tensor  # [S, A] group of each atom
    group_device: torch.Tensor  # [S, G] device of each group
    atom_device: torch.Tensor  # [S, A] device of each atom (its group's)
    log_prob: torch.Tensor  # [S] joint log-probability (grouper's per atom + placer's per non-empty group)
    entropy: torch.Tensor  # [S] the same decisions' entropies, summed
    decisions: torch.Tensor  # [S] how many decisions those sums hold


class Policy(nn.Module):
    def __init__(self, n_features: int, n_groups: int, n_devices: int, layers: int = 1) -> None:
        super().__init__()
        self.grouper = Grouper(n_features, n_groups)
        self.placer = Placer(n_features, n_groups, n_devices, layers=layers)

    def sample(self, feats: torch.Tensor, weight: torch.Tensor, n: int, gen: torch.Generator) -> Sample:
        """`n` placements drawn with `gen`; log_prob and entropy carry gradients.

        An empty group's device changes nothing, so its choice is left out of the joint
        log-probability and entropy (it would only add variance to the gradient)."""
        n_atoms = feats.shape[0]
        g_logp = torch.log_softmax(self.grouper(feats), dim=-1)  # [A, G]
        g_prob = g_logp.exp()
        assign = torch.multinomial(g_prob.detach(), n, replacement=True, generator=gen).T.contiguous()  # [S, A]
        atoms = torch.arange(n_atoms)
        lp_group = g_logp[atoms.unsqueeze(0), assign].sum(dim=1)  # [S]
        ent_group = -(g_prob * g_logp).sum()  # the same for every sample

        p_logp = torch.log_softmax(self.placer(feats, weight, assign), dim=-1)  # [S, G, D]
        p_prob = p_logp.exp()
        s, g, d = p_logp.shape
        draw = torch.multinomial(p_prob.detach().reshape(s * g, d), 1, generator=gen).reshape(s, g)
        used = torch.zeros(s, g, dtype=torch.bool).scatter_(1, assign, True)
        lp_place = (p_logp.gather(2, draw.unsqueeze(-1)).squeeze(-1) * used).sum(dim=1)
        ent_place = (-(p_prob * p_logp).sum(dim=-1) * used).sum(dim=1)
        return Sample(
            assign=assign,
            group_device=draw,
            atom_device=draw.gather(1, assign),
            log_prob=lp_group + lp_place,
            entropy=ent_group + ent_place,
            decisions=used.sum(dim=1) + n_atoms,
        )
