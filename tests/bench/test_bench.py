"""Benchmarks (`make bench`): ratios measured in one run, so a noisy shared machine hits both sides.

- executor vs eager PyTorch, default transformer and nmt: target at most 1.10x;
- simulating a default step vs executing it: target at least 20x faster;
- simulated ops per second on the search's path (a reused Simulator, record=False):
  target at least 1 million on a 5,000-op graph, and 300 thousand for a fresh `simulate()`;
- the same on a real graph (transformer, default size) with the Profile: first (nothing
  warm), cold (a new cost model object; the graph's own structure kept) and reused, for
  the Profile as it is (keyed, `sim.cost_table`) and unkeyed (`tests.sim.keyed_profile`),
  at one slot, two slots, and two slots of two threads (where calls that run inline hold
  one core and pay no wake: `sim.cost.team_or_inline`);
- a cold call on two held-out models with the Profile answering whole columns against one
  op at a time: target at least 1.3x.
"""

from __future__ import annotations

import pytest

from tests.conftest import captured_workload

pytestmark = pytest.mark.bench


@pytest.fixture(autouse=True, scope="module")
def _tuned_allocator() -> None:
    """The conditions of the CLI, where these figures are also measured (schedlab/allocator.py)."""
    from schedlab.allocator import tune_malloc

    tune_malloc()


@pytest.mark.parametrize("model", ["transformer", "nmt"])
def test_executor_overhead_vs_eager(benchmark, model: str) -> None:  # type: ignore[no-untyped-def]
    from schedlab.exec.bench import compare_with_eager

    w, c = captured_workload(model, "sgd", "default")
    res = benchmark.pedantic(
        lambda: compare_with_eager(w.module, c.graph, c.input_values, repeats=8), rounds=1, iterations=1
    )
    benchmark.extra_info.update(res.to_json())
    print(f"\n{model}: exec/eager = {res.ratio:.3f} (IQR {res.ratio_spread[0]:.3f}-{res.ratio_spread[1]:.3f}), "
          f"eager {res.eager_step_s * 1e3:.1f} ms, exec {res.exec_step_s * 1e3:.1f} ms, {res.ops} ops")
    assert res.ratio <= 1.10


@pytest.mark.parametrize("model", ["transformer", "nmt"])
def test_simulation_is_faster_than_execution(benchmark, model: str) -> None:  # type: ignore[no-untyped-def]
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH, Profile
    from schedlab.exec import run_steps
    from schedlab.machine import detect_host
    from schedlab.plan import Plan, resolve
    from schedlab.sim import simulate

    if not DEFAULT_PROFILE_PATH.exists():
        pytest.skip("no profile: run `make calibrate` first")
    profile = Profile.load(check_machine=False)
    _, c = captured_workload(model, "sgd", "default")
    machine = detect_host()
    resolved = resolve(c.graph, Plan(), machine)
    sim = benchmark(lambda: simulate(c.graph, resolved, machine, profile, record=False))
    exec_s = run_steps(c.graph, c.input_values, Plan(), machine, steps=3, warmup=1).step_time_s
    ratio = exec_s / benchmark.stats.stats.median
    benchmark.extra_info.update({"exec_step_s": exec_s, "sim_s": benchmark.stats.stats.median, "ratio": ratio, "ops": len(c.graph)})
    print(f"\n{model}: execute {exec_s * 1e3:.1f} ms, simulate {benchmark.stats.stats.median * 1e3:.2f} ms "
          f"-> {ratio:.0f}x, {len(c.graph) / benchmark.stats.stats.median:.0f} simulated ops/s")
    assert sim.step_time_s > 0 and ratio >= 20


@pytest.mark.parametrize("slots", [1, 2])
def test_simulated_ops_per_second(benchmark, slots: int) -> None:  # type: ignore[no-untyped-def]
    from schedlab.sim.bench import measure

    row = benchmark.pedantic(lambda: measure(5000, slots, 2, "compiled", repeats=7), rounds=1, iterations=1)
    ref = measure(5000, slots, 2, "fast", repeats=3)
    by_op = measure(5000, slots, 2, "compiled", repeats=7, columns=False)  # the cost model asked one op at a time
    benchmark.extra_info.update({**row.__dict__, "python_reused_ops_per_s": ref.reused_ops_per_s,
                                 "per_op_cost_cold_ops_per_s": by_op.cold_ops_per_s})
    print(f"\n5000 ops, {slots} slot(s): reused {row.reused_ops_per_s:,.0f}, cold {row.cold_ops_per_s:,.0f}, "
          f"first {row.first_ops_per_s:,.0f} ops/s; Python reference reused {ref.reused_ops_per_s:,.0f} ops/s "
          f"({row.reused_ops_per_s / ref.reused_ops_per_s:.1f}x); cold with the cost model asked op by op "
          f"{by_op.cold_ops_per_s:,.0f} ops/s ({row.cold_ops_per_s / by_op.cold_ops_per_s:.1f}x slower)")
    assert row.step_ms == ref.step_ms == by_op.step_ms  # every engine and way of asking simulated the same step
    assert row.reused_ops_per_s >= 1e6 and row.cold_ops_per_s >= 3e5
    # 2026-12-02, 2-core VM: here 7.7x and 3.7x (one and two slots); `sim.bench` 6-10x at 5,000 and 20,000 ops
    assert row.cold_ops_per_s >= 2 * by_op.cold_ops_per_s


