"""The CUDA C renderer: its text, and what its kernels compute, compiled for the CPU with a CUDA shim (cuda_host.py)
and run with each block's threads as real threads (so barriers and shared memory are exercised): the shared cases
with hardware indices, locals and grouped reductions, vector loads at aligned and misaligned addresses, every cast
between dtypes, the ALU's edge cases and the float math, against NumPy and tiny.ir.alu. Whether NVRTC compiles the
text is tiny-runtime-nv's test; running it on a GPU is the CUDA suite's. Skips where no clang++ builds C++20."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from alu_cases import ALL, EDGE, loop_uops, np_dtype, read, same, to_memory, values
from cuda_host import Job, compiler, run, run_all
from kernel_helpers import GPU_TARGET, NUMPY, make_cases, past_static_shared, reduce, renders_with, run_case, tensor

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import lower_kernel
from tiny.codegen.opt import Kernel, Opt, OptOps
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.ir.alu import exec_alu
from tiny.ir.device import fold_grid
from tiny.ir.dtypes import dtypes, truncate
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp

pytestmark = pytest.mark.skipif(compiler() is None, reason="no clang++ here builds C++20 with std::barrier")
f32, i32 = dtypes.float32, dtypes.int32
R = CUDARenderer(GPU_TARGET)
CASES = make_cases()
ONE = (1, 1, 1)


render = renders_with(R)  # (the hand-written rules unless opts are given)


def run_cuda(ast: UOp, arrays: list[np.ndarray], opts: list[Opt] | None = None, misalign: int = 0) -> str:
    src, lowered = render(ast, opts)
    run(src, arrays, lowered.global_size, lowered.local_size, misalign=misalign)
    return src


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_compute_what_numpy_does(case: Any) -> None:
    got = run_case(case, lambda ast, arrays: run_cuda(ast, arrays))
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


def test_local_buffers_past_48_kib_are_pieces_of_the_dynamic_shared_array() -> None:
    """64 KiB of local buffers: one `extern __shared__` array whose size the source says for the runtime, each
    buffer a pointer at its offset; under 48 KiB, static arrays as before."""
    uops, want = past_static_shared()
    src = R.render("big", uops)
    assert "// dynamic shared memory: 65536 bytes" in src and "extern __shared__ __align__(16) unsigned char" in src
    assert "float* b = (float*)(tiny_shared + 32768);" in src and "__shared__ float a[" not in src
    out = np.zeros(32, np.float32)
    run(src, [out], ONE, (32, 1, 1))
    np.testing.assert_array_equal(out, want)
    small, _ = past_static_shared(4096)
    assert "tiny_shared" not in R.render("small", small)


def test_grouped_reduction_with_shared_memory_and_barriers() -> None:
    (item,) = create_schedule([reduce(tensor(4, 256), (1,))]).items
    xv = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    out = np.zeros(4, np.float32)
    src = run_cuda(item.ast, [out, xv.reshape(-1).copy()], [Opt(OptOps.GROUP, 1, 16), Opt(OptOps.LOCAL, 0, 2)])
    assert "__shared__ float temp0" in src and "__syncthreads();" in src and "__launch_bounds__(32)" in src
    np.testing.assert_allclose(out, xv.sum(1), rtol=1e-5)


@pytest.mark.parametrize("misalign", [0, 4])
def test_vector_loads_and_stores_aligned_or_not(misalign: int) -> None:
    a, b = tensor(16, 64), tensor(16, 64)
    (item,) = create_schedule([(a * b).maximum(a)]).items
    rng = np.random.default_rng(1)
    av, bv = (rng.standard_normal(16 * 64).astype(np.float32) for _ in range(2))
    out = np.zeros(16 * 64, np.float32)
    src = run_cuda(item.ast, [out, av, bv], misalign=misalign)
    assert "tiny_vload<float, 4>" in src and "tiny_vstore<float, 4>" in src and "tiny_vmax(" in src
    np.testing.assert_array_equal(out, np.maximum(av * bv, av))


def test_alu_edge_cases_match_exec_alu() -> None:
    jobs, checks = [], []
    for i, (op, dtype, xs, ys) in enumerate(EDGE):
        a, b = np.array(xs, NUMPY[dtype.name]), np.array(ys, NUMPY[dtype.name])
        out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
        out = np.zeros(len(xs), NUMPY[out_dtype.name])
        uops = loop_uops([out_dtype, dtype, dtype], lambda x, y, op=op: x.alu(op, y), len(xs))
        jobs.append(Job(R.render(f"binary{i}", uops), [out, a, b]))
        checks.append((op, dtype, out_dtype, a, b, out))
    run_all(jobs)
    for op, dtype, out_dtype, a, b, out in checks:
        for k in range(len(a)):
            want = exec_alu(op, out_dtype, (a[k].item(), b[k].item()))
            assert same(out[k].item(), want), (op, dtype, a[k], b[k], out[k], want)


def test_float_math() -> None:
    xs = [0.0, -0.0, 1.0, 2.5, -2.5, 10.0, 0.3, math.inf, -math.inf, math.nan, -1.0, 100.0, -1000.5]
    jobs, checks = [], []
    for dtype in (f32, dtypes.float64, dtypes.float16, dtypes.bfloat16):
        for op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.RECIP, Ops.NEG):
            vals = [truncate(dtype, x) for x in xs]
            a = to_memory(dtype, vals)
            out = np.zeros(len(xs), a.dtype)
            uops = loop_uops([dtype, dtype], lambda x, op=op: x.alu(op), len(xs))
            jobs.append(Job(R.render(f"unary{len(jobs)}", uops), [out, a]))
            checks.append((op, dtype, vals, out))
    run_all(jobs)
    for op, dtype, vals, out in checks:
        for k, x in enumerate(vals):
            want, got = exec_alu(op, dtype, (x,)), read(dtype, out[k])
            if op in (Ops.SIN, Ops.EXP2, Ops.LOG2) and math.isfinite(want):
                tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float64: 1e-15}.get(dtype, 1e-6)
                assert got == pytest.approx(want, rel=tol, abs=tol), (op, dtype, x, got, want)
            else:
                assert same(got, want), (op, dtype, x, got, want)


def test_casts_from_every_dtype_to_every_dtype_match_truncate() -> None:
    """One kernel per source dtype, storing its casts to every dtype."""
    jobs, checks = [], []
    for frm in ALL:
        xs = values(frm)
        n = len(xs)
        outs = [np.zeros(n, np_dtype(to)) for to in ALL]
        gs = [UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), k) for k, d in enumerate([*ALL, frm])]
        r = UOp.range(UOp.const(i32, n), 0)
        idx = [UOp(Ops.INDEX, g.dtype, (g, r)) for g in gs]
        x = UOp(Ops.LOAD, frm, (idx[-1],))
        casts = [x.cast(to) for to in ALL]
        stores = [UOp(Ops.STORE, src=(ix, c)) for ix, c in zip(idx, casts)]
        uops = [*gs, UOp.const(i32, n), r, *idx, x, *casts, *stores, UOp(Ops.ENDRANGE, src=(r,))]
        jobs.append(Job(R.render(f"casts_{frm.name}", uops), [*outs, to_memory(frm, xs)]))
        checks.append((frm, xs, outs))
    run_all(jobs)
    for frm, xs, outs in checks:
        for to, out in zip(ALL, outs):
            for k, v in enumerate(xs):
                want = truncate(to, v)
                assert same(read(to, out[k]), want), (frm, to, v, read(to, out[k]), want)


def test_text() -> None:
    a = tensor(1000)
    (item,) = create_schedule([a * 2.0]).items
    src, lowered = render(item.ast)
    assert 'extern "C" __global__ void __launch_bounds__(' in src and f") {lowered.name}(float* restrict data0" in src
    assert "blockIdx.x" in src and "threadIdx.x" in src and "#include" not in src
    h = tensor(8, dtype=dtypes.float16)
    (item,) = create_schedule([h * h]).items
    src, _ = render(item.ast)
    assert "unsigned short* restrict data0" in src and "tiny_f16_round(" in src and "tiny_f16_to_f32(" in src


def test_a_grid_over_the_limit_is_launched_folded() -> None:
    """With at most 16 blocks per dimension, a grid of 8 x 64 blocks runs as fold_grid folds it (16 x 16 x 2)."""
    folding = CUDARenderer("arch=sm_90;max_grid=16")
    (item,) = create_schedule([tensor(64, 8) * 2.0]).items
    lowered = lower_kernel(Kernel(item.ast, folding.caps))
    src = folding.render(lowered.name, linearize(graph_rewrite(lowered.sink, symbolic)))
    assert lowered.global_size == (8, 64, 1) and "if (tiny_block >= 512u) return;" in src
    av = np.arange(64 * 8, dtype=np.float32)
    out = np.zeros_like(av)
    run(src, [out, av], fold_grid(lowered.global_size, 16), lowered.local_size)
    np.testing.assert_array_equal(out, av * 2)
