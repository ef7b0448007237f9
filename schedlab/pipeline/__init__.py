"""Pipeline schedules as data: actions, the stages' shape, per-device orders, and the one
timing model every schedule is measured with."""

from schedlab.pipeline.actions import Action, Kind, parse_action
from schedlab.pipeline.check import check_schedule
from schedlab.pipeline.schedule import Schedule, infer_chain, orders_from_rows, parse_text
from schedlab.pipeline.shape import STAGE_MAPS, PipeShape, Stage, chain, stage_devices
from schedlab.pipeline.timing import Timeline, dependencies, time_schedule

__all__ = [
    "STAGE_MAPS",
    "Action",
    "Kind",
    "PipeShape",
    "Schedule",
    "Stage",
    "Timeline",
    "chain",
    "check_schedule",
    "dependencies",
    "infer_chain",
    "orders_from_rows",
    "parse_action",
    "parse_text",
    "stage_devices",
    "time_schedule",
]
