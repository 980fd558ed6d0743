"""OpenCL C: kernels for the CL device. Workgroup indices come from get_group_id and get_local_id (a launch's
global size is the grid times the workgroup), workgroup memory is `__local`, vectors are OpenCL's own floatN
types read and written with vloadN/vstoreN. half needs cl_khr_fp16 and double cl_khr_fp64: the device says
which it has (features=fp16,fp64 in the renderer target) and the other dtypes are left out of the caps.
bfloat16 is emulated (16 bits in memory, float in registers), as in C."""

from __future__ import annotations

from tiny.codegen.renderer.cstyle import CWalk, GPUCStyleRenderer
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.uop import Ops, UOp

_MASK_LANE = {1: "char", 2: "short", 4: "int", 8: "long"}  # a vector comparison's lanes, by their bytes
_EXTENSIONS = {dtypes.float16: "cl_khr_fp16", dtypes.float64: "cl_khr_fp64"}


class OpenCLRenderer(GPUCStyleRenderer):
    """OpenCL C 1.2 (what every OpenCL 1.2 and 3.0 driver compiles)."""

    caps = RendererCaps(language="OpenCL")
    language = "OpenCL"
    kernel_prefix = "__kernel void"
    buffer_prefix = "__global "
    local_qualifier = "__local "
    group_id = "get_group_id({dim})"
    local_id = "get_local_id({dim})"
    barrier_text = "barrier(CLK_LOCAL_MEM_FENCE);"
    optional_dtypes = {"fp16": dtypes.float16, "fp64": dtypes.float64}
    # math on a vector names its operand once a lane (alu)
    repeats_operands = GPUCStyleRenderer.repeats_operands | {Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}
    type_names = {
        "bool": "bool",
        "int8": "char",
        "int16": "short",
        "int32": "int",
        "int64": "long",
        "uint8": "uchar",
        "uint16": "ushort",
        "uint32": "uint",
        "uint64": "ulong",
        "float16": "half",
        "bfloat16": "float",  # emulated: float in registers, rounded after each op; 16 bits in memory
        "float32": "float",
        "float64": "double",
    }
    int_suffix = {"int64": "l", "uint64": "ul", "uint32": "u"}
    nan_text = "NAN"
    inf_text = "INFINITY"
    bf16_prelude = (
        "float tiny_bf16_to_f32(ushort b) { return as_float((uint)b << 16); }\n"
        "ushort tiny_f32_to_bf16(float f) {\n"
        "  uint u = as_uint(f);\n"
        "  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;\n"
        "  u += 0x7fffu + ((u >> 16) & 1u); return (ushort)(u >> 16);\n}\n"
        "float tiny_bf16_round(float f) { return tiny_bf16_to_f32(tiny_f32_to_bf16(f)); }\n"
    )

    def memory_type(self, dt: DType) -> str:
        """bool is kept as uchar in memory: OpenCL leaves the size of bool to the driver and refuses bool pointers
        as kernel arguments."""
        return "uchar" if dt == dtypes.bool else super().memory_type(dt)

    def vector_type_name(self, dt: DType) -> str:
        """floatN, intN ...; a bool vector is the mask a comparison gives: signed lanes as wide as the compared
        ones, which fill one hardware vector (as tiny.codegen.vectorize forms them)."""
        if dt.is_bool:
            return f"{_MASK_LANE[self.caps.vector_width * 4 // dt.count]}{dt.count}"
        return f"{self.type_names[dt.scalar.name]}{dt.count}"

    def vector_typedef(self, dt: DType) -> str:
        return ""  # the vector types are built in

    def vector_prelude(self, dt: DType) -> str:
        return ""  # loads, stores, select and the math functions are built in

    def vector_literal(self, dt: DType, lanes: list[str]) -> str:
        return f"(({self.vector_type_name(dt)})({', '.join(lanes)}))"

    def vector_load(self, dt: DType, addr: str) -> str:
        return f"vload{dt.count}(0, {addr})"

    def vector_store(self, dt: DType, addr: str, value: str) -> str:
        return f"vstore{dt.count}({value}, 0, {addr});"

    def gep(self, vector: str, lane: int) -> str:
        return f"({vector}).s{lane:x}"

    def bit_cast(self, to: str, frm: str, x: str) -> str:
        return f"as_{to}({x})"

    def cast(self, u: UOp, x: str) -> str:
        if u.dtype.count > 1:  # OpenCL converts vectors only through convert_<type>
            return f"convert_{self.vector_type_name(u.dtype)}({x})"
        return super().cast(u, x)

    def float_math(self, fn: str, args: list[str], dt: DType) -> str:
        """OpenCL's math functions take float, double, half and their vectors; bfloat16 computes in float."""
        if dt.scalar in (dtypes.float32, dtypes.float64, dtypes.float16):
            return f"{fn}({', '.join(args)})"
        return f"(({self.type_name(dt)}){fn}({', '.join(f'(float){a}' for a in args)}))"

    def alu(self, u: UOp, args: list[str]) -> str:
        op, dt = u.op, u.dtype
        if op in self.math_fns and dt.count > 1:
            # lane by lane: an implementation's vector functions may round otherwise than its scalar ones (PoCL's
            # exp2 does), and a value computed again in another kernel, vectorized otherwise, must be the same bits
            lanes = [self.float_math(self.math_fns[op], [self.gep(args[0], i)], dt.scalar) for i in range(dt.count)]
            return f"(({self.type_name(dt)})({', '.join(lanes)}))"
        if op in self.math_fns:
            return self.float_math(self.math_fns[op], args, dt)
        if dt.count > 1 and op is Ops.WHERE:  # select(if false, if true, mask)
            return f"select({args[2]}, {args[1]}, {args[0]})"
        if dt.count > 1 and op is Ops.MAX:
            a, b = args
            pick = f"(({a}!={a})|({a}>={b}))" if dt.is_float else f"({a}>={b})"  # NaN wins, as torch.maximum
            return f"select({b}, {a}, {pick})"
        return super().alu(u, args)

    def multiply_add(self, dt: DType, a: str, b: str, acc: str) -> str | None:
        """Contraction is off (preamble): a reduction's accumulator asks for its fused multiply-add."""
        return f"fma({a}, {b}, {acc})" if dt.scalar in (dtypes.float32, dtypes.float64) else None

    def preamble(self, w: CWalk, scalars: set[DType]) -> str:
        """No contraction (OpenCL C fuses a * b + c into one rounding by default: a value computed again in another
        kernel, fused there and not here, would differ), and the extensions the dtypes need."""
        enable = [f"#pragma OPENCL EXTENSION {ext} : enable\n" for dt, ext in _EXTENSIONS.items() if dt in scalars]
        return "#pragma OPENCL FP_CONTRACT OFF\n" + "".join(enable)
