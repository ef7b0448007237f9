"""The README's PostgreSQL recipe, followed as written, against a private server.

The slow test starts its own PostgreSQL (Debian's `postgresql` package: initdb and pg_ctl
under /usr/lib/postgresql/*/bin) in a temporary directory, listening on 127.0.0.1 and a
socket in that directory only, creates the user and database the way the README does, and
runs two `schedlab search` processes on one study as two hosts would, one of them killed
with SIGKILL and started again.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schedlab.errors import SchedlabError
from schedlab.search.study import open_storage

USER, PASSWORD, DATABASE = "schedlab", "secret", "schedlab"  # as in the README
# The README's SQL, run by the database's superuser.
SETUP_SQL = (f"CREATE USER {USER} PASSWORD '{PASSWORD}'", f"CREATE DATABASE {DATABASE} OWNER {USER}")


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_recipe_is_the_one_this_file_runs() -> None:
    """The SQL, the driver, the password's way and the URL's shape the slow test uses are the README's."""
    text = README.read_text()
    for step in (
        *SETUP_SQL, 'pip install "psycopg[binary]"', f"export PGPASSWORD={PASSWORD}",
        f"--storage postgresql://{USER}@DBHOST:5432/{DATABASE}",
    ):
        assert step in text, step


def test_a_missing_driver_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails, as when it is not installed
    with pytest.raises(SchedlabError) as e:
        open_storage(f"postgresql://{USER}:{PASSWORD}@127.0.0.1:1/{DATABASE}")
    msg = str(e.value)
    assert 'pip install "psycopg[binary]"' in msg and "'psycopg'" in msg
    assert "\n" not in msg and PASSWORD not in msg  # one line, and the password is not printed


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    with pytest.raises(SchedlabError) as e:
        open_storage(f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{_free_port()}/{DATABASE}?connect_timeout=5")
    assert str(e.value).startswith("cannot open study storage postgresql://schedlab:***@127.0.0.1:")
    assert "\n" not in str(e.value) and PASSWORD not in str(e.value)


# ---- a private PostgreSQL server ---------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_bin() -> Path | None:
    """The newest /usr/lib/postgresql/VERSION/bin that has initdb, pg_ctl and psql."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found = [b for b in found if (b / "pg_ctl").exists() and (b / "psql").exists()]
    return max(found, key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0, default=None)


@dataclass(frozen=True)
class Server:
    port: int
    socket_dir: Path

    def url(self) -> str:
        """The README's URL shape; the password comes from PGPASSWORD, as the README does it."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"


@pytest.fixture
def postgres() -> Iterator[Server]:
    bin_dir = _server_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries not installed (no /usr/lib/postgresql/*/bin/initdb): apt-get install postgresql")
    as_user: list[str] = []
    root = tempfile.mkdtemp(prefix="schedlab-pg-")  # not under pytest's tmp_path: its parents are root's alone
    if os.geteuid() == 0:  # the server refuses to run as root: hand the directory to the postgres user
        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no postgres user to run the server as")
        os.chown(root, pg.pw_uid, pg.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    os.chmod(root, 0o700)
    data, log, port = Path(root) / "data", Path(root) / "server.log", _free_port()

    def run(*cmd: str, timeout_s: float) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=timeout_s)
        assert done.returncode == 0, f"{cmd[0]} failed: {done.stdout[-1000:]} {done.stderr[-1000:]}"

    started = False
    try:
        run(
            str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
            "--auth-host=scram-sha-256", "--no-sync", timeout_s=120,
        )
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        started = True  # from here on a half-started server is stopped too
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start", timeout_s=90)
        for sql in SETUP_SQL:
            run(str(bin_dir / "psql"), "-h", root, "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1",
                "-c", sql, timeout_s=60)
        yield Server(port, Path(root))
    finally:
        if started:
            with contextlib.suppress(Exception):
                subprocess.run(
                    [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
                    capture_output=True, timeout=60,
                )
        shutil.rmtree(root, ignore_errors=True)


# ---- the study, read straight from the server ----------------------------------------------


def _complete_by_worker(server: Server, study: str) -> dict[str, int]:
    """COMPLETE trials of `study` per worker ("host:pid"); {} before the schema exists."""
    import psycopg

    try:
        with psycopg.connect(
            host="127.0.0.1", port=server.port, user=USER, password=PASSWORD, dbname=DATABASE, connect_timeout=10
        ) as con:
            rows = con.execute(
                "SELECT a.value_json, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'worker' "
                "WHERE s.study_name = %s AND t.state = 'COMPLETE' GROUP BY a.value_json",
                (study,),
            ).fetchall()
    except psycopg.errors.UndefinedTable:
        return {}
    return {str(w).strip('"'): int(n) for w, n in rows}


def _states(server: Server, study: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=server.port, user=USER, password=PASSWORD, dbname=DATABASE, connect_timeout=10
    ) as con:
        rows = con.execute(
            "SELECT t.state, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = %s GROUP BY t.state",
            (study,),
        ).fetchall()
    return {str(state): int(n) for state, n in rows}


def _wait(what: str, ok: object, timeout_s: float, procs: tuple[subprocess.Popen[bytes], ...] = ()) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():  # type: ignore[operator]
        for p in procs:
            assert p.poll() is None, f"a search ended while waiting for {what}: {p.stderr.read().decode()[-1000:]}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_two_hosts_on_postgres_complete_exactly_the_asked_trials_after_a_sigkill(
    postgres: Server, tmp_path: Path, profile_path: Path
) -> None:
    n, study = 300, "mlp-postgres"  # host a alone does ~100 while host b starts
    env = {**os.environ, "PGPASSWORD": PASSWORD}  # the README's way: the password stays out of run.json

    def search(host: str) -> list[str]:
        return [
            sys.executable, "-m", "schedlab", "search", "mlp", "--size", "tiny", "--storage", postgres.url(),
            "--study", study, "--trials", str(n), "--no-progress", "--run-dir", str(tmp_path / host),
            "--profile", str(profile_path),
        ]

    def start(host: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(search(host), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    a = start("a")
    b: subprocess.Popen[bytes] | None = None
    try:
        # The README: start one host and let it create the schema and the study, then the others.
        _wait("host a's first trial", lambda: sum(_complete_by_worker(postgres, study).values()) >= 1, 180, (a,))
        b = start("b")
        _wait(
            "host b's first trials",
            lambda: sum(k for w, k in _complete_by_worker(postgres, study).items() if w.endswith(f":{b.pid}")) >= 5,  # type: ignore[union-attr]
            180,
            (a, b),
        )
        b.send_signal(signal.SIGKILL)
        b.wait(timeout=30)
        at_kill = sum(_complete_by_worker(postgres, study).values())
        assert at_kill < n, "the study was complete before host b could be killed mid-run: raise n"
        again = subprocess.run(search("b"), cwd=tmp_path, env=env, capture_output=True, timeout=300)
        assert again.returncode == 0, again.stderr.decode()[-1000:]
        out_a = a.communicate(timeout=300)[1]
        assert a.returncode == 0, out_a.decode()[-1000:]
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    states = _states(postgres, study)
    assert states.get("COMPLETE") == n, states
    assert "RUNNING" not in states, states  # the trial the kill interrupted was failed on restart
    workers = _complete_by_worker(postgres, study)
    assert sum(workers.values()) == n and len(workers) >= 2  # host a, and host b before the kill (and after)
    for host in ("a", "b"):
        assert PASSWORD not in (tmp_path / host / "run.json").read_text()