@pytest.mark.parametrize("model", ["heldout:dropout-encoder", "heldout:mha-regressor"])
def test_a_cold_call_reads_the_profile_in_columns(benchmark, model: str) -> None:  # type: ignore[no-untyped-def]
    """A cold call on a held-out model of a few hundred ops, two slots of two threads (every
    column a plan can ask: kernels at one and two threads, wakes, three slowdown columns),
    with the Profile answering in columns (`calibrate.profile_columns`) and one op at a
    time (`tests.sim.keyed_profile.columnless`), one after the other in the same run."""
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH, Profile
    from schedlab.plan import Plan
    from schedlab.sim.bench import measure_cold
    from schedlab.sim.testing import cpu_machine
    from tests.calibrate.factories import make_profile
    from tests.sim.keyed_profile import columnless

    profile = Profile.load(check_machine=False) if DEFAULT_PROFILE_PATH.exists() else make_profile()
    _, c = captured_workload(model, "sgd", "default")
    graph, machine, plan = c.graph, cpu_machine(2), Plan(slots=2, threads=2)
    by_column = benchmark.pedantic(
        lambda: measure_cold(graph, machine, plan, lambda g: profile.for_graph(g).for_slots(2), repeats=15),
        rounds=1, iterations=1,
    )
    by_op = measure_cold(graph, machine, plan, lambda g: columnless(profile).for_graph(g).for_slots(2), repeats=15)
    ratio = by_column.cold_ops_per_s / by_op.cold_ops_per_s
    benchmark.extra_info.update({"columns": by_column.__dict__, "one_op_at_a_time": by_op.__dict__, "ratio": ratio})
    print(f"\n{model} ({by_column.ops} ops), {by_column.plan}: cold {by_column.cold_ops_per_s:,.0f} simulated ops/s "
          f"in columns, {by_op.cold_ops_per_s:,.0f} one op at a time ({ratio:.2f}x); first {by_column.first_ops_per_s:,.0f} "
          f"and {by_op.first_ops_per_s:,.0f}")
    assert by_column.step_s == by_op.step_s  # the same floats
    # 1.64x and 1.87x measured here (2-core VM, 2026-12-02); a ratio of the same run, so a noisy host hits both
    assert ratio >= 1.3


@pytest.mark.parametrize(("slots", "threads"), [(1, 1), (2, 1), (2, 2)])  # 2 x 2: inline calls and wake costs
def test_cold_simulate_on_a_real_graph(benchmark, slots: int, threads: int) -> None:  # type: ignore[no-untyped-def]
    from schedlab.calibrate.profile import DEFAULT_PROFILE_PATH, Profile
    from schedlab.plan import Plan
    from schedlab.sim.bench import measure_cold
    from schedlab.sim.testing import cpu_machine
    from tests.calibrate.factories import make_profile
    from tests.sim.keyed_profile import bare, unkeyed

    profile = Profile.load(check_machine=False) if DEFAULT_PROFILE_PATH.exists() else make_profile()
    _, c = captured_workload("transformer", "sgd", "default")
    graph, machine, plan = c.graph, cpu_machine(2), Plan(slots=slots, threads=threads)

    def cost_for(base: Profile):  # type: ignore[no-untyped-def]
        return lambda g: base.for_graph(g).for_slots(slots)  # a new object each call

    key = benchmark.pedantic(lambda: measure_cold(graph, machine, plan, cost_for(profile)), rounds=1, iterations=1)
    plain = measure_cold(graph, machine, plan, cost_for(unkeyed(profile)))
    one_by_one = measure_cold(graph, machine, plan, cost_for(bare(profile)))
    benchmark.extra_info.update({"plain": plain.__dict__, "keyed": key.__dict__, "bare": one_by_one.__dict__})
    for name, r in (("profile, every op one at a time", one_by_one), ("profile, unkeyed", plain), ("profile", key)):
        print(f"\ntransformer ({r.ops} ops), {r.plan}, {name}: first {r.first_ops_per_s:,.0f}, "
              f"cold {r.cold_ops_per_s:,.0f} (target 300,000), reused {r.reused_ops_per_s:,.0f} simulated ops/s")
    assert plain.step_s == key.step_s == one_by_one.step_s  # keys and columns change no answer
    # asking once per key and a column at a time is what makes a cold call cheap: keys gave
    # 1.7-2.2x over asking every op one at a time (once the graph keeps its signatures);
    # with columns, asking every op costs little more than asking one per key
    assert key.cold_ops_per_s >= 1.4 * one_by_one.cold_ops_per_s
    assert key.cold_ops_per_s >= 3e5 and key.reused_ops_per_s >= 1e6
