"""The C renderer: its output compiles with the system C compiler (clang preferred, gcc otherwise) and, run through
ctypes, computes what NumPy does; constants are exact. Tests that need a compiler skip where there is none."""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
from functools import cache
from typing import Any

import numpy as np
import pytest
from kernel_helpers import (
    EXP2_INPUTS,
    NUMPY,
    Case,
    const,
    expand,
    kernel_uops,
    make_cases,
    move,
    reduce,
    renders_with,
    run_case,
    tensor,
)

from tiny.codegen.renderer.cstyle import CRenderer
from tiny.codegen.renderer.prefetch import AHEAD as PREFETCH_AHEAD
from tiny.ir.alu import exec_alu
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp

f32, i32 = dtypes.float32, dtypes.int32
R = CRenderer()
CASES = make_cases()


def compilers() -> list[str]:
    """The C compilers on PATH, as the CPU device would choose: the newest clang first, gcc last."""
    clangs = set()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if os.path.isdir(d):
            clangs |= {f for f in os.listdir(d) if re.fullmatch(r"clang(-\d+)?", f) and shutil.which(f)}
    newest_first = sorted(clangs, key=lambda c: int(c.split("-")[1]) if "-" in c else 0, reverse=True)
    return newest_first + (["gcc"] if shutil.which("gcc") else [])


def system_cc() -> str:
    ccs = compilers()
    if not ccs:
        pytest.skip("no C compiler (clang or gcc) on PATH")
    return ccs[0]


@cache
def compiles(cc: str, src: str) -> bool:
    r = subprocess.run([cc, "-c", "-x", "c", "-", "-o", os.devnull], input=src.encode(), capture_output=True)
    return r.returncode == 0


def cc_with(probe: str, what: str) -> str:
    """A compiler on PATH that accepts `probe`, or skip."""
    for cc in compilers():
        if compiles(cc, probe):
            return cc
    pytest.skip(f"no C compiler here has {what}")


HALF_PROBE = "_Float16 f(_Float16 a) { return a * (_Float16)2; }"


def clang_and_gcc() -> list[str]:
    """The compiler the CPU device would take, and gcc too where it is a different one: both must work."""
    return list(dict.fromkeys([system_cc(), *(cc for cc in compilers() if cc == "gcc")]))


def build(src: str, cc: str | None = None, flags: tuple[str, ...] = ("-O1",)) -> ctypes.CDLL:
    """Compile C source into a shared library, as the CPU device does, and load it."""
    cc = cc or system_cc()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernels.so")
        args = [cc, "-shared", "-fPIC", *flags, "-fwrapv", "-fno-math-errno", "-x", "c", "-", "-o", path, "-lm"]
        r = subprocess.run(args, input=src.encode(), capture_output=True)
        assert r.returncode == 0, f"{cc} failed:\n{r.stderr.decode()}\n--- source ---\n{src}"
        return ctypes.CDLL(path)  # loaded: the file may go


def render(ast: UOp, name: str | None = None) -> tuple[str, str]:
    kernel, uops = kernel_uops(ast, R.caps)
    return (name or kernel.name), R.render(name or kernel.name, uops)


def run_c(ast: UOp, buffers: list[np.ndarray], cc: str | None = None) -> None:
    name, src = render(ast)
    fn = getattr(build(src, cc), name)
    fn(*(ctypes.c_void_p(b.ctypes.data) for b in buffers))


# ---------------------------------------------------------------- whole kernels


@cache
def case_library() -> tuple[dict[UOp, ctypes.CDLL], dict[UOp, str]]:
    """Every kernel of every case, each under a name of its own: the kernels of plain C in one library (one
    compile), those with helpers (vector types, math through a vector function) each in its own, as the helpers of
    two kernels are defined in each."""
    names: dict[UOp, str] = {}
    plain, alone = [], {}
    for case in CASES:
        for item in create_schedule(case.targets).items:
            if item.ast not in names:  # identical kernels are one AST object
                names[item.ast] = f"kernel{len(names)}"
                src = render(item.ast, names[item.ast])[1]
                if src.startswith("void "):
                    plain.append((item.ast, src))
                else:
                    alone[item.ast] = build(src)
    lib = build("".join(src for _, src in plain))
    return {ast: lib for ast, _ in plain} | alone, names


def run_from_library(ast: UOp, buffers: list[np.ndarray]) -> None:
    libs, names = case_library()
    getattr(libs[ast], names[ast])(*(ctypes.c_void_p(b.ctypes.data) for b in buffers))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_compile_and_compute_what_numpy_does(case: Case) -> None:
    system_cc()
    got = run_case(case, run_from_library)
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


