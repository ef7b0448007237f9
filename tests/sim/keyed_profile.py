"""Profiles that do not key their ops or answer in columns, for tests and benchmarks of
`Profile.cost_keys` and `Profile.kernel_column`.

`Profile.cost_keys` lets the simulator ask one op per key (`sim.cost_table`); an
`UnkeyedProfile` answers None, so every op is asked, as before keys existed. The tests
check that both give the same answers, and the benchmark how much cheaper keys make a
cold call. A `ColumnlessProfile` keys its ops but is asked one op at a time, as before a
Profile answered whole columns (`calibrate.profile_columns`); a `BareProfile` is asked for
every op, one at a time, as before either.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph


class UnkeyedProfile(Profile):
    def cost_keys(self, graph: Graph) -> None:  # type: ignore[override]
        return None


def unkeyed(profile: Profile) -> UnkeyedProfile:
    """`profile` without cost keys (its binding and slots kept)."""
    return _as(UnkeyedProfile, profile)


class ColumnlessProfile(Profile):
    """A Profile that keys its ops but answers one op at a time: no columns."""

    kernel_column = dispatch_column = corun_slowdown_column = wake_column = None  # type: ignore[assignment]


def columnless(profile: Profile) -> ColumnlessProfile:
    """`profile` keyed but without columns (its binding and slots kept)."""
    return _as(ColumnlessProfile, profile)


class BareProfile(UnkeyedProfile):
    """A Profile asked for every op, one op at a time: neither keys nor columns."""

    kernel_column = dispatch_column = corun_slowdown_column = wake_column = None  # type: ignore[assignment]


def bare(profile: Profile) -> BareProfile:
    """`profile` without cost keys or columns (its binding and slots kept)."""
    return _as(BareProfile, profile)


P = TypeVar("P", bound=Profile)


def _as(cls: type[P], profile: Profile) -> P:
    """`profile`'s fields (its binding and slots among them) in a `cls`."""
    return cls(**{f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.init})
