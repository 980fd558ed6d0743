"""The LLVM IR renderer: its output parses and verifies with llvmlite and, compiled for the host and called through
ctypes, computes what NumPy and tiny.ir.alu say: whole kernels, every cast between dtypes, the ALU's edge cases,
exact constants, emulated bfloat16, vectors, gated loads, IF blocks and the CPU thread argument. Skips where
llvmlite is not installed."""

from __future__ import annotations

import ctypes
import math
import re
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
    reduce,
    renders_with,
    run_case,
    tensor,
)

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import lower
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.amdgpu import AMDGPURenderer
from tiny.codegen.renderer.llvmir import LLVMRenderer
from tiny.codegen.vectorize import VectorTarget, vectorize
from tiny.ir.alu import exec_alu
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.spec import validate
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp

llvm = pytest.importorskip("llvmlite.binding", reason="llvmlite is not installed (pip install llvmlite)")

f32, i32 = dtypes.float32, dtypes.int32
R = LLVMRenderer()
CASES = make_cases()


def target_machine() -> Any:
    """A new one each time: an execution engine frees the target machine it is given."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=2, jit=True)


_engines: list[Any] = []  # the compiled code lives as long as its engine


def verified(src: str) -> Any:
    """The module parsed and verified: what the CPU device's compiler does first."""
    mod = llvm.parse_assembly(src)
    mod.verify()
    return mod


def jit(src: str, name: str) -> Any:
    """Compile the IR at O2 for this host and return function `name`, to be called with ctypes arguments."""
    tm = target_machine()
    mod = verified(src)
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    passes = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    passes.getModulePassManager().run(mod, passes)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    _engines.append(engine)
    return ctypes.CFUNCTYPE(None)(engine.get_function_address(name))


def render(ast: UOp, caps: RendererCaps = R.caps) -> tuple[str, str]:
    kernel, uops = kernel_uops(ast, caps)
    return kernel.name, R.render(kernel.name, uops)


def run_llvm(ast: UOp, buffers: list[np.ndarray]) -> None:
    name, src = render(ast)
    jit(src, name)(*(ctypes.c_void_p(b.ctypes.data) for b in buffers))


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return math.isnan(got)
    if isinstance(want, float):
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    return got == want


# ---------------------------------------------------------------- whole kernels


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_verify_compile_and_compute_what_numpy_does(case: Case) -> None:
    got = run_case(case, run_llvm)
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


def test_loops_are_blocks_with_phi_nodes() -> None:
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (tensor(4, 8),), (Ops.ADD, (1,)))]).items
    name, src = render(item.ast)
    assert f'define void @"{name}"(ptr noalias %data0, ptr noalias %data1) nounwind {{' in src
    assert "phi i32 [0, %" in src and "phi float [0x0000000000000000, %" in src
    assert "alloca" not in src  # accumulators are SSA values, not memory
    verified(src)


def test_variables_then_the_thread_number_come_after_the_buffers() -> None:
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(32), (), 0)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("n", 1, 16))
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", 2))
    r = UOp.range(n, 0)
    off = g * UOp.const(i32, 16) + r
    idx = UOp(Ops.INDEX, out.dtype, (out, off))
    value = r * n + g
    uops = [out, n, g, r, UOp.const(i32, 16), g * UOp.const(i32, 16), off, idx, r * n, value]
    uops += [UOp(Ops.STORE, src=(idx, value)), UOp(Ops.ENDRANGE, src=(r,))]
    validate(uops)
    src = R.render("with_var", uops)
    assert 'define void @"with_var"(ptr noalias %data0, i32 %n, i32 %gidx0)' in src
    res = np.full(32, -1, np.int32)
    fn = jit(src, "with_var")
    for thread in (0, 1):
        fn(ctypes.c_void_p(res.ctypes.data), ctypes.c_int(5), ctypes.c_int(thread))
    want = [r * 5 + t if r < 5 else -1 for t in (0, 1) for r in range(16)]
    np.testing.assert_array_equal(res, want)


