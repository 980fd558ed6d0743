"""The device op set's validator on small linearized kernels written by hand, each listed in execution order."""

from __future__ import annotations

from typing import Any

import pytest

from tiny.ir.dtypes import DType, dtypes
from tiny.ir.spec import DEVICE_OPS, SpecError, validate
from tiny.ir.uop import GroupOp, Ops, UOp

i32, f32 = dtypes.int32, dtypes.float32
F32X4 = f32.vec(4)


def glob(i: int, dt: DType = f32, size: int = 4) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), i)


def const(v: Any, dt: DType = i32) -> UOp:
    return UOp.const(dt, v)


def index(buf: UOp, offset: UOp, gate: UOp | None = None) -> UOp:
    return UOp(Ops.INDEX, buf.dtype, (buf, offset) + ((gate,) if gate is not None else ()))


def load(idx: UOp, alt: UOp | None = None) -> UOp:
    return UOp(Ops.LOAD, idx.dtype.base, (idx,) + ((alt,) if alt is not None else ()))


def store(idx: UOp, value: UOp) -> UOp:
    return UOp(Ops.STORE, src=(idx, value))


def end(r: UOp) -> UOp:
    return UOp(Ops.ENDRANGE, src=(r,))


def elementwise_kernel() -> list[UOp]:
    """out[i] = in[i] * 2 for i in 0..3"""
    out, inp, n, two = glob(0), glob(1), const(4), const(2.0, f32)
    r = UOp.range(n, 0)
    src = index(inp, r)
    x = load(src)
    y = x * two
    dst = index(out, r)
    return [out, inp, n, two, r, src, x, y, dst, store(dst, y), end(r)]


def reduce_kernel() -> list[UOp]:
    """out[i] = sum_j in[i*8 + j], with the row offset computed outside the inner loop"""
    out, inp, four, eight, zero = glob(0, size=4), glob(1, size=32), const(4), const(8), const(0.0, f32)
    r0 = UOp.range(four, 0)
    row = r0 * eight
    acc = UOp(Ops.DEFINE_ACC, f32, (zero,), 0)
    r1 = UOp.range(eight, 1)
    at = row + r1
    src = index(inp, at)
    x = load(src)
    upd = acc + x
    assign = UOp(Ops.ASSIGN, f32, (acc, upd))
    dst = index(out, r0)
    setup = [out, inp, four, eight, zero, r0, row, acc, r1, at]
    return setup + [src, x, upd, assign, end(r1), dst, store(dst, assign), end(r0)]


def gated_kernel() -> list[UOp]:
    """out[i] = i >= 1 ? in[i-1] : 0, with an IF around a store and hardware indices"""
    out, inp = glob(0), glob(1)
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", 4))
    one, zero = const(1), const(0.0, f32)
    ok = const(0).lt(g)
    prev = g + const(-1)
    src = index(inp, prev, ok)
    x = load(src, zero)
    dst = index(out, g)
    cond = g.lt(const(4))
    iff = UOp(Ops.IF, src=(cond,))
    setup = [out, inp, g, one, zero, const(0), ok, const(-1), prev, src, x, dst]
    return setup + [const(4), cond, iff, store(dst, x), UOp(Ops.ENDIF, src=(iff,))]


def misc_kernel() -> list[UOp]:
    """Variables, casts, bitcasts, WHERE, vectors and lanes, local memory and a barrier."""
    out = glob(0, dtypes.int32, 8)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("n", 1, 8))
    local = UOp(Ops.DEFINE_LOCAL, f32.ptr(8, local=True), (), ("temp", 8))
    r = UOp.range(n, 0)
    f = r.cast(f32)
    lidx = index(local, r)
    st_local = store(lidx, f)
    bar = UOp(Ops.BARRIER, src=(st_local,))
    back = load(lidx)
    bits = back.bitcast(i32)
    vec = UOp(Ops.VECTORIZE, i32.vec(2), (bits, r))
    lane = UOp(Ops.GEP, i32, (vec,), 1)
    three = const(3)
    pick = r.lt(three).where(lane, bits)
    dst = index(out, r)
    setup = [out, n, local, r, f, lidx, st_local, bar, back, bits]
    return setup + [vec, lane, three, r.lt(three), pick, dst, store(dst, pick), end(r)]


