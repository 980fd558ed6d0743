"""HIP C: kernels for AMD GPUs as C++ device code, the conservative alternative to the AMDGPU LLVM IR renderer.

The source needs no HIP header and no ROCm device library (clang -x hip -nogpuinc -nogpulib): workgroup and
work-item ids are clang's __builtin_amdgcn_workgroup_id_x / workitem_id_x, a barrier is a workgroup release fence,
__builtin_amdgcn_s_barrier and an acquire fence, local memory is `__attribute__((shared))`, math is clang's
builtins (which become LLVM intrinsics). Vectors are clang's GNU vectors with the helpers the C renderer uses
(tiny.codegen.renderer.cstyle.CRenderer); every helper is made a device function by
`#pragma clang force_cuda_host_device`. float16 is _Float16; bfloat16 is emulated, as in C; float64 exp2, log2 and
sin are tiny.codegen.renderer.amdmath's. The target is the GPU, as for the AMDGPU renderer ('gfx1100').
"""

from __future__ import annotations

import math
from dataclasses import replace

from tiny.codegen.renderer import amdmath
from tiny.codegen.renderer.amdgpu import amd_target
from tiny.codegen.renderer.cstyle import CRenderer, CWalk, GPUCStyleRenderer
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.tensorcore import tensor_core, tensor_cores_for
from tiny.ir.uop import Ops, UOp

_DIMS = "xyz"


class HIPRenderer(GPUCStyleRenderer):
    """HIP C for one AMD GPU, compiled by clang as device code only (tiny.runtime.amd.compiler.HIPCompiler)."""

    caps = RendererCaps(language="HIP")
    language = "HIP"
    kernel_prefix = 'extern "C" __attribute__((global)) void'
    local_qualifier = "__attribute__((shared)) "
    barrier_text = (
        '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
        '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");'
    )
    type_names = CRenderer.type_names | {"bool": "bool"}
    grid_max = (2**31 - 1, 65535, 65535)  # HIP's grid dims (its runtime folds nothing)
    mvec = False  # no glibc vector math on the GPU: vector math goes lane by lane
    inline_exp2 = False  # the GPU has an exp2 instruction per lane

    # GNU vectors and their helpers, as the C renderer writes them
    vector_typedef = CRenderer.vector_typedef
    vector_prelude = CRenderer.vector_prelude
    _half_conversion = CRenderer._half_conversion
    vector_math = CRenderer.vector_math
    # HIPCompiler compiles with -ffp-contract=off: a reduction's accumulator asks for its fused multiply-add
    multiply_add = CRenderer.multiply_add
    multiply_add_helper = CRenderer.multiply_add_helper
    _fma_type = CRenderer._fma_type

    def __init__(self, target: str = "gfx1100") -> None:
        amd = amd_target(target)
        limits = f"vector_width=4;local_max=1024,1024,1024;local_total_max=1024;shared_max={amd.lds_size}"
        super().__init__(limits)
        self.target, self.amd = target or "gfx1100", amd
        # the float16 matrix cores (bfloat16 ones are the AMDGPU renderer's: here bfloat16 is emulated in floats)
        cores = tuple(tc for tc in tensor_cores_for(amd.name) if tc.dtype_in == dtypes.float16)
        self.caps = replace(self.caps, tensor_cores=cores)

    def special(self, w: CWalk, name: str) -> str:
        kind = "workitem" if name.startswith("lidx") else "workgroup"
        return f"__builtin_amdgcn_{kind}_id_{_DIMS[int(name[4:])]}()"

    def float_math(self, fn: str, args: list[str], dt: DType) -> str:
        if dt.scalar == dtypes.float64 and fn in amdmath.FUNCTIONS:  # no instruction: tiny.codegen.renderer.amdmath's
            return f"{amdmath.ir_name(fn)}({args[0]})"
        return super().float_math(fn, args, dt)

    def wmma(self, u: UOp, args: list[str]) -> str:
        """clang's builtins for WMMA (gfx11, gfx12: wave32) and MFMA (gfx942, gfx950)."""
        tc = tensor_core(u.arg)
        if tc not in self.caps.tensor_cores:
            raise NotImplementedError(f"the HIP renderer for {self.amd.name} has no tensor core {tc.name}")
        if tc.name.startswith("cdna"):
            return f"__builtin_amdgcn_mfma_f32_16x16x16f16({', '.join(args)}, 0, 0, 0)"
        suffix = "_gfx12" if tc.name.startswith("rdna4") else ""
        return f"__builtin_amdgcn_wmma_f32_16x16x16_f16_w32{suffix}({', '.join(args)})"

    def bit_cast(self, to: str, frm: str, x: str) -> str:
        return f"__builtin_bit_cast({to}, ({frm})({x}))"

    def preamble(self, w: CWalk, scalars: set[DType]) -> str:
        # helpers (bfloat16, vectors) are device functions; `restrict` is C's, C++ spells it __restrict__. The float64
        # math with any float64 (a double vector's helpers call all three); clang drops what a kernel does not call
        uses_f64 = any(u.dtype.scalar == dtypes.float64 for u in w.uops)
        helpers = "".join(amdmath.c_function(fn) for fn in amdmath.FUNCTIONS) if uses_f64 else ""
        return "#define restrict __restrict__\n#pragma clang force_cuda_host_device begin\n" + helpers

    def render_kernel(self, w: CWalk, name: str) -> str:
        """The kernel, declared with the workgroup size it is launched with so that clang budgets registers for it."""
        local = math.prod(u.arg[1] for u in w.uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"))
        head = f"{self.kernel_prefix} __attribute__((amdgpu_flat_work_group_size(1, {local}))) {name}"
        body = "\n".join(w.lines)
        return f"#pragma clang force_cuda_host_device end\n{head}({', '.join(w.params())}) {{\n{body}\n}}\n"