# ---------------------------------------------------------------- constants


CONSTANTS = [
    (f32, v)
    for v in (math.inf, -math.inf, math.nan, -0.0, 0.0, 1e-45, 3.4028234663852886e38, 0.1, -1 / 3, 16777216.0)
] + [
    (dtypes.float64, v) for v in (-0.0, math.nan, 5e-324, 1.7976931348623157e308, 0.1, -math.inf)
] + [
    (dtypes.float16, v) for v in (65504.0, -math.inf, math.nan, -0.0, 6e-8, 0.1, 1.5)
] + [
    (dtypes.bfloat16, v) for v in (3.0e38, -math.inf, 0.1, 1e-39, -0.0)
] + [
    (dtypes.int64, -(2**63)), (dtypes.int64, 2**63 - 1), (dtypes.uint64, 2**64 - 1), (i32, -(2**31)),
    (i32, 2**31 - 1), (dtypes.uint32, 2**32 - 1), (dtypes.int8, -128), (dtypes.uint8, 255), (dtypes.int16, -32768),
    (dtypes.uint16, 65535), (dtypes.bool, True), (dtypes.bool, False),
]  # fmt: skip


def _store_const(name: str, dtype: DType, value: Any) -> str:
    out = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(1), (), 0)
    zero = UOp.const(i32, 0)
    idx = UOp(Ops.INDEX, out.dtype, (out, zero))
    c = UOp.const(dtype, value)
    return R.render(name, [out, zero, idx, c, UOp(Ops.STORE, src=(idx, c))])


def _read(dt: DType, raw: np.ndarray) -> Any:
    """An element of a result array as a Python value of dt (bfloat16 arrives as its 16 bits)."""
    return bf16_to_float(int(raw.item())) if dt == dtypes.bfloat16 else raw.item()


def _np_dtype(dt: DType) -> np.dtype:
    return np.dtype(np.uint16) if dt == dtypes.bfloat16 else NUMPY[dt.name]


@pytest.mark.parametrize("i", range(len(CONSTANTS)), ids=[f"{dt.name}={v}" for dt, v in CONSTANTS])
def test_constants_reach_memory_exactly(i: int) -> None:
    dt, v = CONSTANTS[i]
    out = np.zeros(1, _np_dtype(dt))
    jit(_store_const("c", dt, v), "c")(ctypes.c_void_p(out.ctypes.data))
    assert _same(_read(dt, out[0]), truncate(dt, v)), (dt, v, out[0])


def test_constant_text() -> None:
    assert R.const(1.0, f32) == "0x3FF0000000000000"
    assert R.const(1.5, dtypes.float16) == "0xH3E00"
    assert R.const(2**64 - 1, dtypes.uint64) == "-1"
    assert R.const(True, dtypes.bool.vec(2)) == "<i1 true, i1 true>"
    with pytest.raises(TypeError, match="must be a number"):
        R.const("one", f32)


# ---------------------------------------------------------------- ALU edge cases, against exec_alu


def _binary_kernel(name: str, op: Ops, dtype: DType, n: int) -> str:
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    out, a, b = (UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), k) for k, d in enumerate((out_dt, dtype, dtype)))
    r = UOp.range(UOp.const(i32, n), 0)
    ia, ib, io = (UOp(Ops.INDEX, g.dtype, (g, r)) for g in (a, b, out))
    la, lb = UOp(Ops.LOAD, dtype, (ia,)), UOp(Ops.LOAD, dtype, (ib,))
    value = la.alu(op, lb)
    uops = [out, a, b, UOp.const(i32, n), r, ia, ib, io, la, lb, value, UOp(Ops.STORE, src=(io, value))]
    return R.render(name, uops + [UOp(Ops.ENDRANGE, src=(r,))])


