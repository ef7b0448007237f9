"""The machine presets load and simulate synthetic graphs."""

from __future__ import annotations

from schedlab.machine import load_machine
from schedlab.plan import Plan, resolve
from schedlab.sim import simulate
from schedlab.sim.bench import main as bench_main
from schedlab.sim.testing import random_cost, random_dag


def test_manycore_68_with_16_threads() -> None:
    m = load_machine("manycore-68")
    assert m.default_device.cores == 68
    g = random_dag(300, seed=3)
    r = resolve(g, Plan(slots=4, threads=16), m)
    res = simulate(g, r, m, random_cost(3))
    assert res.engine == "compiled"
    assert res.trace is not None and {e.threads for e in res.trace.events} == {16}
    assert 0 < res.busy_core_s["cpu0"] <= 68 * res.step_time_s
    assert res.oom_devices == ()
    # More slots with fewer threads each overlaps more work on 68 cores.
    serial = simulate(g, resolve(g, Plan(slots=1, threads=16), m), m, random_cost(3), record=False)
    assert res.step_time_s < serial.step_time_s


def test_dgx_8gpu_on_one_gpu() -> None:
    m = load_machine("dgx-8gpu")
    g = random_dag(200, seed=4)
    res = simulate(g, resolve(g, Plan(slots=2, device="gpu3"), m), m, random_cost(4))
    assert res.engine == "simpy"
    assert set(res.peak_memory_bytes) == {d.id for d in m.devices}
    assert res.peak_memory_bytes["gpu3"] > 0 and res.peak_memory_bytes["gpu0"] == 0
    assert res.trace is not None and {e.device for e in res.trace.events} == {"gpu3"}


def test_bench_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    bench_main(["--sizes", "40,60", "--repeats", "1", "--slots", "1,2"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (n, s, e) for n in ("40", "60") for s in ("1", "2") for e in ("compiled", "fast")
    ]
    by_key = {(r[0], r[1], r[2]): r[-1] for r in rows}
    assert all(by_key[(n, s, "compiled")] == by_key[(n, s, "fast")] for n in ("40", "60") for s in ("1", "2"))

