"""Tensor cores on NVIDIA, compile-only: an fp16 or bf16 matrix product planned for sm_80 or sm_90 maps onto
mma.sync.aligned.m16n8k16 (tiny.ir.tensorcore), rendered as CUDA C (inline PTX, compiled by NVRTC to a cubin) and as
PTX (assembled by ptxas). What the instruction computes, lane by lane, is the PYTHON emulator's definition
(tiny-runtime-misc's test_python_wmma); running it on a GPU is the CUDA device's tests."""

from __future__ import annotations

import numpy as np
import pytest
from nv_kernels import render_schedule, target
from test_cuda_compile import _ptxas_release, nvrtc, nvrtc_ptx, ptx_for_ptxas, ptxas

from tiny.codegen.opt import Kernel, Opt, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.device import Renderer
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops
from tiny.runtime.nv.nvrtc import compile_cuda, installed
from tiny.tensor import Tensor

ARCHS = ("sm_80", "sm_90")


def matmul(dtype: str, m: int = 64, k: int = 64, n: int = 64) -> Tensor:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((m, k)).astype(np.float32), device="CPU").cast(dtypes.from_name(dtype)).realize()
    b = Tensor(rng.standard_normal((k, n)).astype(np.float32), device="CPU").cast(dtypes.from_name(dtype)).realize()
    return a @ b


def staged(product: Tensor, renderer: Renderer, how: int) -> list[Opt]:
    """The rules' plan for a product (its schedule's one kernel) with its tiles copied through registers (how 0) or
    asynchronously (how 1, the rules' own choice where the renderer has cp.async)."""
    (item,) = product.schedule()
    rules = hand_opts(Kernel(item.ast, renderer.caps))
    assert rules[-1].op is OptOps.STAGE, rules
    return [*rules[:-1], Opt(OptOps.STAGE, rules[-1].axis, how)]


def mma(dtype: str) -> str:
    tag = "f16" if dtype == "float16" else "bf16"
    return f"mma.sync.aligned.m16n8k16.row.col.f32.{tag}.{tag}.f32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_c_compiles_to_mma(arch: str, dtype: str) -> None:
    (k,) = render_schedule("matmul", matmul(dtype), CUDARenderer(target(arch)))
    assert sum(u.op is Ops.WMMA for u in k.uops) == 64, "the heuristics' plan: 4 x 8 tiles per warp, two steps of K"
    assert mma(dtype) in k.src
    assert mma(dtype) in nvrtc_ptx(k.src, arch), "NVRTC keeps the instruction"
    assert compile_cuda(nvrtc(), k.src, arch, cubin=True)[:4] == b"\x7fELF"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_assembles_with_mma(arch: str, dtype: str) -> None:
    opts = [Opt(OptOps.TC, 2, 0 if dtype == "float16" else 1), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 2)]
    (k,) = render_schedule("matmul", matmul(dtype), PTXRenderer(target(arch)), opts)
    assert k.src.count(mma(dtype)) == 2
    assert ptxas(k.src, arch) == ""


def test_only_sm_80_and_newer_declare_tensor_cores() -> None:
    for renderer in (CUDARenderer, PTXRenderer):
        assert len(renderer(target("sm_80")).caps.tensor_cores) == 2
        assert renderer(target("sm_75")).caps.tensor_cores == ()
        assert renderer(target("sm_80")).caps.async_copy and not renderer(target("sm_75")).caps.async_copy
    (k,) = render_schedule("matmul", matmul("float16"), CUDARenderer(target("sm_75")))
    assert "mma" not in k.src


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_padded_matmul_compiles(dtype: str) -> None:
    """M, K and N padded to the tile: gated loads and stores, fragment elements in the padding selected to zero."""
    t = matmul(dtype, 20, 24, 10)
    (k,) = render_schedule("matmul", t, CUDARenderer(target("sm_80")))
    assert mma(dtype) in nvrtc_ptx(k.src, "sm_80")
    (p,) = render_schedule("matmul", t, PTXRenderer(target("sm_80")))
    assert mma(dtype) in p.src and ptxas(p.src, "sm_80") == ""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_c_hands_loaded_fragments_to_mma_as_bits(dtype: str) -> None:
    """Fragments loaded from memory reach mma.sync as their 16 bits: no conversion to float and back per element
    (899 cvt instructions in the 4096 x 4096 kernel's PTX before, 3 after)."""
    (k,) = render_schedule("matmul", matmul(dtype), CUDARenderer(target("sm_90")))
    tag = "f16" if dtype == "float16" else "bf16"
    assert f"tiny_{tag}_to_f32(" not in k.src.split("__global__")[1], "no loaded value is converted to float"
    assert "tiny_vec<unsigned short, 8>" in k.src and "tiny_vec<unsigned short, 4>" in k.src
    ptx = nvrtc_ptx(k.src, "sm_90")
    assert mma(dtype) in ptx
    if dtype == "float16":  # conversions are left in the epilogue alone: the float32 sums rounded to float16
        assert ptx.count("cvt.f32.f16") <= ptx.count("st.global.u16")


