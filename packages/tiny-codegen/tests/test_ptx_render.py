"""The PTX renderer: its text (entry, parameters, registers, shared memory, vector and f16 instructions), and what
its kernels compute, run by a PTX interpreter (ptx_interpreter.py: no PTX emulator is packaged on PyPI or Debian)
against NumPy and tiny.ir.alu: the shared cases with hardware indices, locals and grouped reductions, every cast
between dtypes, the ALU's edge cases, the float math, vector loads at aligned and misaligned addresses. Whether ptxas
takes the text is tiny-runtime-nv's test (it has the CUDA tools); running it on a GPU is the CUDA:PTX suite's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from alu_cases import ALL, EDGE, loop_uops, read, same, to_memory, values
from kernel_helpers import GPU_TARGET, NUMPY, make_cases, past_static_shared, reduce, renders_with, run_case, tensor
from ptx_interpreter import PTXError, run

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import lower_kernel
from tiny.codegen.opt import Kernel, Opt, OptOps
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.alu import exec_alu
from tiny.ir.device import fold_grid
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp

f32, i32 = dtypes.float32, dtypes.int32
R = PTXRenderer(GPU_TARGET)
CASES = make_cases()


render = renders_with(R)  # (the hand-written rules unless opts are given)


def run_ptx(ast: UOp, arrays: list[np.ndarray], opts: list[Opt] | None = None, misalign: int = 0) -> str:
    src, lowered = render(ast, opts)
    run(src, arrays, lowered.global_size, lowered.local_size, misalign=misalign)
    return src


# ---------------------------------------------------------------- whole kernels


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_compute_what_numpy_does(case: Any) -> None:
    got = run_case(case, lambda ast, arrays: run_ptx(ast, arrays))
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


def test_local_buffers_past_48_kib_are_pieces_of_the_dynamic_shared_array() -> None:
    """64 KiB of local buffers: one `.extern .shared` array whose size the source says for the runtime, each buffer at
    its 16-byte aligned offset; under 48 KiB, static arrays as before."""
    uops, want = past_static_shared()
    src = R.render("big", uops)
    assert "// dynamic shared memory: 65536 bytes" in src and ".extern .shared .align 16 .b8 tiny_shared[];" in src
    assert "add.u64" in src and "32768" in src and ".shared .align 16 .b8 a[" not in src
    out = np.zeros(32, np.float32)
    run(src, [out], (1, 1, 1), (32, 1, 1))
    np.testing.assert_array_equal(out, want)
    small, _ = past_static_shared(4096)
    assert "tiny_shared" not in R.render("small", small) and "dynamic" not in R.render("small", small)


def test_grouped_reduction_and_locals_compute_the_sum() -> None:
    x = tensor(4, 256)
    (item,) = create_schedule([reduce(x, (1,))]).items
    xv = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    out = np.zeros(4, np.float32)
    src = run_ptx(item.ast, [out, xv.reshape(-1).copy()], [Opt(OptOps.GROUP, 1, 16), Opt(OptOps.LOCAL, 0, 2)])
    assert "bar.sync 0;" in src and ".shared .align 16" in src
    np.testing.assert_allclose(out, xv.sum(1), rtol=1e-5)


@pytest.mark.parametrize("misalign", [0, 4])
def test_vector_loads_and_stores_aligned_or_not(misalign: int) -> None:
    a, b = tensor(16, 64), tensor(16, 64)
    (item,) = create_schedule([(a * b).maximum(a)]).items
    rng = np.random.default_rng(1)
    av, bv = (rng.standard_normal(16 * 64).astype(np.float32) for _ in range(2))
    out = np.zeros(16 * 64, np.float32)
    src = run_ptx(item.ast, [out, av, bv], misalign=misalign)
    assert "ld.global.v4.f32" in src and "st.global.v4.f32" in src
    np.testing.assert_array_equal(out, np.maximum(av * bv, av))


def test_a_misaligned_vector_access_is_what_the_interpreter_refuses() -> None:
    src = (
        ".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k(\n\t.param .u64 data0\n)\n{\n"
        "\t.reg .b32 %r<5>;\n\t.reg .b64 %rd<2>;\n\tld.param.u64 %rd1, [data0];\n"
        "\tld.global.v4.f32 {%r1, %r2, %r3, %r4}, [%rd1];\n\tret;\n}\n"
    )
    run(src, [np.zeros(4, np.float32)], (1, 1, 1), (1, 1, 1))
    with pytest.raises(PTXError, match="misaligned"):
        run(src, [np.zeros(4, np.float32)], (1, 1, 1), (1, 1, 1), misalign=4)


# ---------------------------------------------------------------- the ALU, against exec_alu


def _loop_kernel(name: str, dts: list[DType], value: Any, n: int) -> str:
    return R.render(name, loop_uops(dts, value, n))


@pytest.mark.parametrize("i", range(len(EDGE)), ids=[f"{op.name}-{dt.name}-{i}" for i, (op, dt, *_) in enumerate(EDGE)])
def test_alu_edge_cases_match_exec_alu(i: int) -> None:
    op, dtype, xs, ys = EDGE[i]
    n = len(xs)
    a, b = np.array(xs, NUMPY[dtype.name]), np.array(ys, NUMPY[dtype.name])
    out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    out = np.zeros(n, NUMPY[out_dtype.name])
    run(
        _loop_kernel("binary", [out_dtype, dtype, dtype], lambda x, y: x.alu(op, y), n),
        [out, a, b],
        (1, 1, 1),
        (1, 1, 1),
    )
    for k in range(n):
        want = exec_alu(op, out_dtype, (a[k].item(), b[k].item()))
        assert same(out[k].item(), want), (op, dtype, xs[k], ys[k], out[k], want)


def test_where_and_negation() -> None:
    n = 4
    c = np.array([True, False, True, False])
    x, y = np.array([1, 2, 3, 4], np.int16), np.array([-1, -2, -3, -4], np.int16)
    out = np.zeros(n, np.int16)
    src = _loop_kernel(
        "where", [dtypes.int16, dtypes.bool, dtypes.int16, dtypes.int16], lambda p, a, b: p.where(-a, b), n
    )
    run(src, [out, c, x, y], (1, 1, 1), (1, 1, 1))
    assert out.tolist() == [-1, -2, -3, -4]


@pytest.mark.parametrize("dtype", [f32, dtypes.float64, dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("op", [Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.RECIP, Ops.NEG])
def test_float_math(op: Ops, dtype: DType) -> None:
    xs = [0.0, -0.0, 1.0, 2.5, -2.5, 10.0, 0.3, math.inf, -math.inf, math.nan, -1.0, 100.0, -1000.5]
    vals = [truncate(dtype, x) for x in xs]
    a = to_memory(dtype, vals)
    out = np.zeros(len(xs), a.dtype)
    run(_loop_kernel("unary", [dtype, dtype], lambda x: x.alu(op), len(xs)), [out, a], (1, 1, 1), (1, 1, 1))
    for k, x in enumerate(vals):
        want, got = exec_alu(op, dtype, (x,)), read(dtype, out[k])
        if op in (Ops.SIN, Ops.EXP2, Ops.LOG2) and math.isfinite(want):
            tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float64: 1e-15}.get(dtype, 1e-6)
            assert got == pytest.approx(want, rel=tol, abs=tol), (op, dtype, x, got, want)
        else:
            assert same(got, want), (op, dtype, x, got, want)


# ---------------------------------------------------------------- casts, every pair of dtypes


@pytest.mark.parametrize("frm", ALL, ids=lambda d: d.name)
def test_casts_from_every_dtype_to_every_dtype_match_truncate(frm: DType) -> None:
    xs = values(frm)
    src = to_memory(frm, xs)
    for to in ALL:
        out = np.zeros(len(xs), np.uint16 if to == dtypes.bfloat16 else NUMPY[to.name])
        run(_loop_kernel("cast", [to, frm], lambda x, to=to: x.cast(to), len(xs)), [out, src], (1, 1, 1), (1, 1, 1))
        for k, x in enumerate(xs):
            want = truncate(to, x)
            assert same(read(to, out[k]), want), (frm, to, x, read(to, out[k]), want)


def _nearest_bf16(x: np.float32) -> int:
    """x's nearest bfloat16 (ties to the even one) from its two neighbours' distances; NaN as the CPU stores it."""
    bits = int(np.array(x, np.float32).view(np.uint32))
    if np.isnan(x) or np.isinf(x):
        return 0x7FC0 if np.isnan(x) else bits >> 16
    below = bits & 0xFFFF0000
    sign = -1.0 if bits >> 31 else 1.0

    def value(c: int) -> float:  # (past the largest float: infinity's bits, as the next step 2**128 away)
        return sign * 2.0**128 if c & 0x7FFFFFFF == 0x7F800000 else float(np.array(c, np.uint32).view(np.float32))

    far = [abs(value(c) - float(x)) for c in (below, below + 0x10000)]
    up = far[1] < far[0] or (far[1] == far[0] and (below >> 16) & 1)
    return (below + 0x10000 * up) >> 16


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_float32_to_bfloat16_rounds_to_nearest_even_with_cvt_from_sm_80(arch: str) -> None:
    """sm_80 and newer round with one cvt.rn.bf16.f32 (its NaN made 0x7fc0 for memory); sm_75 has none and takes
    integer arithmetic. Both give each value's nearest bfloat16, ties to even, as the CPU."""
    xs = np.array(
        [
            1.0,
            1 + 2**-8,
            1 + 3 * 2**-8,
            1 + 2**-8 + 2**-20,
            -(1 + 2**-8),
            3.0e38,
            3.4e38,
            -math.inf,
            math.inf,
            math.nan,
            -math.nan,
            1e-40,
            -1e-45,
            0.0,
            -0.0,
            65504.0,
            1 / 3,
        ],
        np.float32,
    )
    renderer = PTXRenderer(GPU_TARGET.replace("sm_90", arch))
    src = renderer.render("cast", loop_uops([dtypes.bfloat16, f32], lambda x: x.cast(dtypes.bfloat16), len(xs)))
    assert ("cvt.rn.bf16.f32" in src) == (arch == "sm_90")
    out = np.zeros(len(xs), np.uint16)
    run(src, [out, xs], (1, 1, 1), (1, 1, 1))
    assert [hex(b) for b in out] == [hex(_nearest_bf16(x) & 0xFFFF) for x in xs]


