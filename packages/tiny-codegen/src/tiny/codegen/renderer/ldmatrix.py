"""Tensor-core fragments read from local memory as whole 8 x 8 matrices (NVIDIA's ldmatrix), where that is provably
the same as reading them value by value.

A staged matmul (tiny.codegen.opt STAGE) reads each lane's fragment of mma.sync.m16n8k16 from local memory with one
16-bit load per element: 8 for A, 4 for B. `ldmatrix.sync.aligned.m8n8.xN.shared.b16` reads N 8 x 8 matrices of
16-bit values with one instruction for the whole warp: lane 8j + r gives the address of row r of matrix j (16
bytes, 16-byte aligned), and lane l receives, as its register j, the two values of row l / 4 of matrix j at columns
2 (l % 4) and 2 (l % 4) + 1; with `.trans` it receives rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4 instead.

Nothing in the IR changes: `matrix_loads` looks at each fragment (a VECTORIZE of loads of one local buffer) and
works out, from the loads' own offsets, whether some choice of row addresses makes ldmatrix (x4 for A's 8 values,
x2 with .trans for B's 4) deliver exactly those values to every lane. It asks the simplifier for the offsets'
distances from the first one and for the first one's moves from lane 0 to each lane, which must be constants, so
the proof holds for every value of every other index. The renderer (CUDA C, PTX) then emits one ldmatrix whose
per-lane address is the first element's address plus a constant per lane (a table of 32).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiny.ir.config import flag
from tiny.ir.dtypes import dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.symbolic import linear_form, symbolic
from tiny.ir.uop import Ops, UOp, substitute

LDMATRIX = flag(
    "LDMATRIX",
    int,
    1,
    "CUDA C and PTX read 16-bit tensor-core fragments from shared memory with ldmatrix; 0: one load per element",
)

LANES = 32
ROW_ELEMENTS = 8  # 16-bit values in one 16-byte row of a matrix


@dataclass(frozen=True)
class MatrixLoad:
    """One fragment read by ldmatrix: lane l passes `first` (the address of its fragment's element 0) plus
    shift[l] elements."""

    matrices: int  # 4 (A's 8 values) or 2 (B's 4 values)
    trans: bool
    first: UOp  # the INDEX of the fragment's element 0
    shift: tuple[int, ...]  # per lane, in elements


def matrix_loads(uops: list[UOp]) -> dict[UOp, MatrixLoad]:
    """The fragments (VECTORIZE feeding a WMMA) that one ldmatrix can read, by fragment."""
    lane = next((u for u in uops if u.op is Ops.SPECIAL and u.arg == ("lidx0", LANES)), None)
    if lane is None:
        return {}
    out: dict[UOp, MatrixLoad] = {}
    for u in uops:
        if u.op is not Ops.WMMA:
            continue
        for frag in u.src[:2]:
            if frag not in out and (found := _plan(frag, lane)) is not None:
                out[frag] = found
    return out


def _plan(frag: UOp, lane: UOp) -> MatrixLoad | None:
    loads = frag.src
    if frag.op is not Ops.VECTORIZE or len(loads) not in (4, 8):
        return None
    if any(x.op is not Ops.LOAD or x.dtype not in (dtypes.float16, dtypes.bfloat16) for x in loads):
        return None
    addrs = [x.address for x in loads]
    if any(a.gate is not None or a.pointer is not addrs[0].pointer for a in addrs):
        return None
    if addrs[0].pointer.op is not Ops.DEFINE_LOCAL:
        return None
    d = _displacements([a.offset for a in addrs], lane)
    if d is None or not _aligned(substitute(addrs[0].offset, {lane: UOp.const(lane.dtype, 0)})):
        return None
    if len(loads) == 8:
        rows = _rows_x4(d)
        trans = False
    else:
        rows = _rows_x2_trans(d)
        trans = True
    if rows is None or any(r % ROW_ELEMENTS for r in rows):
        return None
    matrices = len(loads) // 2
    shift = tuple(rows[m % (8 * matrices)] - d[0][m] for m in range(LANES))
    return MatrixLoad(matrices, trans, addrs[0], shift)


def _displacements(offsets: list[UOp], lane: UOp) -> list[list[int]] | None:
    """d[e][l]: element e's offset at lane l less element 0's at lane 0, for every value of the other indices;
    None where that is not a constant. (Found as element e's constant distance from element 0, plus element 0's
    move from lane 0 to lane l: 40 questions to the simplifier, not 256.)"""
    first = offsets[0]
    at_zero = substitute(first, {lane: UOp.const(lane.dtype, 0)})
    memo: dict[UOp, UOp] = {}

    def constant(x: UOp) -> int | None:
        x = graph_rewrite(x, symbolic, memo=memo)
        return int(x.arg) if x.op is Ops.CONST else None

    apart = [constant(o - first) for o in offsets]
    moved = [constant(substitute(first, {lane: UOp.const(lane.dtype, v)}) - at_zero) for v in range(LANES)]
    if any(a is None for a in apart) or any(m is None for m in moved):
        return None
    return [[a + m for m in moved] for a in apart]  # type: ignore[operator]


def _aligned(offset: UOp) -> bool:
    """Whether the offset is a multiple of a row (16 bytes) for every value of its indices."""
    lin = linear_form(offset)
    if lin is None:
        return False
    terms, const = lin
    return const % ROW_ELEMENTS == 0 and all(k % ROW_ELEMENTS == 0 for k in terms.values())


def _rows_x4(d: list[list[int]]) -> list[int] | None:
    """Row addresses (relative to element 0 at lane 0) for x4: lane l's values 2j, 2j+1 are row l/4 of matrix j at
    columns 2(l%4), 2(l%4)+1. Row r of matrix j is where lane 4r finds its value 2j."""
    rows = [d[2 * j][4 * r] for j in range(4) for r in range(8)]
    for lane in range(LANES):
        for j in range(4):
            at = rows[8 * j + lane // 4] + 2 * (lane % 4)
            if d[2 * j][lane] != at or d[2 * j + 1][lane] != at + 1:
                return None
    return rows


def _rows_x2_trans(d: list[list[int]]) -> list[int] | None:
    """Row addresses for x2.trans: lane l's values 2j, 2j+1 are rows 2(l%4), 2(l%4)+1 of matrix j at column l/4. Row
    2s of matrix j is where lane s finds its value 2j, row 2s+1 where it finds 2j+1."""
    rows = [d[2 * j + r % 2][r // 2] for j in range(2) for r in range(8)]
    for lane in range(LANES):
        for j in range(2):
            column = lane // 4
            if d[2 * j][lane] != rows[8 * j + 2 * (lane % 4)] + column:
                return None
            if d[2 * j + 1][lane] != rows[8 * j + 2 * (lane % 4) + 1] + column:
                return None
    return rows
