"""The machine code (SASS) of the rules' tensor-core kernels, read back by nvdisasm (a CUDA toolkit's, or the
nvidia-cuda-nvdisasm wheel's, which the nv nox session installs): CUDA C compiled by NVRTC to a cubin, PTX assembled
by ptxas into one, for sm_80 and sm_90. What PTX says is not yet what runs: these check that the staged products
reach the GPU as tensor-core instructions (HMMA) on tiles copied asynchronously (LDGSTS) and read by ldmatrix (LDSM),
from both renderers, and that CUDA C's code keeps to registers (no STL/LDL: local memory, where spills go).
Compile-only."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from nv_kernels import render_schedule, target
from test_cuda_compile import _ptxas, nvrtc
from test_nv_tensor_cores import staged

from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.runtime.nv.nvrtc import CUDACompiler, PTXCompiler, compile_cuda, split_dynamic_shared
from tiny.tensor import Tensor, dtypes

ARCHS = ("sm_80", "sm_90")
LOCAL_MEMORY = ("STL", "LDL")  # stores to and loads from a thread's local memory: spilled registers


@functools.cache
def _nvdisasm() -> str | None:
    """nvdisasm from a CUDA toolkit (PATH, /usr/local/cuda) or from the nvidia-cuda-nvdisasm wheel."""
    found = shutil.which("nvdisasm") or shutil.which("/usr/local/cuda/bin/nvdisasm")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None and not found else []:
        for folder in ("cu13", "cuda_nvdisasm"):  # (the wheel's layout for CUDA 13, and for 12)
            found = found or shutil.which(os.path.join(root, folder, "bin", "nvdisasm"))
    return found


def opcodes(cubin: bytes) -> list[str]:
    """The instructions of a cubin, as nvdisasm lists them (predicates dropped): HMMA.16816.F32, LDSM.16.M88.4 ..."""
    text = listing(cubin)
    found = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
    assert found, text[:2000]
    return found


def listing(cubin: bytes) -> str:
    """nvdisasm's listing of a cubin (skips where there is no nvdisasm)."""
    tool = _nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm: install a CUDA toolkit or pip install nvidia-cuda-nvdisasm (the nv nox session does)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, f.name], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def local_memory_in_loops(cubin: bytes) -> list[str]:
    """The STL/LDL instructions inside a loop (between a label and a branch back to it): spills the loop pays for
    every iteration, where a spill before a loop and its reload after cost once."""
    return _in_loops(listing(cubin))


def _in_loops(text: str) -> list[str]:
    lines = text.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    inside = []
    for i, line in enumerate(lines):
        if (m := re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i:
            inside += [x.strip() for x in lines[labels[m.group(1)] : i] if re.search(r"\b(STL|LDL)\b", x)]
    return inside


def assembled(ptx: str, arch: str) -> bytes:
    """ptxas's cubin of PTX (skips where there is no ptxas)."""
    tool = _ptxas()
    if tool is None:
        pytest.skip("no ptxas: install a CUDA toolkit or pip install nvidia-cuda-nvcc-cu12 (the nv nox session does)")
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        made = subprocess.run([tool, f"-arch={arch}", "-o", out, src], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        with open(out, "rb") as f:
            return f.read()


def cubin(src: str, renderer: str, arch: str) -> bytes:
    return compile_cuda(nvrtc(), src, arch, cubin=True) if renderer == "CUDA" else assembled(src, arch)


def square(dtype: str, n: int = 4096) -> Tensor:
    small = Tensor(np.zeros((n, 1), np.float32), device="CPU").cast(dtypes.from_name(dtype))
    return small.expand(n, n).contiguous().realize()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_staged_product_runs_hmma_on_tiles_copied_asynchronously_and_read_by_ldmatrix(
    arch: str, renderer: str, dtype: str
) -> None:
    """The rules' 4096 x 4096 product (STAGE 1): HMMA.16816 with float32 accumulators (bf16's named so), its tiles
    copied by LDGSTS (cp.async, 16 bytes: .128), its fragments read by LDSM (ldmatrix: A as 4 8x8 matrices, B
    transposed), its outputs stored in 32-bit pairs (STG.E); in CUDA C no local memory at all. (PTX's 64-bit address
    registers spill a few bytes on sm_80: not asserted.)"""
    x = square(dtype)
    made = CUDARenderer(target(arch)) if renderer == "CUDA" else PTXRenderer(target(arch))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 1))
    ops = opcodes(cubin(k.src, renderer, arch))
    hmma = "HMMA.16816.F32" + (".BF16" if dtype == "bfloat16" else "")
    assert ops.count(hmma) == 64, sorted(set(ops))  # (a warp's 4 x 8 tiles, two steps of K a stage)
    assert "LDGSTS.E.BYPASS.128" in ops, sorted(set(ops))
    # the outputs: a lane's neighbours c0, c1 as one 32-bit store where aligned (the 16-bit ones: where not)
    assert ops.count("STG.E") == 64, sorted(set(ops))
    assert ops.count("LDSM.16.M88.4") == 8 and ops.count("LDSM.16.MT88.2") == 16, sorted(set(ops))
    if renderer == "CUDA":
        assert not [op for op in ops if op.startswith(LOCAL_MEMORY)], sorted(set(ops))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
