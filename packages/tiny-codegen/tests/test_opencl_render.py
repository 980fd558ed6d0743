"""The OpenCL C renderer: what its text says (hardware indices, __local memory and barriers, OpenCL's vector
types, extensions, constants), the caps it reads from a device's target string, and that every kernel of the
shared cases is OpenCL C that clang accepts (-x cl -fsyntax-only; skipped where no clang knows OpenCL). Running
the kernels is the CL device's test (tiny-runtime-misc) and the tensor suite's with DEVICE=CL."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from typing import Any

import pytest
from kernel_helpers import const, make_cases, reduce, tensor

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import lower_kernel
from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.renderer.opencl import OpenCLRenderer
from tiny.codegen.vectorize import VectorTarget, vectorize
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.spec import validate
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp

f32, i32 = dtypes.float32, dtypes.int32
TARGET = "vector_width=4;local_max=1024,1024,64;local_total_max=256;shared_max=49152;features=fp64"
R = OpenCLRenderer(TARGET)
CASES = make_cases()


def render(ast: UOp, opts: list[Opt] | None = None, r: OpenCLRenderer = R) -> str:
    """Plan (the hand-written rules unless opts are given), lower, vectorize, linearize and render, as the
    code generator does for a CL device."""
    k = Kernel(ast, r.caps)
    k.apply_opts(hand_opts(k) if opts is None else opts)
    lowered = lower_kernel(k)
    sink = graph_rewrite(graph_rewrite(lowered.sink, symbolic), vectorize, ctx=VectorTarget(r.caps.vector_width * 4))
    uops = linearize(sink)
    validate(uops)
    return r.render(lowered.name, uops)


def kernel_of(*targets: UOp) -> UOp:
    (item,) = create_schedule(list(targets)).items
    return item.ast


@cache
def opencl_clang() -> str | None:
    """A clang on PATH that checks OpenCL C (with its default OpenCL header)."""
    for cc in ("clang", *(f"clang-{v}" for v in range(25, 13, -1))):
        if shutil.which(cc) and _syntax_errors(cc, "__kernel void k(__global float* a) { a[0] = sqrt(a[1]); }") == "":
            return cc
    return None


def _syntax_errors(cc: str, src: str) -> str:
    args = [cc, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-fsyntax-only", "-"]
    r = subprocess.run(args, input=src.encode(), capture_output=True)
    return "" if r.returncode == 0 else r.stderr.decode() or "failed"


def check_syntax(src: str) -> None:
    cc = opencl_clang()
    if cc is None:
        pytest.skip("no clang on PATH checks OpenCL C")
    assert _syntax_errors(cc, src) == "", f"{cc} refused:\n{_syntax_errors(cc, src)}\n--- source ---\n{src}"


# ---------------------------------------------------------------- caps from the device


def test_caps_come_from_the_target_string() -> None:
    caps = R.caps
    assert caps.language == "OpenCL" and caps.has_local and caps.has_shared
    assert caps.local_max == (1024, 1024, 64) and caps.local_total_max == 256 and caps.shared_max == 49152
    assert caps.vector_width == 4
    assert dtypes.float16 not in caps.dtypes and dtypes.float64 in caps.dtypes and dtypes.bfloat16 in caps.dtypes
    both = OpenCLRenderer(TARGET.replace("features=fp64", "features=fp16,fp64")).caps.dtypes
    assert {dtypes.float16, dtypes.float64} <= both
    neither = OpenCLRenderer(TARGET.replace("features=fp64", "features=")).caps.dtypes
    assert dtypes.float16 not in neither and dtypes.float64 not in neither
    assert {dtypes.float16, dtypes.float64} <= OpenCLRenderer().caps.dtypes  # no device: render everything


@pytest.mark.parametrize(
    "target, message",
    [("vector_width", "key=value"), ("local_max=1,2", "local_max in the renderer target has 3 sizes")],
)
def test_bad_target_strings_are_refused(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpenCLRenderer(target)


def test_workgroup_dims_stay_within_the_device_limits() -> None:
    small = OpenCLRenderer("vector_width=4;local_max=8,8,2;local_total_max=256;shared_max=4096;features=")
    k = Kernel(kernel_of(tensor(16, 16, 16) * 2.0), small.caps)
    with pytest.raises(KernelOptError, match=r"workgroup dims \[16\] exceed the renderer's limits \[8, 8, 2\]"):
        k.apply(Opt(OptOps.LOCAL, 2, 16))
    k.apply(Opt(OptOps.LOCAL, 2, 4))
    k.apply(Opt(OptOps.LOCAL, 1, 4))  # lidx0 now; the first moves to lidx1
    with pytest.raises(KernelOptError, match=r"workgroup dims \[2, 4, 4\]"):
        k.apply(Opt(OptOps.LOCAL, 0, 2))  # would put the first (4 threads) in lidx2, which holds 2


# ---------------------------------------------------------------- the text


def test_kernel_signature_and_hardware_indices() -> None:
    a, b = tensor(64, 64), tensor(64, 64)
    src = render(kernel_of(a * b), [Opt(OptOps.LOCAL, 0, 16)])
    assert src.startswith(  # no contraction: x * y + z rounds twice, as in every other kernel that computes it
        "#pragma OPENCL FP_CONTRACT OFF\n"
        "__kernel void E_64_64(__global float* restrict data0, __global const float* restrict data1,"
        " __global const float* restrict data2) {"
    )
    assert "int gidx0 = get_group_id(0); /* 64 */" in src and "int lidx0 = get_local_id(0); /* 16 */" in src
    assert "for (" not in src  # hardware indices, no loops over outputs
    check_syntax(src)


def test_vectors_are_opencl_types_with_vload_and_vstore() -> None:
    a, b = tensor(16, 64), tensor(16, 64)
    src = render(kernel_of((a * b).alu(Ops.EXP2).maximum(a)))
    assert "float4 " in src and "vload4(0, (data1+" in src and "vstore4(" in src
    assert "exp2(" in src and "select(" in src and "tiny_v" not in src
    check_syntax(src)


def test_grouped_reduction_uses_local_memory_and_a_barrier() -> None:
    src = render(kernel_of(reduce(tensor(4, 256), (1,))), [Opt(OptOps.GROUP, 1, 16)])
    assert "__local float temp0[16];" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
    assert "get_local_id(0)" in src
    check_syntax(src)


def test_bool_memory_is_uchar_and_extensions_are_enabled_where_used() -> None:
    a = tensor(8)
    src = render(kernel_of(a.lt(const(0.5, (8,)))))
    assert "__global uchar* restrict data0" in src
    d = tensor(8, dtype=dtypes.float64)
    src = render(kernel_of(d * d))
    assert src.startswith("#pragma OPENCL FP_CONTRACT OFF\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n")
    assert "double" in src
    check_syntax(src)
    h = tensor(8, dtype=dtypes.float16)
    src = render(kernel_of((h * h).alu(Ops.SQRT)), r=OpenCLRenderer())
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" in src and "half" in src
    check_syntax(src)


def test_bfloat16_is_16_bits_in_memory_and_float_in_registers() -> None:
    x = tensor(8, dtype=dtypes.bfloat16)
    src = render(kernel_of(x * x + x))
    assert "__global ushort* restrict data0" in src and "as_float((uint)b << 16)" in src
    assert "tiny_bf16_round(" in src
    check_syntax(src)


@pytest.mark.parametrize(
    "value, dtype, text",
    [
        (float("nan"), f32, "NAN"),
        (float("-inf"), f32, "-INFINITY"),
        (1.5, f32, "1.5f"),
        (-(2**63), dtypes.int64, "(-9223372036854775807l-1)"),
        (2**64 - 1, dtypes.uint64, "18446744073709551615ul"),
        (7, dtypes.uint32, "7u"),
        (-3, dtypes.int8, "((char)-3)"),
    ],
)
def test_constant_text(value: Any, dtype: DType, text: str) -> None:
    assert R.const(value, dtype) == text


def test_bitcasts_and_float_to_int_casts() -> None:
    x = tensor(8)
    bits = UOp(Ops.BITCAST, i32, (x,))
    src = render(kernel_of(bits))
    assert "as_int(" in src
    check_syntax(src)
    src = render(kernel_of(x.cast(dtypes.int64)))
    assert "long long" not in src and "(long)" in src and "(-0x1p63)" in src
    check_syntax(src)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_shared_case_is_opencl_c(case: Any) -> None:
    for item in create_schedule(case.targets).items:
        check_syntax(render(item.ast))