I64_MIN = -(2**63)
EDGE = [
    (Ops.MAX, f32, [1.0, math.nan, -0.0, math.inf, 2.0], [math.nan, 1.0, 0.0, -math.inf, 3.0]),
    (Ops.IDIV, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.MOD, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.IDIV, dtypes.int64, [I64_MIN, 9, -9], [-1, 0, 4]),
    (Ops.IDIV, dtypes.uint8, [255, 7, 0, 200], [2, 0, 3, 255]),
    (Ops.MOD, dtypes.uint32, [2**32 - 1, 7, 5], [2, 0, 2**32 - 1]),
    (Ops.MOD, f32, [5.5, -5.5, 1.0, math.inf], [2.0, 2.0, 0.0, 1.0]),
    (Ops.MAX, i32, [-(2**31), 5, -1], [2**31 - 1, -5, -1]),
    (Ops.MAX, dtypes.uint16, [65535, 3], [1, 4]),
    (Ops.ADD, dtypes.int8, [127, -128, 100], [1, -1, 100]),  # wraps
    (Ops.MUL, dtypes.uint16, [65535, 300, 2], [65535, 300, 3]),
    (Ops.CMPLT, f32, [1.0, math.nan, -0.0], [2.0, 1.0, 0.0]),
    (Ops.CMPLT, dtypes.uint32, [1, 2**32 - 1], [2**32 - 1, 1]),
    (Ops.CMPLT, dtypes.bool, [False, True, False, True], [True, False, False, True]),
    (Ops.CMPNE, f32, [math.nan, -0.0, 1.0], [math.nan, 0.0, 2.0]),
    (Ops.SHL, dtypes.uint32, [1, 3, 0xFFFFFFFF, 5], [31, 4, 1, 32]),
    (Ops.SHR, i32, [-8, 64, 2**31 - 1, -5, 9], [1, 3, 30, 40, 33]),
    (Ops.SHR, dtypes.uint8, [255, 128], [7, 9]),
    (Ops.FDIV, f32, [1.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 7.0]),
    (Ops.ADD, dtypes.bool, [False, True, True], [False, False, True]),
    (Ops.MUL, dtypes.bool, [False, True, True], [True, False, True]),
    (Ops.XOR, dtypes.int16, [-1, 0x0F0F], [0x00FF, 0x7070]),
]


@pytest.mark.parametrize("i", range(len(EDGE)), ids=[f"{op.name}-{dt.name}-{i}" for i, (op, dt, *_) in enumerate(EDGE)])
def test_alu_edge_cases_match_exec_alu(i: int) -> None:
    op, dtype, xs, ys = EDGE[i]
    n = len(xs)
    a, b = np.array(xs, NUMPY[dtype.name]), np.array(ys, NUMPY[dtype.name])
    out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    out = np.zeros(n, NUMPY[out_dtype.name])
    jit(_binary_kernel("binary", op, dtype, n), "binary")(*(ctypes.c_void_p(x.ctypes.data) for x in (out, a, b)))
    for k in range(n):
        want = exec_alu(op, out_dtype, (a[k].item(), b[k].item()))
        assert _same(out[k].item(), want), (op, dtype, xs[k], ys[k], out[k], want)


def _unary_kernel(name: str, op: Ops, dtype: DType, n: int) -> str:
    out, a = (UOp(Ops.DEFINE_GLOBAL, dtype.ptr(n), (), k) for k in range(2))
    r = UOp.range(UOp.const(i32, n), 0)
    ia, io = (UOp(Ops.INDEX, g.dtype, (g, r)) for g in (a, out))
    la = UOp(Ops.LOAD, dtype, (ia,))
    value = la.alu(op)
    uops = [out, a, UOp.const(i32, n), r, ia, io, la, value, UOp(Ops.STORE, src=(io, value))]
    return R.render(name, uops + [UOp(Ops.ENDRANGE, src=(r,))])