@pytest.mark.parametrize("how", [0, 1])
def test_the_staged_products_k_loop_keeps_to_registers(arch: str, renderer: str, how: int) -> None:
    """The K loop of the rules' 4096 product, its tiles staged through registers (STAGE 0) or copied asynchronously
    (STAGE 1), has no local memory in it: CUDA C none at all; PTX, whose addresses are 64-bit registers, spills a few
    (a 64-bit address before the loop, read back after it: ptxas at 255 registers), never inside the loop."""
    x = square("float16")
    made = CUDARenderer(target(arch)) if renderer == "CUDA" else PTXRenderer(target(arch))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, how))
    code = cubin(k.src, renderer, arch)
    assert "HMMA.16816.F32" in opcodes(code) and local_memory_in_loops(code) == []
    if renderer == "CUDA":
        assert not [op for op in opcodes(code) if op.startswith(LOCAL_MEMORY)]


def test_the_loop_check_finds_local_memory_inside_a_loop_only() -> None:
    """What local_memory_in_loops reads from a listing: a spill before a loop and its reload after are not in it; a
    store to local memory between a label and a branch back to that label is, as is one in a loop ended by a
    predicated branch."""
    text = """
        /*0000*/                   STL.64 [R1], R4 ;
    .L_x_0:
        /*0010*/                   HMMA.16816.F32 R8, R12, R14, R8 ;
        /*0020*/              @!P0 BRA `(.L_x_0) ;
        /*0030*/                   LDL.LU.64 R4, [R1] ;
    .L_x_1:
        /*0040*/                   LDL R6, [R1+0x8] ;
        /*0050*/              @P1 BRA `(.L_x_1) ;
        /*0060*/                   BRA `(.L_x_2) ;
    .L_x_2:
        /*0070*/                   STL [R1+0x10], R6 ;
    """
    assert _in_loops(text) == ["/*0040*/                   LDL R6, [R1+0x8] ;"]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_float32_product_with_tf32_runs_its_tensor_core(arch: str) -> None:
    """TF32=1: a float32 product's SASS is HMMA.1688.F32.TF32 (m16n8k8; each input rounded first) on tiles copied by
    LDGSTS, with no local memory; without it, FFMA and no HMMA."""
    a = Tensor.empty(256, 256, device="PYTHON").realize()
    b = Tensor.empty(256, 256, device="PYTHON").realize()
    (k,) = render_schedule("matmul", a @ b, CUDARenderer(target(arch) + ";tf32=1"))
    ops = opcodes(cubin(k.src, "CUDA", arch))
    assert "HMMA.1688.F32.TF32" in ops and "LDGSTS.E.BYPASS.128" in ops, sorted(set(ops))
    assert not [op for op in ops if op.startswith(LOCAL_MEMORY)], sorted(set(ops))
    (plain,) = render_schedule("matmul", a @ b, CUDARenderer(target(arch)))
    ops = opcodes(cubin(plain.src, "CUDA", arch))
    assert "FFMA" in ops and not [op for op in ops if op.startswith("HMMA")], sorted(set(ops))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
