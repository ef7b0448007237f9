"""Tessel's large-vocabulary GPT experiment, simulated (`search.tessel.gpt_experiment`)."""

from __future__ import annotations

import pytest

from schedlab.errors import SchedlabError
from schedlab.search.tessel.gpt_experiment import GPTConfig, megatron_shape, run, stage_us, tessel_m_shape


def test_block_times_follow_the_flop_counts() -> None:
    cfg = GPTConfig(layers=4, hidden=64, vocab=1000, tokens=32)
    peak = cfg.peak_flops()
    assert cfg.layer_us() == pytest.approx((24 * 32 * 64**2 + 4 * 32**2 * 64) / peak * 1e6)
    assert cfg.head_us() == pytest.approx(2 * 32 * 64 * 1000 / peak * 1e6)
    assert stage_us(cfg, 2) == pytest.approx(2 * cfg.layer_us())


def test_megatron_puts_the_embedding_and_head_on_the_end_stages() -> None:
    cfg = GPTConfig()
    shape = megatron_shape(cfg, 4)
    head = cfg.head_us() / stage_us(cfg, 4)
    assert [round(s.f_time, 6) for s in shape.stages] == [round(1 + head, 6), 1.0, 1.0, round(1 + head, 6)]
    assert all(s.b_time == pytest.approx(2 * s.f_time) for s in shape.stages)
    m = tessel_m_shape(cfg, 4)  # the same work in all, the heavy blocks spread over every device
    total = sum((s.f_time + s.b_time) * len(s.devices) for s in m.stages)
    assert total == pytest.approx(sum(s.f_time + s.b_time for s in shape.stages))
    with pytest.raises(SchedlabError, match="split evenly"):
        megatron_shape(GPTConfig(layers=30), 4)


def test_tessel_beats_megatrons_1f1b_with_a_zero_bubble_repetend() -> None:
    r = run(GPTConfig(), 4, 16)
    assert r.tessel_repetend_us == pytest.approx(r.tessel_lower_bound_us)  # no bubble in the steady state
    assert r.speedup > 1.2
    # 1F1B's pace is its heaviest stage's F + B per micro-batch: the last stage's layers and the head
    slowest = 3 * (stage_us(GPTConfig(), 4) + r.head_us)
    assert r.megatron_makespan_us >= 16 * slowest