SAME_SIZE = [(f32, dtypes.uint32), (dtypes.uint32, f32), (dtypes.float64, dtypes.int64), (dtypes.int16, dtypes.float16)]
SAME_SIZE += [(dtypes.bfloat16, dtypes.int16), (dtypes.uint16, dtypes.bfloat16), (dtypes.int8, dtypes.uint8)]
SAME_SIZE += [(dtypes.float16, dtypes.uint16), (dtypes.float16, dtypes.bfloat16)]


@pytest.mark.parametrize("frm, to", SAME_SIZE, ids=lambda d: d.name)
def test_bitcasts_keep_the_bits(frm: DType, to: DType) -> None:
    xs = values(frm)
    src = to_memory(frm, xs)
    out = np.zeros(len(xs), np.uint16 if to == dtypes.bfloat16 else NUMPY[to.name])
    kernel = _loop_kernel("bitcast", [to, frm], lambda x: UOp(Ops.BITCAST, to, (x,)), len(xs))
    run(kernel, [out, src], (1, 1, 1), (1, 1, 1))
    want = src.tobytes()
    if to == dtypes.bfloat16:  # a bfloat16 register is a float: a NaN is stored as the quiet NaN
        want = np.array([float_to_bf16(bf16_to_float(int(b))) for b in src.view(np.uint16)], np.uint16).tobytes()
    assert out.tobytes() == want, (frm, to)


