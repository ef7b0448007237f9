"""Fits recover known parameters from synthetic data; held-out splits are seeded."""

from __future__ import annotations

import random

import pytest

from schedlab.calibrate.fit import Point, fit_all, fit_class, fit_scale, fit_work_threads, split_signatures
from schedlab.calibrate.model import WorkThreadsModel

FLOOR_US = 1.5


def synthetic(model: WorkThreadsModel, op_class: str, n: int, seed: int, noise: float = 0.0) -> list[Point]:
    rng = random.Random(seed)
    points = []
    for i in range(n):
        flops = 10 ** rng.uniform(3, 9)
        nbytes = int(10 ** rng.uniform(3, 8))
        for threads in (1, 2, 4, 8):
            t = FLOOR_US + model.kernel_us(flops, nbytes, threads)
            t *= 1.0 + rng.uniform(-noise, noise)
            points.append(Point(f"{op_class}#{i}", op_class, flops, nbytes, threads, t))
    return points


TRUE = WorkThreadsModel(
    a_us=5.0, us_per_gflop=8000.0, us_per_mb=10.0, us_per_mb_dram=30.0, cache_mb=2.0, p_max=0.9, h_us=50.0, c_us=2.0
)


def test_fit_recovers_known_parameters() -> None:
    m = fit_work_threads(synthetic(TRUE, "mm", 60, seed=1), FLOOR_US)
    assert m.us_per_gflop == pytest.approx(TRUE.us_per_gflop, rel=0.02)
    assert m.us_per_mb == pytest.approx(TRUE.us_per_mb, rel=0.1)
    assert m.us_per_mb_dram == pytest.approx(TRUE.us_per_mb_dram, rel=0.1)
    assert m.cache_mb == pytest.approx(TRUE.cache_mb, rel=0.2)
    assert m.p_max == pytest.approx(TRUE.p_max, abs=0.02)
    assert m.h_us == pytest.approx(TRUE.h_us, rel=0.15)
    assert m.c_us == pytest.approx(TRUE.c_us, rel=0.15)
    assert m.a_us == pytest.approx(TRUE.a_us, rel=0.15)


def test_fit_with_noise_predicts_held_out_shapes() -> None:
    fit = fit_class(synthetic(TRUE, "mm", 60, seed=2, noise=0.05), FLOOR_US, seed=0)
    assert fit.model_name == "work_threads"
    assert fit.n_signatures == 60 and fit.n_heldout == 12
    assert fit.heldout_mape is not None and fit.heldout_mape < 6.0


def test_fit_scale_recovers_a_factor_of_the_fallback_shape() -> None:
    shape = WorkThreadsModel(
        a_us=1.0, us_per_gflop=0.0, us_per_mb=50.0, us_per_mb_dram=0.0, cache_mb=1.0, p_max=0.5, h_us=10.0, c_us=0.5
    )
    points = synthetic(shape.scaled(3.0), "odd", 4, seed=3)
    m = fit_scale(points, FLOOR_US, shape)
    assert m.us_per_mb == pytest.approx(150.0, rel=1e-3)
    assert m.p_max == shape.p_max


def test_small_classes_take_the_fallback_shape_and_report_no_heldout_error() -> None:
    pool = synthetic(TRUE, "add", 40, seed=4)
    small = synthetic(TRUE.scaled(2.0), "rare", 3, seed=5)
    fallback, classes = fit_all(pool + small, FLOOR_US, seed=0)
    assert classes["add"].model_name == "work_threads"
    assert classes["rare"].model_name == "work_threads_scaled"
    assert classes["rare"].heldout_mape is None and classes["rare"].n_heldout == 0
    assert classes["rare"].model.us_per_gflop == pytest.approx(2 * fallback.model.us_per_gflop, rel=0.05)


def test_holdout_split_is_seeded_and_about_a_fifth() -> None:
    sigs = [f"s{i}" for i in range(50)]
    a, b = split_signatures(sigs, seed=7), split_signatures(list(reversed(sigs)), seed=7)
    assert a == b and len(a) == 10
    assert split_signatures(sigs, seed=8) != a
    assert split_signatures(sigs[:4], seed=7) == set()


