"""Optuna studies on any storage URL: creation before workers, resume, and a trial budget
that several workers (processes or hosts) share without losing or adding trials.

Trial budget. A search asks for N COMPLETE trials of one (strategy, space). Each worker
loops: count the COMPLETE trials of that key and the RUNNING ones of live workers; stop at
N; wait while in-flight trials could reach N; otherwise sample a plan, create its trial
(RUNNING, parameters and attributes in one transaction) and check again with the trial's
own number: trials numbered up to it that are COMPLETE or RUNNING must not exceed N, or
the new trial is surplus (failed at once, ``user_attrs["surplus"]``, never simulated).
Trial numbers grow with creation, so the last of any N + 1 trials to pass the check would
have counted all the others: at most N pass, with any number of workers and hosts. An
infeasible plan (PRUNED or FAIL) frees its place.

Sampling runs on an in-memory mirror of the study's finished trials (`_Mirror`), so a
`suggest` reads no database; a trial costs a few commits instead of one per parameter.

Resume. Only COMPLETE trials count, so a search started again runs the remainder. A trial
left RUNNING by a killed worker is *stale*: its ``user_attrs["worker"]`` names a process
of this host that is gone, or it started more than `STALE_AFTER_S` ago; it is failed and
no longer counted.

Clocks. Optuna writes ``datetime_start`` as the writer's local wall time, without a zone,
so a host east of another would read the other's fresh trials as hours old and fail them.
Each trial therefore also carries its start in UTC (``user_attrs["started_utc"]``, ISO
8601 with +00:00), and every age is computed in UTC. ``datetime_start`` stays local, as
Optuna and its dashboard expect (durations are taken against its local
``datetime_complete``).

SQLite: the schema and the study are created by one process before any worker starts
(fresh processes racing to create a schema is a known failure), and every connection
waits up to `SQLITE_BUSY_TIMEOUT_S` for a lock instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from schedlab.errors import SchedlabError
from schedlab.plan import Plan
from schedlab.search.objective import Evaluation, Evaluator
from schedlab.search.space import Space

SQLITE_BUSY_TIMEOUT_S = 120.0
STARTED_ATTR = "started_utc"  # user attribute: when the trial was reserved, ISO 8601 in UTC
STALE_AFTER_S = 600.0  # a trial RUNNING this long is a dead worker's (one trial is a simulation)
POLL_S = 0.05  # how often a worker waiting on in-flight trials looks again
DIRECTIONS = {"time": StudyDirection.MINIMIZE, "memory": StudyDirection.MINIMIZE}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# The pip package of each database driver SQLAlchemy may ask for, by the dialect's driver
# name (a plain postgresql:// URL means psycopg 3 under SQLAlchemy 2.x).
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "pymysql": "PyMySQL",
    "mysqldb": "mysqlclient",
    "mysqlconnector": "mysql-connector-python",
    "mariadbconnector": "mariadb",
    "oracledb": "oracledb",
    "cx_oracle": "cx_Oracle",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}


def shown_url(url: str) -> str:
    """`url` as messages print it: the password, if any, replaced by ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: the error will say so
        return url


