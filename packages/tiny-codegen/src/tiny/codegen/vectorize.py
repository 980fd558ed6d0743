"""Vectors: a VECTORIZE of lane values becomes vector math, vector loads and vector accumulators.

Lowering writes upcast and unrolled lanes out as scalars and gathers the lanes that belong together into a
VECTORIZE (at a store, or at a reduction that accumulates in a vector). These rules push each VECTORIZE down
through its lanes while the lanes do the same thing: the same op on different values becomes one vector op;
loads of consecutive addresses become one vector load. Where lanes differ, the VECTORIZE stays and gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiny.codegen.lower import VECTOR_REDUCE, contiguous
from tiny.ir.device import VECTOR_DTYPES
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.pattern import PatternMatcher, UPat
from tiny.ir.uop import GroupOp, Ops, UOp

# ALU ops every renderer that forms vectors computes on them (math functions by a vector library or lane by lane)
VECTOR_ALU = frozenset(
    {Ops.ADD, Ops.MUL, Ops.NEG, Ops.MAX, Ops.FDIV, Ops.RECIP, Ops.AND, Ops.OR, Ops.XOR}
    | {Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}
)


# 8- and 16-bit lanes a renderer with RendererCaps.narrow_vectors takes in vectors as long as a float32 vector's (a
# quantized weight's bytes, a float16 weight): loaded, combined bitwise and shifted (the integers), converted to float32
NARROW_DTYPES = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16})
NARROW_ALU = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.SHR, Ops.SHL})


@dataclass(frozen=True)
class VectorTarget:
    """The vectorize pass's context: the bytes of one hardware vector, whether narrow lanes form vectors too, and the
    symbolic rules' memo for the kernel (what each node simplified to, as the pass before left it: a load's offsets
    are checked for contiguity with it, and are found there already simplified)."""

    nbytes: int
    simplified: dict[UOp, UOp] = field(default_factory=dict, compare=False)
    narrow: bool = False


def _fits(dt: DType, lanes: int, nbytes: int, half: bool = True) -> bool:
    """Whether `lanes` values of dt make one hardware vector of nbytes (bools: a mask of any lane width), or with
    `half`, half of one where that is still 16 bytes (AVX2's 128-bit halves: a row of 4 floats, 20 wide)."""
    if dt.scalar == dtypes.bool:
        return True
    size = dt.scalar.itemsize * lanes
    return dt.scalar in VECTOR_DTYPES and (size == nbytes or (half and 2 * size == nbytes and size >= 16))


def _narrow_fits(dt: DType, lanes: int, ctx: VectorTarget) -> bool:
    """Whether `lanes` narrow values make a vector of as many lanes as a float32 vector (or half of one)."""
    return ctx.narrow and dt.scalar in NARROW_DTYPES and _fits(dtypes.float32, lanes, ctx.nbytes)


def _converts(frm: DType, to: DType) -> bool:
    """The conversions narrow vectors take, each exact: narrow integers to float32 and to 32-bit integers (extended by
    their sign or by zeros, as C converts them), float16 to float32."""
    if frm.scalar == dtypes.float16:
        return to.scalar == dtypes.float32
    return frm.scalar in NARROW_DTYPES and to.scalar in (dtypes.float32, dtypes.int32, dtypes.uint32)


def _int_to_float(cast: UOp) -> bool:
    """int32 to float32, lane for lane as the scalar conversion (a quantized product's int32 sums, scaled)."""
    return cast.source.dtype.scalar == dtypes.int32 and cast.dtype.scalar == dtypes.float32


def _shifts_within(x: UOp) -> bool:
    """A shift whose amount is a constant below the lanes' width (no test for a shift past it in vector code)."""
    if x.op not in (Ops.SHR, Ops.SHL):
        return True
    amount = x.src[1]
    return amount.op is Ops.CONST and 0 <= amount.arg < x.dtype.scalar.bits


def _alike(lanes: tuple[UOp, ...]) -> bool:
    first = lanes[0]
    return all(s.op is first.op and s.dtype == first.dtype and s.arg == first.arg for s in lanes)


def _gather(dtype_of: UOp, lanes: list[UOp]) -> UOp:
    return UOp(Ops.VECTORIZE, dtype_of.dtype.vec(len(lanes)), tuple(lanes))


def _lanewise(vec: UOp) -> UOp:
    """VECTORIZE(f(a0, b0), f(a1, b1), ...) -> f(VECTORIZE(a0, a1, ...), VECTORIZE(b0, b1, ...))."""
    first = vec.src[0]
    return UOp(first.op, vec.dtype, tuple(_gather(x, [s.src[j] for s in vec.src]) for j, x in enumerate(first.src)))


def _push_down(vec: UOp, ctx: VectorTarget) -> UOp | None:
    """VECTORIZE(f(a0, b0), f(a1, b1), ...) -> f(VECTORIZE(a0, a1, ...), VECTORIZE(b0, b1, ...)) where f allows.
    Lanes of other widths than ctx's hardware vector stay scalars."""
    lanes, nbytes = vec.src, ctx.nbytes
    first = lanes[0]
    n = len(lanes)
    # comparisons and selects stay whole vectors: a mask is as wide as a hardware vector (the renderer's mask types)
    whole = first.op in (Ops.CMPLT, Ops.CMPNE, Ops.WHERE) or first.dtype.scalar == dtypes.bool
    if not _alike(lanes):
        return None
    if _narrow_fits(first.dtype, n, ctx) or (first.op is Ops.CAST and _converts(first.source.dtype, first.dtype)):
        return _push_narrow(vec, ctx)
    if not _fits(first.dtype, n, nbytes, not whole):
        return None
    if first.op is Ops.CONST:
        return UOp.const(vec.dtype, first.arg)  # one value in every lane
    if all(s is first for s in lanes):
        return None  # a broadcast of one value stays as it is
    # (shifts by constants and bit casts of same-sized lanes where narrow lanes are taken: a bfloat16's bits made a
    # float32's)
    exact_bits = ctx.narrow and (first.op is Ops.BITCAST or first.op in NARROW_ALU) and all(map(_shifts_within, lanes))
    # (DOT4 reaches here only where the renderer writes it: tiny.codegen.dot4; int32 -> float32 where lanes convert)
    lanewise = first.op in GroupOp.ByteDots or (ctx.narrow and first.op is Ops.CAST and _int_to_float(first))
    if first.op in VECTOR_ALU or first.op in (Ops.CMPLT, Ops.CMPNE, Ops.WHERE) or exact_bits or lanewise:
        if not all(_fits(x.dtype, n, nbytes, not whole) for x in first.src):
            return None
        return _lanewise(vec)
    if first.dtype == dtypes.bool:
        return None  # bools live in vectors as comparison masks, never in memory or accumulators
    if first.op is Ops.CAST and first.source.dtype == dtypes.bool and _fits(first.dtype, n, nbytes, False):
        # a mask as numbers (a comparison's 0 or 1, as max pooling's gradient counts its maxima): a select of 1 or 0
        mask = _gather(first.source, [s.source for s in lanes])
        return UOp(Ops.WHERE, vec.dtype, (mask, UOp.const(vec.dtype, 1), UOp.const(vec.dtype, 0)))
    if first.op is Ops.REDUCE and all(s.ranges == first.ranges for s in lanes) and first.arg in VECTOR_REDUCE:
        return UOp(Ops.REDUCE, vec.dtype, (_gather(first.value, [s.value for s in lanes]), *first.ranges), first.arg)
    if first.op is Ops.LOAD:
        return _vector_load(vec, lanes, ctx.simplified)
    if first.op is Ops.GEP and all(s.src[0] is first.src[0] and s.arg == i for i, s in enumerate(lanes)):
        return first.src[0] if first.src[0].dtype == vec.dtype else None
    return None


def _push_narrow(vec: UOp, ctx: VectorTarget) -> UOp | None:
    """The lanes of narrow vectors (RendererCaps.narrow_vectors): loads, bitwise ops and constant shifts on narrow
    integers, and their conversions to float32, where the float32 side fits a vector."""
    lanes, first, n = vec.src, vec.src[0], len(vec.src)
    if not ctx.narrow:
        return None
    if first.op is Ops.CONST:
        return UOp.const(vec.dtype, first.arg)  # one value in every lane
    if any(s is first for s in lanes[1:]):
        return None  # (a broadcast of one value stays as it is)
    if first.op is Ops.CAST:
        if not (_fits(first.dtype, n, ctx.nbytes) and _narrow_fits(first.source.dtype, n, ctx)):
            return None
        return UOp(Ops.CAST, vec.dtype, (_gather(first.source, [s.source for s in lanes]),))
    if first.op is Ops.LOAD:
        return _vector_load(vec, lanes, ctx.simplified)
    if first.op in NARROW_ALU and first.dtype.is_int and all(_shifts_within(s) for s in lanes):
        return _lanewise(vec)
    return None


def _vector_load(vec: UOp, lanes: tuple[UOp, ...], simplified: dict[UOp, UOp]) -> UOp | None:
    """Loads of consecutive addresses, gated alike and after the same barrier (local memory's partials), are one
    vector load, after that barrier too."""
    addrs = [s.address for s in lanes]
    first = addrs[0]
    if any(a.pointer is not first.pointer or a.gate is not first.gate for a in addrs):
        return None
    after = lanes[0].waits_for
    if any(s.waits_for != after for s in lanes) or not contiguous([a.offset for a in addrs], simplified):
        return None
    alt = () if first.gate is None else (_gather(lanes[0], [s.alternative for s in lanes]),)
    return UOp(Ops.LOAD, vec.dtype, (first,) + alt + after)


vectorize = PatternMatcher([(UPat(Ops.VECTORIZE, name="vec"), _push_down)], name="vectorize")
