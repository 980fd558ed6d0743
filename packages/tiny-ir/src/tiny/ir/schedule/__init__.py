"""tiny.ir.schedule: the scheduler, which turns a tensor-level graph into the kernels and copies that realize it.

- `scheduler`: `create_schedule` and its passes (prepare, lift reshapes, read copies, then the kernels: which nodes
  become buffers, each kernel's AST, the order).
- `cache`: a graph of the same structure as one scheduled before (other buffers, other values of its Variables)
  takes that schedule, rebound (SCHEDULE_CACHE).
"""

from tiny.ir.schedule.cache import Schedule, ScheduleItem
from tiny.ir.schedule.scheduler import (
    copied_value,
    create_schedule,
    data_view,
    is_memory,
    is_realized,
    lift_reshapes,
    memory_of,
    read_through,
    rebind_graph,
)

__all__ = [
    "Schedule",
    "ScheduleItem",
    "copied_value",
    "create_schedule",
    "data_view",
    "is_memory",
    "is_realized",
    "lift_reshapes",
    "memory_of",
    "read_through",
    "rebind_graph",
]