@pytest.mark.parametrize(
    "dt, value",
    [
        (f32, 1.5),
        (dtypes.float16, -2.25),
        (dtypes.int64, -(2**63)),
        (dtypes.uint32, 2**32 - 1),
        (dtypes.int8, -3),
        (dtypes.bool, True),
        (dtypes.float64, math.nan),
        (dtypes.bfloat16, 3.0),
    ],
)  # noqa: E501
def test_constants_reach_memory_exactly(dt: DType, value: Any) -> None:
    out = np.zeros(1, np.uint16 if dt == dtypes.bfloat16 else NUMPY[dt.name])
    g = UOp(Ops.DEFINE_GLOBAL, dt.ptr(1), (), 0)
    zero = UOp.const(i32, 0)
    idx = UOp(Ops.INDEX, g.dtype, (g, zero))
    c = UOp.const(dt, value)
    run(R.render("c", [g, zero, idx, c, UOp(Ops.STORE, src=(idx, c))]), [out], (1, 1, 1), (1, 1, 1))
    assert same(read(dt, out[0]), truncate(dt, value))


# ---------------------------------------------------------------- the text


def test_entry_parameters_and_version() -> None:
    a = tensor(1000)
    (item,) = create_schedule([a * 2.0]).items
    src, lowered = render(item.ast)
    assert f".visible .entry {lowered.name}(" in src and "\t.param .u64 data0,\n\t.param .u64 data1\n)" in src
    assert src.count(".target sm_90") == 1 and ".version 7.8" in src and ".address_size 64" in src
    assert "%ctaid.x" in src and "%tid.x" in src and ".maxntid " in src
    assert ".version 7.0" in PTXRenderer("arch=sm_80").render(lowered.name, [])


