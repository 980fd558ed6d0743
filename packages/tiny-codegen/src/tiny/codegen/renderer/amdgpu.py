"""The AMDGPU renderer: LLVM IR for the amdgcn-amd-amdhsa target, the AMD device's default language.

It is the LLVM IR renderer (tiny.codegen.renderer.llvmir) with the target part replaced: each kernel is an
`amdgpu_kernel` function whose buffers are global pointers (address space 1); workgroup and work-item ids come from the
llvm.amdgcn.workgroup.id.* and workitem.id.* intrinsics; local memory is an addrspace(3) global (LDS); a barrier
is a workgroup release fence, s_barrier and an acquire fence. float16 is the hardware's half; bfloat16 is emulated
as everywhere (16 bits in memory, float in registers); float64 exp2, log2 and sin, which have no instruction, are
tiny.codegen.renderer.amdmath's functions.

The renderer's target is the GPU: `gfx1100` (the default; RDNA3), `gfx1201` (RDNA4), `gfx942` (CDNA3, MI300),
`gfx950` (CDNA4, MI350) or another gfx name, optionally with features (`gfx942:xnack-`). RDNA (gfx10 and later)
runs waves of 32, CDNA and older GCN (gfx9) waves of 64; every kernel states both its target and its wave size,
and the largest workgroup it is launched with (amdgpu-flat-work-group-size) so that the compiler can budget
registers for exactly that.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tiny.codegen.renderer import amdmath
from tiny.codegen.renderer.llvmir import LLVMRenderer, _Function
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.tensorcore import TensorCore, tensor_core, tensor_cores_for
from tiny.ir.uop import Ops, UOp

_TARGET = re.compile(r"gfx([0-9]{1,2})([0-9a-f]{2})((?::[a-z0-9_]+[+-])*)")
_DIMS = "xyz"


@dataclass(frozen=True)
class AMDTarget:
    """What code generation needs to know of an AMD GPU, from its gfx name."""

    name: str  # the processor, gfx1100
    features: tuple[str, ...]  # target-id features: ("xnack-",)
    wavefront_size: int  # 32 on RDNA (gfx10+), 64 on GCN and CDNA (gfx9)
    lds_size: int  # bytes of LDS one workgroup may use

    @property
    def major(self) -> int:
        return int(self.name[3:-2])

    @property
    def is_cdna(self) -> bool:
        """gfx908, gfx90a, gfx94x, gfx950: the datacenter GPUs (matrix cores, wave64)."""
        return self.name in ("gfx908", "gfx90a") or self.name.startswith(("gfx94", "gfx95"))


def amd_target(target: str) -> AMDTarget:
    """Parse a renderer target such as 'gfx1100' or 'gfx942:sramecc+:xnack-' (an empty one is gfx1100)."""
    m = _TARGET.fullmatch(target or "gfx1100")
    if m is None:
        raise ValueError(
            f"an AMD target is a gfx name with optional features, e.g. 'gfx1100' or 'gfx942:xnack-'; got {target!r}"
        )
    name = (target or "gfx1100").split(":")[0]
    major = int(m.group(1))
    if major < 9:
        raise ValueError(f"{name} is older than gfx9 (GCN5): tiny generates code for gfx9 and later")
    features = tuple(f for f in m.group(3).split(":") if f)
    lds = 160 * 1024 if name == "gfx950" else 64 * 1024
    return AMDTarget(name, features, 32 if major >= 10 else 64, lds)


class AMDGPURenderer(LLVMRenderer):
    """LLVM IR for one AMD GPU, compiled to a code object by clang and ld.lld (tiny.runtime.amd.compiler)."""

    caps = RendererCaps(language="AMDGPU", has_local=True, has_shared=True)
    triple = "amdgcn-amd-amdhsa"
    prefetch = False
    global_addrspace = 1
    local_addrspace = 3

    def __init__(self, target: str = "gfx1100") -> None:
        self.target = target or "gfx1100"
        self.amd = amd_target(self.target)
        self.caps = RendererCaps(
            language="AMDGPU",
            has_local=True,
            has_shared=True,
            global_max=(2**31 - 1, 65535, 65535),
            local_max=(1024, 1024, 1024),
            local_total_max=1024,
            shared_max=self.amd.lds_size,
            vector_width=4,  # global_load_dwordx4: 16 bytes per lane and instruction
            tensor_cores=tensor_cores_for(self.amd.name),  # WMMA on gfx11/gfx12, MFMA on gfx942/gfx950
        )

    # ---------------------------------------------------------------- the target part of LLVMRenderer

    def signature(self, name: str, params: list[str]) -> str:
        return f'define amdgpu_kernel void @"{name}"({", ".join(params)}) #0'

    def special_param(self, u: UOp) -> str | None:
        return None  # read in the body, from intrinsics

    def special(self, f: _Function, u: UOp) -> str:
        name = u.arg[0]
        kind = "workitem" if name.startswith("lidx") else "workgroup"
        dim = int(name[4:])
        if kind == "workgroup" and not name.startswith("gidx"):
            raise ValueError(f"hardware index {name!r}: expected gidxN (workgroup) or lidxN (work item)")
        fn = f"llvm.amdgcn.{kind}.id.{_DIMS[dim]}"
        f.declares.add(f"declare i32 @{fn}()")
        return self._widened(f, f.value(f"call i32 @{fn}()"), u.dtype)

    inline_vexp2 = False  # the GPU's exp2 is an instruction

    def helper_source(self, name: str) -> str:
        fn = name.removeprefix("tiny_").removesuffix("_f64")
        if name == amdmath.ir_name(fn) and fn in amdmath.FUNCTIONS:
            return amdmath.ir_function(fn)
        return super().helper_source(name)

    def _intrinsic(self, f: _Function, fn: str, dt: DType, args: list[str]) -> str:
        """float64 exp2, log2 and sin have no instruction: tiny.codegen.renderer.amdmath's functions, lane by lane."""
        if dt.scalar != dtypes.float64 or fn not in amdmath.FUNCTIONS:
            return super()._intrinsic(f, fn, dt, args)
        f.declares.update(amdmath.IR_DECLARES)
        if dt.count == 1:
            return f.call(amdmath.ir_name(fn), "double", f"double {args[0]}")
        t, vec = self.ltype(dt), "poison"
        for i in range(dt.count):
            lane = f.value(f"extractelement {t} {args[0]}, i32 {i}")
            out = f.call(amdmath.ir_name(fn), "double", f"double {lane}")
            vec = f.value(f"insertelement {t} {vec}, double {out}, i32 {i}")
        return vec

    def barrier(self, f: _Function) -> None:
        f.declares.add("declare void @llvm.amdgcn.s.barrier()")
        f.line('fence syncscope("workgroup") release')
        f.line("call void @llvm.amdgcn.s.barrier()")
        f.line('fence syncscope("workgroup") acquire')

    def wmma(self, f: _Function, u: UOp, args: list[str]) -> str:
        """WMMA (gfx11, gfx12) or MFMA (gfx942, gfx950) on the fragments; bfloat16 fragments (float registers here,
        holding bfloat16 values exactly) go to the instruction as their 16-bit patterns."""
        tc = tensor_core(u.arg)
        if tc not in self.caps.tensor_cores:
            raise NotImplementedError(f"{self.amd.name} has no tensor core {tc.name}")
        a, b, c = (self._wmma_operand(f, tc, s.dtype, x) for s, x in zip(u.src, args))
        ta, tb, tc_t = (self._wmma_type(tc, s.dtype) for s in u.src)
        n_in, n_out = tc.a.elements, tc.c.elements
        elem = "f16" if tc.dtype_in == dtypes.float16 else "i16"
        if tc.name.startswith("cdna"):
            fn = "llvm.amdgcn.mfma.f32.16x16x16f16" if elem == "f16" else "llvm.amdgcn.mfma.f32.16x16x16bf16.1k"
            tail, tail_types = ", i32 0, i32 0, i32 0", ", i32, i32, i32"  # cbsz, abid, blgp: no broadcasts
        else:
            kind = "f16" if elem == "f16" else "bf16"
            fn = f"llvm.amdgcn.wmma.f32.16x16x16.{kind}.v{n_out}f32.v{n_in}{elem}"
            tail, tail_types = "", ""
        f.declares.add(f"declare {tc_t} @{fn}({ta}, {tb}, {tc_t}{tail_types})")
        return f.value(f"call {tc_t} @{fn}({ta} {a}, {tb} {b}, {tc_t} {c}{tail})")

    def _wmma_type(self, tc: TensorCore, dt: DType) -> str:
        return f"<{dt.count} x i16>" if dt.scalar == dtypes.bfloat16 else self.ltype(dt)

    def _wmma_operand(self, f: _Function, tc: TensorCore, dt: DType, x: str) -> str:
        if dt.scalar != dtypes.bfloat16:
            return x
        n = dt.count
        bits = f.value(f"bitcast <{n} x float> {x} to <{n} x i32>")
        high = f.value(f"lshr <{n} x i32> {bits}, <{', '.join(['i32 16'] * n)}>")
        return f.value(f"trunc <{n} x i32> {high} to <{n} x i16>")

    # ---------------------------------------------------------------- the kernel's attributes

    def render(self, name: str, uops: list[UOp]) -> str:
        return super().render(name, uops) + "\n" + self.attributes(uops) + "\n"

    def attributes(self, uops: list[UOp]) -> str:
        """The kernel's attribute group: its target, wave size and the workgroup size it is launched with."""
        local = math.prod(u.arg[1] for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"))
        wave = f"+wavefrontsize{self.amd.wavefront_size}"
        features = ",".join([wave, *(f"{f[-1]}{f[:-1]}" for f in self.amd.features)])
        return (
            f'attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,{local}" '
            f'"target-cpu"="{self.amd.name}" "target-features"="{features}" "uniform-work-group-size"="true" }}'
        )
