"""The multi-process executor: placed plans on 2 and 3 ranks match eager PyTorch, the
merged trace holds every op once per step on its rank, and a dead or hung rank is one
clear error that leaves no process behind.

Each run starts real rank processes (a few seconds each on 2 cores): the default tests
are few, the rest are marked slow.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from schedlab.capture import capture
from schedlab.data_parallel import plan_step
from schedlab.distribute import ALL_REDUCE
from schedlab.errors import SchedlabError
from schedlab.exec.check import check_step
from schedlab.exec.dist import p2p_directions
from schedlab.exec.launch import run_ranks
from schedlab.graph import Graph, GraphInput, GraphOutput, InputRole, Op, OpKind, OutputRole, TensorMeta
from schedlab.machine import Machine, detect_host, host_ranks
from schedlab.plan import Plan, ResolvedPlan, list_schedule, resolve
from tests.conftest import captured_workload


def rank_processes(marker: Path) -> list[int]:
    """Pids of live processes whose command line names `marker` (a job folder's parent)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(marker) in cmd and "schedlab.exec.rank" in cmd:
            out.append(int(pid))
    return out


def blocks(graph: Graph, n: int) -> dict[str, str]:
    """Top-level layers (blocks.i, encoder.i, ... counted one each) in `n` contiguous groups."""
    order: list[str] = []
    for op in graph.ops:
        if op.layer:
            p = op.layer.split(".")
            key = ".".join(p[:2]) if len(p) > 1 and p[1].isdigit() else p[0]
            if key not in order:
                order.append(key)
    return {key: f"cpu{idx * n // len(order)}" for idx, key in enumerate(order)}


def check_run(name: str, layer_devices: dict[str, str], n: int, tmp_path: Path, steps: int = 2, slots: int = 1,
              machine: Machine | None = None) -> Any:
    w, c = captured_workload(name)
    graph = c.graph  # type: ignore[attr-defined]
    machine = machine or host_ranks(n)
    resolved = resolve(graph, Plan(layer_devices=layer_devices, slots=slots), machine)
    assert resolved.multi_device
    res = run_ranks(graph, resolved, machine, c.input_values, steps=steps, warmup=1,  # type: ignore[attr-defined]
                    want_outputs=True, timeout_s=60, job_root=tmp_path)
    check = check_step(w.module, graph, c.input_values, lambda iv: res.outputs)  # type: ignore[attr-defined]
    assert check.numerics_ok, check.describe()
    # Every op of the expanded graph exactly once per step, on the rank that drives its device.
    run_graph = resolved.run_graph(graph)
    seen = Counter((e.step, e.op) for e in res.trace.events)
    assert set(seen) == {(k, op.id) for k in range(steps) for op in run_graph.ops}
    assert set(seen.values()) == {1}
    for e in res.trace.events:
        assert e.rank == machine.device(resolved.device[e.op]).process
        assert e.device == resolved.device[e.op]
        assert (e.worker < 0) == (run_graph.ops[e.op].kind is OpKind.COMM)
        assert 0 <= e.start_ns <= e.end_ns
    if slots == 1:  # one straight line per rank: its ops one after another, in sequence order
        pos = {i: k for k, i in enumerate(resolved.sequence)}
        for (rank, step) in {(e.rank, e.step) for e in res.trace.events}:
            line = sorted((e for e in res.trace.events if e.rank == rank and e.step == step
                           and run_graph.ops[e.op].target != ALL_REDUCE), key=lambda e: e.start_ns)
            assert all(x.end_ns <= y.start_ns for x, y in itertools.pairwise(line))
            assert [pos[e.op] for e in line] == sorted(pos[e.op] for e in line)
    assert len(res.step_times_s) == steps and all(t > 0 for t in res.step_times_s)
    assert len(res.rank_step_times_s) == n and all(len(t) == steps for t in res.rank_step_times_s)
    assert res.trace.meta["ranks"] == n and res.trace.ranks == tuple(range(n))
    assert rank_processes(tmp_path) == []
    return res


def test_placed_mlp_on_two_ranks_matches_eager(tmp_path: Path) -> None:
    res = check_run("mlp", {"head": "cpu1"}, 2, tmp_path)
    chrome = res.trace.to_chrome()
    procs = {e["pid"] for e in chrome["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {0, 1}
    # The steps run back to back: together they span the timed window of the trace.
    assert res.trace.meta["rank_step_times_s"] == [list(t) for t in res.rank_step_times_s]


def test_transformer_on_three_ranks_matches_eager(tmp_path: Path) -> None:
    _, c = captured_workload("transformer")
    check_run("transformer", blocks(c.graph, 3), 3, tmp_path)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "transformer", "nmt"])
def test_layer_split_on_two_ranks_matches_eager(name: str, tmp_path: Path) -> None:
    _, c = captured_workload(name)
    check_run(name, blocks(c.graph, 2), 2, tmp_path)  # type: ignore[attr-defined]


def test_each_direction_between_ranks_gets_its_own_point_to_point_group() -> None:
    """A rank's sends to a peer and its receives from it go through two groups (one per
    direction: `exec.dist`'s docstring says why), made for the directions sends take."""
    _, c = captured_workload("transformer")
    graph = c.graph  # type: ignore[attr-defined]
    machine = host_ranks(3)
    rank_of = {d.id: d.process for d in machine.devices}
    resolved = resolve(graph, Plan(layer_devices=blocks(graph, 3)), machine)
    run_graph = resolved.run_graph(graph)
    # A chain of blocks: activations forward (0 -> 1 -> 2), gradients back (2 -> 1 -> 0), and
    # the inputs rank 0 holds that the last block reads (0 -> 2; nothing flows back to them).
    assert p2p_directions(run_graph, resolved.device, rank_of) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 1)]
    w, _ = captured_workload("mlp")
    step = plan_step(w, 2, lambda part: capture(part, "sgd"))  # type: ignore[arg-type]
    dp = resolve(step.graph, Plan(replicas=2), host_ranks(2))
    assert p2p_directions(dp.run_graph(step.graph), dp.device, {"cpu0": 0, "cpu1": 1}) == []  # all-reduces only


