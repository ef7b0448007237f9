"""`schedlab schedule` end to end in-process: the JSON contract and the closed forms it
must meet, a torch CSV round trip, Tessel's search, placement files, the Gantt picture,
and errors that are one line with exit status 2 and leave no file behind."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from schedlab.cli import main
from schedlab.cli.pipeline_placement import FORMAT, VERSION

JSON_KEYS = {"makespan", "bubble_fraction", "peak_memory", "steady_state_per_microbatch", "steady_state_method"}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["schedule", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_1f1b_json_meets_the_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(
        capsys, "--placement", "vshape", "--devices", "4", "--micro-batches", "8", "--schedule", "1f1b",
        "--f", "1", "--b", "1",
    )  # fmt: skip
    assert set(d) >= JSON_KEYS
    assert d["makespan"] == 22  # 2M + 2(P - 1)
    assert Fraction(d["bubble_fraction"]).limit_denominator(100) == Fraction(3, 11)
    assert d["peak_memory"] == [4, 3, 2, 1]  # 1F1B holds P - d micro-batches on device d
    assert d["steady_state_per_microbatch"] == 2 and d["steady_state_method"] == "marginal"
    assert d["steady_state_step"] == 1
    assert (d["devices"], d["stages"], d["micro_batches"]) == (4, 4, 8)
    assert d["schedule"].splitlines()[3] == "3: " + " ".join(f"3F{m} 3B{m}" for m in range(8))


def test_interleaved_gets_its_looped_chain_and_steps_in_whole_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "interleaved:2", "--f", "1", "--b", "1")
    assert d["stages"] == 8  # 2P on the loop map
    assert d["bubble_fraction"] == pytest.approx(3 / 19)  # (P-1)/(MV+P-1), DESIGN.md: 15.79%
    # M + 1 .. M + 3 do not split into rounds of P; 10 does (M // P rounds of P, the rest in the last)
    assert d["steady_state_step"] == 2 and d["steady_state_per_microbatch"] == pytest.approx(2)


def test_text_output_has_the_summary_and_one_gantt_row_per_device(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "1f1b", "--b", "1", "--width", "80"
    )
    assert rc == 0
    assert "makespan                      22" in out and "27.27% (3/11)" in out
    rows = [line for line in out.splitlines() if line.startswith("d")]
    assert rows[3] == "d3 |......" + "".join(f"F{m}B{m}" for m in range(8)) + "......|"
    assert len(rows) == 4 and all(len(r) <= 80 for r in rows)


def test_torch_csv_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "zb.csv"
    made = _json(capsys, "--devices", "4", "--micro-batches", "6", "--schedule", "zb-h1", "--out", str(csv))
    assert csv.read_text().splitlines()[0].startswith("0F0,0F1,0F2,0F3,")
    back = _json(capsys, "--schedule", str(csv))
    assert back["schedule"] == made["schedule"] and back["source"] == "csv"
    assert back["makespan"] == made["makespan"] and back["peak_memory"] == made["peak_memory"]
    assert back["steady_state_method"] == "completion_spacing" and back["steady_state_step"] is None
    assert (back["devices"], back["micro_batches"]) == (4, 6)  # from the rows and the actions


def test_torch_class_matches_the_generator(capsys: pytest.CaptureFixture[str]) -> None:
    ours = _json(capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "1f1b", "--b", "1")
    torch = _json(capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "torch:1F1B", "--b", "1")
    assert torch["schedule"] == ours["schedule"] and torch["makespan"] == 22
    assert torch["source"] == "torch" and torch["comm_dropped"] > 0  # REDUCE_GRAD, dropped


def test_tessel_search_reports_its_repetend(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "--placement", "xshape", "--devices", "2", "--micro-batches", "6", "--schedule", "tessel")
    assert d["source"] == "tessel"
    assert d["lower_bound"] == 6  # 2 (F + B) per device
    assert d["repetend_time"] >= d["lower_bound"] and d["search_s"] >= 0 and d["solver"] == "highs"
    assert d["steady_state_method"] == "marginal" and d["steady_state_step"] == 1
    assert d["steady_state_per_microbatch"] == pytest.approx(d["repetend_time"])


def test_memory_limit_is_a_constraint_of_the_tessel_search(capsys: pytest.CaptureFixture[str]) -> None:
    free = _json(capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "tessel")
    limit = max(free["peak_memory"]) - 1
    tight = _json(capsys, "--devices", "4", "--micro-batches", "8", "--schedule", "tessel", "--memory", str(limit))
    assert max(tight["peak_memory"]) <= limit and tight["memory_limit"] == limit


def _placement(tmp_path: Path, stages: list[dict[str, Any]], devices: int = 2, **top: Any) -> Path:
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "devices": devices, "stages": stages, **top}))
    return path


def test_placement_file_chain_runs_a_generator_with_its_own_times(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _placement(
        tmp_path, [{"devices": [0], "next": [1], "f": 2, "b": 4}, {"devices": [1], "f": 2, "b": 4}]
    )  # fmt: skip
    d = _json(capsys, "--placement", str(path), "--micro-batches", "4", "--schedule", "1f1b")
    assert d["makespan"] == (4 + 2 - 1) * (2 + 4)  # 1F1B: (M + P - 1)(F + B), the file's F = 2, B = 4


def test_placement_file_with_a_sharded_block_is_searched(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _placement(
        tmp_path,
        [{"name": "embed", "devices": [0, 1], "next": [1]}, {"devices": [0], "next": [2]}, {"devices": [1]}],
    )
    d = _json(capsys, "--placement", str(path), "--micro-batches", "4", "--schedule", "tessel", "--solver", "fast")
    assert d["devices"] == 2 and d["stages"] == 3 and d["shape"] == "placement"
    assert d["lower_bound"] == 6  # each device: the sharded block's F + B and one stage's F + B


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedule", "2f2b", "--devices", "4", "--micro-batches", "4"], "unknown schedule '2f2b'"),
        (
            ["--schedule", "1f1b", "--placement", "wshape", "--devices", "4", "--micro-batches", "4"],
            "unknown placement",
        ),
        (
            ["--schedule", "1f1b", "--placement", "mshape", "--devices", "4", "--micro-batches", "4"],
            "--schedule tessel",
        ),
        (["--schedule", "1f1b", "--devices", "4"], "needs --micro-batches"),
        (["--schedule", "gpipe", "--devices", "4", "--micro-batches", "8", "--memory", "4"], "over the memory limit 4"),
        (["--schedule", "1f1b", "--devices", "4", "--micro-batches", "8", "--w", "3"], "I = B - W"),
        (["--schedule", "tessel", "--placement", "kshape", "--devices", "3", "--micro-batches", "4"], "even number"),
    ],
)
def test_errors_are_one_line_and_write_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    out, png = tmp_path / "s.csv", tmp_path / "s.png"
    rc, stdout, err = _run(capsys, *argv, "--out", str(out), "--gantt", str(png))
    assert rc == 2 and stdout == ""
    assert err.startswith("schedlab schedule: error: ") and err.count("\n") == 1
    assert message in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("0B0,0F0\n", "deadlocks"),  # device 0 runs the backward before the forward it needs
        ("0F0,0X0\n", "row 0 (rank 0), cell 1"),
        ("0F0,1F0,1B0,0B0\n1F0\n", "stage 1 spans devices (0, 1), but device 1 does not run 1B0"),
        ("0F0,0F1,0B0\n", "missing 0B1"),
    ],
)
def test_a_bad_csv_is_one_error_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rows: str, message: str
) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text(rows)
    rc, _, err = _run(capsys, "--schedule", str(csv))
    assert rc == 2 and err.count("\n") == 1
    assert message in err, err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not valid JSON"),
        (json.dumps({"format": FORMAT, "version": 9, "devices": 2, "stages": []}), "version 9"),
        (json.dumps({"format": FORMAT, "version": VERSION, "devices": 2, "stages": [{"devices": [2]}]}), "device 2"),
        (json.dumps({"format": FORMAT, "version": VERSION, "devices": 1, "stages": [{"devces": [0]}]}), "'devces'"),
        (
            json.dumps({"format": FORMAT, "version": VERSION, "devices": 1, "stages": [{"devices": [0], "f": "1"}]}),
            'stage 0 "f" must be a number',
        ),
    ],
)
def test_a_malformed_placement_file_names_itself(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    rc, _, err = _run(capsys, "--placement", str(path), "--micro-batches", "2", "--schedule", "tessel")
    assert rc == 2 and str(path) in err and message in err, err


def test_gantt_png_is_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "fig" / "zbv.png"
    d = _json(capsys, "--devices", "2", "--micro-batches", "4", "--schedule", "zbv", "--gantt", str(png))
    assert d["gantt"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in png.parent.iterdir()] == ["zbv.png"]  # no temp file left


def test_gantt_refuses_other_formats_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = _run(
        capsys, "--devices", "2", "--micro-batches", "4", "--schedule", "1f1b", "--out", str(tmp_path / "a.csv"),
        "--gantt", str(tmp_path / "a.jpg"),
    )  # fmt: skip
    assert rc == 2 and "give a .png or .pdf file" in err
    assert list(tmp_path.iterdir()) == []


def test_out_refuses_a_schedule_torch_cannot_hold(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    rc, _, err = _run(
        capsys, "--placement", "mshape", "--devices", "2", "--micro-batches", "2", "--schedule", "tessel",
        "--solver", "fast", "--out", str(csv),
    )  # fmt: skip
    assert rc == 2 and "torch's CSV" in err and "runs on devices (0, 1)" in err
    assert not csv.exists()
