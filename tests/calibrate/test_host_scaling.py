"""The host's two-core probe: what it measures and how it is saved."""

from __future__ import annotations

import torch

from schedlab.calibrate.host_scaling import HostScaling, probe_host_scaling


def test_one_thread_has_nothing_to_scale() -> None:
    assert probe_host_scaling(1) is None


def test_the_probe_measures_both_ops_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    p = probe_host_scaling(2, reps=1)
    assert p is not None and p.threads == 2
    assert p.compute_1t_us > 0 and p.memory_1t_us > 0
    assert 0 < p.call_us < p.memory_1t_us  # a one-element add: the interpreter and dispatcher
    assert 0 < p.compute_speedup < 10 and 0 < p.memory_speedup < 10
    assert torch.get_num_threads() == before


def test_json_round_trip_and_anything_else_reads_as_no_probe() -> None:
    p = HostScaling(2, 1.9, 1.4, 9600.0, 850.0, 1.25)
    assert HostScaling.from_json(p.to_json()) == p
    before_calls = {k: v for k, v in p.to_json().items() if k != "call_us"}  # a probe from before the tiny call
    assert HostScaling.from_json(before_calls) == HostScaling(2, 1.9, 1.4, 9600.0, 850.0, 0.0)
    assert HostScaling.from_json([1, 2]) is None
    assert HostScaling.from_json(None) is None
    assert HostScaling.from_json({"threads": 2}) is None