@pytest.mark.parametrize("dtype", [f32, dtypes.float64, dtypes.float16])
@pytest.mark.parametrize("op", [Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.RECIP, Ops.NEG])
def test_float_math(op: Ops, dtype: DType) -> None:
    xs = [0.0, -0.0, 1.0, 2.5, -2.5, 10.0, 0.3, math.inf, -math.inf, math.nan, -1.0]
    a = np.array(xs, NUMPY[dtype.name])
    out = np.zeros(len(xs), NUMPY[dtype.name])
    jit(_unary_kernel("unary", op, dtype, len(xs)), "unary")(*(ctypes.c_void_p(x.ctypes.data) for x in (out, a)))
    for k, x in enumerate(a):
        want = exec_alu(op, dtype, (x.item(),))
        got = out[k].item()
        if op in (Ops.SIN, Ops.EXP2, Ops.LOG2) and not math.isnan(want) and not math.isinf(want):
            assert got == pytest.approx(want, rel=1e-6 if dtype != dtypes.float16 else 1e-3, abs=1e-7), (op, x)
        else:
            assert _same(got, want), (op, dtype, x, got, want)


# ---------------------------------------------------------------- casts and bitcasts, every pair of dtypes

ALL = [dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16]
ALL += [dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, f32, dtypes.float64]
SAMPLES = [0, 1, -1, 7.75, -7.75, 100.5, -129.0, 300.25, 65504.0, 65520.0, 1e9 + 0.5, -3e9, 2**31 - 1]
SAMPLES += [2**32 + 3, 2**63 - 2**20, -(2**63), 1e20, 1e-40, 0.1, -0.0, math.inf, -math.inf, math.nan, 16777217]
SAMPLES += [2**24 + 2**16 + 1]  # rounded to float32, a tie of bfloat16: rounded once it is not


def _values(dt: DType) -> list[Any]:
    """SAMPLES as values of dt (as storing them would make them), without repeats."""
    out = []
    for v in SAMPLES:
        if dt.is_int and isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            continue
        t = truncate(dt, int(v) if dt.is_int and isinstance(v, float) and abs(v) < 2**64 else v)
        if not any(_same(t, o) and type(t) is type(o) for o in out):
            out.append(t)
    return out


def _to_memory(dt: DType, values: list[Any]) -> np.ndarray:
    if dt == dtypes.bfloat16:
        return np.array([float_to_bf16(v) for v in values], np.uint16)
    return np.array(values, NUMPY[dt.name])


def _cast_kernel(name: str, frm: DType, to: DType, n: int, op: Ops = Ops.CAST) -> str:
    out, inp = UOp(Ops.DEFINE_GLOBAL, to.ptr(n), (), 0), UOp(Ops.DEFINE_GLOBAL, frm.ptr(n), (), 1)
    r = UOp.range(UOp.const(i32, n), 0)
    io, ii = UOp(Ops.INDEX, out.dtype, (out, r)), UOp(Ops.INDEX, inp.dtype, (inp, r))
    x = UOp(Ops.LOAD, frm, (ii,))
    c = UOp(op, to, (x,))
    uops = [out, inp, UOp.const(i32, n), r, io, ii, x, c, UOp(Ops.STORE, src=(io, c)), UOp(Ops.ENDRANGE, src=(r,))]
    return R.render(name, uops)


@pytest.mark.parametrize("frm", ALL, ids=lambda d: d.name)
def test_casts_from_every_dtype_to_every_dtype_match_truncate(frm: DType) -> None:
    xs = _values(frm)
    src = _to_memory(frm, xs)
    for to in ALL:
        out = np.zeros(len(xs), _np_dtype(to))
        fn = jit(_cast_kernel("cast", frm, to, len(xs)), "cast")
        fn(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(src.ctypes.data))
        for k, x in enumerate(xs):
            want = truncate(to, x)
            assert _same(_read(to, out[k]), want), (frm, to, x, _read(to, out[k]), want)


SAME_SIZE = [(f32, dtypes.uint32), (dtypes.uint32, f32), (dtypes.float64, dtypes.int64), (dtypes.int16, dtypes.float16)]
SAME_SIZE += [(dtypes.bfloat16, dtypes.int16), (dtypes.uint16, dtypes.bfloat16), (dtypes.int8, dtypes.uint8)]
SAME_SIZE += [(dtypes.bool, dtypes.uint8), (dtypes.float16, dtypes.bfloat16)]


