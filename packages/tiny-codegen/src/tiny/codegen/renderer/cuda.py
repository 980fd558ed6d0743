"""CUDA C: kernels for the CUDA device, compiled by NVRTC. Workgroups are blocks (blockIdx), their threads
threadIdx; local memory is `__shared__` and the barrier `__syncthreads()`. Each kernel is `extern "C"` (its name
is not mangled) with `__launch_bounds__` of its block size.

The source needs no header: NVRTC brings the builtins (vector types, math functions) but cuda_fp16.h and
cuda_bf16.h come only with a CUDA toolkit, which a machine with the driver and the NVRTC wheel does not have. So
float16 and bfloat16 are 16 bits in memory and float in registers, converted with PTX's own `cvt` (round to nearest
even; bfloat16's needs sm_80, integer arithmetic before; a NaN stored as 0x7fc0, as the CPU does) and rounded after
each op: what half arithmetic gives, since float holds the exact result of a half op before its one rounding.
Vectors (float4 ...) are a small template with the operators the code generator uses;
a vector load or store is one `ld.global.v4` where the address is aligned, lane by lane where it is not.

The renderer target is the device's: 'arch=sm_90;local_max=1024,1024,64;local_total_max=1024;shared_max=49152'.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tiny.codegen.renderer.cstyle import CWalk, GPUCStyleRenderer, target_fields
from tiny.codegen.renderer.ldmatrix import LDMATRIX, MatrixLoad, matrix_loads
from tiny.codegen.renderer.shared import DYNAMIC_NAME, dynamic_shared, size_line
from tiny.codegen.renderer.walker import use_counts
from tiny.ir.device import RendererCaps, fold_grid
from tiny.ir.dtypes import DType, PtrDType, dtypes
from tiny.ir.tensorcore import tensor_core, tensor_cores_for
from tiny.ir.uop import Ops, UOp

_HALF_BITS = frozenset({dtypes.float16, dtypes.bfloat16})

# what every kernel may use: restrict, bit casts, 16-bit floats, vectors
_PRELUDE = r"""#define restrict __restrict__
#define TINY_F __device__ __forceinline__
template <typename To, typename From> TINY_F To tiny_bitcast(From x) { To r; memcpy(&r, &x, sizeof(To)); return r; }
#ifdef __CUDA_ARCH__
TINY_F float tiny_f16_to_f32(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
TINY_F unsigned short tiny_f32_to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
TINY_F unsigned short tiny_f64_to_f16(double d) {
  unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
#endif
TINY_F float tiny_f16_round(float f) { return tiny_f16_to_f32(tiny_f32_to_f16(f)); }
TINY_F float tiny_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
#if __CUDA_ARCH__ >= 800
TINY_F unsigned short tiny_bf16_rn(float f) {
  unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
TINY_F unsigned short tiny_f32_to_bf16(float f) { return f != f ? 0x7fc0 : tiny_bf16_rn(f); }
TINY_F float tiny_bf16_round(float f) { return tiny_bf16_to_f32(tiny_bf16_rn(f)); }  // (a NaN stays one)
#else
TINY_F unsigned short tiny_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);
}
TINY_F float tiny_bf16_round(float f) { return tiny_bf16_to_f32(tiny_f32_to_bf16(f)); }
#endif
TINY_F unsigned short tiny_f16_bits(float f) { return tiny_f32_to_f16(f); }
TINY_F unsigned short tiny_f16_bits(unsigned short h) { return h; }
TINY_F unsigned short tiny_bf16_bits(float f) { return tiny_f32_to_bf16(f); }
TINY_F unsigned short tiny_bf16_bits(unsigned short b) { return b; }
"""

_VECTORS = r"""template <typename T, int N> struct __align__(sizeof(T) * N) tiny_vec {
  T v[N];
  TINY_F T& operator[](int i) { return v[i]; }
  TINY_F const T& operator[](int i) const { return v[i]; }
};
#define TINY_LANES(R, EXPR) tiny_vec<R, N> r; _Pragma("unroll") for (int i = 0; i < N; i++) r.v[i] = EXPR; return r;
#define TINY_BINARY(OP) template <typename T, int N> \
  TINY_F tiny_vec<T, N> operator OP(tiny_vec<T, N> a, tiny_vec<T, N> b) { TINY_LANES(T, a.v[i] OP b.v[i]) }
TINY_BINARY(+) TINY_BINARY(*) TINY_BINARY(/) TINY_BINARY(&) TINY_BINARY(|) TINY_BINARY(^)
#define TINY_COMPARE(OP) template <typename T, int N> \
  TINY_F tiny_vec<bool, N> operator OP(tiny_vec<T, N> a, tiny_vec<T, N> b) { TINY_LANES(bool, a.v[i] OP b.v[i]) }
TINY_COMPARE(<) TINY_COMPARE(!=)
template <typename T, int N> TINY_F tiny_vec<T, N> operator-(tiny_vec<T, N> a) { TINY_LANES(T, -a.v[i]) }
template <int N> TINY_F tiny_vec<bool, N> operator~(tiny_vec<bool, N> a) { TINY_LANES(bool, !a.v[i]) }
template <typename T, int N>
TINY_F tiny_vec<T, N> tiny_vwhere(tiny_vec<bool, N> c, tiny_vec<T, N> a, tiny_vec<T, N> b) {
  TINY_LANES(T, c.v[i] ? a.v[i] : b.v[i]) }
template <typename T, int N> TINY_F tiny_vec<T, N> tiny_vmax(tiny_vec<T, N> a, tiny_vec<T, N> b) {
  TINY_LANES(T, (a.v[i] != a.v[i] || a.v[i] >= b.v[i]) ? a.v[i] : b.v[i]) }
TINY_F float tiny_sqrt(float x) { return sqrtf(x); }
TINY_F double tiny_sqrt(double x) { return sqrt(x); }
TINY_F float tiny_exp2(float x) { return exp2f(x); }
TINY_F double tiny_exp2(double x) { return exp2(x); }
TINY_F float tiny_log2(float x) { return log2f(x); }
TINY_F double tiny_log2(double x) { return log2(x); }
TINY_F float tiny_sin(float x) { return sinf(x); }
TINY_F double tiny_sin(double x) { return sin(x); }
TINY_F float tiny_trunc(float x) { return truncf(x); }
TINY_F double tiny_trunc(double x) { return trunc(x); }
#define TINY_MATH(FN) template <typename T, int N> TINY_F tiny_vec<T, N> tiny_v##FN(tiny_vec<T, N> a) { \
  TINY_LANES(T, tiny_##FN(a.v[i])) }
TINY_MATH(sqrt) TINY_MATH(exp2) TINY_MATH(log2) TINY_MATH(sin) TINY_MATH(trunc)
template <typename T, int N> TINY_F tiny_vec<T, N> tiny_vload(const T* p) {
  if (((unsigned long long)p & (sizeof(T) * N - 1)) == 0) return *(const tiny_vec<T, N>*)p;
  TINY_LANES(T, p[i])
}
template <typename T, int N> TINY_F void tiny_vstore(T* p, tiny_vec<T, N> x) {
  if (((unsigned long long)p & (sizeof(T) * N - 1)) == 0) { *(tiny_vec<T, N>*)p = x; return; }
  _Pragma("unroll") for (int i = 0; i < N; i++) p[i] = x.v[i];
}
#define TINY_HALF_STORE(TAG) \
  template <int N> TINY_F void tiny_vstore_##TAG(unsigned short* p, tiny_vec<float, N> x) { \
    tiny_vec<unsigned short, N> b; _Pragma("unroll") for (int i = 0; i < N; i++) b.v[i] = tiny_f32_to_##TAG(x.v[i]); \
    tiny_vstore<unsigned short, N>(p, b); } \
  template <int N> TINY_F void tiny_vstore_##TAG(unsigned short* p, tiny_vec<unsigned short, N> x) { \
    tiny_vstore<unsigned short, N>(p, x); }
