"""The `cnn` workload: a small ResNet (basic blocks, BatchNorm) with a cross-entropy loss.

BatchNorm2d runs in training mode, so every forward updates its running statistics: the
exported graph has buffer updates as outputs.

Measured on a 2-core CPU, torch 2.13 (eager step = forward + loss.backward() + SGD step,
torch's default threads; nodes = aot-exported joint graph):
    tiny:    ~2 ms/step, 191 nodes
    default: ~230 ms/step, 571 nodes (2.8M parameters)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.workloads.sizes import config_at


@dataclass(frozen=True)
class CNNConfig:
    batch: int
    image: int  # square images of image x image pixels, 3 channels
    # channels per stage; every stage after the first halves H and W
    widths: tuple[int, ...]
    blocks_per_stage: int
    classes: int


CONFIGS: dict[str, CNNConfig] = {
    "tiny": CNNConfig(batch=2, image=8, widths=(8, 16), blocks_per_stage=1, classes=10),
    "default": CNNConfig(batch=48, image=32, widths=(32, 64, 128, 256), blocks_per_stage=2, classes=100),
}


def conv_bn(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
    """Conv (no bias) followed by BatchNorm2d."""
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-bn, plus a 1x1 conv-bn shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, 1)
        reshape = stride != 1 or cin != cout
        self.shortcut = conv_bn(cin, cout, 1, stride) if reshape else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, cin, H, W] -> [B, cout, H / stride, W / stride]
        out = F.relu(self.conv1(x))
        out = self.conv2(out)
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        self.stem = conv_bn(3, cfg.widths[0], 3, 1)
        blocks: list[nn.Module] = []
        cin = cfg.widths[0]
        for stage, width in enumerate(cfg.widths):
            for i in range(cfg.blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(cin, width, stride))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, cfg.classes)

    def forward(self, images: Tensor, target: Tensor) -> Tensor:
        # images: [B, 3, H, W] float32, target: [B] int64 class ids
        x = F.relu(self.stem(images))  # [B, widths[0], H, W]
        x = self.blocks(x)  # [B, widths[-1], H', W']
        x = x.mean(dim=(2, 3))  # global average pool: [B, widths[-1]]
        logits = self.head(x)  # [B, classes]
        return F.cross_entropy(logits, target)  # []


def build(size: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The model (training mode) and its inputs (images, target), from torch's global RNG."""
    cfg = config_at(CONFIGS, size)
    model = ResNet(cfg).train()
    images = torch.randn(cfg.batch, 3, cfg.image, cfg.image)  # [B, 3, H, W]
    target = torch.randint(cfg.classes, (cfg.batch,))  # [B]
    return model, (images, target)
