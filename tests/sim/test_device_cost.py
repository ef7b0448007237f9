"""Op costs per device kind (`sim.device_cost`): CPU devices keep the calibrated CPU costs,
a cuda device takes the Profile's cuda section or else the preset's roofline, and the
result says which model costed each device."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from schedlab.calibrate.cuda_costs import CudaCosts
from schedlab.calibrate.profile import Profile
from schedlab.calibrate.signature import signature
from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.machine import Device, Machine, load_machine
from schedlab.plan import Plan, resolve
from schedlab.sim import Simulator, simulate
from schedlab.sim.device_cost import CUDA_COMPUTE_EFFICIENCY, CUDA_LAUNCH_US, CUDA_MEMORY_EFFICIENCY
from schedlab.sim.testing import GraphBuilder, TableCost
from tests.calibrate.factories import DISPATCH, make_profile

DISPATCH_US = DISPATCH.op_us  # one slot: the Profile's dispatch of every non-view op
A100_FP32 = 19.5e12  # dgx-8gpu's GPU (schedlab.machine)
A100_BW = 2.039e12


def one_op(flops: float, nbytes: int = 4096) -> Graph:
    g = GraphBuilder("one")
    x = g.input("x", nbytes)
    g.output(g.op("mm", [x], nbytes=nbytes, flops=flops))
    return g.build()


def two_ops(flops: float, nbytes: int = 4096, flops_k1: float | None = None) -> Graph:
    g = GraphBuilder("two")
    x = g.input("x", nbytes)
    for i, f in enumerate((flops, flops if flops_k1 is None else flops_k1)):
        g.output(g.op(f"k{i}", [x], nbytes=nbytes, flops=f), f"k{i}")
    return g.build()


def roofline_us(flops: float, nbytes: int) -> float:
    return CUDA_LAUNCH_US + 1e6 * max(flops / (A100_FP32 * CUDA_COMPUTE_EFFICIENCY), nbytes / (A100_BW * CUDA_MEMORY_EFFICIENCY))


def step_us(graph: Graph, machine: Machine, cost: object, **plan: object) -> float:
    res = simulate(graph, resolve(graph, Plan(**plan), machine), machine, cost)  # type: ignore[arg-type]
    return res.step_time_s * 1e6


@pytest.mark.parametrize("flops", [1e10, 4e10])
def test_a_gpu_op_is_costed_by_the_roofline_of_the_preset(flops: float) -> None:
    m = load_machine("dgx-8gpu")
    g = one_op(flops)
    op = g.ops[0]
    got = step_us(g, m, make_profile(), device="gpu0")
    assert got == pytest.approx(DISPATCH_US + roofline_us(flops, op.bytes_moved))
    # Not the CPU profile's time (10 µs per MFLOP on one thread: 100 ms and more here).
    assert got < make_profile().kernel_us(op, 1) / 10


def test_gpu_time_scales_with_flops_and_with_bytes_when_memory_bound() -> None:
    m = load_machine("dgx-8gpu")
    t1, t4 = (step_us(one_op(f), m, make_profile(), device="gpu0") - DISPATCH_US - CUDA_LAUNCH_US for f in (1e10, 4e10))
    assert t4 == pytest.approx(4 * t1)
    big = 1 << 28  # 256 MiB out, 256 MiB in, no FLOPs: memory-bound
    mem = step_us(one_op(0.0, big), m, make_profile(), device="gpu0") - DISPATCH_US - CUDA_LAUNCH_US
    assert mem == pytest.approx(1e6 * 2 * big / (A100_BW * CUDA_MEMORY_EFFICIENCY))


def test_cpu_devices_keep_the_calibrated_cpu_costs() -> None:
    profile = make_profile()
    g = one_op(1e8)
    want = DISPATCH_US + profile.kernel_us(g.ops[0], 2)
    for name in ("dgx-8gpu", "cpu-2gpu"):
        assert step_us(g, load_machine(name), profile, device="cpu0", threads=2) == pytest.approx(want)


def test_a_mixed_plan_costs_each_device_by_its_kind_and_says_so() -> None:
    m = load_machine("cpu-2gpu")
    g = GraphBuilder("mixed")
    x = g.input("x", 4096)
    a = g.op("a", [x], flops=1e9)
    g.output(g.op("b", [a], flops=1e9))
    graph = g.build()
    profile = make_profile()
    res = simulate(graph, resolve(graph, Plan(device="cpu0", op_devices={1: "gpu0"}), m), m, profile)
    assert res.cost_sources == {
        "cpu0": "calibrated cpu profile",
        "gpu0": "cuda roofline (peak 14 TFLOP/s, 0.9 TB/s; uncalibrated)",
    }
    assert res.trace is not None and res.trace.meta["cost_sources"] == res.cost_sources
    dur = {e.name: (e.end_ns - e.start_ns) / 1e3 for e in res.trace.events if e.kind != "COMM"}
    threads = {e.name: e.threads for e in res.trace.events}
    assert dur["a"] == pytest.approx(DISPATCH_US + profile.kernel_us(graph.ops[0], threads["a"]))
    v100 = CUDA_LAUNCH_US + 1e6 * 1e9 / (14.0e12 * CUDA_COMPUTE_EFFICIENCY)
    assert dur["b"] == pytest.approx(DISPATCH_US + v100, abs=1e-3)  # ns in the trace


def test_the_label_on_one_cpu_device_and_for_a_model_of_every_kind() -> None:
    g = one_op(1e8)
    m = load_machine("dgx-8gpu")
    fast = simulate(g, resolve(g, Plan(device="cpu0"), m), m, make_profile(), record=False)
    assert fast.engine == "compiled" and fast.cost_sources == {"cpu0": "calibrated cpu profile"}
    table = simulate(g, resolve(g, Plan(device="gpu0"), m), m, TableCost(default_kernel_us=100.0))
    assert table.cost_sources == {"gpu0": "TableCost (same costs on every device kind)"}
    assert table.step_time_s == pytest.approx(100e-6)  # a hand-made table holds on every kind


def test_a_profile_with_a_cuda_section_wins_over_the_roofline(tmp_path: Path) -> None:
    m = load_machine("dgx-8gpu")
    g = two_ops(1e10, flops_k1=2e10)
    measured = CudaCosts(device="Test GPU", torch="2.11.0", measured_unix_s=1.7e9, launch_us=2.0,
                         flops_per_s=1e13, bw_bytes_per_s=1e12, signatures={signature(g.ops[0]): 123.0})
    profile = dataclasses.replace(make_profile(), cuda=measured)
    res = simulate(g, resolve(g, Plan(device="gpu0"), m), m, profile)
    assert res.cost_sources == {"gpu0": "calibrated cuda profile (Test GPU)"}
    assert res.trace is not None
    alone = 2.0 + 1e6 * 2e10 / 1e13  # k1: no signature: the section's measured roofline
    assert profile.kind_kernel_us(g.ops[0], "cuda") == 123.0
    assert profile.kind_kernel_us(g.ops[1], "cuda") == pytest.approx(alone)
    # The section survives a save and load; a file without it loads with none.
    again = Profile.load(profile.save(tmp_path / "p.json"), check_machine=False)
    assert again.cuda == measured
    plain = Profile.load(make_profile().save(tmp_path / "q.json"), check_machine=False)
    assert plain.cuda is None and plain.calibrated_kinds() == {"cpu": "calibrated cpu profile"}


def test_a_corrupt_cuda_section_is_one_clear_error(tmp_path: Path) -> None:
    import json

    d = make_profile().to_json()
    d["cuda"] = {"device": "x", "launch_us": 1.0, "flops_per_s": 0, "bw_bytes_per_s": 1e12}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))
    with pytest.raises(SchedlabError, match="bad cuda: flops_per_s must be a finite number > 0"):
        Profile.load(p, check_machine=False)


def test_kernels_co_running_on_gpu_streams_share_the_gpu() -> None:
    # Two independent kernels on 4 streams: they run together, but the roofline is the
    # whole GPU's, so together they take about twice one's work (their launches overlap).
    m = load_machine("dgx-8gpu")
    g = two_ops(1e10)
    work = roofline_us(1e10, g.ops[0].bytes_moved) - CUDA_LAUNCH_US
    got = step_us(g, m, make_profile(), device="gpu0")
    assert 2 * work + CUDA_LAUNCH_US <= got <= 2 * work + CUDA_LAUNCH_US + 2 * DISPATCH_US + 1e-6


def test_a_cuda_device_without_peak_figures_is_one_clear_error() -> None:
    m = Machine("bare", (Device("cpu0", "cpu", 2, 2**30), Device("gpu0", "cuda", 1, 2**30)))
    g = one_op(1e9)
    with pytest.raises(SchedlabError, match=r"device gpu0 .* no peak_flops or mem_bw_bytes_per_s"):
        simulate(g, resolve(g, Plan(device="gpu0"), m), m, make_profile())


def test_a_reused_simulator_costs_each_plan_by_its_devices() -> None:
    m = load_machine("cpu-2gpu")
    g = one_op(1e9)
    sim = Simulator(g, m, make_profile())
    on_cpu = sim.run(resolve(g, Plan(device="cpu0"), m))
    on_gpu = sim.run(resolve(g, Plan(device="gpu0"), m))
    again = sim.run(resolve(g, Plan(device="cpu0"), m))
    assert on_cpu.step_time_s == again.step_time_s != on_gpu.step_time_s
    assert on_gpu.cost_sources["gpu0"].startswith("cuda roofline")


def test_simulate_says_which_model_costed_each_device(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import json

    from schedlab.cli import main
    from schedlab.machine import detect_host

    profile = make_profile(machine=detect_host().fingerprint).save(tmp_path / "p.json")
    plan = Plan(device="gpu0").save(tmp_path / "gpu.json")
    argv = ["simulate", "mlp", "--size", "tiny", "--machine", "dgx-8gpu", "--plan", str(plan), "--profile", str(profile),
            "--out", str(tmp_path / "s.json")]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    label = "cuda roofline (peak 19.5 TFLOP/s, 2.039 TB/s; uncalibrated)"
    assert d["cost_sources"] == {"gpu0": label}
    assert main(argv) == 0
    assert f"costs of gpu0    {label}" in capsys.readouterr().out


def test_the_cuda_sections_issue_costs_are_the_hosts_dispatch_of_gpu_ops(tmp_path: Path) -> None:
    """A GPU op costs the host what the cuda section measured to issue it (by aten target,
    else the median), not the CPU profile's dispatch; a CPU op keeps the CPU's."""
    m = load_machine("cpu-2gpu")
    b = GraphBuilder("two-targets")
    x = b.input("x", 4096)
    b.output(b.op("k0", [x], flops=1e3), "k0")
    b.output(b.op("k1", [x], flops=1e3, target="aten.add.Tensor"), "k1")
    g = b.build()
    k0 = g.ops[0].target
    cuda = CudaCosts(device="Test GPU", torch="2.11.0", measured_unix_s=1.7e9, launch_us=1.0, flops_per_s=1e14,
                     bw_bytes_per_s=1e13, issue_us={k0: 500.0}, issue_default_us=300.0)
    profile = dataclasses.replace(make_profile(), cuda=cuda)
    assert profile.kind_issue_us(g.ops[0], "cuda") == 500.0
    assert profile.kind_issue_us(g.ops[1], "cuda") == 300.0
    assert profile.kind_issue_us(g.ops[0], "cpu") is None
    # Tiny kernels: the host's issue chain is the step (500 + 300 us, one lock).
    on_gpu = simulate(g, resolve(g, Plan(device="gpu0"), m), m, profile, record=False).step_time_s
    assert on_gpu == pytest.approx(800e-6, rel=0.02)
    without = simulate(g, resolve(g, Plan(device="gpu0"), m), m, dataclasses.replace(profile, cuda=None),
                       record=False).step_time_s
    assert without < 200e-6  # the CPU profile's dispatch and the roofline: far less
    on_cpu = simulate(g, resolve(g, Plan(device="cpu0"), m), m, profile, record=False).step_time_s
    assert on_cpu < 200e-6
    again = Profile.load(profile.save(tmp_path / "p.json"), check_machine=False)
    assert again.cuda == cuda