@pytest.mark.slow
def test_three_ranks_mlp(tmp_path: Path) -> None:
    check_run("mlp", {"body.0": "cpu0", "body.2": "cpu1", "head": "cpu2"}, 3, tmp_path)


def four_core_ranks(n: int) -> Machine:
    """`n` ranks of 2 cores each, whatever this host has (co-run slots need cores to resolve)."""
    host = detect_host()
    return host_ranks(n, dataclasses.replace(host, devices=(dataclasses.replace(host.devices[0], cores=2 * n),)))


@pytest.mark.slow
def test_co_run_slots_on_ranks_match_eager(tmp_path: Path) -> None:
    check_run("mlp", {"head": "cpu1"}, 2, tmp_path, slots=2, machine=four_core_ranks(2))


# ---- all-reduce ------------------------------------------------------------------------------


def all_reduce_graph() -> tuple[Graph, tuple[str, ...]]:
    """Two devices, each squaring its inputs x (4,) and y (2, 3) and averaging the squares in
    bucket 0 (x and y) and bucket 1 (x again), in the all-reduce format of distribute.py."""
    f32 = "float32"
    values: list[TensorMeta | None] = []

    def val(shape: tuple[int, ...]) -> int:
        n = 1
        for d in shape:
            n *= d
        values.append(TensorMeta(shape=shape, dtype=f32, nbytes=4 * n))
        return len(values) - 1

    inputs: list[GraphInput] = []
    outputs: list[GraphOutput] = []
    ops: list[Op] = []
    device: list[str] = []
    for d in ("cpu0", "cpu1"):
        x, y = val((4,)), val((2, 3))
        inputs += [GraphInput(x, f"x{d}", InputRole.USER), GraphInput(y, f"y{d}", InputRole.USER)]
    for k, d in enumerate(("cpu0", "cpu1")):
        x, y = 2 * k, 2 * k + 1
        sq = []
        for v in (x, y):
            out = val(values[v].shape)  # type: ignore[union-attr]
            ops.append(Op(id=len(ops), name=f"sq{v}", target="aten.mul.Tensor", kind=OpKind.W, args=({"v": v}, {"v": v}), kwargs={},
                          inputs=(v,), outputs=(out,), flops=0.0, bytes_moved=0))
            device.append(d)
            sq.append(out)
        for bucket, ins in ((0, sq), (1, sq[:1])):
            outs = tuple(val(values[v].shape) for v in ins)  # type: ignore[union-attr]
            ops.append(Op(id=len(ops), name=f"all_reduce b{bucket} {d}", target=ALL_REDUCE, kind=OpKind.COMM,
                          args=(), kwargs={"bucket": bucket, "group": ["cpu0", "cpu1"], "reduce": "avg"},
                          inputs=tuple(ins), outputs=outs, flops=0.0, bytes_moved=0))
            device.append(d)
            outputs += [GraphOutput(v, f"b{bucket}.{v}", OutputRole.GRAD) for v in outs]
    g = Graph(name="allreduce", inputs=tuple(inputs), outputs=tuple(outputs), ops=tuple(ops), values=tuple(values))
    g.validate()
    return g, tuple(device)