@pytest.mark.parametrize("frm, to", SAME_SIZE, ids=lambda d: d.name)
def test_bitcasts_keep_the_bits(frm: DType, to: DType) -> None:
    xs = _values(frm)
    src = _to_memory(frm, xs)
    out = np.zeros(len(xs), _np_dtype(to))
    jit(_cast_kernel("bitcast", frm, to, len(xs), Ops.BITCAST), "bitcast")(
        ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(src.ctypes.data)
    )
    want = src.tobytes()
    if to == dtypes.bfloat16:  # a bfloat16 register is a float: a NaN is stored as the quiet NaN, as the emulator does
        want = np.array([float_to_bf16(bf16_to_float(int(b))) for b in src.view(np.uint16)], np.uint16).tobytes()
    assert out.tobytes() == want, (frm, to)


def test_bitcast_of_a_vector_to_a_wider_scalar() -> None:
    out, inp = UOp(Ops.DEFINE_GLOBAL, dtypes.int64.ptr(1), (), 0), UOp(Ops.DEFINE_GLOBAL, i32.ptr(2), (), 1)
    zero = UOp.const(i32, 0)
    io, ii = UOp(Ops.INDEX, out.dtype, (out, zero)), UOp(Ops.INDEX, inp.dtype, (inp, zero))
    x = UOp(Ops.LOAD, i32.vec(2), (ii,))
    c = UOp(Ops.BITCAST, dtypes.int64, (x,))
    res, src = np.zeros(1, np.int64), np.array([1, 2], np.int32)
    jit(R.render("vb", [out, inp, zero, io, ii, x, c, UOp(Ops.STORE, src=(io, c))]), "vb")(
        ctypes.c_void_p(res.ctypes.data), ctypes.c_void_p(src.ctypes.data)
    )
    assert res[0] == 1 + (2 << 32)


# ---------------------------------------------------------------- bfloat16, emulated in float registers


def test_bfloat16_kernels_round_after_each_op() -> None:
    a, b = tensor(6, dtype=dtypes.bfloat16), tensor(6, dtype=dtypes.bfloat16)
    xs = [1.0, 1.0078125, -2.5, 3.0e38, 1e-39, 100.0]
    ys = [0.00390625, 0.001, 2.5, 3.0e38, 1e-39, -0.3]
    (item,) = create_schedule([a * b + a]).items
    bits = [np.array([float_to_bf16(truncate(dtypes.bfloat16, v)) for v in vs], np.uint16) for vs in (xs, ys)]
    out = np.zeros(6, np.uint16)
    run_llvm(item.ast, [out, *bits])
    for i in range(6):
        x, y = (bf16_to_float(int(v[i])) for v in bits)
        want = truncate(dtypes.bfloat16, truncate(dtypes.bfloat16, x * y) + x)
        assert _same(bf16_to_float(int(out[i])), want), (x, y, bf16_to_float(int(out[i])), want)


def test_half_arithmetic() -> None:
    a, b = tensor(8, dtype=dtypes.float16), tensor(8, dtype=dtypes.float16)
    av = np.linspace(-3, 3, 8).astype(np.float16)
    bv = np.linspace(0.5, 100, 8).astype(np.float16)
    case = Case("half", [a * b + a], {a.src[0]: av, b.src[0]: bv}, [av * bv + av])
    (got,) = run_case(case, run_llvm)
    np.testing.assert_array_equal(got, av * bv + av)  # rounded after each op, as NumPy does


# ---------------------------------------------------------------- vectors, gates and ifs


def vector_uops(ast: UOp, opts: list[Opt]) -> tuple[str, list[UOp]]:
    """Lowered with the actions, vectorized for 8 floats (as tiny.codegen.render_kernel does), linearized."""
    kernel = lower(ast, R.caps, opts)
    sink = graph_rewrite(graph_rewrite(kernel.sink, symbolic), vectorize, ctx=VectorTarget(R.caps.vector_width * 4))
    uops = linearize(sink)
    validate(uops)
    return kernel.name, uops


