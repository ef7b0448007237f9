"""Signatures, argument decoding and the replay of a captured workload."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
import torch

from schedlab.calibrate.aten_call import decode, decode_call, resolve_target
from schedlab.calibrate.cases import Case, new_signatures, workload_cases
from schedlab.calibrate.signature import GROUPED_CLASS, UNBLOCKED_CLASS, is_unblocked_groups, signature, signature_of
from schedlab.calibrate.sweep import EXTRA_MATMUL_MIN_FLOPS, SweepConfig, _conv_specs, sweep_cases, sweep_specs
from schedlab.capture import capture
from schedlab.errors import SchedlabError
from schedlab.workloads import load_workload
from schedlab.workloads.loader import Workload
from tests.calibrate.factories import make_op


def _ungrouped(op_class: str) -> str:
    """A convolution class with its grouped variants taken as the dense class."""
    return op_class.removesuffix(GROUPED_CLASS).removesuffix(UNBLOCKED_CLASS)

def test_signature_names_work_and_non_tensor_args() -> None:
    op = make_op(target="aten.sum.dim_IntList", flops=10.0, nbytes=360, args=({"v": 3}, [0], True))
    assert signature(op) == 'aten.sum.dim_IntList|f=10.0|b=360|a=["T",[0],true]'
    other_dim = make_op(target="aten.sum.dim_IntList", flops=10.0, nbytes=360, args=({"v": 3}, [1], True))
    assert signature(other_dim) != signature(op)
    assert signature_of("aten.clone.default", 4.0, 32, [{"v": 1}], {"memory_format": {"memory_format": "x"}}).endswith(
        '|k={"memory_format":{"memory_format":"x"}}'
    )


def test_decode_enums_lists_and_values() -> None:
    t = torch.ones(2)
    args, kwargs = decode_call(
        ([{"v": 5}, {"v": 5}], 1), {"dtype": {"dtype": "float16"}, "memory_format": {"memory_format": "channels_last"}}, {5: t}
    )
    assert args[0][0] is t and args[1] == 1
    assert kwargs == {"dtype": torch.float16, "memory_format": torch.channels_last}
    assert decode({"device": "cpu"}, {}) == torch.device("cpu")
    assert decode({"layout": "strided"}, {}) is torch.strided
    with pytest.raises(SchedlabError, match="unknown op argument encoding"):
        decode({"what": 1}, {})


def test_resolve_target() -> None:
    assert resolve_target("aten.addmm.default") is torch.ops.aten.addmm.default
    with pytest.raises(SchedlabError, match=r"unknown op .aten\.nonesuch\.default."):
        resolve_target("aten.nonesuch.default")


def test_replay_yields_each_distinct_op_once_on_real_tensors_views_included() -> None:
    c = capture(load_workload("mlp", "tiny"), "sgd")
    seen: set[str] = set()
    expected = new_signatures(c.graph, seen)
    cases = []
    for case in workload_cases(c.graph, c.input_values, seen, "mlp/tiny/sgd"):
        out = case.fn(*case.args, **case.kwargs)  # every case runs on the replay's tensors
        assert out is not None
        cases.append(case)
    assert [k.signature for k in cases] == expected and len(expected) == len(set(expected))
    views = {signature(op): op for op in c.graph.ops if op.is_view}
    assert views and {k.signature for k in cases if k.is_view} == set(views)  # views are cases, marked
    for k in cases:
        if k.is_view:
            assert k.outputs == len(views[k.signature].outputs)
    assert list(workload_cases(c.graph, c.input_values, seen, "again")) == []  # all seen


def test_sweep_is_seeded_and_its_costs_come_from_the_flop_formulas() -> None:
    cfg = SweepConfig(per_class=2, max_flops=1e6, max_elems=1 << 12, seed=3)
    specs = sweep_specs(cfg)
    assert [s.target for s in specs] == [s.target for s in sweep_specs(cfg)]
    cases = list(sweep_cases(specs, set()))
    mm = next(c for c in cases if c.op_class == "mm")
    m, k = mm.args[0].shape
    n = mm.args[1].shape[1]
    assert mm.flops == 2 * m * k * n
    assert mm.nbytes == 4 * (m * k + k * n + m * n)
    assert {c.op_class for c in cases} >= {"mm", "addmm", "bmm", "convolution", "convolution_backward", "relu", "sum",
                                          "gelu_backward", "native_layer_norm_backward", "native_dropout",
                                          "native_dropout_backward", "_safe_softmax", "_softmax_backward_data"}


def test_sweep_spreads_each_class_over_its_whole_range_of_work() -> None:
    """Case i of a class's n lies in the i-th of n log bands of work, so a short sweep
    reaches the sizes of models (12 log-uniform convolutions under a 3e8 cap once topped
    out at 2e7 FLOPs); the norms of convolutional models are swept over sizes too, and the
    CPU's flash attention (the calibration graphs call it at one size, 672 FLOPs)."""
    cfg = SweepConfig(per_class=6, max_flops=3e8, max_elems=1 << 20)
    attention = "_scaled_dot_product_flash_attention_for_cpu"
    by_class: dict[str, list[float]] = {}
    for c in sweep_cases(sweep_specs(cfg), set()):
        cls = _ungrouped(c.op_class)  # a grouped convolution is banded with the dense ones
        compute = cls in ("mm", "convolution", attention, f"{attention}_backward")
        by_class.setdefault(cls, []).append(c.flops if compute else c.nbytes)
    for cls, lo, hi in (("mm", 1e3, 3e8), ("convolution", 1e4, 3e8), ("relu", 4 * 16 * 2, 4 * (1 << 20) * 2),
                        (attention, 1e4, 3e8)):
        works = by_class[cls]
        streams = 2 if cls == "convolution" else 1  # and the blocked grouped ones, banded on their own
        assert len(works) == 6 * streams
        step = (math.log(hi) - math.log(lo)) / 6
        bands = sorted(min(5, int((math.log(w) - math.log(lo)) // step)) for w in works)
        assert bands == sorted([0, 1, 2, 3, 4, 5] * streams), (cls, works)  # one case in every band
    for cls in ("_native_batch_norm_legit_functional", "native_batch_norm_backward", "native_group_norm",
                "native_group_norm_backward", f"{attention}_backward", "_native_batch_norm_legit"):
        sizes = sorted(by_class[cls])
        per = 12 if cls == "native_batch_norm_backward" else 6  # batch norm's and instance norm's
        assert len(sizes) == per and sizes[-1] > 100 * sizes[0], (cls, sizes)


def test_sweep_times_instance_norm_as_a_captured_instance_norm_calls_it() -> None:
    """`nn.InstanceNorm1d` lowers to batch norm without running statistics over (1, N x C, L),
    a class of its own that only the sweep times."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3), torch.nn.InstanceNorm1d(8, affine=True), torch.nn.Flatten(0),
                                torch.nn.LazyLinear(1), torch.nn.Flatten(0))
    model(torch.randn(2, 4, 16))  # the lazy layer's size
    g = capture(Workload("inorm", "tiny", model, (torch.randn(2, 4, 16),))).graph  # type: ignore[arg-type]
    captured = {op.target for op in g.ops if "batch_norm" in op.target}
    swept = [c for c in sweep_cases(sweep_specs(SweepConfig(per_class=3, max_elems=1 << 14)), set())
             if c.target in captured]
    assert {c.target for c in swept} == captured == {"aten._native_batch_norm_legit.no_stats",
                                                     "aten.native_batch_norm_backward.default"}
    assert all(c.args[0].dim() == 3 and c.args[0].shape[0] == 1 for c in swept if "legit" in c.target)


def test_sweep_times_grouped_and_depthwise_convolutions_at_their_own_cost() -> None:
    """About one convolution draw in four is grouped: a few groups or one per channel
    (depthwise), its weight [O, C/g, k, k]; the FLOP count is the grouped one."""
    specs = _conv_specs(SweepConfig(per_class=40, max_flops=2e8), random.Random(0))  # not the blocked stream
    convs = [c for c in sweep_cases(specs, set()) if _ungrouped(c.op_class) == "convolution"]
    grouped = [c for c in convs if c.args[-1] > 1]
    assert 0.1 * len(convs) <= len(grouped) <= 0.5 * len(convs)
    for c in convs:  # fitted as their own class, by whether their groups are on oneDNN's blocks
        channels = (c.args[1].shape[1], c.args[1].shape[0] // c.args[-1])
        own = "convolution[grouped-unblocked]" if is_unblocked_groups(channels) else "convolution[grouped]"
        assert c.op_class == (own if c in grouped else "convolution")
    assert any(c.args[-1] == c.args[0].shape[1] for c in grouped)  # depthwise
    assert any(1 < c.args[-1] < c.args[0].shape[1] for c in grouped)  # a few groups
    for c in grouped:
        x, w, groups = c.args[0], c.args[1], c.args[-1]
        n, ch = x.shape[:2]
        assert w.shape[1] * groups == ch
        out = torch.ops.aten.convolution.default(*c.args)
        assert c.flops == 2 * n * out.shape[1] * out.shape[2] * out.shape[3] * w.shape[1] * w.shape[2] * w.shape[3]
    backward = [c for c in sweep_cases(specs, set()) if _ungrouped(c.op_class) != c.op_class
                and c.op_class.startswith("convolution_backward")]
    assert any(c.args[9] > 1 for c in backward)


def test_big_matmuls_span_the_range_above_the_cap_and_leave_every_other_case_as_drawn() -> None:
    """A quick sweep caps matmuls at 3e8 FLOPs; models run larger ones. `big_matmul_flops`
    adds `big_matmuls` mm and addmm cases per class banded between the two caps, from a
    random stream of their own."""
    base = SweepConfig(per_class=3, max_flops=1e6, max_elems=1 << 12)
    big = replace(base, big_matmul_flops=1e8, big_matmuls=3)
    plain, more = sweep_specs(base), sweep_specs(big)
    assert len(more) == len(plain) + 6
    assert [(s.target, s.build.args) for s in more[: len(plain)]] == [(s.target, s.build.args) for s in plain]
    added = list(sweep_cases(more[len(plain):], set()))
    assert sorted(c.op_class for c in added) == ["addmm"] * 3 + ["mm"] * 3
    for cls in ("mm", "addmm"):
        works = sorted(c.flops for c in added if c.op_class == cls)
        assert all(1e6 < w <= 1e8 for w in works), works
        assert works[-1] > 10 * works[0]  # banded over the range, not bunched
    assert len(sweep_specs(replace(base, big_matmul_flops=1e5))) == len(plain)  # a cap under max_flops adds none


def test_sweep_times_max_and_average_pooling_over_map_sizes_and_windows() -> None:
    """Pooling, forward and backward, over feature maps from a few hundred elements to the
    cap and every window of `POOL_WINDOWS`, 1-D ones on an (N, C, 1, L) map; each case runs
    on its own tensors, and its FLOPs are one per output element, as for a captured pool."""
    from schedlab.calibrate.sweep import POOL_WINDOWS

    cfg = SweepConfig(per_class=8, max_elems=1 << 16)
    cases = [c for c in sweep_cases(sweep_specs(cfg), set()) if "pool" in c.op_class]
    by_class: dict[str, list[Any]] = {}
    for c in cases:
        by_class.setdefault(c.op_class, []).append(c)
    assert sorted(by_class) == ["avg_pool2d", "avg_pool2d_backward", "max_pool2d_with_indices",
                                "max_pool2d_with_indices_backward"]
    for cls, group in by_class.items():
        assert len(group) >= 7, cls  # a repeated signature is timed once
        x = [c.args[1] if cls.endswith("backward") else c.args[0] for c in group]  # the pooled map
        windows = {tuple(tuple(part) for part in (c.args[2:5] if cls.endswith("backward") else c.args[1:4]))
                   for c in group}
        assert windows == set(POOL_WINDOWS), cls
        assert all(t.shape[2] == 1 for t, c in zip(x, group, strict=True)
                   if (c.args[2] if cls.endswith("backward") else c.args[1])[0] == 1)
        sizes = sorted(t.numel() for t in x)
        assert sizes[0] >= 8 and sizes[-1] <= 1 << 16 and sizes[-1] > 10 * sizes[0], (cls, sizes)
        for c in group:
            out = c.fn(*c.args, **c.kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            assert c.flops == sum(o.numel() for o in outs)


def _added_cases(base: SweepConfig, more: SweepConfig, n_added: int) -> list[Case]:
    """The cases `more` adds to `base`'s sweep, after every one of `base`'s, which stay as
    drawn (the same targets and arguments in the same order)."""
    plain, specs = sweep_specs(base), sweep_specs(more)
    assert len(specs) == len(plain) + n_added
    assert [(s.target, s.build.args) for s in specs[: len(plain)]] == [(s.target, s.build.args) for s in plain]
    return list(sweep_cases(specs[len(plain):], set()))


def test_extra_convolutions_come_from_a_stream_of_their_own() -> None:
    """`extra_convs` adds that many cases per convolution class, 2-D and 1-D, banded over the
    same range of work, after every other case, which stays as drawn."""
    base = SweepConfig(per_class=3, max_flops=1e6, max_elems=1 << 12)
    added = _added_cases(base, replace(base, extra_convs=4), 16)
    assert sorted(_ungrouped(c.op_class) for c in added) == sorted(
        [k + d for k in ("convolution", "convolution_backward") for d in ("", "[1d]")] * 4)
    for cls in ("convolution", "convolution[1d]"):
        works = sorted(c.flops for c in added if _ungrouped(c.op_class) == cls)
        assert all(1e4 <= w <= 1e6 for w in works) and works[-1] > 10 * works[0], (cls, works)


def test_extra_matmuls_come_from_a_stream_of_their_own_above_a_megaflop() -> None:
    """`extra_matmuls` adds that many `mm` and `addmm` cases each (no `bmm`), banded from
    `EXTRA_MATMUL_MIN_FLOPS` to `max_flops`, after every other case, which stays as drawn."""
    base = SweepConfig(per_class=3, max_flops=1e8, max_elems=1 << 12)
    added = _added_cases(base, replace(base, extra_matmuls=5), 10)
    assert sorted(c.op_class for c in added) == ["addmm"] * 5 + ["mm"] * 5
    for cls in ("mm", "addmm"):
        works = sorted(c.flops for c in added if c.op_class == cls)
        assert all(EXTRA_MATMUL_MIN_FLOPS <= w <= 1e8 for w in works) and works[-1] > 10 * works[0], (cls, works)


def test_big_convolutions_span_the_range_above_the_cap_and_leave_every_other_case_as_drawn() -> None:
    """As the big matmuls: `big_conv_flops` adds `big_convs` forward and backward cases of
    both convolution kinds (2-D and 1-D), banded between the two caps, from random streams
    of their own, so the cases drawn without them stay as they were."""
    base = SweepConfig(per_class=3, max_flops=1e6, max_elems=1 << 12)
    added = _added_cases(base, replace(base, big_conv_flops=1e8, big_convs=3), 12)
    kinds = ["convolution", "convolution[1d]", "convolution_backward", "convolution_backward[1d]"]
    assert sorted(_ungrouped(c.op_class) for c in added) == [k for k in kinds for _ in range(3)]
    forward = sorted(c.flops for c in added if _ungrouped(c.op_class) == "convolution")
    assert all(1e6 < w <= 1e8 for w in forward), forward
    assert forward[-1] > 10 * forward[0]  # banded over the range, not bunched
    assert len(sweep_specs(replace(base, big_conv_flops=1e5))) == len(sweep_specs(base))  # a cap under max_flops adds none
