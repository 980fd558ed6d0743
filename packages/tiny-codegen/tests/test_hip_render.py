"""The HIP C renderer: its text (kernel declaration, clang's amdgcn builtins for ids and barriers, shared memory,
no HIP header), its caps per target, and that every kernel of the shared cases compiles as HIP device code for
each target the local clang knows (-nogpuinc -nogpulib)."""

from __future__ import annotations

from typing import Any

import pytest
from amd_clang import compile_amd
from kernel_helpers import make_cases, reduce, tensor

from tiny.codegen import render_for
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.hip import HIPRenderer
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp

TARGETS = ("gfx1100", "gfx1201", "gfx942", "gfx950")
CASES = make_cases()


def kernel_of(*targets: UOp) -> UOp:
    (item,) = create_schedule(list(targets)).items
    return item.ast


def test_caps_follow_the_target() -> None:
    caps = HIPRenderer("gfx950").caps
    assert caps.language == "HIP" and caps.has_local and caps.has_shared and caps.shared_max == 160 * 1024
    assert HIPRenderer().caps.shared_max == 65536 and HIPRenderer().target == "gfx1100"
    assert {dtypes.float16, dtypes.bfloat16, dtypes.float64} <= caps.dtypes
    with pytest.raises(ValueError, match="gfx name"):
        HIPRenderer("sm_80")


def test_kernel_text() -> None:
    a, b = tensor(64, 64), tensor(64, 64)
    src = render_for(kernel_of(a * b), HIPRenderer(), [Opt(OptOps.LOCAL, 0, 16)]).src
    head = 'extern "C" __attribute__((global)) void __attribute__((amdgpu_flat_work_group_size(1, 16))) E_64_64('
    assert head in src and "#include" not in src
    assert "int gidx0 = __builtin_amdgcn_workgroup_id_x(); /* 64 */" in src
    assert "int lidx0 = __builtin_amdgcn_workitem_id_x(); /* 16 */" in src
    assert src.index("force_cuda_host_device end") < src.index(head)
    compile_amd(src, "gfx1100", "hip")


@pytest.mark.parametrize("target", TARGETS)
def test_grouped_reduction_uses_shared_memory_and_a_barrier(target: str) -> None:
    src = render_for(kernel_of(reduce(tensor(4, 256), (1,))), HIPRenderer(target), [Opt(OptOps.GROUP, 1, 16)]).src
    assert "__attribute__((shared)) float temp0[16];" in src and "__builtin_amdgcn_s_barrier();" in src
    assert '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup")' in src
    compile_amd(src, target, "hip")


@pytest.mark.parametrize("target", TARGETS)
def test_half_bfloat16_and_bitcasts(target: str) -> None:
    h = tensor(64, dtype=dtypes.float16)
    src = render_for(kernel_of(h * h + h), HIPRenderer(target)).src
    assert "_Float16" in src
    compile_amd(src, target, "hip")
    b = tensor(64, dtype=dtypes.bfloat16)
    src = render_for(kernel_of(b * b), HIPRenderer(target)).src
    assert "tiny_bf16_round(" in src and "unsigned short* restrict data0" in src
    compile_amd(src, target, "hip")
    x = tensor(64)
    src = render_for(kernel_of(UOp(Ops.BITCAST, dtypes.int32, (x,))), HIPRenderer(target)).src
    assert "__builtin_bit_cast(int, (float)(" in src
    compile_amd(src, target, "hip")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_shared_case_compiles(case: Any, target: str) -> None:
    for item in create_schedule(case.targets).items:
        if item.ast.op is Ops.SINK:
            compile_amd(render_for(item.ast, HIPRenderer(target)).src, target, "hip")


@pytest.mark.parametrize("target", TARGETS)
def test_float64_transcendentals_are_amdmath_functions(target: str) -> None:
    d = tensor(64, dtype=dtypes.float64)
    src = render_for(kernel_of(d.alu(Ops.SIN) + d.alu(Ops.EXP2) * d.alu(Ops.LOG2)), HIPRenderer(target)).src
    for fn in ("sin", "exp2", "log2"):
        assert f"static inline double tiny_{fn}_f64(double x)" in src and f"__builtin_{fn}(" not in src
    compile_amd(src, target, "hip")
    assert "tiny_sin_f64" not in render_for(kernel_of(tensor(8) * 2.0), HIPRenderer(target)).src
