"""The `mlp` workload: a stack of Linear+ReLU layers with a cross-entropy loss.

Measured on a 2-core CPU, torch 2.13 (eager step = forward + loss.backward() + SGD step,
torch's default threads; nodes = aot-exported joint graph):
    tiny:    ~0.2 ms/step,  57 nodes
    default: ~180-190 ms/step, 91 nodes (16.7M parameters)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.workloads.sizes import config_at


@dataclass(frozen=True)
class MLPConfig:
    batch: int
    in_features: int
    hidden: int
    layers: int  # hidden Linear+ReLU layers
    classes: int


CONFIGS: dict[str, MLPConfig] = {
    "tiny": MLPConfig(batch=8, in_features=32, hidden=64, layers=2, classes=10),
    "default": MLPConfig(batch=512, in_features=1024, hidden=2048, layers=4, classes=1000),
}


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = cfg.in_features
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.ReLU()]
            width = cfg.hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, cfg.classes)

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        # x: [B, in_features] float32, target: [B] int64 class ids
        logits = self.head(self.body(x))  # [B, classes]
        return F.cross_entropy(logits, target)  # []


def build(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The model (training mode) and its inputs (x, target), drawn from torch's global RNG."""
    cfg = config_at(CONFIGS, size)
    model = MLP(cfg).train()
    x = torch.randn(cfg.batch, cfg.in_features)  # [B, in_features]
    target = torch.randint(cfg.classes, (cfg.batch,))  # [B]
    return model, (x, target)