def test_a_computed_fragment_is_converted_once() -> None:
    """A factor that is computed (a scaled matrix, fused into the product) is a float in registers: converted at the
    mma where fragments come from memory, at its copy into local memory where the tiles are staged (whose
    fragments are then bits). Both forms compile."""
    rng = np.random.default_rng(1)
    p = Tensor(rng.standard_normal((64, 64)).astype(np.float32), device="CPU").cast(dtypes.float16).realize()
    q = Tensor(rng.standard_normal((64, 64)).astype(np.float32), device="CPU").cast(dtypes.float16).realize()
    plain = [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.LOCAL, 0, 2)]
    for opts, computed, loaded in ((plain, "float, 8", "unsigned short, 4"), (None, None, "unsigned short, 8")):
        (k,) = render_schedule("matmul", (p * 2) @ q, CUDARenderer(target("sm_90")), opts)
        body = k.src.split("__global__")[1]
        assert (computed is None) == ("stage0" in body)
        assert f"tiny_vec<{loaded}>" in body and (computed is None or f"tiny_vec<{computed}>" in body)
        assert compile_cuda(nvrtc(), k.src, "sm_90", cubin=True)[:4] == b"\x7fELF"


@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_staged_4096_product_keeps_to_registers(renderer: str, dtype: str) -> None:
    """The rules' kernel for a 4096 x 4096 product with its tiles staged through registers (STAGE 0), assembled for
    sm_90: one barrier, its two double-buffered tiles in shared memory; CUDA C with no spills to local memory. (PTX,
    whose addresses are 64-bit registers, spills a few bytes before its K loop and reads them back after it:
    test_sass checks the loop has none.)"""
    rng = np.random.default_rng(0)
    small = Tensor(rng.standard_normal((4096, 1)).astype(np.float32), device="CPU").cast(dtypes.from_name(dtype))
    x = small.expand(4096, 4096).contiguous().realize()
    made = CUDARenderer(target("sm_90")) if renderer == "CUDA" else PTXRenderer(target("sm_90"))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 0))
    ptx = ptx_for_ptxas(k.src, "sm_90") if renderer == "CUDA" else k.src
    report = ptxas(ptx, "sm_90", report=True)
    assert "used 1 barriers" in report and "38912 bytes smem" in report, report  # A 2 x 128 x 40, B 2 x 32 x 2 x 72
    assert renderer == "PTX" or "0 bytes spill stores, 0 bytes spill loads" in report, report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_asynchronously_staged_4096_product_assembles(arch: str, renderer: str, dtype: str) -> None:
    """The rules' kernel for a 4096 x 4096 product (STAGE 1): its tiles copied by cp.async (16 bytes a
    copy, the next iteration's while this one's are read), one barrier after cp.async.wait_all; CUDA C through NVRTC
    keeps to registers (PTX, whose addresses are 64-bit registers, spills a few bytes: not asserted)."""
    rng = np.random.default_rng(0)
    small = Tensor(rng.standard_normal((4096, 1)).astype(np.float32), device="CPU").cast(dtypes.from_name(dtype))
    x = small.expand(4096, 4096).contiguous().realize()
    made = CUDARenderer(target(arch)) if renderer == "CUDA" else PTXRenderer(target(arch))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 1))
    if renderer == "CUDA":
        ptx = nvrtc_ptx(k.src, arch)
        assert compile_cuda(nvrtc(), k.src, arch, cubin=True)[:4] == b"\x7fELF"
    else:
        ptx = k.src
    assert ptx.count("cp.async.cg.shared.global") == 16 and "cp.async.wait_all" in ptx
    assert mma(dtype) in ptx
    if renderer == "PTX":
        report = ptxas(ptx, arch, report=True)
        assert "used 1 barriers" in report and "38912 bytes smem" in report, report
    else:
        release = _ptxas_release()
        fits = [n for n in installed() if release is not None and n.version <= release]
        if fits:  # (NVRTC's PTX through ptxas: the newest NVRTC whose PTX ISA this ptxas knows)
            old = compile_cuda(max(fits, key=lambda n: n.version), k.src, arch, cubin=False).rstrip(b"\0").decode()
            report = ptxas(old, arch, report=True)
            assert "0 bytes spill stores, 0 bytes spill loads" in report and "used 1 barriers" in report, report


