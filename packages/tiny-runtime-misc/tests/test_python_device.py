"""The PYTHON device on linearized kernels written by hand: each test lists its UOps in execution order."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest

from tiny.ir.alu import exec_alu
from tiny.ir.device import Buffer, CompiledProgram, CompileError, Device, load_renderer
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.spec import validate
from tiny.ir.uop import GroupOp, Ops, UOp
from tiny.runtime.python import (
    PythonAllocator,
    PythonCompiler,
    PythonDevice,
    PythonProgram,
    PythonRenderer,
    parse,
)

DEV = PythonDevice("PYTHON")
i32, f32 = dtypes.int32, dtypes.float32

# ---------------------------------------------------------------- building kernels


def glob(i: int, dt: DType, size: int = -1) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), i)


def const(value: Any, dt: DType = i32) -> UOp:
    return UOp.const(dt, value)


def special(name: str, n: int) -> UOp:
    return UOp(Ops.SPECIAL, i32, (), (name, n))


def index(ptr: UOp, offset: UOp, gate: UOp | None = None) -> UOp:
    return UOp(Ops.INDEX, ptr.dtype, (ptr, offset) if gate is None else (ptr, offset, gate))


def load(idx: UOp, dt: DType | None = None, alt: UOp | None = None) -> UOp:
    return UOp(Ops.LOAD, dt or dtypes.from_name(idx.pointer.dtype.name), (idx,) if alt is None else (idx, alt))


def store(idx: UOp, value: UOp) -> UOp:
    return UOp(Ops.STORE, dtypes.void, (idx, value))


def straight(*stores: UOp) -> list[UOp]:
    """A kernel without loops or ifs: every UOp the stores need, each after its sources."""
    return [u for u in UOp(Ops.SINK, dtypes.void, stores).toposort if u.op is not Ops.SINK]


def pack(dt: DType, values: list) -> bytearray:
    if dt == dtypes.bfloat16:
        return bytearray(struct.pack(f"{len(values)}H", *(float_to_bf16(v) for v in values)))
    return bytearray(struct.pack(f"{len(values)}{dt.fmt}", *values))


def unpack(dt: DType, buf: bytearray) -> list:
    if dt == dtypes.bfloat16:
        return [bf16_to_float(b) for b in struct.unpack(f"{len(buf) // 2}H", buf)]
    return list(struct.unpack(f"{len(buf) // dt.itemsize}{dt.fmt}", buf))


def run(uops: list[UOp], *bufs: bytearray, name: str = "test_kernel", **launch: Any) -> float:
    """Check the kernel, render it, compile it and launch it; returns the seconds it took."""
    validate(uops)
    src = PythonRenderer().render(name, uops)
    assert parse(src) == (name, uops)
    return PythonProgram(DEV, name, PythonCompiler().compile(src))(*bufs, wait=True, **launch)


# ---------------------------------------------------------------- threads and indices


def test_elementwise_with_special_indices() -> None:
    out, a = glob(0, f32, 12), glob(1, f32, 12)
    gx, gy, lx = special("gidx0", 3), special("gidx1", 2), special("lidx0", 2)
    i = (gy * 3 + gx) * 2 + lx
    value = load(index(a, i)) * 2.0 + gy.cast(f32)
    ob, ab = pack(f32, [0.0] * 12), pack(f32, [float(v) for v in range(12)])
    run(straight(store(index(out, i), value)), ob, ab, global_size=(3, 2, 1), local_size=(2, 1, 1))
    assert unpack(f32, ob) == [2.0 * v + (v // 6) for v in range(12)]


def test_every_hardware_index_dimension() -> None:
    """Each thread writes its six indices, as decimal digits, at its own place."""
    gx, gy, gz = special("gidx0", 2), special("gidx1", 3), special("gidx2", 2)
    lx, ly, lz = special("lidx0", 2), special("lidx1", 2), special("lidx2", 2)
    place = ((((gz * 3 + gy) * 2 + gx) * 2 + lz) * 2 + ly) * 2 + lx
    digits = gx + gy * 10 + gz * 100 + lx * 1000 + ly * 10000 + lz * 100000
    ob = pack(i32, [-1] * 96)
    run(straight(store(index(glob(0, i32, 96), place), digits)), ob, global_size=(2, 3, 2), local_size=(2, 2, 2))
    expected = [
        x + 10 * y + 100 * z + 1000 * a + 10000 * b + 100000 * c
        for z in range(2)
        for y in range(3)
        for x in range(2)
        for c in range(2)
        for b in range(2)
        for a in range(2)
    ]
    assert unpack(i32, ob) == expected


def test_hardware_index_counts_past_its_declared_size_is_refused() -> None:
    out = glob(0, i32, 8)
    g = special("gidx0", 4)
    with pytest.raises(ValueError, match="gidx0 counts to 4, launched with 8"):
        run(straight(store(index(out, g), g)), pack(i32, [0] * 8), global_size=(8, 1, 1))


def test_wait_returns_seconds_and_an_empty_launch_runs_nothing() -> None:
    out = glob(0, i32, 4)
    g = special("gidx0", 4)
    ob = pack(i32, [7] * 4)
    assert run(straight(store(index(out, g), g + 1)), ob, global_size=(0, 1, 1)) >= 0.0
    assert unpack(i32, ob) == [7] * 4


# ---------------------------------------------------------------- loops and accumulators


def _sum_kernel(init: float) -> list[UOp]:
    """out[g] = init + sum of a[g*5 + j] for j < n, n a variable in [0, 5]."""
    out, a, n = glob(0, f32, 4), glob(1, f32, 20), UOp(Ops.DEFINE_VAR, i32, (), ("n", 0, 5))
    g, five, start = special("gidx0", 4), const(5), const(init, f32)
    row = g * five
    acc = UOp(Ops.DEFINE_ACC, f32, (start,), 0)
    r = UOp.range(n, 0)
    at = row + r
    x = load(index(a, at))
    total = acc + x
    assign = UOp(Ops.ASSIGN, f32, (acc, total))
    end = UOp(Ops.ENDRANGE, dtypes.void, (r,))
    out_at = index(out, g)
    return [out, a, n, g, five, row, start, acc, r, at, x.address, x, total, assign, end, out_at, store(out_at, assign)]


@pytest.mark.parametrize("n", [0, 1, 5])
def test_reduce_loop_with_accumulator(n: int) -> None:
    a = [float(v) for v in range(20)]
    ob = pack(f32, [0.0] * 4)
    run(_sum_kernel(10.0), ob, pack(f32, a), global_size=(4, 1, 1), vals=(n,))
    assert unpack(f32, ob) == [10.0 + sum(a[g * 5 : g * 5 + n]) for g in range(4)]


def test_accumulator_is_set_again_where_it_stands_inside_an_outer_loop() -> None:
    """A 3x2 @ 2x4 matmul: one thread per row; the column loop holds the accumulator and the k loop."""
    out, a, b = glob(0, f32, 12), glob(1, f32, 6), glob(2, f32, 8)
    row, zero, two, four = special("gidx0", 3), const(0.0, f32), const(2), const(4)
    col = UOp.range(four, 0)
    acc = UOp(Ops.DEFINE_ACC, f32, (zero,), 0)
    k = UOp.range(two, 1)
    a_at, b_at = row * two + k, k * four + col
    x, y = load(index(a, a_at)), load(index(b, b_at))
    prod = x * y
    total = acc + prod
    assign = UOp(Ops.ASSIGN, f32, (acc, total))
    end_k = UOp(Ops.ENDRANGE, dtypes.void, (k,))
    out_at = index(out, row * four + col)
    uops = [out, a, b, row, zero, two, four, col, acc, k, a_at.src[0], a_at, x.address, x, b_at.src[0], b_at]
    uops += [y.address, y, prod, total, assign, end_k, out_at.offset.src[0], out_at.offset, out_at]
    uops += [store(out_at, assign), UOp(Ops.ENDRANGE, dtypes.void, (col,))]
    am, bm = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 0.0, 2.0, -1.0, 0.5, 1.0, 0.0, 3.0]
    ob = pack(f32, [0.0] * 12)
    run(uops, ob, pack(f32, am), pack(f32, bm), global_size=(3, 1, 1))
    expected = [sum(am[r * 2 + k] * bm[k * 4 + c] for k in range(2)) for r in range(3) for c in range(4)]
    assert unpack(f32, ob) == expected


def test_loop_end_must_be_the_same_on_every_thread() -> None:
    out, g = glob(0, i32, 4), special("gidx0", 4)
    end = g + 1
    r = UOp.range(end, 0)
    at = index(out, g)
    uops = [out, g, end.src[1], end, r, at, store(at, r), UOp(Ops.ENDRANGE, dtypes.void, (r,))]
    with pytest.raises(RuntimeError, match="loop's end differs between threads"):
        run(uops, pack(i32, [0] * 4), global_size=(4, 1, 1))


# ---------------------------------------------------------------- gates, bounds and ifs


def test_gated_load_gives_the_alternative_and_reads_nothing_out_of_range() -> None:
    out, a = glob(0, f32, 8), glob(1, f32, 4)
    g = special("gidx0", 8)
    ahead, behind = g + 3, g + (-100)
    near = load(index(a, ahead, ahead.lt(4)), alt=const(-1.0, f32))
    far = load(index(a, behind, behind.ne(behind)), alt=const(0.5, f32))  # the gate is never true
    ob = pack(f32, [0.0] * 8)
    run(straight(store(index(out, g), near + far)), ob, pack(f32, [10.0, 11.0, 12.0, 13.0]), global_size=(8, 1, 1))
    assert unpack(f32, ob) == [13.5] + [-0.5] * 7


def test_gated_store_writes_only_where_the_gate_holds() -> None:
    out = glob(0, i32, 6)
    g = special("gidx0", 6)
    every_third = (g % 3).ne(0).ne(True)
    out_of_range = g + 100
    ob = pack(i32, [7] * 6)
    kernel = straight(
        store(index(out, g, every_third), g * 10),
        store(index(out, out_of_range, out_of_range.lt(6)), g),  # never stored, never out of bounds
    )
    run(kernel, ob, global_size=(6, 1, 1))
    assert unpack(i32, ob) == [0, 7, 7, 30, 7, 7]


def test_ungated_out_of_bounds_access_raises_naming_kernel_and_buffer() -> None:
    out, a = glob(0, f32, 4), glob(1, f32, 4)
    g = special("gidx0", 4)
    kernel = straight(store(index(out, g), load(index(a, g + 1))))
    with pytest.raises(IndexError, match=r"kernel r_oob: LOAD .* element 4 of buffer 1 \(float32\).*gidx=\(3, 0, 0\)"):
        run(kernel, pack(f32, [0.0] * 4), pack(f32, [0.0] * 4), name="r_oob", global_size=(4, 1, 1))
    with pytest.raises(IndexError, match="kernel r_neg: STORE .* element -1 of buffer 0"):
        run(straight(store(index(out, g + (-1)), const(1.0, f32))), pack(f32, [0.0] * 4), name="r_neg")
    past_declared = load(index(glob(1, f32, 2), g))  # the pointer's size bounds it, not the buffer's
    with pytest.raises(IndexError, match="element 2 of buffer 1 \\(float32\\), which holds 2 elements"):
        run(straight(store(index(out, g), past_declared)), pack(f32, [0.0] * 4), pack(f32, [0.0] * 4), global_size=(4,))
    gate_true = load(index(a, g + 4, g.lt(100)), alt=const(0.0, f32))  # a true gate does not excuse it
    with pytest.raises(IndexError, match="element 4 of buffer 1"):
        run(straight(store(index(out, g), gate_true)), pack(f32, [0.0] * 4), pack(f32, [0.0] * 4))


def test_if_runs_its_block_only_where_the_condition_holds() -> None:
    out = glob(0, i32, 8)
    g, lx = special("gidx0", 2), special("lidx0", 4)
    i = g * 4 + lx
    cond = lx.lt(2)
    branch = UOp(Ops.IF, dtypes.void, (cond,))
    at = index(out, i)
    never = index(out, i + 1000)
    nothing = UOp(Ops.IF, dtypes.void, (g.lt(0),))
    uops = [out, g, lx, i.src[0].src[1], i.src[0], i, cond.src[1], cond, branch, at, store(at, i)]
    uops += [UOp(Ops.ENDIF, dtypes.void, (branch,)), const(0), g.lt(0), nothing, const(1000), i + 1000, never]
    uops += [store(never, i), UOp(Ops.ENDIF, dtypes.void, (nothing,))]  # no thread enters: no access at all
    ob = pack(i32, [-1] * 8)
    run(uops, ob, global_size=(2, 1, 1), local_size=(4, 1, 1))
    assert unpack(i32, ob) == [0, 1, -1, -1, 4, 5, -1, -1]


def test_assign_inside_an_if_changes_only_the_threads_inside() -> None:
    """out[g] = number of j < 4 with j < g, counted with an accumulator updated under an IF."""
    out, g, zero, one, four = glob(0, i32, 6), special("gidx0", 6), const(0), const(1), const(4)
    acc = UOp(Ops.DEFINE_ACC, i32, (zero,), 0)
    j = UOp.range(four, 0)
    cond = j.lt(g)
    branch = UOp(Ops.IF, dtypes.void, (cond,))
    bumped = acc + one
    assign = UOp(Ops.ASSIGN, i32, (acc, bumped))
    at = index(out, g)
    uops = [out, g, zero, one, four, acc, j, cond, branch, bumped, assign, UOp(Ops.ENDIF, dtypes.void, (branch,))]
    uops += [UOp(Ops.ENDRANGE, dtypes.void, (j,)), at, store(at, assign)]
    ob = pack(i32, [-1] * 6)
    run(uops, ob, global_size=(6, 1, 1))
    assert unpack(i32, ob) == [0, 1, 2, 3, 4, 4]


# ---------------------------------------------------------------- local memory


def test_local_memory_reverses_each_workgroup() -> None:
    out, a = glob(0, f32, 12), glob(1, f32, 12)
    tmp = UOp(Ops.DEFINE_LOCAL, f32.ptr(4, local=True), (), ("tmp", 4))
    g, lx, three = special("gidx0", 3), special("lidx0", 4), const(3)
    i = g * 4 + lx
    put = store(index(tmp, lx), load(index(a, i)))
    barrier = UOp(Ops.BARRIER, dtypes.void, (put,))
    mirror = three + (-lx)
    got = load(index(tmp, mirror))
    prefix = [out, a, tmp, g, lx, i.src[0].src[1], i.src[0], i, index(a, i), put.value, index(tmp, lx), put, barrier]
    uops = prefix + [three, mirror.src[1], mirror, got.address, got, index(out, i)]
    uops.append(store(index(out, i), got))
    ob = pack(f32, [0.0] * 12)
    run(uops, ob, pack(f32, [float(v) for v in range(12)]), global_size=(3, 1, 1), local_size=(4, 1, 1))
    assert unpack(f32, ob) == [3.0, 2.0, 1.0, 0.0, 7.0, 6.0, 5.0, 4.0, 11.0, 10.0, 9.0, 8.0]


@pytest.mark.parametrize("wait", [("async", 0), None])
def test_asynchronous_copies_land_at_the_barrier_that_waits_for_them(wait: tuple[str, int] | None) -> None:
    """Two threads copy 16 bytes each into local memory (the second's gate is false: zeros); a read before the
    barrier "async" sees what was there before, a read after it the copies. A plain barrier lands nothing."""
    out, a = glob(0, f32, 16), glob(1, f32, 8)
    tmp = UOp(Ops.DEFINE_LOCAL, f32.ptr(8, local=True), (), ("tmp", 8))
    lx = special("lidx0", 2)
    at = lx * 4
    copy = UOp(Ops.COPY_ASYNC, f32.vec(4), (index(tmp, at), index(a, at + 2, lx.lt(const(1)))))
    early = UOp(Ops.LOAD, f32.vec(4), (index(tmp, at), copy))
    barrier = UOp(Ops.BARRIER, dtypes.void, (copy,), wait)
    late = UOp(Ops.LOAD, f32.vec(4), (index(tmp, at), barrier))
    uops = straight(store(index(out, at), early), store(index(out, at + 8), late))
    ob = pack(f32, [-1.0] * 16)
    run(uops, ob, pack(f32, [float(v) for v in range(8)]), local_size=(2, 1, 1))
    landed = [2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0] if wait == ("async", 0) else [0.0] * 8
    assert unpack(f32, ob) == [0.0] * 8 + landed


def test_a_barrier_leaves_its_latest_groups_of_copies_in_flight() -> None:
    """BARRIER ("async", 1): the copies since the last such barrier are a group, and all but the newest group land.
    The first barrier lands nothing (its one group is the newest); the second lands the first group, not the second;
    a third, ("async", 0), lands the rest. Each read (in this order) stores 4 values of local memory."""
    out, a = glob(0, f32, 16), glob(1, f32, 8)
    tmp = UOp(Ops.DEFINE_LOCAL, f32.ptr(8, local=True), (), ("tmp", 8))
    first = UOp(Ops.COPY_ASYNC, f32.vec(4), (index(tmp, const(0)), index(a, const(0))))
    one = UOp(Ops.BARRIER, dtypes.void, (first,), ("async", 1))
    second = UOp(Ops.COPY_ASYNC, f32.vec(4), (index(tmp, const(4)), index(a, const(4)), one))
    two = UOp(Ops.BARRIER, dtypes.void, (second,), ("async", 1))
    three = UOp(Ops.BARRIER, dtypes.void, (two,), ("async", 0))
    uops: list[UOp] = []
    for i, (at, after) in enumerate(((0, one), (0, two), (4, two), (4, three))):
        read = UOp(Ops.LOAD, f32.vec(4), (index(tmp, const(at)), after))
        uops += [u for u in straight(store(index(out, const(4 * i)), read)) if u not in uops]
    ob = pack(f32, [-1.0] * 16)
    run(uops, ob, pack(f32, [float(v) for v in range(1, 9)]), local_size=(1, 1, 1))
    assert unpack(f32, ob) == [0.0] * 4 + [1.0, 2.0, 3.0, 4.0] + [0.0] * 4 + [5.0, 6.0, 7.0, 8.0]


def test_local_memory_out_of_bounds_raises() -> None:
    tmp = UOp(Ops.DEFINE_LOCAL, f32.ptr(4, local=True), (), ("tmp", 4))
    lx = special("lidx0", 8)
    with pytest.raises(IndexError, match="element 4 of local memory 'tmp'"):
        run(straight(store(index(tmp, lx), const(1.0, f32))), local_size=(8, 1, 1))


# ---------------------------------------------------------------- ALU ops against exec_alu

_FLOATS = [0.0, -0.0, 1.5, -2.25, 3.0, 0.1, 1000.0, -7.0, math.inf, -math.inf, math.nan, 2.0**-20, 0.75, 5.0]
_SIGNED = [0, 1, -1, 5, -7, 100, 3, -128, 127, 2, -3, 9, 64, 33]
_UNSIGNED = [0, 1, 5, 7, 100, 3, 255, 2, 9, 64, 33, 128, 6, 4]


def _values(dt: DType, op: Ops) -> list:
    if dt.is_bool:
        return [False, True, True, False, True, False, False, True, True, True, False, False, True, False]
    base = _FLOATS if dt.is_float else _UNSIGNED if dt.is_unsigned else _SIGNED
    extremes = [] if dt.is_float else [dt.min, dt.max]
    return [truncate(dt, v) for v in base + extremes]


def _operands(op: Ops, dt: DType) -> list[list]:
    a = _values(dt, op)
    if op in (Ops.SHL, Ops.SHR):
        shifts = [0, 1, 3, 7, dt.bits - 1, dt.bits, 2, 5, 4, 1, 0, 6, 3, 2, 8, 1]
        return [a, [shifts[i] for i in range(len(a))]]
    b = a[3:] + a[:3]
    if op is Ops.WHERE:
        return [[bool(i % 3) for i in range(len(a))], a, b]
    return [a, b][: 1 if op in GroupOp.Unary else 2]


_INTS = [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint64]
_FLOAT_DTYPES = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
_FLOAT_ONLY = {Ops.FDIV, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}
_INT_ONLY = {Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR}
_BITS = {Ops.AND, Ops.OR, Ops.XOR}


def _alu_cases() -> list[tuple[Ops, DType]]:
    cases = []
    for op in sorted(GroupOp.ALU, key=lambda o: o.name):
        if op in GroupOp.ByteDots:  # (int32s of four bytes each)
            cases += [(op, dtypes.int32)]
        elif op in _FLOAT_ONLY:
            cases += [(op, dt) for dt in _FLOAT_DTYPES]
        elif op in _INT_ONLY:
            cases += [(op, dt) for dt in _INTS]
        elif op in _BITS:
            cases += [(op, dt) for dt in [*_INTS, dtypes.bool]]
        else:
            cases += [(op, dt) for dt in [*_INTS, *_FLOAT_DTYPES, dtypes.bool]]
    return cases


@pytest.mark.parametrize("op,dt", _alu_cases(), ids=lambda x: getattr(x, "name", str(x)))
def test_alu_op_matches_exec_alu(op: Ops, dt: DType) -> None:
    operands = _operands(op, dt)
    n = len(operands[0])
    out_dt = dtypes.bool if op in GroupOp.Comparison else dt
    g = special("gidx0", n)
    in_dts = [dtypes.bool, dt, dt] if op is Ops.WHERE else [dt] * len(operands)
    loaded = [load(index(glob(k + 1, d, n), g)) for k, d in enumerate(in_dts)]
    result = UOp(op, out_dt, tuple(loaded))
    ob = pack(out_dt, [truncate(out_dt, 0)] * n)
    bufs = [pack(d, vs) for d, vs in zip(in_dts, operands)]
    run(straight(store(index(glob(0, out_dt, n), g), result)), ob, *bufs, global_size=(n, 1, 1))
    expected = [exec_alu(op, out_dt, xs) for xs in zip(*operands)]
    assert ob == pack(out_dt, expected), (unpack(out_dt, ob), expected)


@pytest.mark.parametrize(
    "op,dt,a,b,expected",
    [
        (Ops.IDIV, dtypes.int32, -7, 2, -3),  # toward zero, as C
        (Ops.MOD, dtypes.int32, -7, 2, -1),  # sign of the dividend
        (Ops.ADD, dtypes.int8, 127, 1, -128),  # wraps
        (Ops.ADD, dtypes.uint8, 0, 255, 255),
        (Ops.MUL, dtypes.uint64, 2**63, 2, 0),
        (Ops.SHR, dtypes.int16, -8, 1, -4),  # arithmetic shift
        (Ops.ADD, dtypes.float32, 0.1, 0.2, struct.unpack("f", struct.pack("f", 0.1 + 0.2))[0]),
        (Ops.MAX, dtypes.float32, math.nan, 1.0, math.nan),
        (Ops.CMPLT, dtypes.uint32, 1, 4294967295, True),
    ],
)
def test_alu_known_values(op: Ops, dt: DType, a: Any, b: Any, expected: Any) -> None:
    out_dt = dtypes.bool if op in GroupOp.Comparison else dt
    x, y = load(index(glob(1, dt, 1), const(0))), load(index(glob(2, dt, 1), const(0)))
    ob = pack(out_dt, [truncate(out_dt, 0)])
    run(straight(store(index(glob(0, out_dt, 1), const(0)), UOp(op, out_dt, (x, y)))), ob, pack(dt, [a]), pack(dt, [b]))
    (got,) = unpack(out_dt, ob)
    assert (
        (math.isnan(got) and math.isnan(expected))
        if isinstance(expected, float) and expected != expected
        else (got == expected and type(got) is type(expected))
    )


# ---------------------------------------------------------------- dtypes in memory, casts and bitcasts

_ROUND_TRIP = {
    dtypes.float16: [0.0, -0.0, 1.0, 65504.0, -65504.0, 2.0**-24, math.inf, -math.inf, 0.333251953125],
    dtypes.bfloat16: [0.0, -0.0, 1.0, 3.3895313892515355e38, 2.0**-133, -math.inf, 0.333984375, -2.5],
    dtypes.bool: [True, False, True, True, False],
    dtypes.int8: [-128, 127, 0, -1, 5],
    dtypes.uint64: [0, 2**64 - 1, 2**63, 1, 12345678901234567890],
    dtypes.int16: [-32768, 32767, -2],
    dtypes.float64: [1e308, -5e-324, math.pi],
}


@pytest.mark.parametrize("dt", list(_ROUND_TRIP), ids=lambda d: d.name)
def test_load_store_round_trip(dt: DType) -> None:
    values = _ROUND_TRIP[dt]
    n = len(values)
    g = special("gidx0", n)
    src = pack(dt, values)
    ob = bytearray(len(src))
    run(straight(store(index(glob(0, dt, n), g), load(index(glob(1, dt, n), g)))), ob, src, global_size=(n, 1, 1))
    assert ob == src


def test_half_and_bfloat16_values_are_read_as_their_numbers() -> None:
    halves, bf16 = [1.0, -0.5, 65504.0, 2.0**-24], [1.0, -2.5, 0.333984375, 3.3895313892515355e38]
    g = special("gidx0", 4)
    wide = load(index(glob(1, dtypes.float16, 4), g)).cast(dtypes.float64)
    wide2 = load(index(glob(2, dtypes.bfloat16, 4), g)).cast(dtypes.float64)
    ob, ob2 = pack(dtypes.float64, [0.0] * 4), pack(dtypes.float64, [0.0] * 4)
    kernel = straight(
        store(index(glob(0, dtypes.float64, 4), g), wide), store(index(glob(3, dtypes.float64, 4), g), wide2)
    )
    run(kernel, ob, pack(dtypes.float16, halves), pack(dtypes.bfloat16, bf16), ob2, global_size=(4, 1, 1))
    assert unpack(dtypes.float64, ob) == halves and unpack(dtypes.float64, ob2) == bf16


@pytest.mark.parametrize(
    "src_dt,dst_dt,values,expected",
    [
        (f32, i32, [-2.75, 2.75, math.nan, -0.0], [-2, 2, -(2**31), 0]),  # NaN does not fit: the minimum
        (i32, dtypes.bool, [0, 3, -1, 0], [False, True, True, False]),
        (dtypes.bool, f32, [True, False], [1.0, 0.0]),
        (f32, dtypes.float16, [0.1, 70000.0, -1e-8], [0.0999755859375, math.inf, -0.0]),
        (f32, dtypes.bfloat16, [0.1, -3.0, 1.00390625], [bf16_to_float(float_to_bf16(0.1)), -3.0, 1.0]),
        (dtypes.int64, dtypes.uint8, [256 + 7, -1], [7, 255]),
    ],
)
def test_cast(src_dt: DType, dst_dt: DType, values: list, expected: list) -> None:
    n = len(values)
    g = special("gidx0", n)
    ob = pack(dst_dt, [truncate(dst_dt, 0)] * n)
    cast = load(index(glob(1, src_dt, n), g)).cast(dst_dt)
    run(straight(store(index(glob(0, dst_dt, n), g), cast)), ob, pack(src_dt, values), global_size=(n, 1, 1))
    assert unpack(dst_dt, ob) == expected


@pytest.mark.parametrize(
    "src_dt,dst_dt,values,expected",
    [
        (f32, i32, [1.0, -0.0, math.inf, -2.5], [0x3F800000, -(2**31), 0x7F800000, -1071644672]),
        (i32, f32, [0x3F800000, -(2**31), 1, 0x7F800000], [1.0, -0.0, 2.0**-149, math.inf]),
        (dtypes.bfloat16, dtypes.int16, [1.0, -2.0], [0x3F80, -16384]),
        (dtypes.uint16, dtypes.float16, [0x3C00, 0x8001], [1.0, -(2.0**-24)]),
    ],
)
def test_bitcast_reinterprets_bits(src_dt: DType, dst_dt: DType, values: list, expected: list) -> None:
    n = len(values)
    g = special("gidx0", n)
    ob = pack(dst_dt, [truncate(dst_dt, 0)] * n)
    bits = load(index(glob(1, src_dt, n), g)).bitcast(dst_dt)
    run(straight(store(index(glob(0, dst_dt, n), g), bits)), ob, pack(src_dt, values), global_size=(n, 1, 1))
    assert unpack(dst_dt, ob) == expected


def test_vectors_load_gep_vectorize_math_and_store() -> None:
    """Each thread loads a float32x4, reverses it, adds [10, 20, 30, 40] and stores it through a vector pointer."""
    v4 = f32.vec(4)
    out, a = glob(0, v4, 2), glob(1, f32, 8)
    g = special("gidx0", 2)
    at = g * 4
    vec = load(index(a, at), v4)
    lanes = [UOp(Ops.GEP, f32, (vec,), i) for i in (3, 2, 1, 0)]
    reversed_ = UOp(Ops.VECTORIZE, v4, tuple(lanes))
    tens = UOp(Ops.CONST, v4, (), (10.0, 20.0, 30.0, 40.0))
    total = reversed_ + tens
    ob = pack(f32, [0.0] * 8)
    run(straight(store(index(out, g), total)), ob, pack(f32, [float(v) for v in range(8)]), global_size=(2, 1, 1))
    assert unpack(f32, ob) == [13.0, 22.0, 31.0, 40.0, 17.0, 26.0, 35.0, 44.0]


# ---------------------------------------------------------------- variables


def test_define_var_arguments_in_order_of_appearance() -> None:
    out, a = glob(0, i32, 4), glob(1, i32, 4)
    m, k = UOp(Ops.DEFINE_VAR, i32, (), ("m", 0, 10)), UOp(Ops.DEFINE_VAR, i32, (), ("k", -5, 5))
    g = special("gidx0", 4)
    value = load(index(a, g)) * m + k
    kernel = [out, a, m, k, *[u for u in straight(store(index(out, g), value)) if u not in (out, a, m, k)]]
    assert kernel.index(m) < kernel.index(k)
    ob = pack(i32, [0] * 4)
    run(kernel, ob, pack(i32, [1, 2, 3, 4]), global_size=(4, 1, 1), vals=(3, -5))
    assert unpack(i32, ob) == [-2, 1, 4, 7]
    with pytest.raises(ValueError, match=r"variable m=11 is not in \[0, 10\]"):
        run(kernel, ob, pack(i32, [1, 2, 3, 4]), global_size=(4, 1, 1), vals=(11, 0))
    with pytest.raises(ValueError, match="takes the variables"):
        run(kernel, ob, pack(i32, [1, 2, 3, 4]), global_size=(4, 1, 1), vals=(1,))


# ---------------------------------------------------------------- text form, compiler and device


def test_render_then_compile_gives_back_the_same_program() -> None:
    out = glob(0, f32, 4)
    tmp = UOp(Ops.DEFINE_LOCAL, f32.vec(2).ptr(8, local=True), (), ("tmp'\"", 8))
    g = special("gidx0", 4)
    consts = [const(v, f32) for v in (math.inf, -math.inf, math.nan, -0.0, 1e-45, 0.1)]
    r = UOp.range(const(3), 7)
    odd = UOp(Ops.CONST, dtypes.bool, (), True)
    branch = UOp(Ops.IF, dtypes.void, (odd,))
    pair = UOp(Ops.VECTORIZE, f32.vec(2), (consts[0], consts[1]))
    uops = [out, tmp, g, *consts, const(3), r, odd, branch, pair, index(tmp, r), store(index(tmp, r), pair)]
    uops += [UOp(Ops.ENDIF, dtypes.void, (branch,)), UOp(Ops.ENDRANGE, dtypes.void, (r,))]
    total = consts[3] + consts[4]
    uops += [total, index(out, g), store(index(out, g), total)]
    validate(uops)
    src = PythonRenderer().render("r_round_trip", uops)
    assert parse(src) == ("r_round_trip", uops)
    assert all(a is b for a, b in zip(parse(src)[1], uops))  # the very same (hash-consed) UOps
    assert "%1 = DEFINE_LOCAL ptr<float32x2,8,local> arg=('tmp\\'\"', 8)" in src
    assert "= CONST float32 arg=-inf" in src and "= CONST float32 arg=nan" in src
    assert "ADD float32 (%6, %7)" in src
    assert "\n    %15 = STORE void (%14, %13)\n" in src  # indented inside the loop and the if
    assert PythonCompiler().compile(src) == src.encode()
    ob = pack(f32, [0.0] * 4)
    run(uops, ob, global_size=(4, 1, 1))
    assert unpack(f32, ob) == [2.0**-149] * 4


@pytest.mark.parametrize(
    "src,message",
    [
        ("%0 = CONST int32 arg=1\n%1 = ADD int32 (%0, %5)\n", "line 2: source '%5'"),
        ("%0 = CONST int33 arg=1\n", "unknown dtype"),
        ("%0 = FROB int32 arg=1\n", "unknown op FROB"),
        ("%0 = CONST int32 arg=1 +\n", "line 1"),
        ("%0 = CONST int32 arg=foo\n", "unknown name 'foo'"),
        ("this is not a kernel\n", "expected `%i = OP"),
        ("%0 = CONST int32 arg=1\n%0 = CONST int32 arg=2\n", "defined twice"),
        ("%0 = CONST int32 arg=1\n%1 = CONST float32 arg=1.0\n%2 = ADD int32 (%0, %1)\n", "operands must have"),
        ("%0 = CONST int32 arg=4\n%1 = RANGE int32 (%0) arg=0\n", "never closed"),
        ("%0 = CONST float32 arg=1.0\n%1 = WMMA float32 (%0, %0, %0) arg='m16n8k16'\n", "names a tensor core"),
        (
            "%0 = DEFINE_GLOBAL ptr<float32> arg=0\n%1 = CONST int32 arg=0\n%2 = INDEX ptr<float32> (%0, %1)\n"
            "%3 = LOAD int32 (%2)\n",
            "element type",
        ),
    ],
)
def test_compile_errors(src: str, message: str) -> None:
    with pytest.raises(CompileError, match=message.replace("(", r"\(").replace("+", r"\+")):
        PythonCompiler().compile(src)


def test_renderer_refuses_args_it_cannot_write_back() -> None:
    with pytest.raises(ValueError, match="only literal args"):
        PythonRenderer().render("k", [UOp(Ops.CONST, i32, (), frozenset({1}))])


def test_allocator_is_host_memory() -> None:
    alloc = PythonAllocator()
    assert alloc.caps.host_visible
    mem = alloc.alloc(8)
    alloc.copyin(mem, memoryview(struct.pack("2i", 5, -6)))
    view = alloc.as_memoryview(mem, 8)
    view[0] = 9  # the same memory, not a copy
    back = memoryview(bytearray(8))
    alloc.copyout(back, mem)
    assert struct.unpack("2i", back) == (9, -6)
    alloc.free(mem, 8)
    assert alloc.alloc(8) is mem  # kept and handed out again


def test_device_opens_through_its_entry_point_and_runs_a_kernel() -> None:
    dev = Device["PYTHON"]
    assert isinstance(dev, PythonDevice) and dev.priority < 0
    assert isinstance(dev.renderer, PythonRenderer) and load_renderer("PYTHON") is PythonRenderer
    assert dev.renderer.caps.language == "PYTHON" and dev.renderer.caps.dtypes == frozenset(dtypes.all())
    out, a = Buffer("PYTHON", 4, f32), Buffer("PYTHON", 4, f32)
    a.copyin(memoryview(pack(f32, [1.0, 2.0, 3.0, 4.0])))
    g = special("gidx0", 4)
    src = dev.renderer.render("E_4", straight(store(index(glob(0, f32, 4), g), load(index(glob(1, f32, 4), g)) * 3.0)))
    program = CompiledProgram("E_4", "PYTHON", "PYTHON", src, dev.compile(src), 2, (0,), (), (4, 1, 1))
    dev.load(program)(out.opaque, a.opaque, global_size=program.global_size)
    assert unpack(f32, bytearray(out.as_bytes())) == [3.0, 6.0, 9.0, 12.0]


def test_kernel_text_parses_on_many_threads_while_finalizers_run() -> None:
    """Kernels compile on several threads at once (tiny.codegen.get_programs). CPython 3.11's AST constructor counts
    its recursion per interpreter: a finalizer that lets go of the interpreter lock inside one thread's parse let
    another thread parse, and every parse after raised SystemError (a burst of failures in a long test run). The
    PYTHON device's text parser holds a lock around the AST."""
    import gc
    import threading
    import time

    from tiny.runtime.python_text import _parse_arg

    class Churn:  # garbage in a cycle, whose finalizer switches threads when the collector runs it
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            time.sleep(0)

    errors: list[str] = []
    text = "((1, 2.5, 'x', (3, inf)), nan, (4, (5, (6, 7))))"

    def work() -> None:
        try:
            for _ in range(3000):
                Churn(), Churn()
                _parse_arg(text)
        except Exception as e:  # noqa: BLE001  (what the race raised: collected and shown)
            errors.append(repr(e))

    old = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old)
    assert errors == []
    value = _parse_arg(text)
    assert value[0] == (1, 2.5, "x", (3, float("inf"))) and value[1] != value[1] and value[2] == (4, (5, (6, 7)))
