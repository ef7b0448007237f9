"""Bad input, across every command: one clear error and nothing else.

Each case runs one command on one bad input and checks the whole contract: exit status 2;
stderr exactly one line, `schedlab COMMAND: error: ...`, naming the file, flag or model
spec at fault; no traceback anywhere; and nothing half-written: every file under the
test's folder and the shared kit (outputs, run directories, the inputs themselves) is
byte-for-byte and mtime-for-mtime what it was, and no file appeared.

Most cases run in-process through `schedlab.cli.main` (captures cached per session); a
few run `python -m schedlab` from a folder outside the checkout, so the installed module
paths and a user model beside the user are covered too.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from schedlab.cli import main
from tests.conftest import captured_workload

HUGE = 100_000  # more threads or slots than any machine this runs on has cores
MYSQL_URL = "mysql://user:secret@127.0.0.1:1/schedlab"  # no driver installed; nothing listens on port 1


@dataclass(frozen=True)
class Kit:
    """Valid inputs, made once per session, that the cases copy or corrupt."""

    root: Path
    plan: dict[str, Any]  # a plan `schedlab plan mlp --size tiny` wrote
    profile: dict[str, Any]  # a profile measured "on this machine" (no mismatch warning)
    n_ops: int  # ops of mlp/tiny/sgd

    @property
    def run_dir(self) -> Path:
        return self.root / "run"


Content = str | Callable[[Kit], str]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # "{tmp}" and "{kit}" are filled in
    names: str  # what the error line must name: a path, a flag, a model spec
    files: dict[str, Content] = field(default_factory=dict)  # written under {tmp} first
    copy_run: bool = False  # copy the kit's run directory to {tmp}/run first

    @property
    def command(self) -> str:
        return self.argv[0]


def plan_with(**fields: Any) -> Callable[[Kit], str]:
    return lambda kit: json.dumps({**kit.plan, **fields})


def plan_order(make: Callable[[int], list[int]]) -> Callable[[Kit], str]:
    return lambda kit: json.dumps({**kit.plan, "order": make(kit.n_ops)})


def profile_with(edit: Callable[[dict[str, Any]], None]) -> Callable[[Kit], str]:
    def content(kit: Kit) -> str:
        d = json.loads(json.dumps(kit.profile))
        edit(d)
        return json.dumps(d)  # NaN and Infinity are written as JSON's non-standard literals

    return content


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return edit


def machine_file(**device: Any) -> str:
    dev = {"id": "cpu0", "kind": "cpu", "cores": 4, "memory_bytes": 2**30, **device}
    return json.dumps({"schema": "schedlab.machine", "version": 1, "name": "m", "devices": [dev]})


SIM = ("simulate", "mlp", "--size", "tiny", "--profile", "{kit}/profile.json", "--out", "{tmp}/out/sim.json")
TRACE = ("trace", "mlp", "--size", "tiny", "--steps", "1", "--warmup", "0", "--out", "{tmp}/out/trace.json")
SEARCH = ("search", "mlp", "--size", "tiny", "--profile", "{kit}/profile.json", "--run-dir", "{tmp}/run",
          "--trials", "2", "--no-trace-calibration", "--no-progress")
BENCH = ("bench", "mlp", "--size", "tiny", "--repeats", "1")
PLAN = ("plan", "mlp", "--size", "tiny", "-o", "{tmp}/out/plan.json")
P = "{tmp}/bad.json"


def on_plan(cmd: tuple[str, ...], case_id: str, content: Content) -> Case:
    return Case(case_id, (*cmd, "--plan", P), P, {"bad.json": content})


CASES = [
    # ---- plan files: parse, schema, then against the graph and the machine ----------------
    on_plan(SIM, "plan-not-json", "{"),
    on_plan(SIM, "plan-truncated", lambda kit: json.dumps(kit.plan)[:40]),
    on_plan(SIM, "plan-not-an-object", "[1, 2]"),
    on_plan(SIM, "plan-wrong-schema", plan_with(schema="schedlab.profile")),
    on_plan(SIM, "plan-wrong-version", plan_with(version=9)),
    on_plan(SIM, "plan-unknown-field", plan_with(slotz=2)),
    on_plan(SIM, "plan-slots-not-an-integer", plan_with(slots="two")),
    on_plan(SIM, "plan-negative-slots", plan_with(slots=-1)),
    on_plan(SIM, "plan-threads-above-cores", plan_with(threads=HUGE)),
    on_plan(SIM, "plan-zero-threads", plan_with(threads=0)),
    on_plan(SIM, "plan-unknown-op-in-op-threads", plan_with(op_threads={"99999": 1})),
    on_plan(SIM, "plan-op-threads-key-not-an-id", plan_with(op_threads={"first": 1})),
    on_plan(SIM, "plan-unknown-op-class", plan_with(class_threads={"no_such_class": 1})),
    on_plan(SIM, "plan-class-threads-not-an-object", plan_with(class_threads=[1, 2])),
    on_plan(SIM, "plan-order-missing-op", plan_order(lambda n: list(range(n - 1)))),
    on_plan(SIM, "plan-order-duplicated-op", plan_order(lambda n: [0, *range(n - 1)])),
    on_plan(SIM, "plan-order-unknown-op", plan_order(lambda n: [*range(n - 1), n + 7])),
    on_plan(SIM, "plan-order-breaks-dependency", plan_order(lambda n: list(reversed(range(n))))),
    on_plan(SIM, "plan-order-not-ids", plan_with(order=[0, "a"])),
    on_plan(SIM, "plan-unknown-order-policy", plan_with(order="fastest-first")),
    on_plan(SIM, "plan-bad-random-seed", plan_with(order="random:seven")),
    on_plan(SIM, "plan-unknown-device", plan_with(device="gpu9")),
    on_plan(SIM, "plan-device-not-a-string", plan_with(device=5)),
    on_plan(SIM, "plan-placement-not-an-object", plan_with(placement=["cpu0"])),
    on_plan(SIM, "plan-placement-layers-not-devices", plan_with(placement={"layers": {"head": 1}})),
    on_plan(SIM, "plan-replicas-not-an-integer", plan_with(replicas="two")),
    on_plan(SIM, "plan-bucket-not-a-number", plan_with(bucket_mb="big")),
    Case("plan-file-missing", (*SIM, "--plan", "{tmp}/nope.json"), "{tmp}/nope.json"),
    Case("plan-file-is-a-folder", (*SIM, "--plan", "{tmp}"), "{tmp}"),
    on_plan(TRACE, "trace-plan-threads-above-cores", plan_with(threads=HUGE)),
    on_plan(TRACE, "trace-plan-unknown-field", plan_with(colour="red")),
    on_plan(BENCH, "bench-plan-unknown-order-policy", plan_with(order="sideways")),
    # ---- `schedlab plan`: flags that cannot make a plan; where it cannot write ------------
    Case("plan-zero-slots", (*PLAN, "--slots", "0"), "--slots"),
    Case("plan-slots-above-cores", (*PLAN, "--slots", str(HUGE)), "--slots"),
    Case("plan-threads-flag-above-cores", (*PLAN, "--threads", str(HUGE)), "--threads"),
    Case("plan-order-flag-unknown", (*PLAN, "--order", "bogus"), "--order"),
    Case("plan-order-flag-bad-seed", (*PLAN, "--order", "random:x"), "--order"),
    Case("plan-slots-not-an-integer-flag", (*PLAN, "--slots", "two"), "--slots"),
    Case("plan-replicas-do-not-divide-devices", (*PLAN, "--devices", "3", "--replicas", "2"), "--replicas"),
    Case("plan-replicas-do-not-divide-batch", (*PLAN, "--devices", "3", "--replicas", "3"), "divide the batch"),
    Case("plan-layers-on-one-device", (*PLAN, "--placement", "layers"), "--placement layers"),
    Case("plan-placement-file-unknown-key", (*PLAN, "--devices", "2", "--placement", P), "placement file",
         {"bad.json": json.dumps({"layerz": {"head": "cpu1"}})}),
    Case("plan-placement-file-unknown-device", (*PLAN, "--devices", "2", "--placement", P), "cpu7",
         {"bad.json": json.dumps({"layers": {"head": "cpu7"}})}),
    Case("plan-placement-file-unknown-layer", (*PLAN, "--devices", "2", "--placement", P), "nosuch",
         {"bad.json": json.dumps({"layers": {"nosuch": "cpu1"}})}),
    Case("plan-out-is-a-folder", ("plan", "mlp", "--size", "tiny", "-o", "{tmp}/outdir"), "{tmp}/outdir",
         {"outdir/keep.txt": "kept"}),
    Case("plan-out-under-a-file", ("plan", "mlp", "--size", "tiny", "-o", "{tmp}/afile/plan.json"),
         "{tmp}/afile/plan.json", {"afile": "a file, not a folder"}),
    # ---- machine files -------------------------------------------------------------------------
    Case("machine-missing", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json"),
    Case("machine-not-json", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json", {"m.json": "cores: 4"}),
    Case("machine-missing-devices", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json",
         {"m.json": json.dumps({"schema": "schedlab.machine", "version": 1, "name": "m"})}),
    Case("machine-zero-cores", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json", {"m.json": machine_file(cores=0)}),
    Case("machine-negative-memory", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json",
         {"m.json": machine_file(memory_bytes=-5)}),
    Case("machine-cores-not-a-number", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json",
         {"m.json": machine_file(cores="many")}),
    Case("machine-unknown-device-kind", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json",
         {"m.json": machine_file(kind="tpu")}),
    Case("machine-wrong-version", (*SIM, "--machine", "{tmp}/m.json"), "{tmp}/m.json",
         {"m.json": machine_file().replace('"version": 1', '"version": 7')}),
    Case("machine-unknown-preset", ("plan", "mlp", "--size", "tiny", "--machine", "manycore-99", "-o", "{tmp}/p.json"),
         "manycore-99"),
    # ---- profile files -------------------------------------------------------------------------
    Case("profile-missing", ("simulate", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json", "--out", "{tmp}/s.json"),
         "{tmp}/p.json"),
    Case("profile-corrupt", ("simulate", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json", "--out", "{tmp}/s.json"),
         "{tmp}/p.json", {"p.json": '{"schema": "schedlab.prof'}),
    Case("profile-wrong-schema", ("simulate", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json", "--out",
                                  "{tmp}/s.json"), "{tmp}/p.json",
         {"p.json": profile_with(_set(("schema",), "schedlab.plan"))}),
    Case("profile-truncated-on-search", ("search", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json",
                                         "--run-dir", "{tmp}/run"), "{tmp}/p.json",
         {"p.json": lambda kit: json.dumps(kit.profile)[:300]}),
    Case("profile-nan-fit", ("simulate", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json", "--out", "{tmp}/s.json"),
         "{tmp}/p.json",
         {"p.json": profile_with(_set(("fallback", "params", "a_us"), math.nan))}),
    Case("profile-negative-fit", ("search", "mlp", "--size", "tiny", "--profile", "{tmp}/p.json",
                                  "--run-dir", "{tmp}/run"), "{tmp}/p.json",
         {"p.json": profile_with(_set(("fallback", "params", "us_per_gflop"), -3.0))}),
    Case("profile-infinite-dispatch", ("fidelity", "mlp", "--size", "tiny", "--steps", "1", "--profile", "{tmp}/p.json",
                                       "--out", "{tmp}/fid.json"), "{tmp}/p.json",
         {"p.json": profile_with(_set(("dispatch", "op_us"), math.inf))}),
    # ---- run directories -----------------------------------------------------------------------
    Case("validate-missing-dir", ("validate", "{tmp}/nope"), "{tmp}/nope"),
    Case("validate-dir-without-run-json", ("validate", "{tmp}/empty"), "{tmp}/empty", {"empty/.keep": ""}),
    Case("validate-corrupt-run-json", ("validate", "{tmp}/run"), "{tmp}/run/run.json", {"run/run.json": "{oops"},
         copy_run=True),
    Case("validate-run-json-wrong-schema", ("validate", "{tmp}/run"), "{tmp}/run/run.json",
         {"run/run.json": '{"schema": "schedlab.results", "version": 1}'}, copy_run=True),
    Case("validate-corrupt-search-json", ("validate", "{tmp}/run"), "{tmp}/run/search.json",
         {"run/search.json": '{"best": ['}, copy_run=True),
    Case("validate-corrupt-graph-json", ("validate", "{tmp}/run"), "{tmp}/run/graph.json",
         {"run/graph.json": '{"schema": "schedlab.graph", "version": 1}'}, copy_run=True),
    Case("validate-graph-json-a-list", ("validate", "{tmp}/run"), "{tmp}/run/graph.json",
         {"run/graph.json": "[]"}, copy_run=True),
    Case("validate-negative-top", ("validate", "{tmp}/run", "--top", "-1"), "--top", copy_run=True),
    Case("validate-zero-steps", ("validate", "{tmp}/run", "--steps", "0"), "--steps", copy_run=True),
    Case("report-missing-dir", ("report", "{tmp}/nope"), "{tmp}/nope"),
    Case("report-dir-without-run-json", ("report", "{tmp}/empty"), "{tmp}/empty", {"empty/.keep": ""}),
    Case("report-corrupt-run-json", ("report", "{tmp}/run"), "{tmp}/run/run.json", {"run/run.json": "[1,"},
         copy_run=True),
    Case("report-corrupt-results-json", ("report", "{tmp}/run"), "{tmp}/run/results.json",
         {"run/results.json": '{"schema": "schedlab.results", '}, copy_run=True),
    Case("report-results-json-wrong-shape", ("report", "{tmp}/run"), "{tmp}/run/results.json",
         {"run/results.json": '{"schema": "schedlab.results", "version": 1}'}, copy_run=True),
    Case("report-results-file-not-json", ("report", "{tmp}/fid.json", "--out", "{tmp}/rep"), "{tmp}/fid.json",
         {"fid.json": '{"plans": ['}),
    Case("report-results-file-is-a-plan", ("report", "{kit}/plan.json", "--out", "{tmp}/rep"), "{kit}/plan.json"),
    # ---- model specs ---------------------------------------------------------------------------
    Case("model-unknown-builtin", ("trace", "resnet9000", "--size", "tiny", "--out", "{tmp}/t.json"), "resnet9000"),
    Case("model-bad-spec", ("simulate", ":make", "--profile", "{kit}/profile.json", "--out", "{tmp}/s.json"), ":make"),
    Case("model-missing-module", ("simulate", "no_such_pkg.models:make", "--profile", "{kit}/profile.json",
                                  "--out", "{tmp}/s.json"), "no_such_pkg.models:make"),
    Case("model-missing-function", ("plan", "tests.fixtures.user_model:missing", "-o", "{tmp}/p.json"),
         "tests.fixtures.user_model:missing"),
    Case("model-not-callable", ("trace", "tests.fixtures.user_model:NOT_CALLABLE", "--out", "{tmp}/t.json"),
         "tests.fixtures.user_model:NOT_CALLABLE"),
    Case("model-factory-raises-multiline", ("simulate", "tests.fixtures.user_model:make_raises_multiline",
                                            "--profile", "{kit}/profile.json", "--out", "{tmp}/s.json"),
         "tests.fixtures.user_model:make_raises_multiline"),
    Case("model-factory-returns-a-module", ("search", "tests.fixtures.user_model:make_one_thing", "--profile",
                                            "{kit}/profile.json", "--run-dir", "{tmp}/run", "--no-progress"),
         "tests.fixtures.user_model:make_one_thing"),
    Case("model-loss-not-a-scalar", ("bench", "tests.fixtures.user_model:make_nonscalar", "--repeats", "1"),
         "tests.fixtures.user_model:make_nonscalar"),
    Case("model-loss-detached", ("plan", "tests.fixtures.user_model:make_detached_loss", "-o", "{tmp}/p.json"),
         "tests.fixtures.user_model:make_detached_loss"),
    # ---- flags ---------------------------------------------------------------------------------
    Case("search-zero-trials", (*SEARCH, "--trials", "0"), "--trials"),
    Case("search-negative-trials", (*SEARCH, "--trials", "-5"), "--trials"),
    Case("search-zero-workers", (*SEARCH, "--workers", "0"), "--workers"),
    Case("search-unknown-space", (*SEARCH, "--space", "everything"), "--space"),
    Case("search-unknown-strategy", (*SEARCH, "--strategy", "genetic"), "--strategy"),
    Case("search-storage-unknown-scheme", (*SEARCH, "--storage", "nosuchdb://host/db"), "nosuchdb://host/db"),
    Case("search-storage-driver-missing", (*SEARCH, "--storage", MYSQL_URL), "mysql://"),
    Case("search-run-dir-is-a-file", (*SEARCH[:-6], "--run-dir", "{tmp}/afile", "--no-trace-calibration"),
         "{tmp}/afile", {"afile": "not a folder"}),
    Case("trace-zero-steps", (*TRACE, "--steps", "0"), "--steps"),
    Case("trace-negative-warmup", (*TRACE, "--warmup", "-1"), "--warmup"),
    Case("trace-unknown-size", (*TRACE, "--size", "huge"), "--size"),
    Case("trace-unknown-optimizer", (*TRACE, "--optimizer", "lbfgs"), "--optimizer"),
    Case("fidelity-zero-steps", ("fidelity", "mlp", "--size", "tiny", "--steps", "0", "--out", "{tmp}/f.json"),
         "--steps"),
    Case("fidelity-out-is-a-folder", ("fidelity", "mlp", "--size", "tiny", "--steps", "1", "--profile",
                                      "{kit}/profile.json", "--out", "{tmp}/outdir"), "{tmp}/outdir",
         {"outdir/keep.txt": "kept"}),
    Case("fidelity-held-out-out-under-a-file", ("fidelity", "--held-out", "--size", "tiny", "--steps", "1",
                                                "--profile", "{kit}/profile.json", "--out", "{tmp}/afile/f.json"),
         "{tmp}/afile/f.json", {"afile": "a file"}),
    Case("fidelity-held-out-traces-folder-is-a-file", ("fidelity", "--held-out", "--size", "tiny", "--steps", "1",
                                                       "--profile", "{kit}/profile.json", "--out", "{tmp}/f.json"),
         "{tmp}/f-traces", {"f-traces": "a file where the calibration traces would go"}),
    Case("bench-zero-repeats", (*BENCH[:-1], "0"), "--repeats"),
    Case("simulate-out-under-a-file", (*SIM[:-2], "--out", "{tmp}/afile/sim.json"), "{tmp}/afile/sim.json",
         {"afile": "a file"}),
    Case("trace-out-under-a-file", (*TRACE[:-2], "--out", "{tmp}/afile/trace.json"), "{tmp}/afile/trace.json",
         {"afile": "a file"}),
    Case("calibrate-out-is-a-folder", ("calibrate", "--quick", "--no-progress", "--out", "{tmp}/outdir"),
         "{tmp}/outdir", {"outdir/keep.txt": "kept"}),
    Case("calibrate-out-under-a-file", ("calibrate", "--quick", "--no-progress", "--out", "{tmp}/afile/p.json"),
         "{tmp}/afile/p.json", {"afile": "a file"}),
    Case("report-out-under-a-file", ("report", "{tmp}/run", "--out", "{tmp}/afile/report"), "{tmp}/afile/report",
         {"afile": "a file"}, copy_run=True),
    Case("report-out-is-a-file", ("report", "{tmp}/run", "--out", "{tmp}/report.html"), "{tmp}/report.html",
         {"report.html": "<p>someone's page</p>"}, copy_run=True),
]


# ---- the kit and the runner -----------------------------------------------------------------


def _cached_capture(args: Any, **_: Any) -> tuple[object, object]:
    """capture_model, served from the session cache (user specs still fail as they would);
    keyword options of the real one (a graph cache) do not apply to the session cache."""
    return captured_workload(args.model, args.optimizer, args.size)


@pytest.fixture(scope="session")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    from schedlab.machine import detect_host
    from tests.calibrate.factories import make_profile
    from tests.reports.fake_run import make_run_dir

    root = tmp_path_factory.mktemp("kit")
    assert main(["plan", "mlp", "--size", "tiny", "-o", str(root / "plan.json")]) == 0
    profile = make_profile(machine=detect_host().fingerprint).save(root / "profile.json")
    make_run_dir(root / "run", n_trials=2, profile=False)
    _, captured = captured_workload("mlp", "sgd", "tiny")
    return Kit(root, json.loads((root / "plan.json").read_text()), json.loads(profile.read_text()),
               len(captured.graph))  # type: ignore[attr-defined]


@pytest.fixture
def cached_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    import schedlab.cli.common as common

    monkeypatch.setattr(common, "capture_model", _cached_capture)
    for name in ("plan_cmd", "trace_cmd", "simulate_cmd", "bench_cmd"):
        module = sys.modules.get(f"schedlab.cli.{name}")
        if module is not None and hasattr(module, "capture_model"):
            monkeypatch.setattr(module, "capture_model", _cached_capture)


def snapshot(*roots: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `roots`: its bytes and mtime, to prove nothing was (half-)written."""
    return {
        str(p): (p.read_bytes(), p.stat().st_mtime_ns)
        for root in roots
        for p in sorted(root.rglob("*"))
        if p.is_file()
    } | {str(p) + "/": (b"", 0) for root in roots for p in root.rglob("*") if p.is_dir()}


