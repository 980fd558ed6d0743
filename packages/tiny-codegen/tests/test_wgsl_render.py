"""The WGSL renderer: the text of typical kernels, its caps, and, where wgpu and an adapter are present (a GPU, or
Mesa's lavapipe), shaders that wgpu's validator (naga) accepts and that compute what NumPy and tiny.ir.alu say.
The runs here use wgpu directly; no tiny runtime package is involved."""

from __future__ import annotations

import math
import os
import re
import tempfile
from functools import cache
from typing import Any

import numpy as np
import pytest
from kernel_helpers import NUMPY, Case, kernel_uops, make_cases, run_case, tensor

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, lower
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.wgsl import WGSLRenderer, parse_target
from tiny.ir.alu import exec_alu
from tiny.ir.device import fold_grid
from tiny.ir.dtypes import DType, dtypes, truncate
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp

f32, i32 = dtypes.float32, dtypes.int32
TARGET = "f16;max_workgroups=65535;local=1024,1024,64;local_total=1024;shared=32768"
R = WGSLRenderer(TARGET)
CASES = make_cases()

# ---------------------------------------------------------------- wgpu, where it is present


@cache
def gpu() -> Any:
    """A wgpu device (with shader-f16 when offered), or None when wgpu or an adapter is missing."""
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="wgpu_xdg_"))
    try:
        import wgpu
    except ImportError:
        return None
    try:
        adapter = wgpu.gpu.request_adapter_sync()
    except Exception:  # noqa: BLE001  (no driver: any error means no adapter)
        return None
    if adapter is None:
        return None
    features = [f for f in ("shader-f16",) if f in adapter.features]
    limits = {k: v for k, v in adapter.limits.items() if k.startswith(("max-", "min-"))}
    return adapter.request_device_sync(required_features=features, required_limits=limits)


def need_gpu() -> Any:
    dev = gpu()
    if dev is None:
        pytest.skip("no wgpu adapter here (pip install wgpu; apt install mesa-vulkan-drivers)")
    return dev


def validate(src: str) -> None:
    """wgpu (naga) accepts the shader; skipped where there is no adapter."""
    need_gpu().create_shader_module(code=src)


def run_wgsl(name: str, src: str, buffers: list[np.ndarray], grid: tuple[int, int, int]) -> None:
    """Run a shader on flat NumPy arrays (copied back into them); buffers are bound in order."""
    dev = need_gpu()  # skips where wgpu is not installed, before importing it
    import wgpu

    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    bufs = []
    for a in buffers:
        raw = a.tobytes() + b"\0" * (-a.nbytes % 4 or (4 if a.nbytes == 0 else 0))
        bufs.append(dev.create_buffer_with_data(data=raw, usage=usage))
    kinds = {"read": wgpu.BufferBindingType.read_only_storage, "read_write": wgpu.BufferBindingType.storage}
    declared = dict(re.findall(r"@binding\((\d+)\) var<storage, (\w+)>", src))
    layout = dev.create_bind_group_layout(
        entries=[
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kinds[declared[str(i)]]}}
            for i in range(len(bufs))
        ]
    )
    pipeline = dev.create_compute_pipeline(
        layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
        compute={"module": dev.create_shader_module(code=src), "entry_point": name},
    )
    entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)]
    group = dev.create_bind_group(layout=layout, entries=entries)
    encoder = dev.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(*fold_grid(grid, R.max_workgroups))
    compute.end()
    dev.queue.submit([encoder.finish()])
    for a, b in zip(buffers, bufs):
        if a.nbytes:
            a.reshape(-1).view(np.uint8)[:] = np.frombuffer(dev.queue.read_buffer(b), np.uint8)[: a.nbytes]


def lowered(ast: UOp, opts: list[Opt] | None = None) -> tuple[LoweredKernel, list[UOp]]:
    if opts is None:
        return kernel_uops(ast, R.caps)
    kernel = lower(ast, R.caps, opts)
    return kernel, linearize(graph_rewrite(kernel.sink, symbolic))


def run_kernel(ast: UOp, buffers: list[np.ndarray], opts: list[Opt] | None = None) -> str:
    kernel, uops = lowered(ast, opts)
    src = R.render(kernel.name, uops)
    if kernel.name and uops:
        run_wgsl(kernel.name, src, buffers, kernel.global_size)
    return src


# ---------------------------------------------------------------- caps and text