def test_a_bfloat16_products_outputs_are_rounded_by_the_conversion_unit(arch: str, renderer: str) -> None:
    """sm_80 and newer round float32 to bfloat16 with cvt (F2FP.BF16 in SASS, pairs packed), as float16 is: the
    bfloat16 product's epilogue has the float16 one's integer work (LOP3), where rounding in integer arithmetic took
    hundreds more; the kernel is at most half again the float16 one's size (it was twice it: 3392 against 1856)."""
    made = CUDARenderer(target(arch)) if renderer == "CUDA" else PTXRenderer(target(arch))
    ops = {}
    for dtype in ("float16", "bfloat16"):
        x = square(dtype)
        (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 1))
        ops[dtype] = opcodes(cubin(k.src, renderer, arch))
    assert any(op.startswith("F2FP.BF16") for op in ops["bfloat16"]), sorted(set(ops["bfloat16"]))
    lop3 = [sum(op.startswith("LOP3") for op in ops[dt]) for dt in ("float16", "bfloat16")]
    assert lop3[1] <= lop3[0], lop3
    assert len(ops["bfloat16"]) < 1.5 * len(ops["float16"]), (len(ops["float16"]), len(ops["bfloat16"]))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", ["CUDA", "PTX"])
@pytest.mark.parametrize("ahead", [2, 3])
def test_tiles_copied_further_ahead_wait_for_their_own_group_only(arch: str, renderer: str, ahead: int) -> None:
    """STAGE 2 and 3 of the rules' 4096 product on a GPU that gives a block more than 48 KiB (an H100's 227 KiB):
    its 3 or 4 buffers of 19456 bytes in dynamic shared memory, which the compiled image carries for the launch;
    the tiles of `ahead` iterations copied before the loop (LDGSTS) and each one's in the loop, and the loop's wait
    leaving the newest ahead - 1 groups in flight (DEPBAR.LE SB0, ahead - 1); no local memory in the loop."""
    t = target(arch).replace("shared_max=49152", "shared_max=232448")
    made = CUDARenderer(t) if renderer == "CUDA" else PTXRenderer(t)
    x = square("float16")
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, ahead))
    assert f"// dynamic shared memory: {19456 * (ahead + 1)} bytes" in k.src
    compiler = CUDACompiler(arch, nvrtc()) if renderer == "CUDA" else PTXCompiler(arch)
    image, shared = split_dynamic_shared(compiler.compile(k.src))
    assert shared == 19456 * (ahead + 1)
    binary = cubin(k.src, renderer, arch)
    ops = opcodes(binary)
    assert ops.count("HMMA.16816.F32") == 64 and ops.count("LDGSTS.E.BYPASS.128") == 8 * (ahead + 1), sorted(set(ops))
    waits = {line.split("*/")[1].strip().rstrip(" ;") for line in listing(binary).splitlines() if "DEPBAR.LE" in line}
    assert f"DEPBAR.LE SB0, 0x{ahead - 1}" in waits, waits
    assert local_memory_in_loops(binary) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_the_ptx_products_k_loop_issues_no_fallback_copies_and_no_division(arch: str) -> None:
    """PTX's copy of a staged tile: cp.async, and the value-by-value copy for an unaligned source branched around
    (each predicated-off instruction of it took an issue slot every iteration: 64 LDG and 64 STS); index math's
    division and remainder by a power of two as a shift and a mask (ptxas kept rem.s32 by 2 a division through the
    reciprocal: I2F, MUFU.RCP, F2I in the loop)."""
    x = square("float16")
    made = PTXRenderer(target(arch))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 1))
    assert not re.search(r"@%p\d+ st\.shared", k.src) and "bra $L_copied" in k.src
    assert not re.search(r"\b(div|rem)\.", k.src)
    ops = opcodes(cubin(k.src, "PTX", arch))
    assert not {"I2F", "MUFU", "F2I"} & {op.split(".")[0] for op in ops}, sorted(set(ops))