def test_rendered_text_reads_like_c() -> None:
    a, b = tensor(4, 4), tensor(4, 4)
    (item,) = create_schedule([a * b]).items
    name, src = render(item.ast)
    assert src.startswith(
        "void E_4_4(float* restrict data0, const float* restrict data1, const float* restrict data2) {"
    )
    assert "for (int ridx0 = 0; ridx0 < 16; ridx0++) {" in src  # (4 x 4 contiguous: one run, one loop)
    assert src.count("{") == src.count("}")
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (tensor(4, 8),), (Ops.ADD, (1,)))]).items
    _, src = render(item.ast)
    assert "float acc0 = 0.0f;" in src and "acc0 = (acc0+" in src


def test_integer_variables_come_after_the_buffers() -> None:
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(16), (), 0)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("n", 1, 16))
    r = UOp.range(n, 0)
    idx = UOp(Ops.INDEX, out.dtype, (out, r))
    value = r * n
    uops = [out, n, r, idx, value, UOp(Ops.STORE, src=(idx, value)), UOp(Ops.ENDRANGE, src=(r,))]
    src = R.render("with_var", uops)
    assert "void with_var(int* restrict data0, int n)" in src
    res = np.full(16, -1, np.int32)
    build(src).with_var(ctypes.c_void_p(res.ctypes.data), ctypes.c_int(5))
    np.testing.assert_array_equal(res, [0, 5, 10, 15, 20] + [-1] * 11)


def test_constant_offsets_are_added_in_64_bits() -> None:
    """out[r] = x[(r+1)+1] + x[(r+1)+-1]: the constant terms are added after widening, so clang folds them into the
    address instead of wrapping a 32-bit sum (-fwrapv) and sign-extending it at every access."""
    out, x = UOp(Ops.DEFINE_GLOBAL, f32.ptr(6), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.ptr(9), (), 1)
    six, one, minus = UOp.const(i32, 6), UOp.const(i32, 1), UOp.const(i32, -1)
    r = UOp.range(six, 0)
    i = r + one  # a shared index, used with two constants
    ahead, behind = i + one, i + minus
    loads = [UOp(Ops.LOAD, f32, (UOp(Ops.INDEX, x.dtype, (x, o)),)) for o in (ahead, behind)]
    value = loads[0] + loads[1]
    store_at = UOp(Ops.INDEX, out.dtype, (out, r))
    uops = [out, x, six, one, minus, r, i, ahead, behind, *(u.address for u in loads), *loads, value]
    uops += [store_at, UOp(Ops.STORE, src=(store_at, value)), UOp(Ops.ENDRANGE, src=(r,))]
    src = R.render("shifted", uops)
    assert "(data1+((long long)" in src and "+-1))" in src
    res, data = np.zeros(6, np.float32), (np.arange(9, dtype=np.float32) ** 2)
    build(src).shifted(ctypes.c_void_p(res.ctypes.data), ctypes.c_void_p(data.ctypes.data))
    np.testing.assert_array_equal(res, data[2:8] + data[0:6])