@pytest.mark.parametrize("build", [elementwise_kernel, reduce_kernel, gated_kernel, misc_kernel])
def test_accepts_well_formed_kernels(build: Any) -> None:
    validate(build())


def test_accepts_an_empty_kernel() -> None:
    validate([])


def test_device_ops_are_the_kernel_level_ops() -> None:
    assert GroupOp.ALU <= DEVICE_OPS
    for op in (Ops.SINK, Ops.BUFFER, Ops.VIEW, Ops.REDUCE_AXIS, Ops.REDUCE, Ops.COPY, Ops.CONTIGUOUS, Ops.DEVICE):
        assert op not in DEVICE_OPS
    for op in GroupOp.Movement:
        assert op not in DEVICE_OPS
    assert isinstance(DEVICE_OPS, frozenset) and len(DEVICE_OPS) < 50


# ---------------------------------------------------------------- rejections


def rejects(uops: list[UOp], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        validate(uops)


def test_rejects_an_op_outside_the_device_op_set() -> None:
    uops = elementwise_kernel()
    x = uops[6]
    red = UOp(Ops.REDUCE, f32, (x, uops[4]), Ops.ADD)
    rejects(uops[:7] + [red], "REDUCE: not in the device op set")
    rejects([UOp(Ops.SINK)], "SINK: not in the device op set")
    assert issubclass(SpecError, ValueError)


def test_rejects_a_value_used_before_it_is_defined() -> None:
    uops = elementwise_kernel()
    swapped = uops[:6] + [uops[7], uops[6]] + uops[8:]  # the MUL before its LOAD
    rejects(swapped, "MUL: uses a LOAD that comes later or not at all")
    rejects(uops[1:], "INDEX: uses a DEFINE_GLOBAL")  # the output pointer never defined


def test_rejects_a_value_listed_twice() -> None:
    uops = elementwise_kernel()
    rejects(uops[:8] + [uops[7]] + uops[8:], "appears twice")


def test_rejects_mismatched_alu_dtypes() -> None:
    a, b = const(1), const(1.0, f32)
    rejects([a, b, UOp(Ops.ADD, i32, (a, b))], "operands must have the result's dtype")
    rejects([a, b, UOp(Ops.CMPLT, dtypes.bool, (a, b))], "share a dtype")
    rejects([a, UOp(Ops.CMPLT, i32, (a, a))], "a comparison gives bool")
    rejects([a, b, UOp(Ops.WHERE, f32, (a, b, b))], "condition must be bool")
    t = const(True, dtypes.bool)
    rejects([t, a, b, UOp(Ops.WHERE, f32, (t, a, b))], "both branches")
    rejects([b, UOp(Ops.IDIV, f32, (b, b))], "integer op on a non-integer dtype")
    rejects([b, UOp(Ops.SHL, f32, (b, b))], "integer op on a non-integer dtype")
    rejects([a, UOp(Ops.SQRT, i32, (a,))], "float op on a non-float dtype")
    rejects([a, UOp(Ops.FDIV, i32, (a, a))], "float op on a non-float dtype")


def test_rejects_an_unclosed_range() -> None:
    uops = elementwise_kernel()
    rejects(uops[:-1], "never closed")
    red = reduce_kernel()
    rejects([u for u in red if not (u.op is Ops.ENDRANGE and u.src[0].arg == 1)], "never closed|not innermost")


def test_rejects_loops_closed_out_of_order() -> None:
    n = const(4)
    r0, r1 = UOp.range(n, 0), UOp.range(n, 1)
    rejects([n, r0, r1, end(r0), end(r1)], "not innermost")
    rejects([n, r0, end(r0), end(r0)], "appears twice|not innermost")
    rejects([n, r0, end(r1)], "later or not at all|not innermost")


def test_rejects_a_gated_load_without_alternative() -> None:
    buf, i, t = glob(0), const(1), const(True, dtypes.bool)
    gated = index(buf, i, t)
    rejects([buf, i, t, gated, load(gated)], "a gated load needs an alternative")
    plain = index(buf, i)
    zero = const(0.0, f32)
    rejects([buf, i, plain, zero, load(plain, zero)], "a gated load needs an alternative")  # and no gate, no alt


def test_rejects_bad_pointers_and_indices() -> None:
    i = const(1)
    rejects([UOp(Ops.DEFINE_GLOBAL, f32, (), 0)], "bad global")
    rejects([UOp(Ops.DEFINE_GLOBAL, f32.ptr(4, local=True), (), 0)], "bad global")
    rejects([UOp(Ops.DEFINE_LOCAL, f32.ptr(4), (), ("temp", 4))], "local pointer")
    rejects([UOp(Ops.SPECIAL, i32, (), ("tid0", 4))], "bad index")
    rejects([UOp(Ops.SPECIAL, i32, (), ("gidx0", 0))], "bad index")
    buf, fi = glob(0), const(1.0, f32)
    rejects([buf, fi, UOp(Ops.INDEX, buf.dtype, (buf, fi))], "offset must be an integer")
    rejects([i, UOp(Ops.INDEX, f32.ptr(4), (i, i))], "indexes a non-pointer")
    rejects([buf, i, UOp(Ops.INDEX, buf.dtype, (buf, i, i))], "gate must be bool")
    rejects([buf, UOp(Ops.LOAD, f32, (buf,))], "loads from an INDEX")


def test_rejects_bad_accumulators_and_loops() -> None:
    z = const(0.0, f32)
    rejects([z, UOp(Ops.ASSIGN, f32, (z, z))], "assigns an accumulator")
    n = const(4.0, f32)
    rejects([n, UOp(Ops.RANGE, f32, (n,), 0), end(UOp(Ops.RANGE, f32, (n,), 0))], "a loop counts with an integer")


def test_the_error_names_the_op_and_its_sources() -> None:
    a, b = const(1), const(1.0, f32)
    with pytest.raises(SpecError) as info:
        validate([a, b, UOp(Ops.ADD, i32, (a, b))])
    text = str(info.value)
    assert text.startswith("ADD:") and "CONST" in text and "dtypes.int32" in text


def test_rejects_an_end_of_the_wrong_kind() -> None:
    n, two = const(4), const(2)
    r = UOp.range(n, 0)
    cond = r.lt(two)
    iff = UOp(Ops.IF, src=(cond,))
    rejects([n, r, two, cond, iff, end(iff), UOp(Ops.ENDIF, src=(r,))], "ENDRANGE")
    rejects([n, r, two, cond, iff, UOp(Ops.ENDIF, src=(r,)), end(iff)], "ENDIF")


def test_rejects_a_loop_value_used_after_the_loop() -> None:
    uops = elementwise_kernel()
    y, out = uops[7], uops[0]
    zero = const(0)
    after = index(out, zero)
    rejects(uops + [zero, after, store(after, y)], "loop")


def test_an_accumulator_is_read_after_its_loop() -> None:
    validate(reduce_kernel())  # the STORE after the inner loop reads the ASSIGN: the register outlives the loop


def _copy_kernel(
    dst_gate: bool = False, dt: DType = F32X4, to_global: bool = False, after: UOp | None = None
) -> list[UOp]:
    g = glob(0, f32, 16)
    tmp = UOp(Ops.DEFINE_LOCAL, f32.ptr(8, local=True), (), ("tmp", 8))
    off, valid = const(4), UOp.const(dtypes.bool, True)
    dst = index(glob(1, f32, 16) if to_global else tmp, off, valid if dst_gate else None)
    src = index(g, off, valid)
    copy = UOp(Ops.COPY_ASYNC, dt, (dst, src) + ((after,) if after is not None else ()))
    barrier = UOp(Ops.BARRIER, dtypes.void, (copy,), ("async", 0))
    return [u for u in UOp(Ops.SINK, dtypes.void, (barrier,)).toposort if u.op is not Ops.SINK]


def test_an_asynchronous_copy_goes_from_global_to_local_memory_in_4_8_or_16_bytes() -> None:
    validate(_copy_kernel())
    validate(_copy_kernel(dt=f32.vec(2)))
    for bad, why in [
        (_copy_kernel(dst_gate=True), "its local INDEX has no gate"),
        (_copy_kernel(dt=f32.vec(3)), "copies 4, 8 or 16 bytes"),
        (_copy_kernel(dt=dtypes.int32.vec(4)), "the pointers' element type"),
        (_copy_kernel(to_global=True), "from global memory into local memory"),
        (_copy_kernel(after=const(1)), "comes after a BARRIER or COPY_ASYNC"),
    ]:
        with pytest.raises(SpecError, match=why):
            validate(bad)