@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
def test_asynchronous_copies_from_a_matrix_one_value_into_its_buffer(renderer: str) -> None:
    """A matrix that starts one value into its buffer: no 16-byte run of it is aligned, so each copy checks its own
    address (cp.async where aligned, else value by value); both renderers' code assembles."""
    flat = Tensor(np.zeros(256 * 256 + 1, np.float32), device="CPU").cast(dtypes.float16).realize()
    b = Tensor(np.zeros((256, 256), np.float32), device="CPU").cast(dtypes.float16).realize()
    made = CUDARenderer(target("sm_80")) if renderer == "CUDA" else PTXRenderer(target("sm_80"))
    product = flat[1:].reshape(256, 256) @ b
    (k,) = render_schedule("matmul", product, made, staged(product, made, 1))
    if renderer == "CUDA":
        assert compile_cuda(nvrtc(), k.src, "sm_80", cubin=True)[:4] == b"\x7fELF"
        assert "cp.async.cg.shared.global" in nvrtc_ptx(k.src, "sm_80")
    else:
        assert "cp.async.cg.shared.global" in k.src and "ld.global.b16" in k.src
        assert ptxas(k.src, "sm_80") == ""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_staged_3x3_convolution_keeps_to_registers(dtype: str) -> None:
    """The rules stage a 3 x 3 convolution's tiles too (the window's loops around K): in CUDA C for sm_90, one
    barrier, the double-buffered tiles in shared memory and no spills."""
    dt = dtypes.from_name(dtype)
    x = Tensor(np.zeros((2, 128, 28, 28), np.float32), device="CPU").cast(dt).realize()
    w = Tensor(np.zeros((128, 128, 3, 3), np.float32), device="CPU").cast(dt).realize()
    *_, k = render_schedule("conv", x.conv2d(w, padding=1), CUDARenderer(target("sm_90")))
    assert "stage0" in k.src and mma(dtype) in nvrtc_ptx(k.src, "sm_90")
    report = ptxas(ptx_for_ptxas(k.src, "sm_90"), "sm_90", report=True)
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "used 1 barriers" in report, report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
def test_a_float32_product_on_tf32_tensor_cores_compiles(arch: str, renderer: str) -> None:
    """With tf32=1 in the target (TF32=1 on a CUDA device) the rules put a float32 product (scheduled as on a GPU:
    PYTHON) on mma.sync.aligned.m16n8k8 with .tf32 inputs, each rounded by cvt.rna.tf32.f32; NVRTC makes a cubin and
    ptxas assembles the PTX of both renderers, CUDA C's with no spills (PTX's 64-bit address registers spill a few
    hundred bytes, as its 16-bit staged products do). Without tf32=1, no mma at all."""
    a = Tensor.empty(256, 256, device="PYTHON").realize()
    b = Tensor.empty(256, 256, device="PYTHON").realize()
    made = CUDARenderer if renderer == "CUDA" else PTXRenderer
    (k,) = render_schedule("matmul", a @ b, made(target(arch) + ";tf32=1"))
    if renderer == "CUDA":
        assert compile_cuda(nvrtc(), k.src, arch, cubin=True)[:4] == b"\x7fELF"
        ptx = ptx_for_ptxas(k.src, arch)
    else:
        ptx = k.src
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx and "cvt.rna.tf32.f32" in ptx
    assert "st.global.v2.f32" in ptx  # (a lane's c0 and c1, neighbours in a row of the output, stored together)
    report = ptxas(ptx, arch, report=True)
    assert renderer == "PTX" or "0 bytes spill stores, 0 bytes spill loads" in report, report
    (plain,) = render_schedule("matmul", a @ b, made(target(arch)))
    assert "mma" not in plain.src
