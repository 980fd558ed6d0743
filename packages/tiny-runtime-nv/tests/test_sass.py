"""The machine code (SASS) of the rules' tensor-core kernels, read back by nvdisasm (a CUDA toolkit's, or the
nvidia-cuda-nvdisasm wheel's, which the nv nox session installs): CUDA C compiled by NVRTC to a cubin, PTX assembled
by ptxas into one, for sm_80 and sm_90. What PTX says is not yet what runs: these check that the staged products
reach the GPU as tensor-core instructions (HMMA) on tiles copied asynchronously (LDGSTS) and read by ldmatrix (LDSM),
and that CUDA C's code keeps to registers (no STL/LDL: local memory, where spills go). Compile-only."""

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
from tiny.runtime.nv.nvrtc import compile_cuda
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
    tool = _nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm: install a CUDA toolkit or pip install nvidia-cuda-nvdisasm (the nv nox session does)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        listing = subprocess.run([tool, f.name], capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    found = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", listing.stdout)
    assert found, listing.stdout[:2000]
    return found


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
    copied by LDGSTS (cp.async, 16 bytes: .128), its outputs stored in 32-bit pairs (STG.E); in CUDA C its fragments
    read by LDSM (ldmatrix: A as 4 8x8 matrices, B transposed) and no local memory at all. (The PTX renderer reads
    fragments with LDS, and its 64-bit address registers spill a few bytes: neither asserted.)"""
    x = square(dtype)
    made = CUDARenderer(target(arch)) if renderer == "CUDA" else PTXRenderer(target(arch))
    (k,) = render_schedule("matmul", x @ x, made, staged(x @ x, made, 1))
    ops = opcodes(cubin(k.src, renderer, arch))
    hmma = "HMMA.16816.F32" + (".BF16" if dtype == "bfloat16" else "")
    assert ops.count(hmma) == 64, sorted(set(ops))  # (a warp's 4 x 8 tiles, two steps of K a stage)
    assert "LDGSTS.E.BYPASS.128" in ops, sorted(set(ops))
    # the outputs: a lane's neighbours c0, c1 as one 32-bit store where aligned (the 16-bit ones: where not)
    assert ops.count("STG.E") == 64, sorted(set(ops))
    if renderer == "CUDA":
        assert "LDSM.16.M88.4" in ops and "LDSM.16.MT88.2" in ops, sorted(set(ops))
        assert not [op for op in ops if op.startswith(LOCAL_MEMORY)], sorted(set(ops))


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
