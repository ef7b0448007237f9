"""Stale trials are judged in UTC: neither another host's time zone nor a daylight-saving jump
makes a live trial look old enough to be failed."""

from __future__ import annotations

import datetime
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

import schedlab.search.study as study_mod
from schedlab.plan import Plan
from schedlab.search.objective import Evaluation, Evaluator
from schedlab.search.space import SearchSpace
from schedlab.search.study import (
    STALE_AFTER_S,
    STARTED_ATTR,
    count_of,
    create_study,
    fail_stale_trials,
    is_stale,
    load_study,
    make_sampler,
    open_storage,
    optimize,
    started_utc,
    utc_now,
)
from schedlab.sim.testing import cpu_machine, random_cost
from tests.conftest import captured_workload

# POSIX zone strings (no tzdata needed): 12 hours west of UTC, 12 hours east, and US Eastern
# with its daylight-saving rule (clocks jump from 02:00 EST to 03:00 EDT on 2026-03-08).
WEST, EAST, EASTERN = "WWW+12", "EEE-12", "EST5EDT,M3.2.0,M11.1.0"
SPRING_FORWARD = datetime.datetime(2026, 3, 8, 7, 0, tzinfo=datetime.UTC)

SetZone = Callable[[str], None]


@pytest.fixture
def set_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[SetZone]:
    """Moves this process's local time zone; the zone is restored afterwards."""

    def move(zone: str) -> None:
        monkeypatch.setenv("TZ", zone)
        time.tzset()

    yield move
    monkeypatch.undo()
    time.tzset()


class _Clock(datetime.datetime):
    """`datetime.datetime` whose now() is `instant` (aware UTC), given in the zone asked for."""

    instant = SPRING_FORWARD

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _Clock:  # type: ignore[override]
        t = cls.instant.astimezone(tz) if tz is not None else cls.instant.astimezone().replace(tzinfo=None)
        return cls.fromisoformat(t.isoformat())


class _CheckDuringFirstTrial:
    """Evaluates plans like `Evaluator`; during the first one, while its trial is RUNNING in
    the shared storage, it runs `check` (another host, or the same one later, looking for
    stale trials)."""

    def __init__(self, inner: Evaluator, check: Callable[[], None]) -> None:
        self.inner, self.check, self.checked = inner, check, False

    def evaluate(self, plan: Plan) -> Evaluation:
        if not self.checked:
            self.checked = True
            self.check()
        return self.inner.evaluate(plan)


def _search_with_a_check(tmp_path: Path, check: Callable[[str], tuple[int, tuple[int, ...]]]) -> tuple[int, tuple[int, ...]]:
    """Three trials on a fresh SQLite study; `check(url)` runs during the first and returns
    (trials it failed as stale, trial numbers it counted in flight)."""
    graph = captured_workload("mlp")[1].graph  # type: ignore[attr-defined]
    machine, cost = cpu_machine(2), random_cost(0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    create_study(storage, "s", ("time",))
    seen: list[tuple[int, tuple[int, ...]]] = []
    evaluator = _CheckDuringFirstTrial(Evaluator(graph, machine, cost), lambda: seen.append(check(url)))
    study = load_study(storage, "s", make_sampler(("time",), 0))
    space = SearchSpace("all", graph, machine, cost)
    assert optimize(study, storage, space, evaluator, ("time",), 3) == 3  # type: ignore[arg-type]
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.COMPLETE] * 3
    return seen[0]


def _look_for_stale(url: str) -> tuple[int, tuple[int, ...]]:
    storage = open_storage(url)
    study = load_study(storage, "s", make_sampler(("time",), 0))
    in_flight = count_of(study.get_trials(deepcopy=False), "optuna", "all").in_flight
    return fail_stale_trials(study, storage), in_flight


def test_a_daylight_saving_jump_does_not_age_a_live_trial(
    tmp_path: Path, set_zone: SetZone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial started 2 minutes before clocks spring forward is 5 minutes old 3 minutes after,
    though local wall time says 65: it is live."""
    set_zone(EASTERN)
    clock = types.SimpleNamespace(datetime=_Clock, UTC=datetime.UTC)
    monkeypatch.setattr(study_mod, "datetime", clock)
    monkeypatch.setattr(_Clock, "instant", SPRING_FORWARD - datetime.timedelta(minutes=2))

    def later(url: str) -> tuple[int, tuple[int, ...]]:
        monkeypatch.setattr(_Clock, "instant", SPRING_FORWARD + datetime.timedelta(minutes=3))
        return _look_for_stale(url)

    assert _search_with_a_check(tmp_path, later) == (0, (0,))  # nothing failed; trial 0 counted as live


def test_a_live_trial_of_a_host_west_of_utc_is_not_stale_for_a_host_east_of_it(tmp_path: Path, set_zone: SetZone) -> None:
    set_zone(WEST)

    def from_the_east(url: str) -> tuple[int, tuple[int, ...]]:
        set_zone(EAST)  # 24 hours ahead on the wall clock
        try:
            return _look_for_stale(url)
        finally:
            set_zone(WEST)

    assert _search_with_a_check(tmp_path, from_the_east) == (0, (0,))
    t = load_study(open_storage(f"sqlite:///{tmp_path / 'study.db'}"), "s", make_sampler(("time",), 0)).trials[0]
    stamp = datetime.datetime.fromisoformat(t.user_attrs[STARTED_ATTR])
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert t.datetime_start is not None  # Optuna's own field stays naive local time, 12 hours behind UTC here
    assert abs((stamp.replace(tzinfo=None) - t.datetime_start).total_seconds() - 12 * 3600) < 60


def test_age_is_measured_from_the_utc_stamp_in_any_zone(tmp_path: Path, set_zone: SetZone) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    study = create_study(storage, "s", ("time",))
    now = utc_now()
    for age_s in (STALE_AFTER_S - 30, STALE_AFTER_S + 30):
        trial = study.ask()
        trial.set_user_attr("worker", "another-host:1")  # not a process of this host: only its age can tell
        trial.set_user_attr(STARTED_ATTR, (now - datetime.timedelta(seconds=age_s)).isoformat())
    young, old = study.get_trials(deepcopy=False)
    for zone in (WEST, EAST):
        set_zone(zone)
        assert not is_stale(young) and is_stale(old)
    assert fail_stale_trials(study, storage) == 1
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.RUNNING, TrialState.FAIL]


def test_a_trial_without_the_stamp_falls_back_to_optunas_local_start(tmp_path: Path, set_zone: SetZone) -> None:
    set_zone(EAST)
    study = create_study(open_storage(f"sqlite:///{tmp_path / 'study.db'}"), "s", ("time",))
    study.ask()  # an Optuna trial, as an older schedlab recorded them: no UTC stamp
    start = started_utc(study.get_trials(deepcopy=False)[0])
    assert start is not None and start.utcoffset() == datetime.timedelta(0)
    assert abs((utc_now() - start).total_seconds()) < 60