def test_unrolled_accumulators_take_their_terms_in_turns() -> None:
    """a += x0 + x1; b += x0*x0 + x1*x1; c += a + x0 over 4 steps: a and b are updated one term at a time,
    alternately (clang keeps a register tile's operands in registers that way); c reads a, so it waits for a."""
    outs = [UOp(Ops.DEFINE_GLOBAL, f32.ptr(1), (), i) for i in range(3)]
    x = UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 3)
    zero_f, zero_i, one, two, four = (UOp.const(f32, 0.0), *(UOp.const(i32, v) for v in (0, 1, 2, 4)))
    accs = [UOp(Ops.DEFINE_ACC, f32, (zero_f,), i) for i in range(3)]
    r = UOp.range(four, 0)
    at = [r * two, r * two + one]
    index = [UOp(Ops.INDEX, x.dtype, (x, i)) for i in at]
    x0, x1 = (UOp(Ops.LOAD, f32, (i,)) for i in index)
    squares = [x0 * x0, x1 * x1]
    a, b, c = accs[0] + x0 + x1, accs[1] + squares[0] + squares[1], accs[2] + accs[0] + x0
    assigns = [UOp(Ops.ASSIGN, f32, (acc, v)) for acc, v in zip(accs, (a, b, c))]
    uops = [*outs, x, zero_f, zero_i, one, two, four, *accs, r, *at, *index, x0, x1, *squares]
    uops += [a.src[0], a, assigns[0], b.src[0], b, assigns[1], c.src[0], c, assigns[2], UOp(Ops.ENDRANGE, src=(r,))]
    stores = [UOp(Ops.INDEX, o.dtype, (o, zero_i)) for o in outs]
    uops += [*stores, *(UOp(Ops.STORE, src=(i, v)) for i, v in zip(stores, assigns))]
    src = R.render("turns", uops)
    updates = [line.strip() for line in src.splitlines() if re.match(r"acc\d+ = (\(acc|tiny_fma_)", line.strip())]
    assert [u.split(" ")[0] for u in updates] == ["acc0", "acc1", "acc0", "acc1", "acc2", "acc2"], updates
    res, data = [np.zeros(1, np.float32) for _ in range(3)], np.arange(1, 9, dtype=np.float32)
    build(src).turns(*(ctypes.c_void_p(v.ctypes.data) for v in (*res, data)))
    want = [0.0, 0.0, 0.0]
    for step in range(4):
        x0v, x1v = data[2 * step], data[2 * step + 1]
        want[0] += x0v + x1v
        want[1] += x0v * x0v + x1v * x1v
        want[2] += want[0] + x0v
    np.testing.assert_allclose([v[0] for v in res], want)


# ---------------------------------------------------------------- constants

CONST_TEXT = [
    (math.inf, f32, "__builtin_inff()"),
    (-math.inf, f32, "-__builtin_inff()"),
    (-0.0, f32, "-0.0f"),
    (0.1, dtypes.float64, "0.1"),
    (-(2**63), dtypes.int64, "(-9223372036854775807ll-1)"),
    (-(2**31), i32, "(-2147483647-1)"),
    (2**64 - 1, dtypes.uint64, "18446744073709551615ull"),
    (2**32 - 1, dtypes.uint32, "4294967295u"),
    (-128, dtypes.int8, "((signed char)-128)"),
    (1.5, dtypes.float16, "((_Float16)1.5f)"),
    (True, dtypes.bool, "1"),
]


@pytest.mark.parametrize("value, dtype, text", CONST_TEXT)
def test_constant_text(value: Any, dtype: DType, text: str) -> None:
    assert R.const(value, dtype) == text
    assert "nan" in R.const(math.nan, f32)


CONSTANTS = [
    (f32, v)
    for v in (math.inf, -math.inf, math.nan, -0.0, 0.0, 1e-45, 3.4028234663852886e38, 0.1, -1 / 3, 16777216.0)
] + [
    (dtypes.float64, v) for v in (-0.0, math.nan, 5e-324, 1.7976931348623157e308, 0.1, -math.inf)
] + [
    (dtypes.int64, -(2**63)), (dtypes.int64, 2**63 - 1), (dtypes.uint64, 2**64 - 1), (i32, -(2**31)),
    (i32, 2**31 - 1), (dtypes.uint32, 2**32 - 1), (dtypes.int8, -128), (dtypes.uint8, 255), (dtypes.int16, -32768),
    (dtypes.uint16, 65535), (dtypes.bool, True), (dtypes.bool, False),
]  # fmt: skip


def _store_const_kernel(name: str, dtype: DType, value: Any) -> str:
    out = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(1), (), 0)
    zero = UOp.const(i32, 0)
    idx = UOp(Ops.INDEX, out.dtype, (out, zero))
    c = UOp.const(dtype, value)
    return R.render(name, [out, zero, idx, c, UOp(Ops.STORE, src=(idx, c))])


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return math.isnan(got)
    if isinstance(want, float):
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    return got == want


def test_constants_reach_memory_exactly() -> None:
    src = "".join(_store_const_kernel(f"const{i}", dt, v) for i, (dt, v) in enumerate(CONSTANTS))
    lib = build(src)
    for i, (dt, v) in enumerate(CONSTANTS):
        out = np.zeros(1, NUMPY[dt.name])
        getattr(lib, f"const{i}")(ctypes.c_void_p(out.ctypes.data))
        want = truncate(dt, v)
        assert _same(out[0].item(), want), (dt, v, out[0])


def test_random_float_constants_are_exact() -> None:
    rng = np.random.default_rng(5)
    values = [float(np.float32(v)) for v in rng.standard_normal(50) * 10.0 ** rng.integers(-30, 30, 50)]
    src = "".join(_store_const_kernel(f"rc{i}", f32, v) for i, v in enumerate(values))
    lib = build(src)
    for i, v in enumerate(values):
        out = np.zeros(1, np.float32)
        getattr(lib, f"rc{i}")(ctypes.c_void_p(out.ctypes.data))
        assert out[0] == np.float32(v)


