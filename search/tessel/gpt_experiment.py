"""Tessel's GPT experiment, simulated: a GPT-like model whose vocabulary is large enough
that its embedding and output head weigh as much as several layers, pipelined over P
devices two ways (Lin et al., HPCA 2024, the large-vocabulary GPT runs of its Fig. 10):

- **1F1B as Megatron places it**: P stages of L/P layers, the embedding on the first
  stage and the head on the last, run under the 1F1B schedule. The last stage carries the
  head alone, so it sets the pace.
- **Tessel's M shape**: the same layers as a V of P stages, the embedding and the head
  each sharded over all P devices (blocks spanning every device, `tessel_shapes.mshape`
  with `sharded_head`), scheduled by Tessel's repetend search (HiGHS) under twice 1F1B's
  activation memory per device (2P stages' worth; at 1F1B's own P the search found a
  repetend 21% above its bound at 4 devices and none at 8 within its 60 s limit).

Block times come from FLOP counts on one GPU of a machine preset at its peak (`GPTConfig`;
a transformer layer: 24 T h^2 + 4 T^2 h forward FLOPs for T tokens of width h, the head:
2 T h V); backward is twice forward. Every block here is matmul-bound, so the ratio of
the two makespans does not depend on the peak chosen. The embedding block is charged the
head's time (a lookup costs less; this counts against Tessel). Communication is free, as
in the timing model of every abstract schedule.

    python -m schedlab.search.tessel.gpt_experiment 4 32     # a Markdown table on stdout
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from schedlab.errors import SchedlabError
from schedlab.machine import load_machine
from schedlab.pipeline import check_schedule
from schedlab.pipeline.generators import generate
from schedlab.pipeline.shape import PipeShape, Stage
from schedlab.pipeline.tessel_shapes import tessel_shape
from schedlab.search.tessel.search import search_tessel


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-like model and the device its blocks are costed on."""

    layers: int = 32
    hidden: int = 2048
    vocab: int = 256_000
    tokens: int = 1024  # per micro-batch (sequence length x micro-batch size)
    preset: str = "dgx-8gpu"

    def peak_flops(self) -> float:
        gpus = [d for d in load_machine(self.preset).devices if d.kind == "cuda"]
        if not gpus or gpus[0].peak_flops <= 0:
            raise SchedlabError(f"preset {self.preset!r} has no GPU with a peak FLOP rate")
        return gpus[0].peak_flops

    def layer_us(self) -> float:
        """Forward time of one transformer layer (µs)."""
        t, h = self.tokens, self.hidden
        return (24 * t * h * h + 4 * t * t * h) / self.peak_flops() * 1e6

    def head_us(self) -> float:
        """Forward time of the output head (µs)."""
        return 2 * self.tokens * self.hidden * self.vocab / self.peak_flops() * 1e6


@dataclass(frozen=True)
class GPTRow:
    n_devices: int
    n_microbatches: int
    layer_us: float
    head_us: float
    megatron_makespan_us: float
    tessel_makespan_us: float
    tessel_repetend_us: float
    tessel_lower_bound_us: float
    tessel_search_s: float

    @property
    def speedup(self) -> float:
        return self.megatron_makespan_us / self.tessel_makespan_us


def megatron_shape(cfg: GPTConfig, n_devices: int) -> PipeShape:
    """L/P layers per stage, the embedding on the first stage and the head on the last;
    times in units of one stage's layers' forward (`stage_us`)."""
    if cfg.layers % n_devices:
        raise SchedlabError(f"{cfg.layers} layers do not split evenly over {n_devices} devices")
    per, head = 1.0, cfg.head_us() / stage_us(cfg, n_devices)
    stages = []
    for s in range(n_devices):
        f = per + (head if s == 0 else 0.0) + (head if s == n_devices - 1 else 0.0)
        stages.append(Stage(devices=(s,), next=(s + 1,) if s + 1 < n_devices else (), f_time=f, b_time=2 * f,
                            i_time=f, w_time=f, f_mem=1.0, name=f"stage{s}"))
    return PipeShape(stages=tuple(stages), n_devices=n_devices, name="megatron")


def stage_us(cfg: GPTConfig, n_devices: int) -> float:
    """Forward time of one stage's L/P layers (µs): the unit both shapes' times are in (the
    repetend search works on small numbers; the makespans' ratio is the same)."""
    return cfg.layers // n_devices * cfg.layer_us()


def tessel_m_shape(cfg: GPTConfig, n_devices: int) -> PipeShape:
    """The same layers as a V of P stages; embedding and head each sharded over all P devices."""
    per, shard = 1.0, cfg.head_us() / n_devices / stage_us(cfg, n_devices)
    return tessel_shape("mshape", n_devices, f_time=per, b_time=2 * per, f_mem=1.0,
                        shard_f_time=shard, shard_b_time=2 * shard, sharded_head=True)


def run(cfg: GPTConfig, n_devices: int, n_microbatches: int, memory_factor: float = 2.0,
        time_limit_s: float = 60) -> GPTRow:
    """Both pipelines of `cfg` over `n_devices` devices and `n_microbatches` micro-batches,
    Tessel's under `memory_factor` times 1F1B's activation memory (P stages' worth)."""
    baseline = check_schedule(generate("1f1b", megatron_shape(cfg, n_devices), n_microbatches))
    found = search_tessel(tessel_m_shape(cfg, n_devices), n_microbatches, memory_limit=memory_factor * n_devices,
                          time_limit_s=time_limit_s)
    unit = stage_us(cfg, n_devices)
    return GPTRow(n_devices, n_microbatches, cfg.layer_us(), cfg.head_us(), baseline.makespan * unit,
                  found.makespan * unit, found.repetend_time * unit, found.lower_bound * unit, found.search_s)


def main(argv: list[str]) -> int:
    sizes = [int(x) for x in argv] or [4, 32]
    cfg = GPTConfig()
    print(f"GPT-like: {cfg.layers} layers, hidden {cfg.hidden}, vocabulary {cfg.vocab}, {cfg.tokens} tokens per "
          f"micro-batch, one GPU of {cfg.preset} at peak; simulated (abstract schedules, free communication)\n")
    print("| P | M | layer F ms | head F ms | 1F1B (Megatron) ms | Tessel M shape ms | speedup | repetend / bound ms "
          "| search s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in sizes:
        r = run(cfg, p, 4 * p)
        print(f"| {p} | {r.n_microbatches} | {r.layer_us / 1e3:.2f} | {r.head_us / 1e3:.2f} | "
              f"{r.megatron_makespan_us / 1e3:.1f} | {r.tessel_makespan_us / 1e3:.1f} | {r.speedup:.2f}x | "
              f"{r.tessel_repetend_us / 1e3:.2f} / {r.tessel_lower_bound_us / 1e3:.2f} | {r.tessel_search_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
