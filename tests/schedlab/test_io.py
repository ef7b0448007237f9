"""Atomic writes: a reader sees the old file or the new one, never half of one; nothing is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedlab.io import atomic_file, write_json_atomic, write_text_atomic


def test_writers_replace_the_file_and_leave_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "a.json"
    write_json_atomic(p, {"x": 1})
    write_json_atomic(p, {"x": 2}, indent=1)
    assert json.loads(p.read_text()) == {"x": 2}
    write_text_atomic(tmp_path / "b.txt", "hello\n")
    with atomic_file(tmp_path / "c.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "b.txt").read_text() == "hello\n" and (tmp_path / "c.bin").read_bytes() == b"\x00\x01"
    assert sorted(q.name for q in tmp_path.rglob("*")) == ["a.json", "b.txt", "c.bin", "sub"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    p = write_text_atomic(tmp_path / "a.txt", "old")
    with pytest.raises(RuntimeError), atomic_file(p) as f:
        f.write("half of the new")
        raise RuntimeError("disk full")
    with pytest.raises(TypeError):
        write_json_atomic(p, {"not serialisable": object()})
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["a.txt"]
    with pytest.raises(ValueError, match="mode"), atomic_file(p, "a"):
        pass


def test_a_write_the_file_system_refuses_is_one_clear_error(tmp_path: Path) -> None:
    from schedlab.errors import SchedlabError
    from schedlab.io import check_writable

    blocker = write_text_atomic(tmp_path / "file", "x")
    for bad in (tmp_path, blocker / "a.json"):  # a folder; a path under a file
        with pytest.raises(SchedlabError, match="cannot write"):
            write_json_atomic(bad, {"x": 1})
        with pytest.raises(SchedlabError, match="cannot write"):
            check_writable(bad)
    check_writable(tmp_path / "new" / "deeper" / "a.json")  # writable: the probe leaves nothing
    assert [q.name for q in tmp_path.iterdir()] == ["file"] and blocker.read_text() == "x"


def test_swap_dir_replaces_a_folder_and_puts_it_back_on_failure(tmp_path: Path) -> None:
    from schedlab.io import staging_dir, swap_dir

    final = tmp_path / "report"
    with staging_dir(final) as staged:  # first time: nothing to move aside
        (staged / "a.txt").write_text("1")
        swap_dir(staged, final)
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and (final / "a.txt").read_text() == "1"

    def fail() -> None:
        raise OSError("results.json not written")

    with pytest.raises(OSError), staging_dir(final) as staged:
        (staged / "b.txt").write_text("2")
        swap_dir(staged, final, then=fail)  # the file that goes with the folder failed: roll back
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and [p.name for p in final.iterdir()] == ["a.txt"]

    with pytest.raises(KeyboardInterrupt), staging_dir(final) as staged:
        (staged / "c.txt").write_text("3")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and [p.name for p in final.iterdir()] == ["a.txt"]

    written: list[str] = []
    with staging_dir(final) as staged:
        (staged / "d.txt").write_text("4")
        swap_dir(staged, final, then=lambda: written.append(sorted(p.name for p in final.iterdir())[0]))
    assert written == ["d.txt"]  # `then` runs with the new folder in place
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and [p.name for p in final.iterdir()] == ["d.txt"]


def test_json_number_reads_finite_numbers_and_names_what_is_wrong() -> None:
    from schedlab.io import json_number

    assert json_number(3, "x") == 3.0 and json_number("-2.5", "x") == -2.5
    assert json_number(0, "x", minimum=0.0) == 0.0
    for bad, minimum, says in ((float("inf"), None, "x must be a finite number,"), ("nan", None, "finite"),
                               (-1, 0.0, "x must be a finite number >= 0")):
        with pytest.raises(ValueError, match=says):
            json_number(bad, "x", minimum=minimum)
    with pytest.raises(ValueError):
        json_number("many", "x")
