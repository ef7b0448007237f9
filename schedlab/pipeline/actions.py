"""Pipeline actions: what one device does for one stage and one micro-batch.

The text form is torch.distributed.pipelining's (torch 2.13 `_Action`): stage index, kind,
micro-batch index, so `2F0` is stage 2's forward of micro-batch 0 and `1SEND_B3` stage 1
sending micro-batch 3's input gradient. Schedules written here read back in torch and the
other way round.

Kinds:
- ``F`` forward; ``B`` full backward (input and weight gradient together);
- ``I`` input-gradient backward and ``W`` weight-gradient backward (B split in two, as
  Zero Bubble and out-of-order backprop do: I is on the critical path, W is not);
- ``SEND_F`` / ``RECV_F`` / ``SEND_B`` / ``RECV_B`` communication between stages on
  different devices. The timing model derives communication from the dependencies, so
  these are accepted in imported schedules and otherwise implied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from schedlab.errors import SchedlabError


class Kind(StrEnum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - torch's letter for the input-gradient backward
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS


COMPUTE_KINDS = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})
COMM_KINDS = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})

# Longest names first so SEND_F is not read as S + ...; torch's regex has the same shape.
_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """Stage `stage`'s work of kind `kind` on micro-batch `mb`."""

    stage: int
    kind: Kind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.mb}"


def parse_action(text: str) -> Action:
    """`2F0` -> Action(2, F, 0). The error names the cell and the expected form."""
    match = _ACTION_RE.match(text.strip())
    if match is None:
        raise SchedlabError(
            f"cannot read pipeline action {text!r}: expected STAGE KIND MICROBATCH as torch writes it, "
            f"e.g. 0F1, 3B0, 2I5, 2W5, 1SEND_F0 (kinds F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B)"
        )
    stage, kind, mb = match.groups()
    return Action(int(stage), Kind(kind), int(mb))
