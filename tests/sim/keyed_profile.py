"""A Profile that keys its ops (`sim.cost_table.KeyedCostModel`), for tests and benchmarks.

What `Profile.cost_keys` would be: an op's content key (`sim.cost_table.content_keys`,
finer than its `calibrate.signature`) and whether it pays the first-use extra of a bound
Profile, the only other thing a Profile reads of an op. Kept in the tests until the
Profile itself says it; the tests check that it changes no answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from schedlab.calibrate.profile import Profile
from schedlab.graph import Graph
from schedlab.sim.cost_table import content_keys


class KeyedProfile(Profile):
    def cost_keys(self, graph: Graph) -> Sequence[Hashable]:
        first = self.bound[1] if self.bound is not None else frozenset()
        return [(k, id(op) in first) for k, op in zip(content_keys(graph), graph.ops, strict=True)]


def keyed(profile: Profile) -> KeyedProfile:
    """`profile` with cost keys (its binding and slots kept)."""
    return KeyedProfile(**{f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.init})
