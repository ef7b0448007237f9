"""scripts/corun_pairs.py's reading of two traces: each op's time alone, and per co-run call
the other worker's op it overlapped most."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from schedlab.trace import TraceEvent

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "corun_pairs.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corun_pairs", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def _ev(op: int, worker: int, start_us: float, end_us: float, step: int = 0) -> TraceEvent:
    return TraceEvent(op=op, name=f"op{op}", kind="F", device="cpu0", worker=worker, threads=2,
                      start_ns=int(start_us * 1e3), end_ns=int(end_us * 1e3), step=step)


def test_alone_is_the_median_over_steps_and_skips_overhead_events() -> None:
    mod = _script()
    events = [_ev(0, 0, 0, 10, 0), _ev(0, 0, 0, 30, 1), _ev(0, 0, 0, 20, 2), _ev(-1, 0, 0, 99)]
    assert mod.alone_us(events) == {0: 20.0}


def test_each_call_names_the_op_it_overlapped_most_in_its_own_step() -> None:
    mod = _script()
    events = [
        _ev(0, 0, 0, 100),  # overlaps op 1 for 20 us and op 2 for 70 us
        _ev(1, 1, 0, 20),
        _ev(2, 1, 30, 130),
        _ev(3, 1, 0, 100, step=1),  # another step: no overlap with op 0
        _ev(4, 0, 200, 205),  # shorter than min_us: left out
    ]
    out = mod.overlaps(events, min_us=10.0)
    (call,) = out[0]
    assert call.other == 2
    assert abs(call.share - 0.7) < 1e-9
    assert abs(call.end_after_us - (100 - 130)) < 1e-9
    assert out[3][0].other == -1 and out[3][0].share == 0.0
    assert 4 not in out