def test_caps_leave_out_what_wgsl_lacks() -> None:
    plain = WGSLRenderer()
    for dt in (dtypes.float64, dtypes.int64, dtypes.uint64, dtypes.float16):
        assert dt not in plain.caps.dtypes
    assert dtypes.float16 in R.caps.dtypes and dtypes.float64 not in R.caps.dtypes
    for dt in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.bfloat16, f32, i32):
        assert dt in plain.caps.dtypes
    assert plain.caps.has_local and plain.caps.has_shared and plain.caps.vector_width == 1
    assert plain.caps.local_max == (256, 256, 64) and plain.caps.shared_max == 16384
    assert R.caps.local_total_max == 1024 and R.caps.global_max == (2**31 - 1, 65535, 65535)
    assert parse_target("f16;local=1,2,3") == {"f16": "", "local": "1,2,3"}


def test_text_of_an_elementwise_kernel() -> None:
    a, b = tensor(64), tensor(64)
    (item,) = create_schedule([a * b + a]).items
    kernel, uops = kernel_uops(item.ast, R.caps)
    src = R.render(kernel.name, uops)
    assert "@group(0) @binding(0) var<storage, read_write> data0: array<f32>;" in src
    assert "@group(0) @binding(1) var<storage, read> data1: array<f32>;" in src
    assert f"@compute @workgroup_size(1, 1, 1)\nfn {kernel.name}(" in src
    assert "let gidx0 = i32(wid.x);" in src and "enable f16" not in src
    validate(src)


def test_workgroups_local_memory_and_barriers() -> None:
    x = tensor(8, 64)
    (item,) = create_schedule([reduce_rows(x)]).items
    opts = [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 1, 16)]
    xv = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    out = np.zeros(8, np.float32)
    src = run_kernel(item.ast, [out, xv.reshape(-1)], opts)
    assert "var<workgroup> temp0: array<f32," in src and "workgroupBarrier();" in src
    assert re.search(r"@workgroup_size\(\d+, \d+, 1\)", src) and "lid.x" in src
    validate(src)
    np.testing.assert_allclose(out, xv.sum(1), rtol=1e-5, atol=1e-5)


def reduce_rows(x: UOp, op: Ops = Ops.ADD) -> UOp:
    return UOp(Ops.RESHAPE, x.dtype, (UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, (1,))),), (8,))


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.bool, dtypes.bfloat16], ids=lambda d: d.name)
def test_narrow_dtypes_in_local_memory(dtype: DType) -> None:
    x = tensor(8, 64, dtype=dtype)
    (item,) = create_schedule([reduce_rows(x, Ops.MAX)]).items
    rng = np.random.default_rng(3)
    xv = rng.integers(-100, 100, (8, 64)) if dtype != dtypes.bool else rng.random((8, 64)) < 0.02
    if dtype == dtypes.bfloat16:  # 16-bit patterns of small integers, which bfloat16 holds exactly
        arr = (xv.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        out = np.zeros(8, np.uint16)
    else:
        arr = xv.astype(NUMPY[dtype.name])
        out = np.zeros(8, NUMPY[dtype.name])
    src = run_kernel(item.ast, [out, arr.reshape(-1)], [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.GROUP, 1, 8)])
    assert "var<workgroup> temp0" in src
    got = (out.astype(np.uint32) << 16).view(np.float32) if dtype == dtypes.bfloat16 else out
    np.testing.assert_array_equal(got, xv.max(1).astype(got.dtype))


def test_variables_follow_the_buffers() -> None:
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(4), (), 0)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("start", 0, 10))
    r = UOp.range(UOp.const(i32, 4), 0)
    idx = UOp(Ops.INDEX, out.dtype, (out, r))
    value = r + n
    uops = [out, n, UOp.const(i32, 4), r, idx, value, UOp(Ops.STORE, src=(idx, value)), UOp(Ops.ENDRANGE, src=(r,))]
    src = R.render("k", uops)
    assert "@group(0) @binding(1) var<storage, read> tiny_vars: array<i32>;" in src
    assert "let var_start = tiny_vars[0];" in src
    validate(src)


def test_narrow_dtypes_are_packed_in_words() -> None:
    a = tensor(6, dtype=dtypes.int8)
    (item,) = create_schedule([a * a]).items
    kernel, uops = kernel_uops(item.ast, R.caps)
    src = R.render(kernel.name, uops)
    assert "data0: array<atomic<u32>>" in src and "data1: array<u32>" in src
    assert "atomicAnd(" in src and "atomicOr(" in src
    validate(src)


# ---------------------------------------------------------------- running kernels


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_compute_what_numpy_does(case: Case) -> None:
    need_gpu()
    got = run_case(case, run_kernel)
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