def test_upcast_kernels_use_llvm_vectors() -> None:
    a, b = tensor(64), tensor(64)
    (item,) = create_schedule([(a * b).maximum(a) + const(1.0, (64,))]).items
    name, uops = vector_uops(item.ast, [Opt(OptOps.UPCAST, 0, 8)])
    src = R.render(name, uops)
    assert "load <8 x float>" in src and "store <8 x float>" in src and "select <8 x i1>" in src
    av = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    bv = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    av[3] = np.nan
    out = np.zeros(64, np.float32)
    jit(src, name)(*(ctypes.c_void_p(x.ctypes.data) for x in (out, av, bv)))
    np.testing.assert_array_equal(out, np.maximum(av * bv, av) + 1)


def test_vector_reduction_accumulators() -> None:
    x = tensor(8, 64)
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (x,), (Ops.ADD, (1,)))]).items
    name, uops = vector_uops(item.ast, [Opt(OptOps.UNROLL, 1, 8)])
    src = R.render(name, uops)
    xv = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    out = np.zeros(8, np.float32)
    jit(src, name)(*(ctypes.c_void_p(v.ctypes.data) for v in (out, xv)))
    np.testing.assert_allclose(out, xv.sum(1), rtol=1e-5, atol=1e-5)


def test_vectorize_and_gep_lanes() -> None:
    out, inp = UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 1)
    zero = UOp.const(i32, 0)
    io, ii = UOp(Ops.INDEX, out.dtype, (out, zero)), UOp(Ops.INDEX, inp.dtype, (inp, zero))
    v = UOp(Ops.LOAD, f32.vec(4), (ii,))
    lanes = [UOp(Ops.GEP, f32, (v,), k) for k in (3, 2, 1, 0)]
    back = UOp(Ops.VECTORIZE, f32.vec(4), tuple(lanes))
    pair = UOp(Ops.GEP, f32.vec(2), (back,), (0, 3))
    twice = UOp(Ops.VECTORIZE, f32.vec(4), (UOp(Ops.GEP, f32, (pair,), 0), UOp(Ops.GEP, f32, (pair,), 1)) * 2)
    total = back + twice
    uops = [out, inp, zero, io, ii, v, *lanes, back, pair, *twice.src[:2], twice, total]
    uops.append(UOp(Ops.STORE, src=(io, total)))
    res, src = np.zeros(4, np.float32), np.array([1, 2, 3, 4], np.float32)
    jit(R.render("lanes", uops), "lanes")(ctypes.c_void_p(res.ctypes.data), ctypes.c_void_p(src.ctypes.data))
    np.testing.assert_array_equal(res, [4 + 4, 3 + 1, 2 + 4, 1 + 1])


def test_gated_loads_and_stores_do_not_touch_memory_where_the_gate_is_false() -> None:
    out, inp = UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.ptr(4), (), 1)
    n8, n4 = UOp.const(i32, 8), UOp.const(i32, 4)
    r = UOp.range(n8, 0)
    inside = r.alu(Ops.CMPLT, n4)
    ii = UOp(Ops.INDEX, inp.dtype, (inp, r, inside))
    alt = UOp.const(f32, -1.0)
    x = UOp(Ops.LOAD, f32, (ii, alt))
    odd = UOp(Ops.CMPNE, dtypes.bool, (r.alu(Ops.AND, UOp.const(i32, 1)), UOp.const(i32, 0)))
    io = UOp(Ops.INDEX, out.dtype, (out, r, odd))
    uops = [out, inp, n8, n4, r, inside, ii, alt, x, UOp.const(i32, 1), odd.src[0], UOp.const(i32, 0), odd, io]
    uops += [UOp(Ops.STORE, src=(io, x)), UOp(Ops.ENDRANGE, src=(r,))]
    validate(uops)
    small = np.array([10, 11, 12, 13], np.float32)
    res = np.full(8, 7.0, np.float32)
    jit(R.render("gated", uops), "gated")(ctypes.c_void_p(res.ctypes.data), ctypes.c_void_p(small.ctypes.data))
    np.testing.assert_array_equal(res, [7, 11, 7, 13, 7, -1, 7, -1])