def test_half_constants_through_casts() -> None:
    cc = cc_with(HALF_PROBE, "_Float16")
    values = [65504.0, -math.inf, math.nan, -0.0, 6e-8, 0.1, 1.5]
    src = "".join(_store_const_kernel(f"h{i}", dtypes.float16, v) for i, v in enumerate(values))
    lib = build(src, cc)
    for i, v in enumerate(values):
        out = np.zeros(1, np.float16)
        getattr(lib, f"h{i}")(ctypes.c_void_p(out.ctypes.data))
        assert _same(float(out[0]), truncate(dtypes.float16, v)), (v, out[0])


def test_half_arithmetic() -> None:
    cc = cc_with(HALF_PROBE, "_Float16")
    a, b = tensor(8, dtype=dtypes.float16), tensor(8, dtype=dtypes.float16)
    av = np.linspace(-3, 3, 8).astype(np.float16)
    bv = np.linspace(0.5, 100, 8).astype(np.float16)
    case = Case("half", [a * b + a], {a.src[0]: av, b.src[0]: bv}, [av * bv + av])
    (got,) = run_case(case, lambda ast, bufs: run_c(ast, bufs, cc))
    np.testing.assert_allclose(got.astype(np.float32), (av * bv + av).astype(np.float32), rtol=1e-3)


# ---------------------------------------------------------------- ALU edge cases, against exec_alu


def _binary_kernel(name: str, op: Ops, dtype: DType, n: int) -> str:
    out, a, b = (UOp(Ops.DEFINE_GLOBAL, (dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype).ptr(n), (), 0),
                 UOp(Ops.DEFINE_GLOBAL, dtype.ptr(n), (), 1), UOp(Ops.DEFINE_GLOBAL, dtype.ptr(n), (), 2))  # fmt: skip
    r = UOp.range(UOp.const(i32, n), 0)
    ia, ib, io = (UOp(Ops.INDEX, g.dtype, (g, r)) for g in (a, b, out))
    la, lb = UOp(Ops.LOAD, dtype, (ia,)), UOp(Ops.LOAD, dtype, (ib,))
    value = la.alu(op, lb)
    uops = [out, a, b, UOp.const(i32, n), r, ia, ib, io, la, lb, value, UOp(Ops.STORE, src=(io, value))]
    return R.render(name, uops + [UOp(Ops.ENDRANGE, src=(r,))])


EDGE = [
    (Ops.MAX, f32, [1.0, math.nan, -0.0, math.inf, 2.0], [math.nan, 1.0, 0.0, -math.inf, 3.0]),
    (Ops.IDIV, i32, [7, -7, 7, -7, 5, -(2**31), 0], [2, 2, -2, -2, 0, 3, 0]),
    (Ops.MOD, i32, [7, -7, 7, -7, 5, -(2**31), 0], [2, 2, -2, -2, 0, 3, 0]),
    (Ops.IDIV, dtypes.uint8, [255, 7, 0, 200], [2, 0, 3, 255]),
    (Ops.MAX, i32, [-(2**31), 5, -1], [2**31 - 1, -5, -1]),
    (Ops.ADD, dtypes.int8, [127, -128, 100], [1, -1, 100]),  # wraps
    (Ops.MUL, dtypes.uint16, [65535, 300, 2], [65535, 300, 3]),
    (Ops.CMPLT, f32, [1.0, math.nan, -0.0], [2.0, 1.0, 0.0]),
    (Ops.CMPNE, f32, [math.nan, -0.0, 1.0], [math.nan, 0.0, 2.0]),
    (Ops.SHL, dtypes.uint32, [1, 3, 0xFFFFFFFF], [31, 4, 1]),
    (Ops.SHR, i32, [-8, 64, 2**31 - 1], [1, 3, 30]),
    (Ops.FDIV, f32, [1.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 7.0]),
]


@cache
def edge_library() -> ctypes.CDLL:
    return build("".join(_binary_kernel(f"binary{i}", op, dt, len(xs)) for i, (op, dt, xs, _) in enumerate(EDGE)))


