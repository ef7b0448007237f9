"""Schedule generators by name: `generate("1f1b", shape, 8)` returns that schedule's data
for a chain-shaped pipeline, and `default_shape("zbv", 4)` builds the chain each one
needs (stage count and stage map), so schedules compare on the same model.

Names: gpipe, 1f1b, interleaved:V (V stages per device), looped-bfs, zb-h1, zb-h2, zbv,
ooo. The generators live in gen_classic (full backward), gen_zero_bubble and gen_ooo
(backward split into I and W); gen_list holds the list scheduler ZB-V and ooo share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schedlab.errors import SchedlabError
from schedlab.pipeline.gen_classic import gpipe, interleaved_1f1b, looped_bfs, one_f_one_b
from schedlab.pipeline.gen_layout import chain_layout
from schedlab.pipeline.gen_ooo import ooo
from schedlab.pipeline.gen_zero_bubble import zb_h1, zb_h2, zbv
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape, chain

Generator = Callable[[PipeShape, int], Schedule]


@dataclass(frozen=True)
class ScheduleKind:
    """A registered schedule: its generator, the stage map it needs, and its stages per
    device (`fixed`, or else `default` unless the caller chooses; interleaved takes V
    from its name)."""

    generate: Generator
    stage_map: str
    split_backward: bool
    summary: str
    fixed_stages_per_device: int | None = None
    default_stages_per_device: int = 1
    min_stages_per_device: int = 1


SCHEDULES: dict[str, ScheduleKind] = {
    "gpipe": ScheduleKind(gpipe, "loop", False, "all forwards, then all backwards", fixed_stages_per_device=1),
    "1f1b": ScheduleKind(
        one_f_one_b, "loop", False, "warm-up, one forward one backward, cool-down", fixed_stages_per_device=1
    ),
    "interleaved": ScheduleKind(
        interleaved_1f1b, "loop", False, "1F1B over V looped stages per device (name it interleaved:V)"
    ),
    "looped-bfs": ScheduleKind(
        looped_bfs, "loop", False, "each stage of a device breadth first", default_stages_per_device=2
    ),
    "zb-h1": ScheduleKind(
        zb_h1, "loop", True, "Zero Bubble H1: 1F1B's memory, a third of its bubble", fixed_stages_per_device=1
    ),
    "zb-h2": ScheduleKind(
        zb_h2, "loop", True, "Zero Bubble H2: longer warm-up, no bubble in steady state", fixed_stages_per_device=1
    ),
    "zbv": ScheduleKind(zbv, "v", True, "Zero Bubble V: two stages per device in a V", fixed_stages_per_device=2),
    "ooo": ScheduleKind(
        ooo,
        "loop",
        True,
        "out-of-order backprop: I fast-forwarded, W deferred, modulo layer allocation",
        default_stages_per_device=2,
        min_stages_per_device=2,
    ),
}


def schedule_names() -> tuple[str, ...]:
    """The names `generate` takes; interleaved is written with its V, as interleaved:V."""
    return tuple("interleaved:V" if n == "interleaved" else n for n in SCHEDULES)


def parse_name(name: str) -> tuple[ScheduleKind, int | None]:
    """'interleaved:2' -> (its kind, 2); 'zbv' -> (its kind, None). The error lists the
    valid names."""
    base, sep, arg = name.strip().partition(":")
    kind = SCHEDULES.get(base)
    if kind is None:
        raise SchedlabError(f"unknown pipeline schedule {name!r}; choose one of: {', '.join(schedule_names())}")
    if base != "interleaved":
        if sep:
            raise SchedlabError(f"schedule {base!r} takes no ':' argument (got {name!r}); only interleaved:V does")
        return kind, None
    if not arg.isdigit() or int(arg) < 2:
        raise SchedlabError(
            f"interleaved needs its stages per device V >= 2 in the name, e.g. interleaved:2 (got {name!r}); "
            f"for one stage per device use 1f1b"
        )
    return kind, int(arg)


def generate(name: str, shape: PipeShape, n_microbatches: int) -> Schedule:
    """The schedule `name` for `shape` and `n_microbatches` micro-batches. The shape must
    be the chain the schedule needs (see `default_shape`); a mismatch, or a micro-batch
    count the schedule cannot run, is a SchedlabError that says what to change."""
    kind, v = parse_name(name)
    if n_microbatches < 1:
        raise SchedlabError(f"a schedule needs at least one micro-batch, not {n_microbatches}")
    if v is not None:
        have = chain_layout(shape, name).stages_per_device
        if have != v:
            raise SchedlabError(
                f"schedule {name!r} needs {v} stages per device; this pipeline has {have}. "
                f"Build it with generators.default_shape({name!r}, {shape.n_devices}) or name interleaved:{have}"
            )
    return kind.generate(shape, n_microbatches)


def stages_per_device(name: str, n_devices: int, n_stages: int | None = None) -> int:
    """How many stages a device holds under `name`: fixed by the schedule, or `n_stages`
    over the devices where the schedule leaves it open (its default when None)."""
    kind, v = parse_name(name)
    fixed = v if v is not None else kind.fixed_stages_per_device
    if n_stages is None:
        return fixed if fixed is not None else kind.default_stages_per_device
    if n_stages < 1 or n_stages % n_devices:
        raise SchedlabError(
            f"{n_stages} stages do not split evenly over {n_devices} devices; give a multiple of {n_devices}"
        )
    per = n_stages // n_devices
    if fixed is not None and per != fixed:
        raise SchedlabError(
            f"schedule {name!r} runs {fixed} stage(s) per device, {fixed * n_devices} on {n_devices} devices, "
            f"not {n_stages}; leave n_stages unset"
        )
    if per < kind.min_stages_per_device:
        raise SchedlabError(
            f"schedule {name!r} needs at least {kind.min_stages_per_device} stages per device "
            f"({kind.min_stages_per_device * n_devices} on {n_devices} devices), not {n_stages}"
        )
    return per


def default_shape(
    name: str,
    n_devices: int,
    n_stages: int | None = None,
    *,
    f_time: float = 1.0,
    b_time: float | None = None,
    i_time: float | None = None,
    w_time: float | None = None,
    f_mem: float = 1.0,
    w_mem: float = 0.0,
) -> PipeShape:
    """The chain schedule `name` runs on `n_devices` devices: P stages for gpipe, 1f1b,
    zb-h1 and zb-h2; V P looped for interleaved:V; 2P in a V for zbv; 2P looped (or
    `n_stages`) for ooo's modulo allocation and for looped-bfs.

    Times and memory are one device's share of the model for one micro-batch (the model
    split evenly over P devices; defaults and the B = I + W split as in `chain`), divided
    evenly among that device's stages; so every name's default shape does the same
    total work, and schedules compare by makespan as they stand."""
    v = stages_per_device(name, n_devices, n_stages)
    kind, _ = parse_name(name)

    def per_stage(x: float | None) -> float | None:
        return None if x is None else x / v

    return chain(
        n_devices,
        v * n_devices,
        kind.stage_map,
        f_time=f_time / v,
        b_time=per_stage(b_time),
        i_time=per_stage(i_time),
        w_time=per_stage(w_time),
        f_mem=f_mem / v,
        w_mem=w_mem / v,
        name=f"{name.strip()} chain",
    )