@pytest.mark.parametrize("slots", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_all_reduce_averages_buckets_across_ranks(slots: int, tmp_path: Path) -> None:
    g, device = all_reduce_graph()
    machine = four_core_ranks(2)
    prio = tuple(range(len(g.ops)))
    resolved = ResolvedPlan(
        plan=Plan(slots=slots), slots=slots, threads=(1,) * len(g.ops), priority=prio, device=device,
        sequence=list_schedule(g, prio), device_slots={"cpu0": slots, "cpu1": slots},
    )
    gen = torch.Generator().manual_seed(0)
    inputs = {i.value: torch.randn(g.values[i.value].shape, generator=gen) for i in g.inputs}  # type: ignore[union-attr]
    res = run_ranks(g, resolved, machine, inputs, steps=1, warmup=0, want_outputs=True, job_root=tmp_path)
    assert res.outputs is not None
    x0, y0, x1, y1 = (inputs[i.value] for i in g.inputs)
    want = {0: [(x0 * x0 + x1 * x1) / 2, (y0 * y0 + y1 * y1) / 2], 1: [(x0 * x0 + x1 * x1) / 2]}
    for o in g.outputs:
        bucket = int(o.name[1])
        k = [p for p in g.outputs if p.name.startswith(f"b{bucket}.")].index(o) % len(want[bucket])
        torch.testing.assert_close(res.outputs[o.value], want[bucket][k])
    assert {e.op for e in res.trace.events} == set(range(len(g.ops)))


# ---- failures --------------------------------------------------------------------------------


def mlp_two_ranks() -> tuple[Graph, ResolvedPlan, Machine, dict[int, torch.Tensor]]:
    _, c = captured_workload("mlp")
    machine = host_ranks(2)
    graph = c.graph  # type: ignore[attr-defined]
    return graph, resolve(graph, Plan(layer_devices={"head": "cpu1"}), machine), machine, c.input_values  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault, says", [
    ("exit", "rank 1 exited with code 3 in step 1"),
    pytest.param("kill", "rank 1 was killed by signal SIGKILL in step 1", marks=pytest.mark.slow),
])
def test_a_dead_rank_is_one_clear_error_and_leaves_no_process(fault: str, says: str, tmp_path: Path) -> None:
    graph, resolved, machine, inputs = mlp_two_ranks()
    t0 = time.monotonic()
    with pytest.raises(SchedlabError) as e:
        run_ranks(graph, resolved, machine, inputs, steps=3, warmup=0, timeout_s=30, job_root=tmp_path,
                  extra_env={"SCHEDLAB_TEST_FAULT": f"1:{fault}:1"})
    assert says in str(e.value)
    assert "test fault" in str(e.value)  # the end of its log
    assert time.monotonic() - t0 < 30
    assert rank_processes(tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # the job folder is gone


def test_a_hung_rank_times_out_with_one_clear_error_and_leaves_no_process(tmp_path: Path) -> None:
    graph, resolved, machine, inputs = mlp_two_ranks()
    timeout_s = 4.0
    t0 = time.monotonic()
    with pytest.raises(SchedlabError) as e:
        run_ranks(graph, resolved, machine, inputs, steps=3, warmup=0, timeout_s=timeout_s, job_root=tmp_path,
                  extra_env={"SCHEDLAB_TEST_FAULT": "1:hang:1"})
    msg = str(e.value)
    assert "had not finished" in msg and "rank 1: step 1" in msg
    assert "_inject" in msg  # rank 1's stack: where it hung
    assert time.monotonic() - t0 < 30  # start-up + the timeout, far from the collectives' own
    assert rank_processes(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ranks_stuck_after_writing_their_results_are_stopped_and_the_run_kept(tmp_path: Path) -> None:
    from schedlab.exec.launch import TEARDOWN_GRACE_S, RankTeardownWarning

    graph, resolved, machine, inputs = mlp_two_ranks()
    t0 = time.monotonic()
    with pytest.warns(RankTeardownWarning, match=r"rank\(s\) 0, 1 wrote their results but did not exit"):
        res = run_ranks(graph, resolved, machine, inputs, steps=2, warmup=0, timeout_s=60, job_root=tmp_path,
                        extra_env={"SCHEDLAB_TEST_FAULT": "0:hang:-1"})  # rank 1 then waits in the barrier
    assert res.step_time_s > 0 and len(res.trace.events) > 0
    assert TEARDOWN_GRACE_S <= time.monotonic() - t0 < 60  # the grace, not the hang timeout
    assert rank_processes(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


# ---- the CLI and the Backend -----------------------------------------------------------------


@pytest.mark.slow
def test_cli_trace_runs_a_placed_plan_on_its_ranks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import json

    from schedlab.cli import main
    from schedlab.trace import Trace

    plan = tmp_path / "p.json"
    Plan(layer_devices={"head": "cpu1"}).save(plan)
    rc = main(["trace", "mlp", "--size", "tiny", "--plan", str(plan), "--steps", "2", "--warmup", "1",
               "--out", str(tmp_path / "t.json"), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["numerics_ok"] and d["max_abs_grad_diff"] <= 1e-5
    assert d["ranks"] == 2 and len(d["rank_step_times_s"]) == 2 and len(d["step_times_s"]) == 2
    trace = Trace.load(d["trace"])
    assert trace.ranks == (0, 1) and trace.meta["numeric_check"]["numerics_ok"]
    chrome = json.loads(Path(d["chrome_trace"]).read_text())
    assert {e["pid"] for e in chrome["traceEvents"] if e.get("name") == "process_name"} == {0, 1}


def test_cli_trace_names_a_device_it_cannot_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from schedlab.cli import main

    plan = tmp_path / "p.json"
    Plan(layer_devices={"head": "gpu0"}).save(plan)
    rc = main(["trace", "mlp", "--size", "tiny", "--plan", str(plan)])
    assert rc != 0 and "local ranks" in capsys.readouterr().err


@pytest.mark.slow
def test_exec_backend_hands_a_multi_device_plan_to_the_ranks(tmp_path: Path) -> None:
    from schedlab.exec import ExecBackend

    graph, resolved, machine, inputs = mlp_two_ranks()
    run = ExecBackend(inputs, warmup=0).run(graph, resolved, machine, steps=2)
    assert len(run.step_times_s) == 2 and run.trace.ranks == (0, 1) and run.trace.meta["ranks"] == 2


@pytest.mark.slow
def test_the_rank_entry_point_runs_under_torchrun(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    from schedlab.exec.launch import collect, prepare_job

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    graph, resolved, machine, inputs = mlp_two_ranks()
    job = tmp_path / "job"
    run_graph = prepare_job(job, graph, resolved, machine, inputs, steps=2, warmup=0, want_outputs=True)
    p = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "schedlab.exec.rank", str(job)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    res = collect(job, run_graph, resolved, machine, workload="mlp", graph_hash=graph.hash, warmup=0)
    assert len(res.step_times_s) == 2 and res.trace.ranks == (0, 1) and res.outputs
    shutil.rmtree(job)


LAUNCHER = """
import signal
import sys
# Ctrl-C as in a terminal: a shell that starts jobs in the background (CI under nohup or
# `&`) hands them SIGINT ignored, and Python then keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from tests.exec.test_dist import mlp_two_ranks
from schedlab.exec.launch import run_ranks
graph, resolved, machine, inputs = mlp_two_ranks()
run_ranks(graph, resolved, machine, inputs, steps=3, warmup=0, timeout_s=600, job_root=Path(sys.argv[1]),
          extra_env={"SCHEDLAB_TEST_FAULT": "1:hang:1"})
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_no_rank_outlives_an_interrupted_or_killed_launcher(sig: str, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 60
        while len(rank_processes(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(rank_processes(tmp_path)) == 2
        time.sleep(1.0)
        launcher.send_signal(getattr(signal, sig))
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while rank_processes(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rank_processes(tmp_path) == []
    finally:
        launcher.kill()
        launcher.wait()
