"""Prefetches for the CPU's renderers (C and LLVM IR): which loads ask for their data ahead of time.

A loop that reads several streams of memory at once (a matrix-vector product reads 4 rows of the matrix side by
side) gets less from the hardware's own prefetcher than the memory could give: a float16 product over 23 MB read at
33 GB/s, and at 46 with each row's line asked for 1 KB ahead. A single stream (a sum) reads as fast without; data read
again (a matrix product's tiles) is in the caches; a stream that reaches a new line only every few times round its
loop (a block's scale) is left to the hardware.

How a prefetch treats its line is the host's (the CPU device's target says, `locality`): AMD's CPUs read streams
fastest asked for non-temporally (an EPYC's float16 products: 46 GB/s), Intel's at a third of the speed so (a
Sapphire Rapids Xeon's float16 products over 1.1 GB: 10.7 GB/s non-temporal, 31 into every cache level, 24 with no
prefetch)."""

from __future__ import annotations

from tiny.ir.dtypes import PtrDType
from tiny.ir.uop import Ops, UOp

AHEAD = 1024  # bytes ahead of a load that its prefetch reads
FROM = 1 << 18  # bytes a buffer needs for its reads to come from memory (smaller ones stay in the caches)
STEP_MOST = 256  # bytes a load may move by each time round its loop and still be a stream
STEP_LEAST = 16  # bytes it must move by: a stream that reaches a new line every 4+ times round is left to the hardware
LINE = 64  # bytes of a cache line: one prefetch for the loads of a stream within one
KEEP = 3  # the locality hint (as __builtin_prefetch's and llvm.prefetch's, 0-3) where the target names none


def locality(target: str) -> int:
    """The locality hint of the prefetches a CPU target's 'prefetch_locality=L' part names (0: non-temporal, 3: into
    every cache level), else KEEP."""
    for part in target.split(";"):
        if part.startswith("prefetch_locality="):
            hint = int(part.split("=")[1])
            if not 0 <= hint <= 3:
                raise ValueError(f"prefetch_locality must be 0 to 3, got {hint} in the target {target!r}")
            return hint
    return KEEP


def prefetches(uops: list[UOp]) -> dict[UOp, int]:
    """The loads to prefetch ahead of, each with how many elements ahead: the loads of an innermost loop that reads
    two or more streams, each a global buffer of FROM bytes or more read once (its address moves with every loop
    around it) and on by STEP_LEAST to STEP_MOST bytes each time round; one load per cache line of a stream."""
    loops: list[UOp] = []
    found: dict[UOp, dict[tuple, tuple[UOp, int]]] = {}  # innermost loop -> (buffer, base, line) -> load, ahead
    for u in uops:
        if u.op is Ops.RANGE:
            loops.append(u)
        elif u.op is Ops.ENDRANGE:
            loops.pop()
        elif u.op is Ops.LOAD and loops and (at := _stream(u, loops)) is not None:
            found.setdefault(loops[-1], {}).setdefault(at[0], (u, at[1]))
    out: dict[UOp, int] = {}
    for lines in found.values():
        if len({(buf, base, line * LINE // AHEAD) for buf, base, line in lines}) >= 2:
            out.update(lines.values())
    return out


def _stream(load: UOp, loops: list[UOp]) -> tuple[tuple, int] | None:
    """(buffer, the offset less its constant, the constant's cache line) and the elements ahead to prefetch, for a
    load of a stream (see prefetches); else None."""
    addr = load.address
    ptr, offset = addr.pointer.dtype, addr.offset
    if not isinstance(ptr, PtrDType) or ptr.local or ptr.base is None or offset.dtype.count != 1:
        return None
    item = ptr.base.itemsize
    if ptr.size * item < FROM or any(_step(offset, loop) == 0 for loop in loops):
        return None
    moves = _step(offset, loops[-1])
    if moves is None or not STEP_LEAST <= moves * item <= STEP_MOST:
        return None
    base, const = offset, 0
    if offset.op is Ops.ADD:
        first, last = offset.src
        if last.op is Ops.CONST:
            base, const = first, last.arg
    return (addr.pointer, base, const * item // LINE), AHEAD // item


def _step(offset: UOp, loop: UOp) -> int | None:
    """How many elements an offset moves by when the loop's counter goes up by one: for a sum of multiples of the
    counter by constants and of terms the loop leaves alone; None for any other form."""
    if offset is loop:
        return 1
    if loop not in offset.toposort:
        return 0
    if offset.op is Ops.ADD:
        a, b = (_step(s, loop) for s in offset.src)
        return None if a is None or b is None else a + b
    if offset.op is Ops.MUL:
        x, c = sorted(offset.src, key=lambda s: s.op is Ops.CONST)  # (the constant last)
        moves = _step(x, loop) if c.op is Ops.CONST and isinstance(c.arg, int) else None
        return None if moves is None else moves * c.arg
    return None
