"""What one micro-batch's work looks like across devices: stages, the devices each runs
on, which stage feeds which, and what each kind of work costs in time and memory.

A plain pipeline is a chain of stages, one device each. Tessel's placements are more
general, and this is the same data: a stage may span several devices at once (a block
sharded over all of them, as the M shape's embedding), and stages form a DAG (the K
shape's two branches). Backward work follows the forward edges reversed.

Times are in one unit throughout (µs for a model's stages; any unit for an abstract
schedule, where F = 1 is customary). Memory is in one unit too (bytes for a model, or
"one micro-batch's activations" for an abstract schedule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from schedlab.errors import SchedlabError

STAGE_MAPS = ("loop", "v")


@dataclass(frozen=True)
class Stage:
    """One stage: the devices it runs on together, the stages its forward output feeds,
    its work's times, and the activation memory its forward holds on each of its devices
    until its backward frees it (`w_mem` of that is still held after I, until W)."""

    devices: tuple[int, ...]
    next: tuple[int, ...] = ()
    f_time: float = 1.0
    b_time: float = 2.0
    i_time: float = 1.0
    w_time: float = 1.0
    f_mem: float = 1.0
    w_mem: float = 0.0
    name: str = ""


@dataclass(frozen=True)
class PipeShape:
    """Stages (index = stage id) over devices 0..n_devices-1."""

    stages: tuple[Stage, ...]
    n_devices: int
    name: str = ""
    prev: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.stages:
            raise SchedlabError("a pipeline needs at least one stage")
        if self.n_devices < 1:
            raise SchedlabError(f"a pipeline needs at least one device, not {self.n_devices}")
        prev: list[list[int]] = [[] for _ in self.stages]
        for s, stage in enumerate(self.stages):
            if not stage.devices:
                raise SchedlabError(f"stage {s} runs on no device")
            for d in stage.devices:
                if not 0 <= d < self.n_devices:
                    raise SchedlabError(f"stage {s} is on device {d}; devices are 0..{self.n_devices - 1}")
            if len(set(stage.devices)) != len(stage.devices):
                raise SchedlabError(f"stage {s} names a device twice: {stage.devices}")
            for n in stage.next:
                if not 0 <= n < len(self.stages) or n == s:
                    raise SchedlabError(f"stage {s} feeds stage {n}, which is not another stage of this pipeline")
                prev[n].append(s)
        object.__setattr__(self, "prev", tuple(tuple(p) for p in prev))
        _check_acyclic(self)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def stages_on(self, device: int) -> tuple[int, ...]:
        return tuple(s for s, st in enumerate(self.stages) if device in st.devices)

    def work_per_microbatch(self, split_backward: bool) -> tuple[float, ...]:
        """Per device, one micro-batch's compute time there: a lower bound on the steady
        state's time per micro-batch (the repetend's length, in Tessel's terms)."""
        work = [0.0] * self.n_devices
        for st in self.stages:
            t = st.f_time + (st.i_time + st.w_time if split_backward else st.b_time)
            for d in st.devices:
                work[d] += t
        return tuple(work)


def _check_acyclic(shape: PipeShape) -> None:
    indeg = [len(p) for p in shape.prev]
    ready = [s for s, k in enumerate(indeg) if k == 0]
    seen = 0
    while ready:
        s = ready.pop()
        seen += 1
        for n in shape.stages[s].next:
            indeg[n] -= 1
            if indeg[n] == 0:
                ready.append(n)
    if seen != shape.n_stages:
        raise SchedlabError("the stages' forward edges form a cycle; a pipeline's stages must form a DAG")


def stage_devices(n_stages: int, n_devices: int, stage_map: str = "loop") -> tuple[int, ...]:
    """Which device runs each stage of a chain.

    ``loop``: stage s on device s mod P (0 1 2 3 0 1 2 3: interleaved 1F1B, looped BFS).
    ``v``: down and back up (0 1 2 3 3 2 1 0 ...: ZBV, DualPipeV), so the last stage sits
    beside the first and the loss turns around on one device."""
    if n_stages < 1 or n_devices < 1:
        raise SchedlabError(f"need at least one stage and one device (got {n_stages} stages, {n_devices} devices)")
    if n_stages % n_devices:
        raise SchedlabError(
            f"{n_stages} stages do not split evenly over {n_devices} devices; give a multiple of {n_devices}"
        )
    if stage_map == "loop":
        return tuple(s % n_devices for s in range(n_stages))
    if stage_map == "v":
        out = []
        for s in range(n_stages):
            lap, pos = divmod(s, n_devices)
            out.append(pos if lap % 2 == 0 else n_devices - 1 - pos)
        return tuple(out)
    raise SchedlabError(f"unknown stage map {stage_map!r}; choose one of: {', '.join(STAGE_MAPS)}")


def backward_times(
    f_time: float, b_time: float | None, i_time: float | None, w_time: float | None
) -> tuple[float, float, float]:
    """(B, I, W) from what was given: unset I and W default to F, B to I + W; given B
    alone, I = W = B / 2."""
    if b_time is None:
        i = f_time if i_time is None else i_time
        w = f_time if w_time is None else w_time
        return i + w, i, w
    i = b_time / 2 if i_time is None else i_time
    return b_time, i, b_time - i if w_time is None else w_time


def chain(
    n_devices: int,
    n_stages: int | None = None,
    stage_map: str = "loop",
    *,
    f_time: float = 1.0,
    b_time: float | None = None,
    i_time: float | None = None,
    w_time: float | None = None,
    f_mem: float = 1.0,
    w_mem: float = 0.0,
    name: str = "",
) -> PipeShape:
    """A chain of `n_stages` (default one per device) identical stages mapped onto devices
    by `stage_map`. Unset backward times follow the usual split: I = W = F and B = I + W;
    given B alone, I = W = B / 2."""
    n = n_devices if n_stages is None else n_stages
    devs = stage_devices(n, n_devices, stage_map)
    return chain_of(
        [(d,) for d in devs],
        n_devices,
        f_time=f_time,
        b_time=b_time,
        i_time=i_time,
        w_time=w_time,
        f_mem=f_mem,
        w_mem=w_mem,
        name=name or f"chain-{stage_map}",
    )


def chain_of(
    stage_devices: Sequence[tuple[int, ...]],
    n_devices: int,
    *,
    f_time: float = 1.0,
    b_time: float | None = None,
    i_time: float | None = None,
    w_time: float | None = None,
    f_mem: float = 1.0,
    w_mem: float = 0.0,
    name: str = "",
) -> PipeShape:
    """A chain of identical stages, stage s on `stage_devices[s]` and feeding s + 1
    (backward times as `backward_times` completes them)."""
    b, i, w = backward_times(f_time, b_time, i_time, w_time)
    n = len(stage_devices)
    stages = tuple(
        Stage(
            devices=devs,
            next=(s + 1,) if s + 1 < n else (),
            f_time=f_time,
            b_time=b,
            i_time=i,
            w_time=w,
            f_mem=f_mem,
            w_mem=w_mem,
        )
        for s, devs in enumerate(stage_devices)
    )
    return PipeShape(stages=stages, n_devices=n_devices, name=name)
