"""The AMDGPU renderer (LLVM IR for amdgcn-amd-amdhsa): its targets and caps, what its text says (kernel
signature, address spaces, id intrinsics, LDS, barriers, the attribute group), and that every kernel of the shared
cases compiles for each target the local clang knows. Running them needs an AMD GPU (tiny-runtime-amd)."""

from __future__ import annotations

from typing import Any

import pytest
from amd_clang import compile_amd
from kernel_helpers import make_cases, reduce, tensor

from tiny.codegen import render_for
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.amdgpu import AMDGPURenderer, amd_target
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp

TARGETS = ("gfx1100", "gfx1201", "gfx942", "gfx950")
CASES = make_cases()


def kernel_of(*targets: UOp) -> UOp:
    (item,) = create_schedule(list(targets)).items
    return item.ast


@pytest.mark.parametrize(
    "target, wave, lds, cdna",
    [
        ("gfx1100", 32, 65536, False),
        ("gfx1201", 32, 65536, False),
        ("gfx942", 64, 65536, True),
        ("gfx950", 64, 163840, True),
        ("gfx90a:xnack-", 64, 65536, True),
        ("gfx1030", 32, 65536, False),
    ],
)
def test_targets(target: str, wave: int, lds: int, cdna: bool) -> None:
    t = amd_target(target)
    assert (t.wavefront_size, t.lds_size, t.is_cdna) == (wave, lds, cdna)
    caps = AMDGPURenderer(target).caps
    assert caps.language == "AMDGPU" and caps.has_local and caps.has_shared
    assert caps.shared_max == lds and caps.local_total_max == 1024 and caps.local_max == (1024, 1024, 1024)
    assert {dtypes.float16, dtypes.bfloat16, dtypes.float64} <= caps.dtypes


def test_default_target_is_rdna3() -> None:
    assert AMDGPURenderer().target == "gfx1100" and AMDGPURenderer("").amd.name == "gfx1100"


@pytest.mark.parametrize(
    "target, message", [("sm_90", "gfx name"), ("gfx1100:xnack", "gfx name"), ("gfx803", "older than gfx9")]
)
def test_bad_targets_are_refused(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AMDGPURenderer(target)


def test_kernel_text() -> None:
    a, b = tensor(64, 64), tensor(64, 64)
    src = render_for(kernel_of(a * b), AMDGPURenderer("gfx942"), [Opt(OptOps.LOCAL, 0, 16)]).src
    assert src.startswith('target triple = "amdgcn-amd-amdhsa"\n')
    assert (
        'define amdgpu_kernel void @"E_64_64"(ptr addrspace(1) noalias %data0, ptr addrspace(1) noalias %data1' in src
    )
    assert "call i32 @llvm.amdgcn.workgroup.id.x()" in src and "call i32 @llvm.amdgcn.workitem.id.x()" in src
    assert "declare i32 @llvm.amdgcn.workitem.id.x()" in src
    attrs = src.strip().splitlines()[-1]
    assert attrs.startswith("attributes #0 = {") and '"amdgpu-flat-work-group-size"="1,16"' in attrs
    assert '"target-cpu"="gfx942"' in attrs and '"target-features"="+wavefrontsize64"' in attrs
    compile_amd(src, "gfx942", "ir")


def test_features_become_target_features() -> None:
    src = render_for(kernel_of(tensor(8) * 2.0), AMDGPURenderer("gfx90a:sramecc+:xnack-"), []).src
    assert '"target-features"="+wavefrontsize64,+sramecc,-xnack"' in src and '"target-cpu"="gfx90a"' in src
    compile_amd(src, "gfx90a", "ir")


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_reduction_uses_lds_and_a_barrier(target: str) -> None:
    src = render_for(kernel_of(reduce(tensor(4, 256), (1,))), AMDGPURenderer(target), [Opt(OptOps.GROUP, 1, 16)]).src
    assert "internal addrspace(3) global [16 x float] undef, align 16" in src
    fence = 'fence syncscope("workgroup") release\n  call void @llvm.amdgcn.s.barrier()\n'
    assert fence + '  fence syncscope("workgroup") acquire' in src
    assert '"amdgpu-flat-work-group-size"="1,16"' in src
    compile_amd(src, target, "ir")


@pytest.mark.parametrize("target", TARGETS)
def test_half_is_llvm_half_and_bfloat16_is_emulated(target: str) -> None:
    h = tensor(64, dtype=dtypes.float16)
    src = render_for(kernel_of(h * h + h), AMDGPURenderer(target)).src
    assert "fmul <4 x half>" in src or "fmul half" in src  # (not contract: float16 rounds after each op)
    compile_amd(src, target, "ir")
    b = tensor(64, dtype=dtypes.bfloat16)
    src = render_for(kernel_of(b * b), AMDGPURenderer(target)).src
    assert "@tiny_bf16_round" in src and "load i16" in src
    compile_amd(src, target, "ir")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_shared_case_compiles(case: Any, target: str) -> None:
    for item in create_schedule(case.targets).items:
        if item.ast.op is Ops.SINK:
            compile_amd(render_for(item.ast, AMDGPURenderer(target)).src, target, "ir")


@pytest.mark.parametrize("target", TARGETS)
def test_float64_transcendentals_are_amdmath_functions(target: str) -> None:
    d = tensor(64, dtype=dtypes.float64)
    src = render_for(kernel_of(d.alu(Ops.SIN) + d.alu(Ops.EXP2) * d.alu(Ops.LOG2)), AMDGPURenderer(target)).src
    for fn in ("sin", "exp2", "log2"):
        assert f"define internal double @tiny_{fn}_f64(double %x)" in src and f"@llvm.{fn}.f64" not in src
    compile_amd(src, target, "ir")
