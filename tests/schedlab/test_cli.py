"""The CLI: JSON contract of `trace`, and one clear error (no traceback) for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.cli import main
from schedlab.trace import Trace


def _run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_trace_json_contract(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out_path = tmp_path / "t.json"
    rc, out, _ = _run(capsys, "trace", "mlp", "--size", "tiny", "--steps", "3", "--warmup", "1", "--out", str(out_path), "--json")
    assert rc == 0
    d = json.loads(out)
    for key in ("step_time_s", "step_times_s", "max_abs_grad_diff", "trace", "chrome_trace"):
        assert key in d
    assert len(d["step_times_s"]) == 3 and d["max_abs_grad_diff"] <= 1e-5
    trace = Trace.load(d["trace"])
    assert trace.source == "exec" and len({e.step for e in trace.events}) == 3
    chrome = json.loads(Path(d["chrome_trace"]).read_text())
    assert any(e["ph"] == "X" for e in chrome["traceEvents"])
    assert any(e.get("name") == "thread_name" for e in chrome["traceEvents"])


def test_plan_then_trace(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "p.json"
    rc, _, _ = _run(capsys, "plan", "cnn", "--size", "tiny", "--slots", "2", "--threads", "1", "--order", "critical-path", "-o", str(plan))
    assert rc == 0 and json.loads(plan.read_text())["slots"] == 2
    rc, out, _ = _run(capsys, "trace", "cnn", "--size", "tiny", "--plan", str(plan), "--steps", "2", "--out", str(tmp_path / "t.json"), "--json")
    assert rc == 0 and json.loads(out)["plan"]["order"] == "critical-path"


def test_every_model_command_defaults_to_the_same_size() -> None:
    """A plan written without --size is checked against the graph simulate/trace/search run."""
    from schedlab.cli import build_parser

    parser = build_parser()
    sizes = {
        cmd: parser.parse_args([cmd, "mlp", *extra]).size
        for cmd, extra in (("plan", ["-o", "p.json"]), ("trace", []), ("simulate", []), ("search", []))
    }
    assert set(sizes.values()) == {"default"}, sizes


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["trace", "nosuchmodel", "--size", "tiny"], "unknown workload 'nosuchmodel'"),
        (["trace", "no_such_pkg.mod:make"], "no_such_pkg"),
        (["trace", "tests.fixtures.user_model:missing"], "missing"),
        (["trace", "tests.fixtures.user_model:make_tuple_output"], "scalar loss tensor"),
        (["trace", "tests.fixtures.user_model:make_not_module"], "nn.Module"),
        (["trace", "tests.fixtures.user_model:make_raises"], "make_raises"),
        (["trace", "mlp", "--size", "tiny", "--steps", "0"], "--steps must be >= 1"),
        (["plan", "mlp", "--size", "tiny", "--threads", "999", "-o", "/tmp/never-written.json"], "more than the"),
        (["plan", "mlp", "--size", "tiny", "--order", "bogus", "-o", "/tmp/never-written.json"], "unknown order policy"),
    ],
)
def test_bad_input_is_one_clear_error(capsys, argv: list[str], msg: str) -> None:  # type: ignore[no-untyped-def]
    rc, _out, err = _run(capsys, *argv)
    assert rc == 2
    assert msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not Path("/tmp/never-written.json").exists()


@pytest.mark.parametrize("text", ["{", json.dumps({"schema": "schedlab.plan", "version": 1, "order": [0, 0]})])
def test_bad_plan_file_on_trace(capsys, tmp_path: Path, text: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.json"
    p.write_text(text)
    rc, _, err = _run(capsys, "trace", "mlp", "--size", "tiny", "--plan", str(p))
    assert rc == 2 and "Traceback" not in err and ("not valid JSON" in err or "exactly once" in err)


def test_corrupt_trace_file(tmp_path: Path) -> None:
    from schedlab.errors import SchedlabError

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schema": "schedlab.trace", "version": 1, "event_fields": ["op"], "events": []}))
    with pytest.raises(SchedlabError, match="corrupt trace"):
        Trace.load(p)
