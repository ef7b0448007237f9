"""Which stages each device runs, read from a chain-shaped pipeline and checked against
what a schedule generator needs.

Every generator here works on a chain (stage s feeds stage s + 1 only, each stage on one
device); they differ in how many stages a device holds and in the order they map onto
devices (`loop`: s mod P; `v`: down and back up). Reading the layout once, with one
error per mismatch that says how to build the right shape, keeps each generator short.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlab.errors import SchedlabError
from schedlab.pipeline.shape import PipeShape, stage_devices


@dataclass(frozen=True)
class ChainLayout:
    """A chain's stages over its devices: `device_of[s]` runs stage s; `stages_of[d]` are
    device d's stages in chain order."""

    n_devices: int
    device_of: tuple[int, ...]
    stages_of: tuple[tuple[int, ...], ...]

    @property
    def n_stages(self) -> int:
        return len(self.device_of)

    @property
    def stages_per_device(self) -> int:
        return self.n_stages // self.n_devices


def chain_layout(shape: PipeShape, schedule: str) -> ChainLayout:
    """The layout of `shape`, which must be a chain of single-device stages spread evenly
    over the devices; `schedule` names the generator asking, for the error."""
    for s, st in enumerate(shape.stages):
        want_next = (s + 1,) if s + 1 < shape.n_stages else ()
        if st.next != want_next:
            raise SchedlabError(
                f"schedule {schedule!r} needs a chain of stages (stage s feeding s + 1 only); stage {s} feeds "
                f"{list(st.next)}. Build the pipeline with schedlab.pipeline.chain or generators.default_shape"
            )
        if len(st.devices) != 1:
            raise SchedlabError(
                f"schedule {schedule!r} needs each stage on one device; stage {s} spans devices {st.devices}"
            )
    device_of = tuple(st.devices[0] for st in shape.stages)
    stages_of = tuple(tuple(s for s, d in enumerate(device_of) if d == dev) for dev in range(shape.n_devices))
    counts = {len(ss) for ss in stages_of}
    if len(counts) != 1:
        raise SchedlabError(
            f"schedule {schedule!r} needs the same number of stages on every device; devices hold "
            f"{[len(ss) for ss in stages_of]}"
        )
    return ChainLayout(n_devices=shape.n_devices, device_of=device_of, stages_of=stages_of)


def require_layout(layout: ChainLayout, schedule: str, stage_map: str, stages_per_device: int | None = None) -> None:
    """Refuse a layout other than `stages_per_device` stages a device (any number if None)
    mapped by `stage_map`, naming what the shape has and what to build instead."""
    p = layout.n_devices
    if stages_per_device is not None and layout.stages_per_device != stages_per_device:
        raise SchedlabError(
            f"schedule {schedule!r} needs {stages_per_device} stage(s) per device ({stages_per_device * p} stages "
            f"on {p} devices); this pipeline has {layout.n_stages}. "
            f"Build it with generators.default_shape({schedule!r}, {p})"
        )
    if layout.device_of != stage_devices(layout.n_stages, p, stage_map):
        raise SchedlabError(
            f"schedule {schedule!r} needs stages mapped {stage_map!r} onto devices "
            f"{stage_devices(layout.n_stages, p, stage_map)}; this pipeline maps them {layout.device_of}. "
            f"Build it with generators.default_shape({schedule!r}, {p})"
        )
