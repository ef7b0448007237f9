"""Fits recover known parameters from synthetic data; held-out splits are seeded."""

from __future__ import annotations

import random

import pytest

from schedlab.calibrate.fit import (
    Point,
    fit_all,
    fit_class,
    fit_fixed_cost,
    fit_scale,
    fit_work_threads,
    roofline_shape,
    split_signatures,
)
from schedlab.calibrate.model import WorkThreadsModel
from schedlab.calibrate.roofline import Roofline

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


ROOF = Roofline(gflops={1: 50.0, 2: 90.0}, gbps={1: 20.0, 2: 30.0}, a_us=3.0)


def _tiny(op_class: str, fixed_us: float, n: int) -> list[Point]:
    """`n` shapes of a class measured only where its fixed cost dominates (a quick
    calibration's small shapes): a few KB, the time all fixed cost plus a little work."""
    return [Point(f"{op_class}#{i}", op_class, 500.0 * (i + 1), 4000 * (i + 1), threads,
                  FLOOR_US + fixed_us + 0.01 * (i + 1)) for i in range(n) for threads in (1, 2)]


def test_a_narrowly_measured_memory_bound_class_keeps_its_fixed_cost_and_moves_bytes_at_the_roofline() -> None:
    """Scaled to points that are all fixed cost, the fallback's shape scales the work by the
    same factor; the roofline's work is the machine's measured bandwidth whatever the points."""
    pool = synthetic(TRUE, "add", 40, seed=4)
    small = _tiny("select_backward", fixed_us=40.0, n=3)
    _, scaled = fit_all(pool + small, FLOOR_US, seed=0)
    _, roofed = fit_all(pool + small, FLOOR_US, seed=0, roofline=ROOF)
    fit = roofed["select_backward"]
    assert scaled["select_backward"].model_name == "work_threads_scaled"
    assert fit.model_name == "work_threads_roofline"
    assert fit.model.a_us == pytest.approx(40.0, rel=0.05)  # less the little work of the points
    mb = 10.0  # far beyond the points: 10 MB at 20 GB/s is 500 us of work
    assert fit.model.kernel_us(0.0, int(mb * 1e6), 1) == pytest.approx(40.0 + 500.0, rel=0.02)
    assert scaled["select_backward"].model.kernel_us(0.0, int(mb * 1e6), 1) > 2 * fit.model.kernel_us(0.0, int(mb * 1e6), 1)
    assert roofed["add"].model_name == "work_threads"  # a class measured widely keeps its own fit


def test_a_narrowly_measured_compute_class_takes_the_fallback_shape_even_with_a_roofline() -> None:
    """CPU flash attention runs far below the mm peak the roofline measures."""
    pool = synthetic(TRUE, "add", 40, seed=4)
    small = _tiny("_scaled_dot_product_flash_attention_for_cpu", fixed_us=20.0, n=2)
    _, classes = fit_all(pool + small, FLOOR_US, seed=0, roofline=ROOF)
    assert classes["_scaled_dot_product_flash_attention_for_cpu"].model_name == "work_threads_scaled"


def test_fit_fixed_cost_recovers_the_fixed_cost_under_a_given_work() -> None:
    fallback = WorkThreadsModel(a_us=1.0, us_per_gflop=0.0, us_per_mb=5.0, us_per_mb_dram=0.0, cache_mb=1.0,
                                p_max=0.8, h_us=10.0, c_us=0.5)
    shape = roofline_shape(ROOF, fallback)
    assert shape.us_per_gflop == pytest.approx(1e6 / 50.0) and shape.us_per_mb == pytest.approx(1e3 / 20.0)
    assert (shape.p_max, shape.h_us, shape.c_us) == (0.8, 10.0, 0.5) and shape.a_us == 0.0
    true = WorkThreadsModel(**{**shape.to_params(), "a_us": 7.0})
    points = [Point(f"x#{i}", "x", 1e4 * i, 10_000 * i, n, FLOOR_US + true.kernel_us(1e4 * i, 10_000 * i, n))
              for i in range(1, 6) for n in (1, 2)]
    assert fit_fixed_cost(points, FLOOR_US, shape).a_us == pytest.approx(7.0, rel=1e-3)


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
