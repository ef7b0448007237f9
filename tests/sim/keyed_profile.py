"""A Profile that does not key its ops, for tests and benchmarks of `Profile.cost_keys`.

`Profile.cost_keys` lets the simulator ask one op per key (`sim.cost_table`); an
`UnkeyedProfile` answers None, so every op is asked, as before keys existed. The tests
check that both give the same answers, and the benchmark how much cheaper keys make a
cold call.
"""

from __future__ import annotations

import dataclasses

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph


class UnkeyedProfile(Profile):
    def cost_keys(self, graph: Graph) -> None:  # type: ignore[override]
        return None


def unkeyed(profile: Profile) -> UnkeyedProfile:
    """`profile` without cost keys (its binding and slots kept)."""
    return UnkeyedProfile(**{f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.init})
