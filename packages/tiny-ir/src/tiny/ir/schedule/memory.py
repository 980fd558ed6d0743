"""Memory a schedule's temporary buffers share: the memory planner.

A schedule makes a buffer for every node it realizes; most of them are read by a later kernel of the same schedule
and by nothing once it has run (an attention layer's scores, a matrix product's panel copy of a weight). Allocated
each on its own they would all be alive until the schedule ends, so a model's step takes the sum of its
intermediates. Here each temporary that is first written after another's last reader has run takes that one's
memory instead (a view of it, on devices whose allocator has views), so a step takes about the most its kernels
need at one time.

Kernels on one device run in schedule order (a device's queue is in order), so memory whose last reader was launched
before the next writer is free for it. A buffer a copy reads or writes, or a kernel of another device reads, keeps
its own memory: those run on the other device's queue, beside this one's kernels.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

from tiny.ir.device import Buffer, Device
from tiny.ir.schedule.cache import ScheduleItem
from tiny.ir.uop import Ops

SHARE_WASTE = 2  # a buffer takes memory at most this many times its own size (else its own allocation)


def share_memory(items: Sequence[ScheduleItem], temporaries: Iterable[Buffer]) -> int:
    """Give each of `temporaries` (buffers of `items` that nothing reads after the schedule has run) the memory of an
    earlier temporary whose last kernel comes before its first, where the sizes fit (within SHARE_WASTE) and the
    device's allocator has views. Only buffers not allocated yet are planned. The bytes not allocated thereby."""
    mine = {id(b): b for b in temporaries if _plannable(b)}
    if len(mine) < 2:
        return 0
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (ast, buffers) in enumerate(items):
        for b in buffers:
            if (k := id(b)) in mine:
                if ast.op is Ops.COPY or b.device != buffers[0].device:  # (another device's queue may read it)
                    del mine[k]
                    continue
                first.setdefault(k, i)
                last[k] = i
    ending: dict[int, list[int]] = {}
    for k, i in last.items():
        if k in mine:
            ending.setdefault(i, []).append(k)
    free: dict[str, list[tuple[int, int, Buffer]]] = {}  # per device: (bytes, order, memory) of the free, by size
    memory: dict[int, Buffer] = {}  # each planned buffer -> the buffer whose allocation it uses (itself, or a root)
    order, saved = itertools.count(), 0
    for i, (_, buffers) in enumerate(items):
        for b in buffers:
            if (k := id(b)) in mine and first[k] == i and k not in memory:
                memory[k] = _take(free.get(b.device), b) or b
                if memory[k] is not b:
                    b.base, b.offset = memory[k], 0
                    saved += b.nbytes
        for k in ending.get(i, ()):
            if k in memory:  # (its memory free again for the kernels after this one)
                root = memory[k]
                insort(free.setdefault(root.device, []), (root.nbytes, next(order), root))
    return saved


def _plannable(b: Buffer) -> bool:
    return b.base is None and not b.is_allocated and not b.foreign and b.nbytes > 0 and _views(b.device)


def _views(device: str) -> bool:
    return Device[device].allocator.caps.views


def _take(free: list[tuple[int, int, Buffer]] | None, b: Buffer) -> Buffer | None:
    """The smallest free memory that holds b (and is at most SHARE_WASTE times its size), taken off the list."""
    if not free:
        return None
    at = bisect_left(free, (b.nbytes, -1))
    if at == len(free) or free[at][0] > SHARE_WASTE * b.nbytes:
        return None
    return free.pop(at)[2]
