"""A pipeline placement file for `schedlab schedule --placement FILE`: which devices each
stage of one micro-batch runs on, which stages it feeds, and what its work costs.

Schema, version 1 (JSON):

    {
      "format": "schedlab-pipeline-placement",
      "version": 1,
      "name": "two-branch",                 (optional)
      "devices": 4,                         (how many devices: 0..devices-1)
      "stages": [                           (index in this list = stage id)
        {"name": "embed",                   (optional)
         "devices": [0, 1, 2, 3],           (runs on all of them at once: a sharded block)
         "next": [1, 2],                    (stages its forward output feeds; [] for the last)
         "f": 1, "b": 2, "w": 1,            (forward, full backward, weight-gradient times;
                                             optional, I = B - W)
         "memory": 1, "w_memory": 0}        (activations held from F until the backward frees
                                             them, and the part of that W holds after I;
                                             optional, default 1 and 0)
      ]
    }

Stages must form a DAG (the forward edges); backward work follows them reversed. A time a
stage leaves out is the command's (--f, --b, --w), so one file serves several cost
settings; a stage that sets "b" but not "w" gets W = B / 2. Unknown keys are refused, so a misspelt key is an error rather than a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.io import read_json
from schedlab.pipeline import PipeShape, Stage

FORMAT = "schedlab-pipeline-placement"
VERSION = 1
_TOP_KEYS = frozenset({"format", "version", "name", "devices", "stages"})
_STAGE_KEYS = frozenset({"name", "devices", "next", "f", "b", "w", "memory", "w_memory"})


@dataclass(frozen=True)
class BlockTimes:
    """Forward, full backward and weight-gradient time of one block; I = B - W."""

    f: float
    b: float
    w: float

    def __post_init__(self) -> None:
        if self.f <= 0 or self.b <= 0:
            raise SchedlabError(f"times must be positive (got F={self.f:g}, B={self.b:g})")
        if not 0 < self.w < self.b:
            raise SchedlabError(
                f"W={self.w:g} must lie strictly between 0 and B={self.b:g}, so that I = B - W is positive"
            )

    @property
    def i(self) -> float:
        return self.b - self.w

    @classmethod
    def from_flags(cls, f: float, b: float | None, w: float | None) -> BlockTimes:
        """--f, --b, --w as given: B defaults to 2F, W to half of B."""
        b_time = 2.0 * f if b is None else b
        return cls(f=f, b=b_time, w=b_time / 2 if w is None else w)


def load_placement(path: str | Path, times: BlockTimes) -> PipeShape:
    """The PipeShape a placement file describes; `times` fill the times a stage leaves out.
    Every malformed part is one SchedlabError naming the file and the stage."""
    p = Path(path)
    data = read_json(p, "placement")
    try:
        return _shape_of(data, times, default_name=p.stem)
    except SchedlabError as e:
        raise SchedlabError(f"placement file {p}: {e}") from None


def _shape_of(data: Any, times: BlockTimes, default_name: str) -> PipeShape:
    if not isinstance(data, dict):
        raise SchedlabError("expected a JSON object with format, version, devices and stages")
    if data.get("format") != FORMAT:
        raise SchedlabError(f'"format" must be "{FORMAT}" (got {data.get("format")!r})')
    if data.get("version") != VERSION:
        raise SchedlabError(f"version {data.get('version')!r} is not one this schedlab reads; write version {VERSION}")
    _no_unknown_keys(data, _TOP_KEYS, "the file")
    n_devices = _count(data.get("devices"), '"devices"')
    stages_data = data.get("stages")
    if not isinstance(stages_data, list) or not stages_data:
        raise SchedlabError('"stages" must be a non-empty list of stage objects')
    stages = tuple(_stage(s, st, times) for s, st in enumerate(stages_data))
    name = data.get("name", default_name)
    if not isinstance(name, str):
        raise SchedlabError(f'"name" must be a string, not {name!r}')
    return PipeShape(stages=stages, n_devices=n_devices, name=name)


def _stage(s: int, data: Any, times: BlockTimes) -> Stage:
    where = f"stage {s}"
    if not isinstance(data, dict):
        raise SchedlabError(f"{where} must be an object with devices and next, not {data!r}")
    _no_unknown_keys(data, _STAGE_KEYS, where)
    if "devices" not in data:
        raise SchedlabError(f'{where} has no "devices" (the list of devices it runs on)')
    devices = _int_list(data["devices"], f'{where} "devices"')
    nxt = _int_list(data.get("next", []), f'{where} "next"')
    f = _number(data.get("f", times.f), f'{where} "f"')
    b = _number(data.get("b", times.b), f'{where} "b"')
    # W: the stage's own; else half the stage's own B; else the command's
    w = _number(data["w"], f'{where} "w"') if "w" in data else (b / 2 if "b" in data else times.w)
    try:
        block = BlockTimes(f=f, b=b, w=w)
    except SchedlabError as e:
        raise SchedlabError(f"{where}: {e}") from None
    memory = _number(data.get("memory", 1.0), f'{where} "memory"', allow_zero=True)
    w_memory = _number(data.get("w_memory", 0.0), f'{where} "w_memory"', allow_zero=True)
    if w_memory > memory:
        raise SchedlabError(f'{where}: "w_memory" {w_memory:g} exceeds "memory" {memory:g} (it is a part of it)')
    name = data.get("name", "")
    if not isinstance(name, str):
        raise SchedlabError(f'{where} "name" must be a string, not {name!r}')
    return Stage(
        devices=tuple(devices),
        next=tuple(nxt),
        f_time=block.f,
        b_time=block.b,
        i_time=block.i,
        w_time=block.w,
        f_mem=memory,
        w_mem=w_memory,
        name=name,
    )


def _no_unknown_keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SchedlabError(f"{where} has unknown key(s) {unknown}; known: {', '.join(sorted(allowed))}")


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedlabError(f"{what} must be a positive whole number, not {value!r}")
    return value


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise SchedlabError(f"{what} must be a list of whole numbers, not {value!r}")
    return value


def _number(value: Any, what: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchedlabError(f"{what} must be a number, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SchedlabError(f"{what} must be {'non-negative' if allow_zero else 'positive'}, not {value!r}")
    return float(value)
