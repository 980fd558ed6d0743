"""Compile-only tests of the CUDA stack, runnable without a GPU: every kernel of a representative set of tensor ops
(nv_kernels.py), planned for an H100's limits, rendered as CUDA C and compiled by NVRTC to a cubin for sm_80 and
sm_90, and rendered as PTX and assembled by ptxas for the same architectures (skipped, with the reason, where no
CUDA toolkit's ptxas is on PATH). Then what the code says (vector loads, shared memory and barriers, f16
instructions), how NVRTC is chosen for a driver, and the compilers' errors."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import shutil
import subprocess
import tempfile

import pytest
from nv_kernels import ops, render_schedule, target

from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.device import CompileError, DeviceUnavailable
from tiny.ir.dtypes import dtypes
from tiny.ir.tensorcore import TENSOR_CORES
from tiny.ir.uop import Ops, UOp
from tiny.runtime.nv.nvrtc import CUDA_OPTIONS, CUDACompiler, PTXCompiler, compile_cuda, find_nvrtc, installed
from tiny.tensor import Tensor

ARCHS = ("sm_80", "sm_90")
OPS = ops()


def nvrtc():  # noqa: ANN201
    if not installed():
        pytest.skip("no NVRTC: pip install nvidia-cuda-nvrtc (the nv nox session does)")
    return installed()[0]


@functools.cache
def _ptxas() -> str | None:
    """ptxas from a CUDA toolkit (PATH, /usr/local/cuda) or from the nvidia-cuda-nvcc-cu12 wheel."""
    found = shutil.which("ptxas") or shutil.which("/usr/local/cuda/bin/ptxas")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None and not found else []:
        found = found or shutil.which(os.path.join(root, "cuda_nvcc", "bin", "ptxas"))
    return found


def ptxas(src: str, arch: str, report: bool = False) -> str:
    """ptxas's complaints about the PTX ('' when it assembles), or with report its -v report of each kernel
    (registers, spills, barriers, shared memory; an assertion where it does not assemble); skips where there is no
    ptxas."""
    tool = _ptxas()
    if tool is None:
        pytest.skip("no ptxas: install a CUDA toolkit or pip install nvidia-cuda-nvcc-cu12 (the nv nox session does)")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(src)
        f.flush()
        verbose = ["-v"] if report else []
        r = subprocess.run([tool, *verbose, f"-arch={arch}", "-o", "/dev/null", f.name], capture_output=True, text=True)
    if report:
        assert r.returncode == 0, r.stderr
        return r.stderr
    return "" if r.returncode == 0 else r.stderr or "failed"


def nvrtc_ptx(src: str, arch: str) -> str:
    return compile_cuda(nvrtc(), src, arch, cubin=False, options=CUDA_OPTIONS).rstrip(b"\0").decode()


def ptx_for_ptxas(src: str, arch: str) -> str:
    """NVRTC's PTX of a CUDA C kernel in a PTX ISA this ptxas knows: from the newest NVRTC not newer than ptxas's own
    release (skips, saying why, where there is no ptxas or every NVRTC installed is newer)."""
    release = _ptxas_release()
    if release is None:
        ptxas("", arch)  # skips, saying why
    fits = [n for n in installed() if release is not None and n.version <= release]
    if not fits:
        pytest.skip(f"no NVRTC installed is as old as ptxas {release}: its PTX ISA would be too new for it")
    return compile_cuda(max(fits, key=lambda n: n.version), src, arch, cubin=False).rstrip(b"\0").decode()


# ---------------------------------------------------------------- the sweep


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_cuda_c_compiles_to_a_cubin(op: str, arch: str) -> None:
    n = nvrtc()
    kernels = render_schedule(op, OPS[op](), CUDARenderer(target(arch)))
    assert kernels, f"{op} scheduled no kernel"
    for k in kernels:
        binary = CUDACompiler(arch, n).compile(k.src)
        assert binary[:4] == b"\x7fELF", f"{k.name}: NVRTC gave no cubin"


@functools.cache
def _ptxas_release() -> tuple[int, int] | None:
    tool = _ptxas()
    if tool is None:
        return None
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_cuda_c_compiles_to_ptx_that_ptxas_assembles(op: str, arch: str) -> None:
    """NVRTC's PTX (what the device falls back to where NVRTC has no cubin for the GPU), assembled by ptxas: with the
    newest NVRTC whose PTX ISA this ptxas knows (not newer than ptxas's own release)."""
    for k in render_schedule(op, OPS[op](), CUDARenderer(target(arch))):
        ptx = ptx_for_ptxas(k.src, arch)
        errors = ptxas(ptx, arch)
        assert errors == "", f"ptxas refused NVRTC's PTX of {k.name}:\n{errors}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_ptx_assembles(op: str, arch: str) -> None:
    for k in render_schedule(op, OPS[op](), PTXRenderer(target(arch))):
        assert k.src.count(f".target {arch}") == 1
        assert PTXCompiler(arch).compile(k.src).endswith(b"\0")
        errors = ptxas(k.src, arch)
        assert errors == "", f"ptxas refused {k.name}:\n{errors}\n--- PTX ---\n{k.src}"


# ---------------------------------------------------------------- what the code says


def test_vector_loads_are_v4_in_both_renderers() -> None:
    a, b = (Tensor.ones(64, 64, device="CPU").contiguous().realize() for _ in range(2))
    (k,) = render_schedule("mul", a * b, PTXRenderer(target("sm_90")))
    assert any(u.dtype.count == 4 for u in k.uops if u.op is Ops.LOAD), "the plan made no vector load"
    assert "ld.global.v4.f32" in k.src and "st.global.v4.f32" in k.src
    assert ptxas(k.src, "sm_90") == ""
    (c,) = render_schedule("mul", a * b, CUDARenderer(target("sm_90")))
    assert "tiny_vload<float, 4>" in c.src
    assert any(w in nvrtc_ptx(c.src, "sm_90") for w in ("ld.global.nc.v4.f32", "ld.global.v4.f32"))


def test_a_grid_dim_past_65535_workgroups_is_launched_not_looped() -> None:
    """A softmax over attention's scores (batch x heads x queries rows, 262144 here) is one workgroup per row: the
    rows' dim is the grid's x (CUDA and HIP take 2**31-1 workgroups there; CUDA's renderers fold a bigger grid), not
    a loop in one workgroup over all of them (which ran attention 4000 times slower on an H200)."""
    from tiny.codegen.renderer.hip import HIPRenderer

    x = Tensor.ones(8, 16, 2048, 4, device="CPU").contiguous().realize()
    for renderer in (CUDARenderer(target("sm_90")), PTXRenderer(target("sm_90")), HIPRenderer()):
        (k,) = render_schedule("softmax", x.softmax(-1), renderer)
        assert math.prod(k.global_size) == 8 * 16 * 2048, k.global_size
        assert not any(u.op is Ops.RANGE and u.end.arg == 8 * 16 * 2048 for u in k.uops)
        if isinstance(renderer, PTXRenderer):
            assert ptxas(k.src, "sm_90") == ""
        elif isinstance(renderer, CUDARenderer):
            assert "bar.sync" in nvrtc_ptx(k.src, "sm_90")


def test_grouped_reduction_uses_shared_memory_and_a_barrier() -> None:
    x = Tensor.ones(4, 256, device="CPU").contiguous().realize()
    (k,) = render_schedule("sum", x.sum(axis=1), PTXRenderer(target("sm_90")), [Opt(OptOps.GROUP, 1, 16)])
    assert ".shared .align 16 .b8 temp0[64];" in k.src and "bar.sync 0;" in k.src and "%tid.x" in k.src
    assert ".maxntid 16, 1, 1" in k.src
    assert ptxas(k.src, "sm_90") == ""
    (c,) = render_schedule("sum", x.sum(axis=1), CUDARenderer(target("sm_90")), [Opt(OptOps.GROUP, 1, 16)])
    assert "__align__(16) __shared__ float temp0[16];" in c.src and "__syncthreads();" in c.src
    assert "__launch_bounds__(16)" in c.src and "threadIdx.x" in c.src
    assert "bar.sync" in nvrtc_ptx(c.src, "sm_90")


@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
def test_a_weight_gradients_partial_products_keep_to_registers(renderer: str) -> None:
    """The MNIST step's second convolution's weight gradient (32 x 32 x 5 x 5 over 128 x 20 x 20), scheduled for a
    device with workgroups (PYTHON, as a GPU: its batch split into 64 partial products, then their sum) and planned
    for sm_90: ptxas reports no spills (a tile of 100 outputs, each a vector of 4 steps, spilled 4.5 KB)."""
    x = Tensor.empty(128, 32, 24, 24, device="PYTHON").realize()
    w = Tensor.empty(32, 32, 5, 5, device="PYTHON").realize()
    w.requires_grad = True
    y = x.conv2d(w)
    (dw,) = y.gradient(w, gradient=Tensor.empty(*y.shape, device="PYTHON").realize())
    made = CUDARenderer(target("sm_90")) if renderer == "CUDA" else PTXRenderer(target("sm_90"))
    kernels = render_schedule("weight_gradient", dw, made)
    assert [k.name for k in kernels] == ["r_64_32_32_5_5_2_20_20", "r_32_32_5_5_64"]
    for k in kernels:
        ptx = ptx_for_ptxas(k.src, "sm_90") if renderer == "CUDA" else k.src
        report = ptxas(ptx, "sm_90", report=True)
        assert "0 bytes spill stores, 0 bytes spill loads" in report, report


def test_float_products_and_sums_are_never_fused_but_an_accumulator_takes_fma() -> None:
    """x * x - y must be exactly 0 where y holds x * x computed in another kernel: no compiler fuses a product into
    the sum after it (NVRTC: --fmad=false; PTX: .rn, which ptxas never contracts), and a reduction's accumulator asks
    for its fma itself (CUDA C: tiny_fma; the SASS of both keeps the elementwise product apart)."""
    x, y = (Tensor.ones(7, device="CPU").contiguous().realize() for _ in range(2))
    (k,) = render_schedule("mad", x * x - y, PTXRenderer(target("sm_90")))
    assert "mul.rn.f32" in k.src and "add.rn.f32" in k.src and "fma" not in k.src
    assert ptxas(k.src, "sm_90") == ""
    (c,) = render_schedule("mad", x * x - y, CUDARenderer(target("sm_90")))
    ptx = nvrtc_ptx(c.src, "sm_90")  # (without --fmad=false: mul.f32 and sub.f32, which ptxas fuses)
    assert "mul.rn.f32" in ptx and "sub.rn.f32" in ptx and "fma" not in ptx, ptx
    assert "--fmad=false" in CUDACompiler("sm_90", nvrtc()).cachekey
    a = Tensor.ones(16, 16, device="CPU").contiguous().realize()
    (m,) = render_schedule("matmul", a @ a, CUDARenderer(target("sm_90")))
    assert "tiny_fma(" in m.src
    assert "fma.rn.f32" in nvrtc_ptx(m.src, "sm_90")


def test_half_math_uses_f16_instructions() -> None:
    h = Tensor.ones(64, device="CPU").cast(dtypes.float16).realize()
    (k,) = render_schedule("half", h * h + h, PTXRenderer(target("sm_80")))
    assert "mul.f16" in k.src and "add.f16" in k.src and "ld.global.b16" in k.src and "st.global.b16" in k.src
    assert ptxas(k.src, "sm_80") == ""
    (c,) = render_schedule("half", h * h + h, CUDARenderer(target("sm_80")))
    assert "tiny_f16_round(" in c.src and "unsigned short* restrict data0" in c.src  # 16 bits in memory


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_bfloat16_is_float_math_rounded_after_each_op(arch: str) -> None:
    """float32 arithmetic, each result rounded to bfloat16: by cvt.rn.bf16.f32 from sm_80 on, by integer arithmetic
    before (no bfloat16 instruction there); a NaN is stored as 0x7fc0 either way."""
    b = Tensor.ones(64, device="CPU").cast(dtypes.bfloat16).realize()
    (k,) = render_schedule("bf16", b * b + b, PTXRenderer(target(arch)))
    assert "mul.f32" in k.src and "add.f32" in k.src and "ld.global.u16" in k.src and "0x7fc0" in k.src
    body = k.src.split("}")[0].split("{", 1)[1]
    assert sorted(set(re.findall(r"\S*bf16\S*", body))) == (["cvt.rn.bf16.f32"] if arch == "sm_90" else [])
    assert ptxas(k.src, arch) == ""


def test_integer_division_is_guarded_and_max_lets_nan_win() -> None:
    i = Tensor.ones(64, device="CPU").cast(dtypes.int32).realize()
    (k,) = render_schedule("div", i // i, PTXRenderer(target("sm_90")))
    assert "div.s32" in k.src and "setp.eq.s32" in k.src  # a zero divisor gives 0, not the hardware's answer
    f = Tensor.ones(64, device="CPU").contiguous().realize()
    (k,) = render_schedule("max", f.maximum(f * 2), PTXRenderer(target("sm_90")))
    assert "setp.nan.f32" in k.src


def test_kernel_signature() -> None:
    a = Tensor.ones(1000, device="CPU").contiguous().realize()
    (c,) = render_schedule("add", a + 1, CUDARenderer(target("sm_90")))
    assert 'extern "C" __global__ void __launch_bounds__(' in c.src
    assert "float* restrict data0, const float* restrict data1" in c.src
    (k,) = render_schedule("add", a + 1, PTXRenderer(target("sm_90")))
    assert ".visible .entry " in k.src and ".param .u64 data0" in k.src and ".version 7.8" in k.src
    (k,) = render_schedule("add", a + 1, PTXRenderer(target("sm_80")))
    assert ".version 7.0" in k.src and ".target sm_80" in k.src


def test_wmma_of_a_tensor_core_the_arch_lacks_is_refused_by_name() -> None:
    """Tensor-core kernels themselves are test_nv_tensor_cores'; an AMD tensor core's WMMA is not NVIDIA's."""
    tc = TENSOR_CORES["rdna3_16x16x16_float16_float32"]
    frags = tuple(UOp.const(dt, 0.0) for dt in (tc.a_dtype, tc.b_dtype, tc.c_dtype))
    wmma = UOp(Ops.WMMA, tc.c_dtype, frags, tc.name)
    for r in (CUDARenderer(target("sm_90")), PTXRenderer(target("sm_90"))):
        with pytest.raises(NotImplementedError, match="sm_90 has no tensor core rdna3"):
            r.render("k", [*frags, wmma])


@pytest.mark.parametrize("bad", ["arch=sm_9x", "arch=gfx90a", "arch=sm_60;local_max=1,2"])
def test_bad_targets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        PTXRenderer(bad)
    if "sm_60" not in bad:
        with pytest.raises(ValueError, match="arch"):
            CUDARenderer(bad)


# ---------------------------------------------------------------- NVRTC and the driver


def test_nvrtc_is_chosen_for_the_driver() -> None:
    n = nvrtc()
    newest = installed()[0]
    assert find_nvrtc(None) is newest
    assert find_nvrtc(n.version[0] * 1000 + 990) is newest or n.version[0] < newest.version[0]
    with pytest.raises(DeviceUnavailable, match=r"older than every NVRTC installed"):
        find_nvrtc(min(x.version[0] for x in installed()) * 1000 - 1000)


def test_compilers_key_their_cache_by_nvrtc_and_arch() -> None:
    n = nvrtc()
    c80, c90 = CUDACompiler("sm_80", n), CUDACompiler("sm_90", n)
    assert c80.cachekey != c90.cachekey and f"nvrtc{n.version[0]}.{n.version[1]}" in str(c80.cachekey)
    assert c80.cubin  # NVRTC makes cubins for sm_80: the driver loads them without a PTX JIT


def test_compile_errors_carry_the_log_and_the_source() -> None:
    src = 'extern "C" __global__ void k(float* a) { a[0] = undefined_thing; }'
    with pytest.raises(CompileError, match="undefined_thing") as e:
        CUDACompiler("sm_90", nvrtc()).compile(src)
    assert "--- source ---" in str(e.value) and "sm_90" in str(e.value)
    with pytest.raises(CompileError, match=r"must say `.target sm_90`"):
        PTXCompiler("sm_90").compile(".version 7.0\n.target sm_80\n")
    with pytest.raises(ValueError, match="sm_90"):
        CUDACompiler("compute_90", nvrtc())