def fill(text: str, tmp: Path, kit: Kit) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{kit}", str(kit.root))


def check_one_clear_error(command: str, rc: int | str | None, out: str, err: str, names: str) -> None:
    assert rc == 2, f"exit status {rc}, stderr:\n{err}"
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"stderr is not one line:\n{err}"
    assert lines[0].startswith(f"schedlab {command}: error: "), lines[0]
    assert names in lines[0], f"the error does not name {names!r}: {lines[0]}"
    assert out == "", f"stdout not empty:\n{out}"


def test_the_corpus_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)
    commands = {c.command for c in CASES}
    assert commands >= {"plan", "trace", "bench", "calibrate", "simulate", "fidelity", "search", "validate", "report"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_error(
    case: Case, kit: Kit, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    cached_capture: None,
) -> None:
    if case.copy_run:
        shutil.copytree(kit.run_dir, tmp_path / "run")
    for rel, content in case.files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content(kit) if callable(content) else content)
    monkeypatch.chdir(tmp_path)  # anything written to a default relative path lands here, and is seen
    before = snapshot(tmp_path, kit.root)
    try:
        rc: int | str | None = main([fill(a, tmp_path, kit) for a in case.argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    check_one_clear_error(case.command, rc, out, err, fill(case.names, tmp_path, kit))
    assert snapshot(tmp_path, kit.root) == before, "the command wrote or changed a file"


def test_a_profile_from_another_machine_is_one_warning_line_before_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.calibrate.factories import make_profile

    foreign = make_profile(machine={"cpu_model": "Some Other CPU", "cores": 68, "torch": "2.13.0"})
    path = foreign.save(tmp_path / "p.json")
    rc = main(["search", "mlp", "--size", "tiny", "--profile", str(path), "--run-dir", str(tmp_path / "run"),
               "--storage", "nosuchdb://host/db"])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(lines) == 2, lines
    assert lines[0].startswith("schedlab: warning: profile ") and "another machine" in lines[0]
    assert lines[1].startswith("schedlab search: error: ") and "nosuchdb://host/db" in lines[1]
    assert not (tmp_path / "run").exists()


# ---- the same through `python -m schedlab`, from outside the checkout ---------------------------

USER_MODEL = '''
def make():
    raise RuntimeError("weights not found\\nsee the docs")
'''

SUBPROCESS_CASES = [
    Case("sub-unknown-space", ("search", "mlp", "--space", "everything"), "--space"),
    Case("sub-plan-wrong-schema", ("simulate", "mlp", "--size", "tiny", "--plan", P, "--profile", "{kit}/profile.json",
                                   "--out", "{tmp}/s.json"), P, {"bad.json": plan_with(schema="x")}),
    Case("sub-user-model-raises", ("trace", "my_model:make", "--out", "{tmp}/t.json"), "my_model:make",
         {"my_model.py": USER_MODEL}),
    Case("sub-validate-missing-dir", ("validate", "{tmp}/nope"), "{tmp}/nope"),
]


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[c.id for c in SUBPROCESS_CASES])
def test_bad_input_through_python_m_schedlab(case: Case, kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("elsewhere")  # outside the checkout: only the installed package is importable
    repo = Path(__file__).resolve().parents[1]
    assert not work.resolve().is_relative_to(repo)
    for rel, content in case.files.items():
        (work / rel).write_text(content(kit) if callable(content) else content)
    before = snapshot(work, kit.root)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "schedlab", *(fill(a, work, kit) for a in case.argv)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )
    check_one_clear_error(case.command, proc.returncode, proc.stdout, proc.stderr, fill(case.names, work, kit))
    assert snapshot(work, kit.root) == before, "the command wrote or changed a file"