def test_an_accumulator_assigned_inside_an_if() -> None:
    out, inp = UOp(Ops.DEFINE_GLOBAL, f32.ptr(1), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 1)
    zero_f, zero_i, n = UOp.const(f32, 0.0), UOp.const(i32, 0), UOp.const(i32, 8)
    acc = UOp(Ops.DEFINE_ACC, f32, (zero_f,), 0)
    r = UOp.range(n, 0)
    ii = UOp(Ops.INDEX, inp.dtype, (inp, r))
    x = UOp(Ops.LOAD, f32, (ii,))
    positive = UOp(Ops.CMPLT, dtypes.bool, (zero_f, x))
    branch = UOp(Ops.IF, src=(positive,))
    total = acc + x
    assign = UOp(Ops.ASSIGN, f32, (acc, total))
    io = UOp(Ops.INDEX, out.dtype, (out, zero_i))
    uops = [out, inp, zero_f, zero_i, n, acc, r, ii, x, positive, branch, total, assign, UOp(Ops.ENDIF, src=(branch,))]
    uops += [UOp(Ops.ENDRANGE, src=(r,)), io, UOp(Ops.STORE, src=(io, assign))]
    validate(uops)
    src = R.render("sum_positive", uops)
    xs = np.array([1, -2, 3, -4, 5, -6, 7, -8], np.float32)
    res = np.zeros(1, np.float32)
    jit(src, "sum_positive")(ctypes.c_void_p(res.ctypes.data), ctypes.c_void_p(xs.ctypes.data))
    assert res[0] == 16


def test_what_the_cpu_cannot_do_is_a_clear_error() -> None:
    local = UOp(Ops.DEFINE_LOCAL, f32.ptr(16, local=True), (), ("temp", 16))
    assert "addrspace(3)" in R.render("with_local", [local])
    with pytest.raises(NotImplementedError, match="barrier"):
        R.render("b", [UOp(Ops.BARRIER)])
    with pytest.raises(NotImplementedError, match="WMMA"):
        R.render("w", [UOp(Ops.WMMA, f32)])


# ---------------------------------------------------------------- vector exp2 in the vector unit