@pytest.mark.parametrize("i", range(len(EDGE)), ids=[f"{op.name}-{dt.name}" for op, dt, _, _ in EDGE])
def test_alu_edge_cases_match_exec_alu(i: int) -> None:
    op, dtype, xs, ys = EDGE[i]
    n = len(xs)
    a, b = np.array(xs, NUMPY[dtype.name]), np.array(ys, NUMPY[dtype.name])
    out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    out = np.zeros(n, NUMPY[out_dtype.name])
    system_cc()
    getattr(edge_library(), f"binary{i}")(*(ctypes.c_void_p(x.ctypes.data) for x in (out, a, b)))
    for i in range(n):
        want = exec_alu(op, out_dtype, (a[i].item(), b[i].item()))
        assert _same(out[i].item(), want), (op, dtype, xs[i], ys[i], out[i], want)


def _cast_kernel(name: str, src_dtype: DType, dst: DType, n: int) -> str:
    out, inp = UOp(Ops.DEFINE_GLOBAL, dst.ptr(n), (), 0), UOp(Ops.DEFINE_GLOBAL, src_dtype.ptr(n), (), 1)
    r = UOp.range(UOp.const(i32, n), 0)
    io, ii = UOp(Ops.INDEX, out.dtype, (out, r)), UOp(Ops.INDEX, inp.dtype, (inp, r))
    x = UOp(Ops.LOAD, src_dtype, (ii,))
    c = x.cast(dst)
    uops = [out, inp, UOp.const(i32, n), r, io, ii, x, c, UOp(Ops.STORE, src=(io, c)), UOp(Ops.ENDRANGE, src=(r,))]
    return R.render(name, uops)


def _run_cast(dst: DType, values: list[float]) -> tuple[list, list]:
    xs = np.array(values, np.float32)
    out = np.zeros(len(xs), NUMPY[dst.name])
    lib = build(_cast_kernel("cast", f32, dst, len(xs)))
    lib.cast(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(xs.ctypes.data))
    return [v.item() for v in out], [truncate(dst, float(v)) for v in xs]


@pytest.mark.parametrize("dst", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint32, dtypes.int32, dtypes.int64])
def test_float_to_int_casts_in_range_go_toward_zero(dst: DType) -> None:
    got, want = _run_cast(dst, [-1.5, -0.7, 0.0, 0.99, 100.7, 127.0])
    if dst.is_unsigned:  # a negative float to an unsigned type: only -0.7 -> 0 is defined in C
        got, want = got[1:], want[1:]
    assert got == want


@pytest.mark.parametrize("dst", [dtypes.int32, dtypes.int64])
def test_float_to_int_casts_out_of_range_follow_the_spec(dst: DType) -> None:
    got, want = _run_cast(dst, [3e9, -3e9, 1e19, math.nan, math.inf, -math.inf])
    assert got == want


# ---------------------------------------------------------------- bfloat16, emulated in float registers


@pytest.mark.parametrize("which", [0, 1], ids=["first", "gcc"])
def test_bfloat16_kernels_round_after_each_op(which: int) -> None:
    ccs = clang_and_gcc()
    if which >= len(ccs):
        pytest.skip("no second compiler")
    cc = ccs[which]
    a, b = tensor(6, dtype=dtypes.bfloat16), tensor(6, dtype=dtypes.bfloat16)
    xs = [1.0, 1.0078125, -2.5, 3.0e38, 1e-39, 100.0]
    ys = [0.00390625, 0.001, 2.5, 3.0e38, 1e-39, -0.3]
    (item,) = create_schedule([a * b + a]).items
    bits = [np.array([float_to_bf16(truncate(dtypes.bfloat16, v)) for v in vs], np.uint16) for vs in (xs, ys)]
    out = np.zeros(6, np.uint16)
    run_c(item.ast, [out, *bits], cc)
    for i in range(6):
        x, y = (bf16_to_float(int(v[i])) for v in bits)
        want = truncate(dtypes.bfloat16, truncate(dtypes.bfloat16, x * y) + x)
        assert _same(bf16_to_float(int(out[i])), want), (x, y, bf16_to_float(int(out[i])), want)


def test_bitcast_kernels() -> None:
    a = tensor(4)
    out = UOp(Ops.BITCAST, dtypes.uint32, (a,))
    (item,) = create_schedule([out]).items
    av = np.array([1.0, -0.0, math.inf, 0.1], np.float32)
    for cc in clang_and_gcc():
        res = np.zeros(4, np.uint32)
        run_c(item.ast, [res, av], cc)
        assert list(res) == [struct.unpack("I", struct.pack("f", float(v)))[0] for v in av], cc


