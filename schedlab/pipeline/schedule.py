"""A pipeline schedule: per device, the ordered list of actions it runs.

The compact text form is one line per device, actions as torch writes them:

    0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3
    1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3

A stage that spans several devices (a sharded block) appears, with the same actions, in
each of their lists. Communication actions are implied by the dependencies and dropped
on reading (`Schedule.comm_dropped` counts them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind, parse_action
from schedlab.pipeline.shape import PipeShape, chain_of


@dataclass(frozen=True)
class Schedule:
    shape: PipeShape
    n_microbatches: int
    orders: tuple[tuple[Action, ...], ...]  # per device
    name: str = ""
    comm_dropped: int = 0

    def __post_init__(self) -> None:
        if len(self.orders) != self.shape.n_devices:
            raise SchedlabError(
                f"schedule {self.name or ''} lists {len(self.orders)} devices; its pipeline has {self.shape.n_devices}"
            )
        if self.n_microbatches < 1:
            raise SchedlabError(f"a schedule needs at least one micro-batch, not {self.n_microbatches}")

    @property
    def n_devices(self) -> int:
        return self.shape.n_devices

    @property
    def split_backward(self) -> bool:
        return any(a.kind is Kind.I for order in self.orders for a in order)

    def actions(self) -> set[Action]:
        return {a for order in self.orders for a in order}

    def n_actions(self) -> int:
        return sum(len(o) for o in self.orders)

    def with_shape(self, shape: PipeShape) -> Schedule:
        return replace(self, shape=shape)

    def to_text(self) -> str:
        return "\n".join(f"{d}: {' '.join(str(a) for a in order)}" for d, order in enumerate(self.orders)) + "\n"

    def to_rows(self) -> list[list[str]]:
        """One row per device (torch's CSV layout), compute actions only."""
        return [[str(a) for a in order] for order in self.orders]


# torch's actions that are neither compute nor SEND/RECV; all are communication or
# bookkeeping around it, and carry no micro-batch.
_TORCH_ONLY_RE = re.compile(r"^\d+(UNSHARD|RESHARD|REDUCE_GRAD)$")
_COMPOUND_RE = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def read_cell(text: str) -> tuple[tuple[Action, ...], int]:
    """One cell in torch's text -> the compute actions it holds (an OVERLAP_F_B
    compound's sub-actions, in order) and how many communication actions it held."""
    text = text.strip()
    if not text:
        return (), 0
    if _TORCH_ONLY_RE.match(text):
        return (), 1
    compound = _COMPOUND_RE.match(text)
    parts = compound.group(1).split(";") if compound else [text]
    actions = tuple(parse_action(p) for p in parts)
    if compound and not all(a.kind.is_compute for a in actions):
        raise SchedlabError(f"OVERLAP_F_B {text!r} holds communication; it pairs compute actions only")
    compute = tuple(a for a in actions if a.kind.is_compute)
    return compute, len(actions) - len(compute)


def orders_from_rows(rows: Sequence[Sequence[str]]) -> tuple[tuple[tuple[Action, ...], ...], int]:
    """Rows of cells in torch's text, one row per rank (empty cells skipped) -> compute
    orders per rank, and how many communication actions were dropped."""
    orders: list[tuple[Action, ...]] = []
    dropped = 0
    for r, row in enumerate(rows):
        acts: list[Action] = []
        for c, cell in enumerate(row):
            try:
                compute, comm = read_cell(cell)
            except SchedlabError as e:
                raise SchedlabError(f"row {r} (rank {r}), cell {c}: {e}") from None
            acts.extend(compute)
            dropped += comm
        orders.append(tuple(acts))
    return tuple(orders), dropped


def parse_text(text: str) -> tuple[tuple[tuple[Action, ...], ...], int]:
    """The compact text form (`D: ACTION ...` per line; `#` comments) -> orders, dropped."""
    rows: dict[int, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        head, sep, rest = line.partition(":")
        if not sep or not head.strip().isdigit():
            raise SchedlabError(f"schedule line {n}: expected 'DEVICE: ACTION ACTION ...', got {line!r}")
        d = int(head)
        if d in rows:
            raise SchedlabError(f"schedule line {n}: device {d} listed twice")
        rows[d] = rest.split()
    if sorted(rows) != list(range(len(rows))):
        raise SchedlabError(f"schedule lists devices {sorted(rows)}; expected 0..{len(rows) - 1}, each once")
    return orders_from_rows([rows[d] for d in range(len(rows))])


def infer_chain(
    orders: Sequence[Sequence[Action]],
    *,
    f_time: float = 1.0,
    b_time: float | None = None,
    i_time: float | None = None,
    w_time: float | None = None,
    f_mem: float = 1.0,
    w_mem: float = 0.0,
) -> PipeShape:
    """The chain of stages a schedule's actions imply: stage s runs on every device whose
    list holds one of its actions, and feeds stage s + 1 (how torch reads a CSV)."""
    devices: dict[int, set[int]] = {}
    for d, order in enumerate(orders):
        for a in order:
            devices.setdefault(a.stage, set()).add(d)
    if not devices:
        raise SchedlabError("the schedule holds no compute action")
    n_stages = max(devices) + 1
    missing = [s for s in range(n_stages) if s not in devices]
    if missing:
        raise SchedlabError(f"the schedule has no action for stage(s) {missing} of 0..{n_stages - 1}")
    stage_devs = [tuple(sorted(devices[s])) for s in range(n_stages)]
    return chain_of(
        stage_devs,
        len(orders),
        f_time=f_time,
        b_time=b_time,
        i_time=i_time,
        w_time=w_time,
        f_mem=f_mem,
        w_mem=w_mem,
        name="inferred chain",
    )


def n_microbatches_of(orders: Iterable[Iterable[Action]]) -> int:
    mbs = {a.mb for order in orders for a in order}
    if not mbs:
        raise SchedlabError("the schedule holds no compute action")
    return max(mbs) + 1