def _binary_uops(op: Ops, dtype: DType, n: int) -> list[UOp]:
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    out, a, b = (UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), i) for i, d in enumerate((out_dt, dtype, dtype)))
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", n))
    ia, ib, io = (UOp(Ops.INDEX, x.dtype, (x, g)) for x in (a, b, out))
    la, lb = UOp(Ops.LOAD, dtype, (ia,)), UOp(Ops.LOAD, dtype, (ib,))
    value = la.alu(op, lb)
    return [out, a, b, g, ia, ib, io, la, lb, value, UOp(Ops.STORE, src=(io, value))]


EDGE = [
    (Ops.MAX, f32, [1.0, math.nan, -0.0, math.inf, 2.0], [math.nan, 1.0, 0.0, -math.inf, 3.0]),
    (Ops.IDIV, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.MOD, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.IDIV, dtypes.uint8, [255, 7, 0, 200, 9], [2, 0, 3, 255, 4]),
    (Ops.IDIV, dtypes.int8, [-128, 7, -7, 100, 9], [-1, 0, 2, -3, 4]),
    (Ops.MAX, i32, [-(2**31), 5, -1], [2**31 - 1, -5, -1]),
    (Ops.ADD, dtypes.int8, [127, -128, 100, 5, -3], [1, -1, 100, 6, -4]),
    (Ops.MUL, dtypes.uint16, [65535, 300, 2], [65535, 300, 3]),
    (Ops.MUL, dtypes.int16, [32767, -300, 2], [2, 300, -3]),
    (Ops.CMPLT, f32, [1.0, math.nan, -0.0, 3.0, 1.0], [2.0, 1.0, 0.0, math.nan, 1.0]),
    (Ops.CMPNE, f32, [math.nan, -0.0, 1.0, 1.0, 2.0], [math.nan, 0.0, 2.0, math.nan, 2.0]),
    (Ops.CMPLT, dtypes.bool, [False, False, True, True], [False, True, False, True]),
    (Ops.SHL, dtypes.uint32, [1, 3, 0xFFFFFFFF, 5], [31, 4, 1, 40]),
    (Ops.SHR, i32, [-8, 64, 2**31 - 1, -8], [1, 3, 30, 40]),
    (Ops.XOR, dtypes.bool, [False, False, True, True], [False, True, False, True]),
    (Ops.ADD, dtypes.bfloat16, [1.0, 256.0, -3.5], [0.00390625, 1.0, 1.25]),
]


@pytest.mark.parametrize("i", range(len(EDGE)), ids=[f"{op.name}-{dt.name}" for op, dt, _, _ in EDGE])
def test_alu_edge_cases_match_exec_alu(i: int) -> None:
    op, dtype, xs, ys = EDGE[i]
    n = len(xs)
    np_dt = np.float32 if dtype == dtypes.bfloat16 else NUMPY[dtype.name]
    out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    src = R.render("binary_k", _binary_uops(op, dtype, n))
    a, b = np.array(xs, np_dt), np.array(ys, np_dt)
    out = np.zeros(n, np.float32 if out_dtype == dtypes.bfloat16 else NUMPY[out_dtype.name])
    if dtype == dtypes.bfloat16:  # 16-bit patterns in memory
        a, b = (a.view(np.uint32) >> 16).astype(np.uint16), (b.view(np.uint32) >> 16).astype(np.uint16)
        out = np.zeros(n, np.uint16)
    run_wgsl("binary_k", src, [out, a, b], (n, 1, 1))
    if dtype == dtypes.bfloat16:
        out = (out.astype(np.uint32) << 16).view(np.float32)
    for j in range(n):
        want = exec_alu(op, out_dtype, (truncate(dtype, xs[j]), truncate(dtype, ys[j])))
        assert _same(out[j].item(), want), (op, dtype, xs[j], ys[j], out[j], want)


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == want


def _cast_uops(src_dtype: DType, dst: DType, n: int) -> list[UOp]:
    out, inp = UOp(Ops.DEFINE_GLOBAL, dst.ptr(n), (), 0), UOp(Ops.DEFINE_GLOBAL, src_dtype.ptr(n), (), 1)
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", n))
    io, ii = UOp(Ops.INDEX, out.dtype, (out, g)), UOp(Ops.INDEX, inp.dtype, (inp, g))
    x = UOp(Ops.LOAD, src_dtype, (ii,))
    c = x.cast(dst)
    return [out, inp, g, io, ii, x, c, UOp(Ops.STORE, src=(io, c))]


CAST_VALUES = [-1.5, -0.7, 0.0, 0.99, 100.7, 127.0, 300.5, -129.0, 3e9, -3e9, 1e19, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize(
    "dst", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.bool]
)
def test_float_to_int_casts_follow_the_spec(dst: DType) -> None:
    xs = np.array(CAST_VALUES, np.float32)
    out = np.zeros(len(xs), NUMPY[dst.name])
    run_wgsl("cast_k", R.render("cast_k", _cast_uops(f32, dst, len(xs))), [out, xs], (len(xs), 1, 1))
    assert [v.item() for v in out] == [truncate(dst, float(v)) for v in xs]