def test_half_math_is_f16_instructions() -> None:
    h = tensor(8, dtype=dtypes.float16)
    (item,) = create_schedule([h * h + h]).items
    src, _ = render(item.ast)
    assert "mul.f16" in src and "add.f16" in src and "ld.global.b16" in src


def test_variables_are_u32_parameters_after_the_buffers() -> None:
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(1), (), 0)
    var = UOp(Ops.DEFINE_VAR, i32, (), ("start_pos", 0, 100))
    zero = UOp.const(i32, 0)
    idx = UOp(Ops.INDEX, out.dtype, (out, zero))
    src = R.render("v", [out, var, zero, idx, UOp(Ops.STORE, src=(idx, var))])
    assert "\t.param .u64 data0,\n\t.param .u32 var_start_pos\n)" in src
    result = np.zeros(1, np.int32)
    run(src, [result], (1, 1, 1), (1, 1, 1), vals={"start_pos": 42})
    assert result.tolist() == [42]


F64_SAMPLES = {
    Ops.EXP2: [-1074.5, -1074.0, -1060.3, -1022.0, -1021.7, -700.25, -3.5, -0.5, -1e-10, 1e-300, 0.49, 1.0, 13.37]
    + [100.1, 1023.0, 1023.99, 1024.0, 2000.0],
    Ops.LOG2: [5e-324, 1e-310, 2.2250738585072014e-308, 1e-100, 0.5, 0.7071, 0.99999999, 1.0, 1.00000001, 1.4142]
    + [1.5, 3.0, 1e10, 1.7976931348623157e308],
    Ops.SIN: [-1e5, -1000.5, -10.0, -3.14159, -1.0, -1e-8, 0.5, 0.785, 1.5707963267948966, 2.0, 3.141592653589793]
    + [4.7, 100.0, 12345.678],
}


@pytest.mark.parametrize("op", list(F64_SAMPLES), ids=lambda o: o.name)
def test_float64_transcendentals_are_within_a_few_ulp(op: Ops) -> None:
    xs = F64_SAMPLES[op]
    out, a = np.zeros(len(xs)), np.array(xs)
    run(_loop_kernel("f64", [dtypes.float64] * 2, lambda x: x.alu(op), len(xs)), [out, a], (1, 1, 1), (1, 1, 1))
    for x, got in zip(xs, out.tolist()):
        want = exec_alu(op, dtypes.float64, (x,))
        ulps = abs(got - want) / math.ulp(want) if want and math.isfinite(want) else (0 if got == want else math.inf)
        assert ulps <= (4 if op is not Ops.SIN else 4 + abs(x) / 1000), (op, x, got, want, ulps)


def test_a_grid_over_the_limit_is_launched_folded() -> None:
    """With at most 16 blocks per dimension, a grid of 8 x 64 blocks runs as fold_grid folds it (16 x 16 x 2)."""
    folding = PTXRenderer("arch=sm_90;max_grid=16")
    a = tensor(64, 8)
    (item,) = create_schedule([a * 2.0]).items
    k = Kernel(item.ast, folding.caps)
    lowered = lower_kernel(k)
    uops = linearize(graph_rewrite(lowered.sink, symbolic))
    src = folding.render(lowered.name, uops)
    assert lowered.global_size == (8, 64, 1) and "mad.lo.u32" in src and "setp.ge.u32" in src
    av = np.arange(64 * 8, dtype=np.float32)
    out = np.zeros_like(av)
    run(src, [out, av], fold_grid(lowered.global_size, 16), lowered.local_size)
    np.testing.assert_array_equal(out, av * 2)
