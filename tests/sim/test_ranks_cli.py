"""`schedlab simulate` on multi-device plans: local ranks, per-rank figures, transfers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.cli.common import plan_ranks
from schedlab.errors import SchedlabError
from schedlab.machine import detect_host
from schedlab.plan import Plan
from schedlab.trace import Trace
from tests.calibrate.factories import make_profile


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    return make_profile(machine=detect_host().fingerprint).save(tmp_path / "profile.json")


def simulate_json(capsys, tmp_path: Path, profile_file: Path, plan: Plan, *extra: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    path = plan.save(tmp_path / "plan.json")
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--plan", str(path),
               "--out", str(tmp_path / "s.sim.json"), "--json", *extra])
    assert rc == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_placed_plan_runs_on_as_many_local_ranks_as_it_names(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    d = simulate_json(capsys, tmp_path, profile_file, Plan(device="cpu0", layer_devices={"head": "cpu1"}))
    assert d["machine"] == "host-2ranks" and d["ranks"] == 2 and d["engine"] == "simpy"
    assert [r["rank"] for r in d["per_rank"]] == [0, 1]
    assert [r["devices"] for r in d["per_rank"]] == [["cpu0"], ["cpu1"]]
    assert all(r["ops"] > 0 and r["busy_core_s"] > 0 and r["lock_busy_s"] > 0 for r in d["per_rank"])
    assert max(r["end_s"] for r in d["per_rank"]) == pytest.approx(d["predicted_step_time_s"])
    assert d["transfers"]["count"] > 0 and d["transfers"]["bytes"] == sum(r["sent_bytes"] for r in d["per_rank"])
    assert set(d["peak_memory_bytes"]) == {"cpu0", "cpu1"} and all(b > 0 for b in d["peak_memory_bytes"].values())
    trace = Trace.load(d["trace"])
    assert trace.ranks == (0, 1) and len({e.op for e in trace.events}) == d["ops"] == len(trace.events)
    assert any(e.kind == "COMM" and e.worker < 0 for e in trace.events)


def test_a_data_parallel_plan_runs_on_one_rank_per_replica(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    d = simulate_json(capsys, tmp_path, profile_file, Plan(replicas=2, bucket_mb=0.002, order="w-last"))
    assert d["machine"] == "host-2ranks" and d["ranks"] == 2
    assert d["collectives"] > 1 and d["transfers"]["count"] == 0


def test_the_text_report_shows_each_rank(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    path = Plan(device="cpu0", layer_devices={"head": "cpu1"}).save(tmp_path / "plan.json")
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--plan", str(path),
               "--out", str(tmp_path / "s.sim.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "rank 0" in out and "rank 1" in out and "transfers" in out and "cpu1:" in out


def test_devices_flag_and_plans_on_devices_the_host_lacks(capsys, tmp_path: Path, profile_file: Path) -> None:  # type: ignore[no-untyped-def]
    d = simulate_json(capsys, tmp_path, profile_file, Plan(device="cpu0", layer_devices={"head": "cpu1"}), "--devices", "3")
    assert d["machine"] == "host-3ranks" and d["ranks"] == 2  # cpu2 runs nothing
    path = Plan(device="gpu0").save(tmp_path / "gpu.json")
    rc = main(["simulate", "mlp", "--size", "tiny", "--profile", str(profile_file), "--plan", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "--machine" in err and "Traceback" not in err
    assert plan_ranks(Plan()) == 1 and plan_ranks(Plan(op_devices={0: "cpu3"})) == 4
    assert plan_ranks(Plan(replicas=2, layer_devices={"head": "cpu1"})) == 4
    with pytest.raises(SchedlabError, match="gpu0"):
        plan_ranks(Plan(device="gpu0"))