@pytest.mark.parametrize("src_dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.bool])
def test_narrow_values_load_and_store_exactly(src_dtype: DType) -> None:
    rng = np.random.default_rng(1)
    n = 1027  # not a whole number of words: every thread stores beside a neighbour in the same word
    lo, hi = (0, 1) if src_dtype.is_bool else (src_dtype.min, src_dtype.max)
    xs = rng.integers(lo, hi, n, endpoint=True).astype(NUMPY[src_dtype.name])
    out = np.zeros(n, NUMPY[src_dtype.name])
    uops = _cast_uops(src_dtype, src_dtype, n)
    run_wgsl("cast_k", R.render("cast_k", uops), [out, xs], (n, 1, 1))
    np.testing.assert_array_equal(out, xs)


def test_a_grid_over_the_workgroup_limit_is_folded() -> None:
    small = WGSLRenderer("max_workgroups=16")
    n = 100
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(n), (), 0)
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", n))
    idx = UOp(Ops.INDEX, out.dtype, (out, g))
    three = UOp.const(i32, 3)
    value = g * three
    src = small.render("k", [out, g, three, idx, value, UOp(Ops.STORE, src=(idx, value))])
    assert "tiny_flat" in src and "return;" in src
    assert fold_grid((100, 1, 1), 16) == (16, 7, 1) and fold_grid((10, 1, 1), 16) == (10, 1, 1)
    with pytest.raises(ValueError, match="more than a device can launch"):
        fold_grid((17**3, 1, 1), 16)
    dev = need_gpu()
    import wgpu

    buf = dev.create_buffer(size=4 * n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=src)})
    group = dev.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
    )
    encoder = dev.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(16, 7, 1)
    compute.end()
    dev.queue.submit([encoder.finish()])
    np.testing.assert_array_equal(np.frombuffer(dev.queue.read_buffer(buf), np.int32), np.arange(n) * 3)


def test_half_kernels_enable_f16() -> None:
    a = tensor(8, dtype=dtypes.float16)
    (item,) = create_schedule([a * a]).items
    kernel, uops = kernel_uops(item.ast, R.caps)
    src = R.render(kernel.name, uops)
    assert src.startswith("enable f16;") and "array<f16>" in src
    dev = need_gpu()
    if "shader-f16" not in dev.features:
        pytest.skip("the adapter has no shader-f16")
    xs = np.linspace(-3, 3, 8).astype(np.float16)
    out = np.zeros(8, np.float16)
    run_wgsl(kernel.name, src, [out, xs], kernel.global_size)
    np.testing.assert_array_equal(out, xs * xs)


def test_float_constants_render_exactly() -> None:
    assert R.const(math.nan, f32) == "bitcast<f32>(0x7fc00000u)"
    assert R.const(-math.inf, f32) == "bitcast<f32>(0xff800000u)"
    assert R.const(0.1, f32) == "0.1f" and R.const(1.5, dtypes.float16) == "1.5h"
    assert R.const(-(2**31), i32) == "(-2147483647i - 1i)" and R.const(7, dtypes.uint8) == "7u"
    assert R.const(True, dtypes.bool) == "true"


def test_a_kernel_over_the_drivers_loop_limit_is_refused() -> None:
    """llvmpipe ends a shader after 65535 loop iterations (all loops together) and keeps what it had: a renderer
    told the limit (target 'loops=N') refuses a kernel whose threads would loop more, instead of a wrong answer."""
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (tensor(20, 300, 300),), (Ops.ADD, (1, 2)))]).items
    kernel, uops = kernel_uops(item.ast, R.caps)  # no opts: a loop of 300 around a loop of 300 in each thread
    limited = WGSLRenderer("loops=65535")
    assert limited.caps.max_loop_iterations == 65535 and WGSLRenderer().caps.max_loop_iterations == 0
    with pytest.raises(ValueError, match=r"runs 90300 loop iterations in each thread .* stops a shader after 65535"):
        limited.render(kernel.name, uops)
    validate(R.render(kernel.name, uops))  # without the limit it renders
    (item,) = create_schedule([UOp(Ops.REDUCE_AXIS, f32, (tensor(20, 200, 300),), (Ops.ADD, (1, 2)))]).items
    small, small_uops = kernel_uops(item.ast, R.caps)
    validate(limited.render(small.name, small_uops))  # 200 + 60000 iterations: under it