TINY_HALF_STORE(f16) TINY_HALF_STORE(bf16)
"""


_SHARED_ADDRESS = r"""TINY_F unsigned int tiny_shared_address(const void* p) {
  unsigned int a; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p)); return a; }
"""

# COPY_ASYNC: N bytes from global into shared memory by cp.async where the source is aligned to N (buffers from
# cuMemAlloc, offsets a whole number of runs: every copy of a staged tile), else here, byte by byte; zeros where not
# valid (cp.async's source size 0)
_COPY_ASYNC = r"""template <int N> TINY_F void tiny_copy_async(void* dst, const void* src, bool valid) {
  if (((unsigned long long)src & (N - 1)) == 0) {
    if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
      :: "r"(tiny_shared_address(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
      :: "r"(tiny_shared_address(dst)), "l"(src), "n"(N), "r"(valid ? N : 0) : "memory");
    return;
  }
  _Pragma("unroll") for (int i = 0; i < N; i++)
    ((unsigned char*)dst)[i] = valid ? ((const unsigned char*)src)[i] : (unsigned char)0;
}
"""

# fragments of 16-bit values read from shared memory as whole 8 x 8 matrices (tiny.codegen.renderer.ldmatrix): each
# register holds two values, the lower in its lower half
_LDMATRIX = r"""TINY_F tiny_vec<unsigned short, 8> tiny_ldmatrix_x4(const unsigned short* p) {
  unsigned int r[4];
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tiny_shared_address(p)) : "memory");
  tiny_vec<unsigned short, 8> v;
  _Pragma("unroll") for (int i = 0; i < 4; i++) { v[2 * i] = r[i] & 0xffffu; v[2 * i + 1] = r[i] >> 16; }
  return v;
}
TINY_F tiny_vec<unsigned short, 4> tiny_ldmatrix_x2_trans(const unsigned short* p) {
  unsigned int r[2];
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
    : "=r"(r[0]), "=r"(r[1]) : "r"(tiny_shared_address(p)) : "memory");
  tiny_vec<unsigned short, 4> v;
  _Pragma("unroll") for (int i = 0; i < 2; i++) { v[2 * i] = r[i] & 0xffffu; v[2 * i + 1] = r[i] >> 16; }
  return v;
}
"""


class _CUDAWalk(CWalk):
    """A CUDA kernel being written: the C walk, and the block and grid it is launched with, the tensor cores it uses,
    the 16-bit float values held as their bits and the fragments that ldmatrix reads."""

    def __init__(self, uops: list[UOp], inline_depth: int, repeats: frozenset[Ops], max_grid: int) -> None:
        super().__init__(uops, inline_depth, repeats)
        self.block = 1
        grid = [1, 1, 1]
        for u in uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
                self.block *= u.arg[1]
            elif u.op is Ops.SPECIAL:
                grid[int(u.arg[0][4:])] = u.arg[1]
        self.grid = (grid[0], grid[1], grid[2])
        self.fold = fold_grid(self.grid, max_grid) if max(grid) > max_grid else None  # launched folded
        self.mma: list[str] = sorted({u.arg for u in uops if u.op is Ops.WMMA})  # the tensor cores used
        self.bits = tensor_core_bits(uops)  # 16-bit float values held as their bits
        # local buffers over 48 KiB in all: pieces of the dynamic shared array (tiny.codegen.renderer.shared)
        self.dynamic = dynamic_shared(uops, lambda u: u.arg[1] * u.dtype.base.itemsize)
        loads = matrix_loads(uops) if LDMATRIX else {}
        # fragments read by ldmatrix, the loads they stand for, and the loads no other op reads (left out)
        self.matrices: dict[UOp, MatrixLoad] = {v: m for v, m in loads.items() if v in self.bits}
        users = use_counts(uops)
        self.read_by_matrices = {x for v in self.matrices for x in v.src if users[x] == 1}
        self.tables: dict[tuple[int, ...], int] = {}  # ldmatrix's per-lane row shifts, one table each


class CUDARenderer(GPUCStyleRenderer):
    """CUDA C for NVRTC; `target` is the device's 'arch=sm_XY;...' (sm_90 and the limits below when empty)."""

    caps = RendererCaps(language="CUDA")
    language = "CUDA"
    kernel_prefix = 'extern "C" __global__ void'
    local_qualifier = "__shared__ "
    barrier_text = "__syncthreads();"
    # C's integer names; float16 is 16 bits in memory, float in registers, rounded after each op
    type_names = GPUCStyleRenderer.type_names | {"bool": "bool", "float16": "float"}
    default_limits = GPUCStyleRenderer.default_limits | {"shared_max": "49152", "arch": "sm_90", "max_grid": "65535"}
    nan_text = "__int_as_float(0x7fc00000)"
    inf_text = "__int_as_float(0x7f800000)"
    bf16_prelude = ""  # the helpers are in every kernel's prelude, with float16's
    repeats_operands = GPUCStyleRenderer.repeats_operands | {Ops.SHL, Ops.SHR}  # guarded shifts name them twice
    rules = GPUCStyleRenderer.rules | {Ops.COPY_ASYNC: "write_copy_async"}

    def __init__(self, target: str = "") -> None:
        super().__init__(";".join(p for p in target.split(";") if p and not p.startswith("arch=")))
        arch = next((p.split("=", 1)[1] for p in target.split(";") if p.startswith("arch=")), "sm_90")
        if not arch.startswith("sm_") or not arch[3:].rstrip("af").isdigit():
            raise ValueError(f"arch in the renderer target is a CUDA architecture like 'sm_90', got {arch!r}")
        self.arch, self.cc = arch, int(arch[3:].rstrip("af"))
        self.target = target
        fields = target_fields(";".join(p for p in target.split(";") if p))
        self.max_grid = int(fields.get("max_grid", "65535"))
        # mma.sync and cp.async on sm_80 and newer (float32 products on tensor cores where the target says tf32=1)
        tf32 = fields.get("tf32", "0") == "1"
        cores = tensor_cores_for(arch, tf32)
        self.caps = replace(self.caps, tensor_cores=cores, async_copy=self.cc >= 80, half_pairs=True)

    # ---------------------------------------------------------------- 16-bit floats: memory bits, float registers

    def _bf16(self, dt: DType) -> bool:
        return dt.scalar in _HALF_BITS

    def _tag(self, dt: DType) -> str:
        return "f16" if dt.scalar == dtypes.float16 else "bf16"

    def loaded(self, w: _CUDAWalk, u: UOp, raw: str) -> str:
        if u in w.bits:
            return raw
        return f"tiny_{self._tag(u.dtype)}_to_f32({raw})" if self._bf16(u.dtype) else raw

    def value_type(self, w: _CUDAWalk, u: UOp) -> str:
        if u in w.bits:
            return "unsigned short" if u.dtype.count == 1 else f"tiny_vec<unsigned short, {u.dtype.count}>"
        return super().value_type(w, u)

    def vectorize(self, w: _CUDAWalk, u: UOp, lanes: list[str]) -> str:
        if (m := w.matrices.get(u)) is not None:  # the whole fragment by one ldmatrix (tiny.codegen.renderer.ldmatrix)
            table = w.tables.setdefault(m.shift, len(w.tables))
            kind = f"x{m.matrices}{'_trans' if m.trans else ''}"
            return f"tiny_ldmatrix_{kind}({w.names[m.first]} + tiny_rows{table}[lidx0])"
        if u in w.bits:
            return f"{self.value_type(w, u)}{{{{{', '.join(lanes)}}}}}"
        return super().vectorize(w, u, lanes)

    def write_copy_async(self, w: _CUDAWalk, u: UOp) -> None:
        dst, src = u.address, u.copied_from
        valid = "true" if src.gate is None else w.names[src.gate]
        w.line(f"tiny_copy_async<{u.dtype.nbytes}>({w.names[dst]}, {w.names[src]}, {valid});")

    def write_barrier(self, w: _CUDAWalk, u: UOp) -> None:
        n = u.copies_in_flight  # this thread's copies have landed (all but its n latest groups), then every thread's
        if n == 0:
            w.line('asm volatile("cp.async.wait_all;" ::: "memory");')
        elif n is not None:
            w.line(f'asm volatile("cp.async.commit_group;\\n\\tcp.async.wait_group {n};" ::: "memory");')
        super().write_barrier(w, u)

    def elided(self, w: _CUDAWalk, u: UOp) -> bool:
        return u in w.read_by_matrices

    def define_local(self, name: str, dt: DType, size: int) -> str:
        return f"__align__(16) __shared__ {self.memory_type(dt)} {name}[{size}];"  # (ldmatrix's rows: 16 bytes)

    def write_local(self, w: CWalk, u: UOp) -> str:
        assert isinstance(w, _CUDAWalk) and isinstance(u.dtype, PtrDType) and u.dtype.base is not None
        if w.dynamic is None:
            return super().write_local(w, u)
        t = self.memory_type(u.dtype.base)
        w.line(f"{t}* {u.arg[0]} = ({t}*)({DYNAMIC_NAME} + {w.dynamic[0][u]});")
        return u.arg[0]

    def stored(self, w: _CUDAWalk, value: UOp, expr: str) -> str:
        if value in w.bits:
            return expr
        return f"tiny_f32_to_{self._tag(value.dtype)}({expr})" if self._bf16(value.dtype) else expr

    def rounded(self, u: UOp, expr: str) -> str:
        exact = u.op in (Ops.WHERE, Ops.MAX, Ops.NEG, Ops.TRUNC, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP)
        if u.op is Ops.CAST and u.source.dtype.scalar == u.dtype.scalar:
            exact = True
        return f"tiny_{self._tag(u.dtype)}_round({expr})" if self._bf16(u.dtype) and not exact else expr

    def cast(self, u: UOp, x: str) -> str:
        if u.dtype.scalar == dtypes.float16 and u.source.dtype.scalar == dtypes.float64:
            return f"tiny_f16_to_f32(tiny_f64_to_f16({x}))"  # one rounding, not two through float
        return super().cast(u, x)

    def bitcast(self, u: UOp, x: str) -> str:
        frm, to = u.source.dtype, u.dtype
        if self._bf16(frm):
            x, frm_name = f"tiny_f32_to_{self._tag(frm)}({x})", "unsigned short"
        else:
            frm_name = self.type_name(frm)
        if self._bf16(to):
            return f"tiny_{self._tag(to)}_to_f32(tiny_bitcast<unsigned short, {frm_name}>({x}))"
        return f"tiny_bitcast<{self.type_name(to)}, {frm_name}>({x})"

    # ---------------------------------------------------------------- vectors and math

    def vector_type_name(self, dt: DType) -> str:
        return f"tiny_vec<{self.type_names[dt.scalar.name]}, {dt.count}>"

    def vector_typedef(self, dt: DType) -> str:
        return ""  # one template for every vector type, in the prelude

    def vector_prelude(self, dt: DType) -> str:
        return ""

    def vector_literal(self, dt: DType, lanes: list[str]) -> str:
        if dt.is_bool:  # lanes come as all-ones integers; braces refuse narrowing them to bool
            lanes = [f"(bool)({x})" for x in lanes]
        return f"{self.vector_type_name(dt)}{{{{{', '.join(lanes)}}}}}"

    def vector_load(self, dt: DType, addr: str) -> str:
        return f"tiny_vload<{self.type_names[dt.scalar.name]}, {dt.count}>({addr})"

    def vector_store(self, dt: DType, addr: str, value: str) -> str:
        if self._bf16(dt):  # (16-bit floats: float registers, or their bits, stored as bits; a pair in one store)
            return f"tiny_vstore_{self._tag(dt)}<{dt.count}>({addr}, {value});"
        return f"tiny_vstore<{self.type_names[dt.scalar.name]}, {dt.count}>({addr}, {value});"

    def float_math(self, fn: str, args: list[str], dt: DType) -> str:
        """CUDA's math library: fn for double, fnf for float and the 16-bit floats (float in registers)."""
        return f"{fn}{'' if dt.scalar == dtypes.float64 else 'f'}({', '.join(args)})"

    def alu(self, u: UOp, args: list[str]) -> str:
        op, dt = u.op, u.dtype
        if dt.count > 1 and op in self.math_fns:
            return f"tiny_v{self.math_fns[op]}({args[0]})"
        if dt.count > 1 and op is Ops.WHERE:
            return f"tiny_vwhere({', '.join(args)})"
        if dt.count > 1 and op is Ops.MAX:
            return f"tiny_vmax({args[0]}, {args[1]})"
        return super().alu(u, args)

    # ---------------------------------------------------------------- the kernel

    def special(self, w: _CUDAWalk, name: str) -> str:
        dim = int(name[4:])
        if name.startswith("lidx"):
            return f"threadIdx.{'xyz'[dim]}"
        if w.fold is None:
            return f"blockIdx.{'xyz'[dim]}"
        stride = math.prod(w.grid[:dim])
        return f"(int)((tiny_block / {stride}u) % {w.grid[dim]}u)"

    def start(self, uops: list[UOp]) -> CWalk:
        return _CUDAWalk(uops, self.max_inline_depth, self.repeats_operands, self.max_grid)

    def multiply_add(self, dt: DType, a: str, b: str, acc: str) -> str | None:
        return f"tiny_fma({a}, {b}, {acc})" if dt.scalar in (dtypes.float32, dtypes.float64) else None

    def multiply_add_helper(self, dt: DType) -> str:
        """NVRTC compiles with --fmad=false (tiny.runtime.nv.nvrtc), so a reduction's accumulator asks for its fma."""
        fn = "fmaf" if dt.scalar == dtypes.float32 else "fma"
        if dt.count == 1:
            t = self.type_name(dt)
            return f"TINY_F {t} tiny_fma({t} a, {t} b, {t} c) {{ return {fn}(a, b, c); }}\n"
        t = self.vector_type_name(dt)
        lanes = f"r.v[i] = {fn}(a.v[i], b.v[i], c.v[i])"
        loop = f'_Pragma("unroll") for (int i = 0; i < {dt.count}; i++) {lanes};'
        return f"TINY_F {t} tiny_fma({t} a, {t} b, {t} c) {{\n  {t} r;\n  {loop}\n  return r;\n}}\n"

    def wmma(self, u: UOp, args: list[str]) -> str:
        tc = tensor_core(u.arg)
        if tc not in self.caps.tensor_cores:
            raise NotImplementedError(f"{self.arch} has no tensor core {tc.name}")
        return f"tiny_mma_{tc.name}({', '.join(args)})"

    def mma_function(self, name: str) -> str:
        """mma.sync.aligned.m16n8k16 through inline PTX: the fragments are packed two to a 32-bit register, the lower
        element in the lower half, as the instruction takes them. A fragment comes as floats (a computed value,
        converted here) or as the 16-bit values' bits (loaded from memory: tensor_core_bits), one template each.
        TF32's m16n8k8: each float rounded to TF32 (cvt.rna.tf32.f32), a 32-bit register each."""
        tc = tensor_core(name)
        if tc.mantissa is not None:
            return self.tf32_mma_function(name)
        tag = "f16" if tc.dtype_in == dtypes.float16 else "bf16"
        na, nb, nc = tc.a.elements, tc.b.elements, tc.c.elements
        pack = [f"tiny_{tag}_bits({x}[{i}]) | ((unsigned int)tiny_{tag}_bits({x}[{i + 1}]) << 16)"
                for x, n in (("a", na), ("b", nb)) for i in range(0, n, 2)]  # fmt: skip
        regs = [f"%{i}" for i in range(nc + len(pack) + nc)]
        a_regs, b_regs = regs[nc : nc + na // 2], regs[nc + na // 2 : nc + len(pack)]
        ptx = (
            f"mma.sync.aligned.m16n8k16.row.col.f32.{tag}.{tag}.f32 {{{', '.join(regs[:nc])}}}, "
            f"{{{', '.join(a_regs)}}}, {{{', '.join(b_regs)}}}, {{{', '.join(regs[nc + len(pack) :])}}};"
        )
        outs = ", ".join(f'"=f"(d[{i}])' for i in range(nc))
        ins = ", ".join([f'"r"((unsigned int)({p}))' for p in pack] + [f'"f"(c[{i}])' for i in range(nc)])
        return (
            f"template <typename TA, typename TB>\nTINY_F tiny_vec<float, {nc}> tiny_mma_{name}(tiny_vec<TA, {na}> a, "
            f"tiny_vec<TB, {nb}> b, tiny_vec<float, {nc}> c) {{\n  tiny_vec<float, {nc}> d;\n"
            f'  asm volatile("{ptx}"\n    : {outs}\n    : {ins});\n  return d;\n}}\n'
        )

    def tf32_mma_function(self, name: str) -> str:
        tc = tensor_core(name)
        na, nb, nc = tc.a.elements, tc.b.elements, tc.c.elements
        regs = [f"%{i}" for i in range(nc + na + nb + nc)]
        ptx = (
            f"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{', '.join(regs[:nc])}}}, "
            f"{{{', '.join(regs[nc : nc + na])}}}, {{{', '.join(regs[nc + na : nc + na + nb])}}}, "
            f"{{{', '.join(regs[nc + na + nb :])}}};"
        )
        outs = ", ".join(f'"=f"(d[{i}])' for i in range(nc))
        ins = [f'"r"(tiny_tf32(a[{i}]))' for i in range(na)] + [f'"r"(tiny_tf32(b[{i}]))' for i in range(nb)]
        ins += [f'"f"(c[{i}])' for i in range(nc)]
        return (
            "TINY_F unsigned int tiny_tf32(float x) {\n  unsigned int r;\n"
            '  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));\n  return r;\n}\n'
            f"TINY_F tiny_vec<float, {nc}> tiny_mma_{name}(tiny_vec<float, {na}> a, tiny_vec<float, {nb}> b, "
            f"tiny_vec<float, {nc}> c) {{\n  tiny_vec<float, {nc}> d;\n"
            f'  asm volatile("{ptx}"\n    : {outs}\n    : {", ".join(ins)});\n  return d;\n}}\n'
        )

    def render_kernel(self, w: _CUDAWalk, name: str) -> str:
        """A grid with more blocks in a dimension than CUDA allows (65535 in y and z) is launched folded, as
        tiny.ir.device.fold_grid folds it (the CUDA device does); the kernel unfolds its block's number and the
        blocks past the grid's end return at once."""
        head = f"{self.kernel_prefix} __launch_bounds__({w.block}) {name}({', '.join(w.params())})"
        body = w.lines
        if w.fold is not None:
            x, y, _ = w.fold
            flat = f"blockIdx.x + blockIdx.y * {x}u + blockIdx.z * {x * y}u"
            total = math.prod(w.grid)
            body = [f"  unsigned int tiny_block = {flat};", f"  if (tiny_block >= {total}u) return;", *body]
        return head + " {\n" + "\n".join(body) + "\n}\n"

    def preamble(self, w: _CUDAWalk, scalars: set[DType]) -> str:
        tables = "".join(
            f"__device__ const int tiny_rows{i}[32] = {{{', '.join(map(str, shift))}}};\n"
            for shift, i in w.tables.items()
        )
        copies = any(u.op is Ops.COPY_ASYNC for u in w.uops)
        shared = _SHARED_ADDRESS if w.matrices or copies else ""
        matrices, copy = _LDMATRIX if w.matrices else "", _COPY_ASYNC if copies else ""
        mma = "".join(self.mma_function(name) for name in w.mma)
        dynamic = ""
        if w.dynamic is not None:
            dynamic = size_line(w.dynamic[1]) + f"extern __shared__ __align__(16) unsigned char {DYNAMIC_NAME}[];\n"
        return dynamic + _PRELUDE + _VECTORS + mma + shared + copy + matrices + tables


def tensor_core_bits(uops: list[UOp]) -> set[UOp]:
    """The 16-bit float loads that only feed tensor-core fragments or are only copied into local memory, and the
    fragments made of such loads alone: these are held as their bits (unsigned short), loaded and handed on with no
    conversion. Held as floats, each element took a conversion to float at its load and another back at the mma
    or the copy: inline-asm cvt, 16 results a clock per multiprocessor."""
    users: dict[UOp, list[UOp]] = {}
    for u in uops:
        for s in u.src:
            users.setdefault(s, []).append(u)
    fragments = {
        v
        for u in uops
        if u.op is Ops.WMMA
        for v in u.src[:2]
        if v.op is Ops.VECTORIZE
        and all(x.op is Ops.LOAD and x.dtype in _HALF_BITS for x in v.src)
        and all(w.op is Ops.WMMA and w.src[2] is not v for w in users[v])
    }
    loads = {x for v in fragments for x in v.src if all(w in fragments for w in users[x])}
    copied = {  # a value copied into local memory as it was loaded (a staged tile, tiny.codegen.lower)
        u
        for u in uops
        if u.op is Ops.LOAD
        and u.dtype in _HALF_BITS
        and u.address.pointer.op is Ops.DEFINE_GLOBAL
        and all(w.op is Ops.STORE and w.value is u and w.address.pointer.op is Ops.DEFINE_LOCAL for w in users[u])
    }
    return loads | copied | {v for v in fragments if all(x in loads for x in v.src)}
