"""Matrix cores: an fp16 or bf16 matrix product, planned by the hand heuristics for an AMD target, maps onto its
tensor core (tiny.ir.tensorcore: RDNA3/RDNA4 WMMA, CDNA MFMA), renders as the AMDGPU renderer's intrinsic, and
compiles to v_wmma (gfx11, gfx12) or v_mfma (gfx942, gfx950) instructions. What the instruction computes, lane by
lane, is the PYTHON emulator's definition (tiny-runtime-misc's test_python_wmma)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from amd_helpers import TARGETS, compiler
from test_amd_disasm import disassemble, mnemonics

from tiny.codegen.opt import Kernel, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.renderer.amdgpu import AMDGPURenderer
from tiny.codegen.renderer.hip import HIPRenderer
from tiny.ir.device import Device
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops
from tiny.runtime.amd.kfd import AMDDevice
from tiny.tensor import Tensor
from tiny.tensor.realize import capture

INSTRUCTION = {"gfx1100": "v_wmma_f32_16x16x16", "gfx1201": "v_wmma_f32_16x16x16", "gfx942": "v_mfma_f32_16x16x16"}
INSTRUCTION["gfx950"] = INSTRUCTION["gfx942"]
_NAMES = itertools.count(11)


def operands(dtype: str, m: int = 64, k: int = 64, n: int = 64) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((m, k)).astype(np.float32)).cast(dtypes.from_name(dtype)).realize()
    b = Tensor(rng.standard_normal((k, n)).astype(np.float32)).cast(dtypes.from_name(dtype)).realize()
    return a, b


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_matmul_compiles_to_matrix_instructions(target: str, dtype: str) -> None:
    a, b = operands(dtype)
    ops = mnemonics(disassemble(target, "AMDGPU", a @ b))
    kind = "f16" if dtype == "float16" else "bf16"
    found = sorted(m for m in ops if m.startswith(INSTRUCTION[target]))
    assert found and all(m.endswith(kind) for m in found), sorted(ops)


@pytest.mark.parametrize("target", TARGETS)
def test_the_heuristics_choose_the_tensor_core_only_where_it_fits(target: str) -> None:
    caps = AMDGPURenderer(target).caps
    assert [tc.threads for tc in caps.tensor_cores] == [32 if target.startswith("gfx1") else 64] * 2

    def plan(x: Tensor) -> list:
        (ast,) = [i.ast for i in x.schedule() if i.ast.op is Ops.SINK]
        return hand_opts(Kernel(ast, caps))

    a, b = operands("float16")
    assert plan(a @ b)[0].op is OptOps.TC
    g, h = operands("float16", 20, 24, 10)  # M, K and N padded to the tile first
    assert [o.op for o in plan(g @ h)][:4] == [OptOps.PADTO] * 3 + [OptOps.TC]
    c, d = operands("float16", 6, 40, 24)  # M = 6: padding it to 16 would more than double it
    assert all(o.op is not OptOps.TC for o in plan(c @ d))
    e, f = Tensor(np.ones((64, 64), np.float32)), Tensor(np.ones((64, 64), np.float32))
    assert all(o.op is not OptOps.TC for o in plan(e @ f)), "float32 inputs: no matrix core takes them"


def test_older_targets_declare_no_tensor_cores() -> None:
    assert AMDGPURenderer("gfx1030").caps.tensor_cores == () and AMDGPURenderer("gfx90a").caps.tensor_cores == ()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("target", ["gfx1100", "gfx1201", "gfx942"])
def test_a_matmul_on_the_mock_gpu(target: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AMD device on the mock driver: the kernel is compiled by the real toolchain and run as its linearized
    program on the PYTHON emulator, WMMA included."""
    pytest.importorskip("tiny.runtime.python", reason="the mock runs kernels on tiny-runtime-misc's PYTHON device")
    compiler(target)  # skips where the toolchain does not know the target
    monkeypatch.setenv("AMD_MOCK", target)
    # a device of its own (AMD may be open already, with another target), under a name no other test used: buffers
    # of an earlier test freed late go back to the device their name finds
    name = f"AMD:{next(_NAMES)}"
    monkeypatch.setitem(Device._open, name, AMDDevice("AMD", "AMDGPU"))
    rng = np.random.default_rng(1)
    av, bv = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    dt = dtypes.from_name(dtype)
    a, b = Tensor(av, device=name).cast(dt).realize(), Tensor(bv, device=name).cast(dt).realize()
    with capture() as launches:
        out = (a @ b).cast(dtypes.float32).realize()
    intrinsic = "llvm.amdgcn.mfma" if target == "gfx942" else "llvm.amdgcn.wmma"
    assert any(lnc.program is not None and intrinsic in lnc.program.src for lnc in launches)
    ra, rb = (Tensor(x).cast(dt).cast(dtypes.float32).numpy() for x in (av, bv))
    np.testing.assert_allclose(out.numpy(), ra @ rb, rtol=2e-2, atol=2e-2 * np.abs(ra @ rb).max())


@pytest.mark.parametrize("target", ["gfx1100", "gfx942"])
def test_a_padded_matmul_compiles(target: str) -> None:
    a, b = operands("float16", 20, 24, 10)
    ops = mnemonics(disassemble(target, "AMDGPU", a @ b))
    assert any(m.startswith(INSTRUCTION[target]) for m in ops), sorted(ops)


@pytest.mark.parametrize("target", TARGETS)
def test_hip_renders_the_float16_matrix_cores(target: str) -> None:
    """HIP C: clang's WMMA/MFMA builtins for float16 (bfloat16, emulated in floats there, stays on AMDGPU)."""
    assert [tc.dtype_in for tc in HIPRenderer(target).caps.tensor_cores] == [dtypes.float16]
    a, b = operands("float16")
    ops = mnemonics(disassemble(target, "HIP", a @ b))
    assert any(m.startswith(INSTRUCTION[target]) and m.endswith("f16") for m in ops), sorted(ops)
    c, d = operands("bfloat16")
    (ast,) = [i.ast for i in (c @ d).schedule() if i.ast.op is Ops.SINK]
    assert all(o.op is not OptOps.TC for o in hand_opts(Kernel(ast, HIPRenderer(target).caps)))