def test_bitcast_kernels_compile_with_gcc() -> None:
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    a = tensor(4)
    (item,) = create_schedule([UOp(Ops.BITCAST, dtypes.uint32, (a,))]).items
    _, src = render(item.ast)
    assert compiles("gcc", src)


# ---------------------------------------------------------------- long expressions


def test_a_long_elementwise_chain_compiles_with_clang() -> None:
    clangs = [cc for cc in compilers() if cc.startswith("clang")]
    if not clangs:
        pytest.skip("no clang")
    g0, g1 = UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 1)
    r = UOp.range(UOp.const(i32, 4), 0)
    i0, i1 = UOp(Ops.INDEX, g0.dtype, (g0, r)), UOp(Ops.INDEX, g1.dtype, (g1, r))
    x = UOp(Ops.LOAD, f32, (i1,))
    uops = [g0, g1, UOp.const(i32, 4), r, i0, i1, x]
    for k in range(300):
        c = UOp.const(f32, 1.0 + k / 1000)
        x = x * c if k % 2 else x + c
        uops += [c, x]
    uops += [UOp(Ops.STORE, src=(i0, x)), UOp(Ops.ENDRANGE, src=(r,))]
    assert compiles(clangs[0], R.render("chain", uops))


def test_a_constant_tensor_kernel() -> None:
    (item,) = create_schedule([const(2.5, (3,))]).items
    out = np.zeros(3, np.float32)
    run_c(item.ast, [out])
    np.testing.assert_array_equal(out, [2.5, 2.5, 2.5])


def test_a_sum_of_1000_tensors_compiles_and_runs() -> None:
    xs = [tensor(4) for _ in range(1000)]
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    (item,) = create_schedule([total]).items
    inputs = [np.full(4, i, np.float32) for i in range(1000)]
    for cc in clang_and_gcc():
        out = np.zeros(4, np.float32)
        run_c(item.ast, [out, *inputs], cc)
        np.testing.assert_array_equal(out, np.full(4, sum(range(1000)), np.float32), err_msg=cc)


# ---------------------------------------------------------------- vector math


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_vector_exp2_is_within_2_ulp_of_numpy(lanes: int) -> None:
    """The C renderer's float32 vector exp2 (a polynomial in the vector unit, not libm's or libmvec's call), built
    as the CPU device builds kernels (-O2 -march=native, fused multiply-adds) and at -O1 without them, by clang and
    gcc: within 2 ulp of NumPy's float64 exp2 rounded to float32, subnormal results included; exact at 0 and
    inf; NaN for NaN."""
    v = f32.vec(lanes)
    t = R.vector_type_name(v)
    src = R.vector_typedef(v) + R.vector_prelude(v)
    assert "_ZGV" not in src and "__builtin_exp2f" not in src.split(f"tiny_vexp2_{t}")[1].split("}")[0]
    src += (
        f"void exp2s(float* out, const float* x, int n) {{\n"
        f"  for (int i = 0; i < n; i += {lanes}) tiny_vstore_{t}(out + i, tiny_vexp2_{t}(tiny_vload_{t}(x + i)));\n}}\n"
    )
    x = np.concatenate([EXP2_INPUTS, np.zeros(-len(EXP2_INPUTS) % lanes, np.float32)])
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    native = ("-O2", "-march=native", "-ffp-contract=fast") if os.uname().machine == "x86_64" else ("-O2",)
    for cc in clang_and_gcc():
        for flags in (native, ("-O1", "-ffp-contract=off")):
            got = np.zeros_like(x)
            lib = build(src, cc, flags)
            lib.exp2s(ctypes.c_void_p(got.ctypes.data), ctypes.c_void_p(x.ctypes.data), ctypes.c_int(len(x)))
            what = f"{cc} {' '.join(flags)}"
            np.testing.assert_array_equal(np.isnan(got), np.isnan(x), err_msg=what)
            exact = np.isnan(want) | np.isinf(want) | (want == 0) | (x == 0)
            np.testing.assert_array_equal(got[exact & ~np.isnan(x)], want[exact & ~np.isnan(x)], err_msg=what)
            ulps = np.abs(got[~exact].astype(np.float64) - want[~exact]) / np.spacing(np.abs(want[~exact]))
            assert ulps.max() <= 2, f"{what}: {ulps.max()} ulp at x = {x[~exact][ulps.argmax()]!r}"


