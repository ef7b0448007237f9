"""The one validator every schedule passes before it is timed, run or written: each
action once, on its stage's devices, every micro-batch's work complete, no deadlock,
and, given a limit, no device over its memory. Each failure is one SchedlabError that
names the action and the device."""

from __future__ import annotations

from collections import Counter

from schedlab.errors import SchedlabError
from schedlab.pipeline.actions import Action, Kind
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.timing import Timeline, peak_memory, time_schedule


def check_schedule(schedule: Schedule, memory_limit: float | None = None, comm_time: float = 0.0) -> Timeline:
    """Validate `schedule` and return its timeline (the deadlock check is the timing)."""
    shape = schedule.shape
    label = f"schedule {schedule.name!r}" if schedule.name else "the schedule"
    for d, order in enumerate(schedule.orders):
        counts = Counter(order)
        dup = sorted(a for a, k in counts.items() if k > 1)
        if dup:
            raise SchedlabError(f"{label}: device {d} runs {', '.join(map(str, dup[:5]))} more than once")
        for a in order:
            if not a.kind.is_compute:
                raise SchedlabError(f"{label}: device {d} lists {a}; communication is implied, list compute only")
            if not 0 <= a.stage < shape.n_stages:
                raise SchedlabError(f"{label}: device {d} runs {a}, but stages are 0..{shape.n_stages - 1}")
            if d not in shape.stages[a.stage].devices:
                raise SchedlabError(
                    f"{label}: device {d} runs {a}, but stage {a.stage} runs on device(s) {shape.stages[a.stage].devices}"
                )
            if not 0 <= a.mb < schedule.n_microbatches:
                raise SchedlabError(f"{label}: {a} names micro-batch {a.mb}; there are {schedule.n_microbatches}")
    present = schedule.actions()
    on_device = [set(order) for order in schedule.orders]
    for a in present:
        for d in shape.stages[a.stage].devices:
            if a not in on_device[d]:
                raise SchedlabError(
                    f"{label}: stage {a.stage} spans devices {shape.stages[a.stage].devices}, "
                    f"but device {d} does not run {a}"
                )
    for s in range(shape.n_stages):
        for m in range(schedule.n_microbatches):
            if Action(s, Kind.F, m) not in present:
                raise SchedlabError(f"{label}: missing {Action(s, Kind.F, m)} (stage {s}'s forward of micro-batch {m})")
            full = Action(s, Kind.B, m) in present
            i, w = Action(s, Kind.I, m) in present, Action(s, Kind.W, m) in present
            if full and (i or w):
                raise SchedlabError(f"{label}: stage {s}, micro-batch {m} has both a full backward B and a split I/W")
            if not full and not (i and w):
                want = Action(s, Kind.W if i else Kind.I, m) if i or w else Action(s, Kind.B, m)
                raise SchedlabError(f"{label}: missing {want} (stage {s}'s backward of micro-batch {m})")
    timeline = time_schedule(schedule, comm_time=comm_time)
    if memory_limit is not None:
        for d, peak in enumerate(peak_memory(schedule)):
            if peak > memory_limit + 1e-9:
                raise SchedlabError(
                    f"{label}: device {d} holds {peak:g} at its peak, over the memory limit {memory_limit:g}; "
                    f"fewer micro-batches in flight (1F1B rather than GPipe) or a higher limit"
                )
    return timeline