def _missing_driver(url: str, e: ImportError) -> SchedlabError:
    """One line naming the driver SQLAlchemy could not import and the package that provides it."""
    from sqlalchemy.engine import make_url

    cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e
    try:
        driver = str(make_url(url).get_dialect().driver)
    except Exception:
        driver = (cause.name or "").split(".")[0]
    package = DRIVER_PACKAGES.get(driver, driver)
    how = f'pip install "{package}"' if package else "install the database driver for it"
    return SchedlabError(
        f"storage {shown_url(url)} needs the database driver {driver!r}, which cannot be imported ({cause}): {how}"
    )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url` (SQLite gets a busy timeout); one SchedlabError if it fails."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except ImportError as e:
        raise _missing_driver(url, e) from None
    except Exception as e:  # sqlalchemy and driver errors: bad URL, unreachable server, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SchedlabError(f"cannot open study storage {shown_url(url)}: {first}") from None
    if url.startswith("sqlite"):
        _tune_sqlite(storage)
    return storage


def _tune_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """Write-ahead log, and no fsync at every commit (a search commits ~20 times a trial).

    In WAL mode with synchronous=NORMAL a crashed or killed process loses nothing that was
    committed; only a power cut may lose the last commits. Readers no longer block writers.
    """
    from sqlalchemy import event

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # pooled connections opened before the listener get it too


def make_sampler(objectives: Sequence[str], seed: int | None) -> optuna.samplers.BaseSampler:
    """TPE for step time alone; NSGA-II for step time and peak memory together."""
    if len(objectives) > 1:
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def create_study(storage: optuna.storages.BaseStorage, name: str, objectives: Sequence[str]) -> optuna.Study:
    """Create the study (or load it if it exists with the same objectives)."""
    directions = [DIRECTIONS[o] for o in objectives]
    try:
        study = optuna.create_study(storage=storage, study_name=name, directions=directions, load_if_exists=True)
    except optuna.exceptions.DuplicatedStudyError:  # created by another host in between
        study = optuna.load_study(storage=storage, study_name=name)
    if list(study.directions) != directions:
        have = [d.name.lower() for d in study.directions]
        raise SchedlabError(
            f"study {name!r} exists with {len(have)} objective(s) ({', '.join(have)}); this search has "
            f"{len(directions)} ({', '.join(objectives)}): use another --study or --run-dir"
        )
    return study


def load_study(storage: optuna.storages.BaseStorage, name: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    try:
        return optuna.load_study(storage=storage, study_name=name, sampler=sampler)
    except KeyError:
        raise SchedlabError(f"no study named {name!r} in the storage") from None


# ---- which trials count -----------------------------------------------------------------


def _matches(t: FrozenTrial, strategy: str, space: str) -> bool:
    return bool(t.user_attrs.get("strategy") == strategy and t.user_attrs.get("space") == space)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def started_utc(t: FrozenTrial) -> datetime.datetime | None:
    """When `t` started, as an aware UTC time (see "Clocks" in the module docstring).

    A trial without the UTC stamp (recorded by an older schedlab) falls back to Optuna's
    naive local ``datetime_start`` read in this host's zone, which is right for trials
    of this host.
    """
    stamp = t.user_attrs.get(STARTED_ATTR)
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return datetime.datetime.fromisoformat(stamp).astimezone(datetime.UTC)
    if t.datetime_start is not None:
        return t.datetime_start.astimezone(datetime.UTC)
    return None


def is_stale(t: FrozenTrial, now_utc: datetime.datetime | None = None) -> bool:
    """A RUNNING trial whose worker is gone (see the module docstring); `now_utc` is aware."""
    if t.state is not TrialState.RUNNING:
        return False
    host, _, pid = str(t.user_attrs.get("worker", "")).rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
        return True
    started = started_utc(t)
    if started is not None:
        return ((now_utc or utc_now()) - started).total_seconds() > STALE_AFTER_S
    return False


def fail_stale_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int:
    """Mark stale RUNNING trials FAIL; returns how many."""
    study_id = storage.get_study_id_from_name(study.study_name)
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if is_stale(t):
            try:
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
                n += 1
            except Exception:  # finished meanwhile, or another process got there first
                pass
    return n


@dataclass(frozen=True)
class Counts:
    complete: int  # COMPLETE trials of the key
    in_flight: tuple[int, ...]  # numbers of the key's RUNNING trials whose workers are alive


def count_of(trials: Sequence[FrozenTrial], strategy: str, space: str) -> Counts:
    complete = sum(1 for t in trials if t.state is TrialState.COMPLETE and _matches(t, strategy, space))
    now = utc_now()
    in_flight = tuple(
        t.number
        for t in trials
        if t.state is TrialState.RUNNING
        and _matches(t, strategy, space)
        and not t.user_attrs.get("surplus")
        and not is_stale(t, now)
    )
    return Counts(complete, in_flight)


def completed_trials(study: optuna.Study, strategy: str, space: str) -> int:
    return count_of(study.get_trials(deepcopy=False), strategy, space).complete


# ---- recording an evaluation --------------------------------------------------------------


def evaluation_attrs(ev: Evaluation, strategy: str, space: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "strategy": strategy,
        "space": space,
        "plan": ev.plan.to_json(),
        "peak_memory_bytes": ev.peak_memory_bytes,
    }
    if ev.error is not None:
        attrs["fail_reason"] = ev.error
        if ev.step_time_s != float("inf"):
            attrs["predicted_step_time_s"] = ev.step_time_s
    return attrs


def plan_hash(t: FrozenTrial) -> str:
    """The hash of a trial's plan ("" for a trial without one)."""
    plan = t.user_attrs.get("plan")
    if not isinstance(plan, dict):
        return ""
    try:
        return Plan.from_json(plan).hash
    except SchedlabError:
        return ""


def _state_of(ev: Evaluation) -> TrialState:
    if ev.ok:
        return TrialState.COMPLETE
    return TrialState.PRUNED if ev.oom else TrialState.FAIL


# ---- the Optuna worker loop ---------------------------------------------------------------


class _Mirror:
    """An in-memory study that mirrors the shared study's finished trials of one key.

    The sampler works on it: sampling then reads no database, and a trial's parameters
    reach the shared storage in a few writes at the end instead of a read-modify-write
    per `suggest`.
    """

    def __init__(self, objectives: Sequence[str], sampler: optuna.samplers.BaseSampler) -> None:
        self.study = optuna.create_study(directions=[DIRECTIONS[o] for o in objectives], sampler=sampler)
        self.synced: set[int] = set()  # numbers of the shared trials already in the mirror

    def sync(self, trials: Sequence[FrozenTrial], strategy: str, space: str) -> None:
        for t in trials:
            if t.number in self.synced or not t.state.is_finished() or not _matches(t, strategy, space):
                continue
            self.synced.add(t.number)
            if t.state is TrialState.FAIL or not t.params:
                continue  # nothing for a sampler to learn
            self.study.add_trial(
                optuna.trial.create_trial(
                    state=t.state,
                    values=t.values if t.state is TrialState.COMPLETE else None,
                    params=t.params,
                    distributions=t.distributions,
                    system_attrs=t.system_attrs,
                )
            )


def _reservation(params: dict[str, Any], distributions: dict[str, Any], attrs: dict[str, Any]) -> FrozenTrial:
    """A RUNNING trial with its parameters and attributes, created in one transaction.

    It starts now: in Optuna's local wall time, and in UTC as `STARTED_ATTR`."""
    now = utc_now()
    return FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=now.astimezone().replace(tzinfo=None),
        datetime_complete=None,
        params=params,
        distributions=distributions,
        user_attrs={**attrs, STARTED_ATTR: now.isoformat()},
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )


def optimize(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    space: Space,
    evaluator: Evaluator,
    objectives: Sequence[str],
    target: int,
    *,
    sampler: optuna.samplers.BaseSampler | None = None,
    strategy: str = "optuna",
    on_trial: Callable[[int], None] | None = None,
    max_attempts: int | None = None,
) -> int:
    """Run trials until `target` COMPLETE trials of (strategy, space.name) exist in `study`.

    `study` is the shared study (reads go through its trial cache) and `storage` its
    storage (writes). Safe to run in several processes or hosts on one study at once.
    Returns how many trials this call completed; `on_trial(complete_count)` is called
    after each finished trial. `max_attempts` (default 3 * target + 20) bounds the trials
    this call starts, so a space whose plans all fail cannot loop forever.
    """
    objectives = tuple(objectives)
    study_id = storage.get_study_id_from_name(study.study_name)
    mirror = _Mirror(objectives, sampler or make_sampler(objectives, None))
    me = worker_id()
    limit = max_attempts if max_attempts is not None else 3 * target + 20
    attempts = done_here = 0
    room = 0  # free places seen at the last check; look again before asking when few are left
    in_flight = 0
    trials: Sequence[FrozenTrial] = ()
    while attempts < limit:
        if room <= in_flight + 1:
            trials = study.get_trials(deepcopy=False)
            counts = count_of(trials, strategy, space.name)
            if counts.complete >= target:
                break
            if counts.complete + len(counts.in_flight) >= target:
                time.sleep(POLL_S)  # in-flight trials may finish the budget; if one fails, go on
                continue
        mirror.sync(trials, strategy, space.name)
        local = mirror.study.ask()
        plan = dataclasses.replace(space.suggest(local), name=strategy)
        params = dict(local.params)
        attrs = {"strategy": strategy, "space": space.name, "worker": me, "plan": plan.to_json()}
        trial_id = storage.create_new_trial(study_id, template_trial=_reservation(params, local.distributions, attrs))
        number = storage.get_trial_number_from_id(trial_id)
        mirror.synced.add(number)
        trials = study.get_trials(deepcopy=False)
        counts = count_of(trials, strategy, space.name)
        ahead = sum(1 for n in counts.in_flight if n <= number)
        if counts.complete + ahead > target:  # surplus: another worker took the last place
            storage.set_trial_user_attr(trial_id, "surplus", True)
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            mirror.study.tell(local, state=TrialState.FAIL)
            room = 0
            continue
        room = target - counts.complete - len(counts.in_flight)
        in_flight = len(counts.in_flight)
        attempts += 1
        try:
            ev = evaluator.evaluate(plan)
            state = _state_of(ev)
            values = ev.values(objectives) if state is TrialState.COMPLETE else None
            mirror.study.tell(local, values, state=state)
            for key, value in evaluation_attrs(ev, strategy, space.name).items():
                if key not in attrs:
                    storage.set_trial_user_attr(trial_id, key, value)
            storage.set_trial_state_values(trial_id, state, values)
        except BaseException:
            with contextlib.suppress(Exception):
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
            raise
        if values is not None:
            done_here += 1
        if on_trial is not None:
            on_trial(counts.complete + (1 if values is not None else 0))
    return done_here


# ---- seed strategies: a fixed list of plans ----------------------------------------------


def record_plans(
    study: optuna.Study,
    plans: Sequence[Plan],
    evaluator: Evaluator,
    objectives: Sequence[str],
    strategy: str,
    space: str,
    *,
    on_trial: Callable[[int], None] | None = None,
) -> int:
    """Simulate `plans` and add each as a finished trial, skipping plans already recorded
    for this (strategy, space) (a resumed run). Returns how many were added."""
    seen = {
        plan_hash(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished() and _matches(t, strategy, space)
    }
    added = 0
    objectives = tuple(objectives)
    for plan in plans:
        if plan.hash in seen:
            continue
        ev = evaluator.evaluate(plan)
        state = _state_of(ev)
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                values=ev.values(objectives) if state is TrialState.COMPLETE else None,
                user_attrs={**evaluation_attrs(ev, strategy, space), "name": plan.name},
            )
        )
        seen.add(plan.hash)
        added += 1
        if on_trial is not None:
            on_trial(added)
    return added