@pytest.mark.parametrize("lanes", [1, 4, 8, 16])
def test_an_accumulators_multiply_add_is_fused_by_each_compiler(lanes: int) -> None:
    """tiny_fma (an accumulator's update, exp2's polynomial) under the CPU's -ffp-contract=off: one rounding with
    clang (its pragma) and with gcc (which ignores the pragma: an fma per lane, made one vector instruction) where
    the host's fma is fast, so the two compilers' kernels round alike; a * a - b with a = 1 + 2^-12, b = 1 + 2^-11 is
    2^-24 fused and 0 in two roundings. A product and an add outside it stay two roundings."""
    if os.uname().machine != "x86_64":
        pytest.skip("the -march=native build of an x86-64 host's fma")
    v = f32.vec(lanes) if lanes > 1 else f32
    t = R.vector_type_name(v) if lanes > 1 else "float"
    src = (R.vector_typedef(v) + R.vector_prelude(v)) if lanes > 1 else R.multiply_add_helper(v)
    src += (
        f"void fused(float* out, const float* a, const float* c) {{\n  {t} x, y;\n"
        f"  __builtin_memcpy(&x, a, sizeof x); __builtin_memcpy(&y, c, sizeof y);\n"
        f"  {t} r = tiny_fma_{t}(x, x, y), s = x * x + y;\n"
        f"  __builtin_memcpy(out, &r, sizeof r); __builtin_memcpy(out + {lanes}, &s, sizeof s);\n}}\n"
    )
    a = np.full(lanes, 1 + 2.0**-12, np.float32)
    c = np.full(lanes, -(1 + 2.0**-11), np.float32)
    for cc in clang_and_gcc():
        macros = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True)
        if b"__FP_FAST_FMAF" not in macros.stdout:
            continue
        out = np.zeros(2 * lanes, np.float32)
        lib = build(src, cc, ("-O2", "-march=native", "-ffp-contract=off"))
        lib.fused(*(ctypes.c_void_p(x.ctypes.data) for x in (out, a, c)))
        np.testing.assert_array_equal(out[:lanes], np.full(lanes, 2.0**-24, np.float32), err_msg=f"{cc}: fused")
        np.testing.assert_array_equal(out[lanes:], np.zeros(lanes, np.float32), err_msg=f"{cc}: not fused")


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16])
def test_narrow_vectors_load_shift_and_convert_with_each_compiler(dtype: DType) -> None:
    """Narrow lanes (RendererCaps.narrow_vectors): 8 values loaded as one vector, their low and high halves taken by
    constant shifts and masks and combined (integers), converted to float32 by __builtin_convertvector (a GNU C cast
    of a vector would reinterpret its bits) and summed against float32 rows; clang and gcc compute NumPy's values."""
    from kernel_helpers import expand, move, reduce, vector_uops

    from tiny.codegen.opt import Opt, OptOps

    r = CRenderer("x86_64;vector_width=8;threads=1;f16")
    rows, k = 4, 64
    w, x = tensor(rows, k, dtype=dtype), tensor(1, k)
    if dtype == dtypes.float16:
        wv = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float16)
        field = w
    else:
        info = np.iinfo(dtype.name)
        wv = np.random.default_rng(1).integers(info.min, info.max, (rows, k), endpoint=True).astype(dtype.name)
        half = dtype.itemsize * 4
        mask = const((1 << half) - 1, (rows, k), dtype)
        high = UOp(Ops.SHR, dtype, (w, const(half, (rows, k), dtype)))
        field = UOp(Ops.XOR, dtype, (UOp(Ops.AND, dtype, (w, mask)), UOp(Ops.AND, dtype, (high, mask))))
    values = UOp(Ops.CAST, dtypes.float32, (field,)) * expand(x, (rows, k))
    ast = create_schedule([move(Ops.RESHAPE, reduce(values, (1,)), (rows,))]).items[-1].ast
    uops = vector_uops(ast, r.caps, [Opt(OptOps.UNROLL, 1, 8)])
    casts = [u for u in uops if u.op is Ops.CAST and u.dtype.count == 8]
    assert casts and casts[0].src[0].dtype == dtype.vec(8), "one conversion a vector of 8 narrow lanes"
    assert not any(u.op is Ops.VECTORIZE and u.dtype.scalar == dtype for u in uops), "no lanes gathered one by one"
    src = r.render("narrow", uops)
    assert "__builtin_convertvector" in src
    xv = np.random.default_rng(2).standard_normal((1, k)).astype(np.float32)
    if dtype == dtypes.float16:
        want = wv.astype(np.float64) @ xv[0].astype(np.float64)
    else:
        half, m = dtype.itemsize * 4, (1 << dtype.itemsize * 4) - 1
        fields = (wv & m) ^ ((wv >> half) & m)
        want = fields.astype(np.float64) @ xv[0].astype(np.float64)
    for cc in clang_and_gcc():
        if dtype == dtypes.float16 and not compiles(cc, HALF_PROBE):
            continue
        out = np.zeros(rows, np.float32)
        lib = build(src, cc, ("-O2", "-mavx2", "-mf16c"))
        lib.narrow(*(ctypes.c_void_p(b.ctypes.data) for b in (out, wv, xv)))  # (data1 the weight, data2 x)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4, err_msg=cc)


