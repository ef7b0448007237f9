"""`schedlab simulate` and the fidelity summary, on a hand-made profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.calibrate.fidelity import FidelityRow, plan_spread, summarise
from schedlab.cli import main
from schedlab.machine import detect_host
from tests.calibrate.factories import make_profile


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    return make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")


def test_simulate_json_contract(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.sim.json"
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--out", str(out), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("predicted_step_time_s", "peak_memory_bytes", "sim_wall_s", "trace"):
        assert key in d
    assert d["predicted_step_time_s"] > 0 and d["peak_memory_bytes"]["cpu0"] > 0
    from schedlab.trace import Trace

    assert Trace.load(d["trace"]).source == "sim"


def test_simulate_other_machine_and_impossible_memory(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    machine = detect_host()
    tiny = type(machine)(
        name="tiny-mem",
        devices=(type(machine.devices[0])(id="cpu0", kind="cpu", cores=4, memory_bytes=1024),),
        host=machine.host,
    )
    mpath = tiny.save(tmp_path / "m.json")
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--machine", str(mpath), "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "plan does not fit" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content, msg",
    [("{", "not valid JSON"), (json.dumps({"schema": "schedlab.machine", "version": 1, "name": "x", "devices": []}), "no devices")],
)
def test_bad_machine_file(capsys, tmp_path: Path, profile_file: Path, content: str, msg: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "m.json"
    p.write_text(content)
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--machine", str(p)])
    assert rc == 2 and msg in capsys.readouterr().err


def test_profile_from_another_machine_warns(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = make_profile(machine={"cpu_model": "Some Other CPU", "cores": 68, "torch": "2.13.0"})
    path = other.save(tmp_path / "p.json")
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(path), "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 0 and "warning" in err and "cores" in err


def test_plan_spread_and_summary() -> None:
    plans = plan_spread(2)
    assert len(plans) == 16 and {(p.slots, p.threads) for p in plans} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    rows = [
        FidelityRow("w", "a", 1.0, (1.0, 1.0), 1.1, 0.01, 0.02, 100, False),
        FidelityRow("w", "b", 2.0, (2.0, 2.0), 1.8, 0.01, 0.02, 100, False),
        FidelityRow("w", "c", 3.0, (3.0, 3.0), 3.3, 0.01, 0.02, 100, True),
    ]
    (s,) = summarise(rows)
    assert s.mape == pytest.approx((0.1 + 0.1 + 0.1) / 3)
    assert s.kendall_tau == pytest.approx(1.0)
    assert s.sim_ops_per_s == pytest.approx(10_000)


def test_trace_runs_the_critical_path_order_simulate_predicts(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With one profile, `trace --plan` and `simulate --plan` rank a critical-path order alike."""
    from schedlab.trace import Trace
    # The hand-made profile ranks ops differently from the FLOP/byte estimate (checked: without
    # the profile, trace runs another order).
    profile_file = make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")
    plan = tmp_path / "cp.json"
    assert main(["plan", "mlp", "--size", "tiny", "--slots", "1", "--order", "critical-path", "-o", str(plan)]) == 0
    common = ["mlp", "--size", "tiny", "--plan", str(plan), "--profile", str(profile_file)]
    assert main(["simulate", *common, "--out", str(tmp_path / "s.json")]) == 0
    assert main(["trace", *common, "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "e.json")]) == 0
    capsys.readouterr()

    def order(path: Path) -> list[int]:
        events = Trace.load(path).step_events(0)
        return [e.op for e in sorted(events, key=lambda e: (e.start_ns, e.end_ns))]

    assert order(tmp_path / "e.json") == order(tmp_path / "s.json")