def _vexp2_loop(lanes: int) -> str:
    t = f"<{lanes} x float>"
    return R.helper_source(f"tiny_vexp2_v{lanes}f32") + (
        "define void @exp2s(ptr noalias %out, ptr noalias %x, i32 %n) {\n"
        "entry:\n  br label %loop\n"
        "loop:\n  %i = phi i32 [0, %entry], [%next, %body]\n  %more = icmp slt i32 %i, %n\n"
        "  br i1 %more, label %body, label %exit\n"
        f"body:\n  %px = getelementptr float, ptr %x, i32 %i\n  %v = load {t}, ptr %px, align 4\n"
        f"  %r = call {t} @tiny_vexp2_v{lanes}f32({t} %v)\n  %po = getelementptr float, ptr %out, i32 %i\n"
        f"  store {t} %r, ptr %po, align 4\n  %next = add i32 %i, {lanes}\n  br label %loop\n"
        "exit:\n  ret void\n}\n"
    )


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_vector_exp2_is_within_2_ulp_of_numpy(lanes: int) -> None:
    """float32 vector exp2 is the C renderer's polynomial in LLVM IR (llvm.exp2 on a vector is a libm call per
    lane): within 2 ulp of NumPy's float64 exp2 rounded to float32, subnormal results included; exact at 0 and inf;
    NaN for NaN. Compiled at O2 for this host, where products and sums of the polynomial may fuse."""
    x = np.concatenate([EXP2_INPUTS, np.zeros(-len(EXP2_INPUTS) % lanes, np.float32)])
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    got = np.zeros_like(x)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(
        ctypes.cast(jit(_vexp2_loop(lanes), "exp2s"), ctypes.c_void_p).value
    )
    fn(got.ctypes.data, x.ctypes.data, len(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    exact = np.isnan(want) | np.isinf(want) | (want == 0) | (x == 0)
    np.testing.assert_array_equal(got[exact & ~np.isnan(x)], want[exact & ~np.isnan(x)])
    ulps = np.abs(got[~exact].astype(np.float64) - want[~exact]) / np.spacing(np.abs(want[~exact]))
    assert ulps.max() <= 2, f"{ulps.max()} ulp at x = {x[~exact][ulps.argmax()]!r}"


def test_a_vector_exp2_calls_no_libm() -> None:
    """A float32 exp2 over 8 lanes renders the inlined polynomial; float64 and scalar lanes keep llvm.exp2."""
    a = UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 1)
    out = UOp(Ops.DEFINE_GLOBAL, f32.ptr(8), (), 0)
    zero = UOp.const(i32, 0)
    ia, io = (UOp(Ops.INDEX, g.dtype, (g, zero)) for g in (a, out))
    v = UOp(Ops.LOAD, f32.vec(8), (ia,))
    value = v.alu(Ops.EXP2)
    src = R.render("e", [out, a, zero, ia, io, v, value, UOp(Ops.STORE, src=(io, value))])
    assert "call <8 x float> @tiny_vexp2_v8f32" in src and "@llvm.exp2.v8f32" not in src
    verified(src)


def test_only_a_reductions_update_may_fuse() -> None:
    """acc + a*b of a reduction is marked contract (one multiply-add); an elementwise a*b + c is not, so that a value
    computed again in another kernel rounds the same there (a max's gradient compares a value with the max of it)."""
    a, b = tensor(4, 8), tensor(4, 8)
    prod = UOp(Ops.MUL, f32, (a, b))
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (prod,), (Ops.ADD, (1,)))]).items
    _, src = render(item.ast)
    assert "fmul contract float" in src and "fadd contract float" in src
    (item,) = create_schedule([UOp(Ops.ADD, f32, (prod, tensor(4, 8)))]).items
    _, src = render(item.ast)
    assert "fmul float" in src and "fadd float" in src and "contract" not in src


def test_a_matrix_vector_product_prefetches_its_rows_on_a_cpu_not_a_gpu() -> None:
    """The streams of a 1 MB float16 matrix read side by side ask for their lines ahead through llvm.prefetch, as
    the C renderer's do (tiny.codegen.renderer.prefetch); the AMD GPU's LLVM IR has none."""
    w, x = tensor(1024, 512, dtype=dtypes.float16), tensor(1, 512)
    target = reduce(UOp(Ops.CAST, dtypes.float32, (w,)) * expand(x, (1024, 512)), (1,))
    cpu = "".join(
        renders_with(LLVMRenderer("x86_64;vector_width=16;threads=2"))(i.ast)[0]
        for i in create_schedule([target]).items
    )
    assert cpu.count("call void @llvm.prefetch.p0(") >= 2 and "declare void @llvm.prefetch.p0" in cpu
    assert set(re.findall(r"@llvm\.prefetch\.p0\(ptr %[^,]+, i32 0, i32 (\d), i32 1\)", cpu)) == {"3"}, cpu
    amd_host = LLVMRenderer("x86_64;vector_width=16;threads=2;prefetch_locality=0;f16")  # (the CPU device's, on AMD)
    cpu = "".join(renders_with(amd_host)(i.ast)[0] for i in create_schedule([target]).items)
    assert set(re.findall(r"@llvm\.prefetch\.p0\(ptr %[^,]+, i32 0, i32 (\d), i32 1\)", cpu)) == {"0"}, cpu
    gpu = "".join(renders_with(AMDGPURenderer("gfx1100"))(i.ast)[0] for i in create_schedule([target]).items)
    assert "prefetch" not in gpu