# ---------------------------------------------------------------- prefetches for streams of memory

AVX512 = CRenderer("x86_64;vector_width=16;threads=2;f16")


def _rendered(target: UOp) -> str:
    """The C of every kernel the target is scheduled as."""
    return "".join(renders_with(AVX512)(item.ast)[0] for item in create_schedule([target]).items)


def _matvec(rows: int, k: int) -> UOp:
    w, x = tensor(rows, k, dtype=dtypes.float16), tensor(1, k)
    return reduce(UOp(Ops.CAST, f32, (w,)) * expand(x, (rows, k)), (1,))


def test_a_matrix_vector_product_prefetches_its_rows_ahead() -> None:
    """Rows of a 1 MB float16 matrix read side by side in the loop over k: each row's stream asks for its line
    PREFETCH_AHEAD bytes on (the hardware's prefetcher alone read such a product at 33 GB/s, with these at 46); the
    vector, read again for every row, is not prefetched."""
    src = _rendered(_matvec(1024, 512))
    prefetched = re.findall(r"__builtin_prefetch\(\((data\d)\+[^;]*\)\+(\d+), 0, 3\);", src)
    (matrix,) = re.findall(r"const _Float16\* restrict (data\d)", src)
    assert len(prefetched) >= 2 and {buf for buf, _ in prefetched} == {matrix}, src
    assert {int(ahead) for _, ahead in prefetched} == {PREFETCH_AHEAD // 2}  # (elements of float16)


def test_the_targets_prefetch_locality_is_the_hint_of_every_prefetch() -> None:
    """The CPU device's target names how its host's prefetches treat their lines (tiny.runtime.cpu.locality_for: 0,
    non-temporal, on AMD's CPUs; 3 elsewhere, where non-temporal streams read at a third of the speed): each prefetch
    of a kernel is rendered with it; a hint out of 0-3 is refused, naming the target."""
    for hint in (0, 1, 3):
        r = CRenderer(f"x86_64;vector_width=16;threads=2;prefetch_locality={hint};f16")
        src = "".join(renders_with(r)(item.ast)[0] for item in create_schedule([_matvec(1024, 512)]).items)
        hints = re.findall(r"__builtin_prefetch\([^;]*, 0, (\d)\);", src)
        assert len(hints) >= 2 and set(hints) == {str(hint)}, src
    with pytest.raises(ValueError, match=r"prefetch_locality must be 0 to 3, got 4 in the target 'x86_64;.*"):
        CRenderer("x86_64;vector_width=16;threads=2;prefetch_locality=4;f16")


def test_no_prefetch_for_one_stream_data_read_again_or_small_buffers() -> None:
    """A sum reads one stream (the hardware prefetches it as fast), a matrix product and a product of a matrix with
    8 vectors read their data again from the caches, and a small matrix stays in them: none of them prefetches."""
    assert "__builtin_prefetch" not in _rendered(reduce(tensor(1 << 20), (0,)))
    n = 512
    a, b = tensor(n, n), tensor(n, n)
    prod = expand(move(Ops.RESHAPE, a, (n, 1, n)), (n, n, n)) * expand(
        move(Ops.RESHAPE, move(Ops.PERMUTE, b, (1, 0)), (1, n, n)), (n, n, n)
    )
    assert "__builtin_prefetch" not in _rendered(reduce(prod, (2,)))
    w, x, full = tensor(1024, 512, dtype=dtypes.float16), tensor(8, 512), (8, 1024, 512)
    rows = expand(move(Ops.RESHAPE, UOp(Ops.CAST, f32, (w,)), (1, 1024, 512)), full)
    eight = reduce(rows * expand(move(Ops.RESHAPE, x, (8, 1, 512)), full), (2,))  # (the matrix read for each row)
    assert "__builtin_prefetch" not in _rendered(eight)
    assert "__builtin_prefetch" not in _rendered(_matvec(128, 512))  # (128 KB: the kernel of the 1 MB one)