def test_a_class_measured_over_a_narrow_range_of_sizes_takes_the_fallback_shape() -> None:
    """Twelve tiny shapes spanning 2-14 KB say nothing about 100 KB: no slope of their own."""
    rng = random.Random(5)
    points = []
    for i in range(12):
        nbytes = int(2000 * 7 ** (i / 11))  # 2 KB .. 14 KB
        for threads in (1, 2):
            t = FLOOR_US + 1.0 + rng.uniform(-0.3, 0.3)  # a constant cost and noise
            points.append(Point(f"v#{i}", "_unsafe_view", nbytes / 8, nbytes, threads, t))
    shape = WorkThreadsModel(a_us=1.0, us_per_gflop=0.0, us_per_mb=50.0, us_per_mb_dram=0.0, cache_mb=1.0,
                             p_max=0.5, h_us=10.0, c_us=0.5)
    fit = fit_class(points, FLOOR_US, seed=0, fallback=shape)
    assert fit.model_name == "work_threads_scaled"
    assert fit.model.kernel_us(115_000 / 8, 115_000, 1) < 50.0  # not the 64 ms of a free slope
    # A full fit on the same points (no fallback to lean on) keeps a physical memory slope.
    own = fit_work_threads(points, FLOOR_US)
    assert own.us_per_mb <= 5000.0 and own.us_per_mb_dram <= 5000.0


def test_points_all_below_the_lowest_hinge_fit_no_slope_beyond_it() -> None:
    """Points of up to 32 KB cannot say what happens above a 50-100 KB hinge."""
    rng = random.Random(6)
    points = []
    for i in range(20):
        nbytes = int(16 * 2000 ** (i / 19))  # 16 B .. 32 KB
        for threads in (1, 2):
            t = FLOOR_US + 0.5 + 100.0 * nbytes * 1e-6 + rng.uniform(-0.4, 0.4)
            points.append(Point(f"s#{i}", "sqrt", nbytes / 8, nbytes, threads, t))
    m = fit_work_threads(points, FLOOR_US)
    assert m.us_per_mb_dram < 1e-3
    assert m.kernel_us(2.5e5, 2_000_000, 1) < 2_000.0  # 2 MB: the in-cache slope, not 0.2 GB/s


def test_points_under_the_call_floor_count_as_at_it_and_do_not_pull_the_fit_down() -> None:
    """An op that ran faster in the step than its benchmark less the executor's dispatch is
    stored as a kernel of zero; left under the floor, a fifth of such points pulled every
    parameter of a quick profile's `add` to its bound (train MAPE 23,551%)."""
    rng = random.Random(7)
    true = WorkThreadsModel(a_us=0.5, us_per_gflop=300_000.0, us_per_mb=5.0, us_per_mb_dram=0.0, cache_mb=1.0,
                            p_max=0.8, h_us=5.0, c_us=0.1)
    points = []
    for i in range(60):
        elems = 10 ** rng.uniform(0, 6.5)
        for threads in (1, 2):
            t = FLOOR_US + true.kernel_us(elems, 12 * elems, threads)
            if elems < 100 and i % 2:  # a tiny add whose in-step time fell under the floor
                t = 1e-3
            points.append(Point(f"add#{i}", "add", elems, int(12 * elems), threads, t))
    assert sum(p.call_us < FLOOR_US for p in points) >= 8
    fit = fit_class(points, FLOOR_US, seed=0)
    assert fit.trusted and fit.train_mape < 20.0
    big = fit.model.kernel_us(1e6, 12e6, 1)
    assert big == pytest.approx(true.kernel_us(1e6, 12e6, 1), rel=0.2)


def test_a_small_variant_takes_its_plain_classs_shape_not_the_fallbacks() -> None:
    """Calibration times a strided layer-norm backward at one tiny shape: scaled to it, the
    pooled memory-bound shape says nothing of a large one; the contiguous class's shape does."""
    memory = WorkThreadsModel(a_us=1.0, us_per_gflop=0.0, us_per_mb=20.0, us_per_mb_dram=0.0, cache_mb=1.0,
                              p_max=0.5, h_us=10.0, c_us=0.5)
    plain = WorkThreadsModel(a_us=4.0, us_per_gflop=0.0, us_per_mb=60.0, us_per_mb_dram=0.0, cache_mb=1.0,
                             p_max=0.9, h_us=20.0, c_us=1.0)
    pool = synthetic(memory, "relu", 30, seed=8)
    lnb = synthetic(plain, "native_layer_norm_backward", 30, seed=9)
    tiny = [Point("lnb-strided#0", "native_layer_norm_backward[strided]", 600.0, 7_000, k,
                  FLOOR_US + 2.0 * plain.kernel_us(600.0, 7_000, k)) for k in (1, 2)]
    _, classes = fit_all(pool + lnb + tiny, FLOOR_US, seed=0)
    variant = classes["native_layer_norm_backward[strided]"]
    assert variant.model_name == "work_threads_scaled"
    big = variant.model.kernel_us(2.6e5, 3_000_000, 1)
    assert big == pytest.approx(2.0 * plain.kernel_us(2.6e5, 3_000_000, 1), rel=0.1)
    assert list(classes) == sorted(classes)
