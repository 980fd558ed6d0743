"""NAK, the NVIDIA compiler of Mesa's NVK stack: NIR from the NIR renderer compiled to NVIDIA shader code for
Turing (sm_75) and newer, through libtinymesa.so with ctypes. Compile-only: tiny has no device that loads NAK's
output yet (it needs a direct-to-driver NV device that fills a QMD, the launch descriptor, with the shader's info;
the CUDA device loads cubins and PTX only).

Arguments are read the way NAK wants them: from constant buffer 0 (`ldc_nv`), each buffer's 64-bit address and then
each Variable's 32-bit value from byte 0, the layout the NIR renderer gives uniform block 0 (a launch binds the
arguments as constant buffer 0 in the QMD).

The compiler deserializes the renderer's shader with NAK's NIR options, runs NAK's NIR passes
(`nak_preprocess_nir`; `nak_compile_shader` runs `nak_postprocess_nir` itself) and compiles it. Its binary is NAK's
`nak_shader_info` as Mesa 25.2 lays it out (what a QMD is filled from), then the code: `read_nak_binary` reads it
back. Where NAK fails (a Rust panic it catches, printing the reason), the compiler raises CompileError with the
reason and the source.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from tiny.codegen.renderer.cstyle import target_fields
from tiny.codegen.renderer.mesa import (
    ACCESS_CAN_REORDER,
    MESA_SHADER_COMPUTE,
    MESA_VERSION,
    captured_stderr,
    deserialize,
    mesa,
)
from tiny.codegen.renderer.nir import NIR_DTYPES, NIRRenderer, _Build, serialized
from tiny.ir.device import CompileError, Compiler, RendererCaps
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp

NO_FLOAT64 = (Ops.EXP2, Ops.LOG2, Ops.SIN)  # float math NAK has only in float32

# warps one SM runs at once, by shader model (nak_compiler_create reads it with the shader model)
WARPS_PER_SM = {75: 32, 80: 64, 86: 48, 87: 48, 89: 48, 90: 64, 100: 64, 120: 48}


def sm_of(arch: str) -> int:
    """'sm_86' -> 86; a ValueError naming what NAK takes otherwise."""
    found = re.fullmatch(r"sm_(\d+)[af]?", arch)
    sm = int(found.group(1)) if found else -1
    if sm not in WARPS_PER_SM:
        raise ValueError(f"NAK compiles for the NVIDIA architectures {[f'sm_{s}' for s in WARPS_PER_SM]}, got {arch!r}")
    return sm


class NAKRenderer(NIRRenderer):
    """NIR for NAK; `target` is 'arch=sm_XY;...' as the CUDA device reports it (sm_75 and newer; sm_90 when empty)."""

    default_limits = {
        "arch": "sm_90",
        "vector_width": "4",
        "local_max": "1024,1024,64",
        "local_total_max": "1024",
        "shared_max": "49152",
    }

    def __init__(self, target: str = "") -> None:
        super().__init__(target)
        fields = self.default_limits | target_fields(target)
        self.arch, self.sm = fields["arch"], sm_of(fields["arch"])
        local_max = tuple(int(x) for x in fields["local_max"].split(","))
        if len(local_max) != 3:
            raise ValueError(f"local_max in the renderer target has 3 sizes, got {fields['local_max']!r}")
        self.caps = RendererCaps(
            language="NIR",
            has_local=True,
            has_shared=True,
            global_max=(2**31 - 1, 65535, 65535),
            local_max=local_max,
            local_total_max=int(fields["local_total_max"]),
            shared_max=int(fields["shared_max"]),
            vector_width=int(fields["vector_width"]),
            dtypes=NIR_DTYPES,
        )

    def render(self, name: str, uops: list[UOp]) -> str:
        for u in uops:
            if u.op in NO_FLOAT64 and u.dtype.scalar == dtypes.float64:
                raise NotImplementedError(
                    f"NAK has no float64 {u.op.name.lower()} (NVIDIA's transcendental unit is float32): compute it "
                    "in float32, or on the CUDA device's CUDA or PTX renderer"
                )
        return super().render(name, uops)

    def param(self, b: _Build, offset: int, bits: int) -> Any:
        """An argument: `bits` wide at byte `offset` of constant buffer 0."""
        return b.intrinsic(
            "ldc_nv",
            [b.const(0, dtypes.uint32), b.const(offset, dtypes.uint32)],
            1,
            bits,
            access=ACCESS_CAN_REORDER,
            align_mul=bits // 8,
            align_offset=0,
        )


# ---------------------------------------------------------------- Mesa 25.2's nak.h and nv_device_info.h

NV_DEVICE_INFO_SIZE = 512  # (more than nv_device_info's size: what NAK does not read stays zero)
NV_DEVICE_SM, NV_DEVICE_MAX_WARPS_PER_MP = 92, 97  # byte offsets of `sm` and `max_warps_per_mp`


class NAKShaderInfo(ctypes.Structure):
    """nak_shader_info, up to its compute fields (the rest, for 3D stages, is kept as bytes)."""

    _fields_ = [
        ("stage", ctypes.c_uint32),
        ("sm", ctypes.c_uint8),
        ("num_gprs", ctypes.c_uint8),
        ("num_control_barriers", ctypes.c_uint8),
        ("_pad0", ctypes.c_uint8),
        ("max_warps_per_sm", ctypes.c_uint32),
        ("num_instrs", ctypes.c_uint32),
        ("num_static_cycles", ctypes.c_uint32),
        ("num_spills_to_mem", ctypes.c_uint32),
        ("num_fills_from_mem", ctypes.c_uint32),
        ("num_spills_to_reg", ctypes.c_uint32),
        ("num_fills_from_reg", ctypes.c_uint32),
        ("slm_size", ctypes.c_uint32),
        ("crs_size", ctypes.c_uint32),
        ("local_size", ctypes.c_uint16 * 3),  # (the compute member of the stage union)
        ("smem_size", ctypes.c_uint16),
        ("_union_rest", ctypes.c_uint8 * 4),
        # vtg: 8 bytes of flags, nak_xfb_info (4 strides, 4 streams, 4 counts, 4 x 128 indices); the 3D header
        ("_vtg_and_hdr", ctypes.c_uint8 * (8 + 16 + 4 + 4 + 512 + 4 * 32)),
    ]


class NAKShaderBin(ctypes.Structure):
    _fields_ = [
        ("info", NAKShaderInfo),
        ("code_size", ctypes.c_uint32),
        ("code", ctypes.c_void_p),
        ("asm_str", ctypes.c_char_p),
    ]


_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "nak_compiler_create": (ctypes.c_void_p, [ctypes.c_void_p]),
    "nak_nir_options": (ctypes.c_void_p, [ctypes.c_void_p]),
    "nak_preprocess_nir": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "nak_compile_shader": (
        ctypes.POINTER(NAKShaderBin),
        [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p],
    ),
    "nak_shader_bin_destroy": (None, [ctypes.POINTER(NAKShaderBin)]),
}


@cache
def nak_compiler(sm: int) -> int:
    """NAK's compiler for shader model `sm`, made once (its NIR options live as long as it does)."""
    lib = mesa().lib
    for fn, (restype, argtypes) in _FUNCTIONS.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    dev = (ctypes.c_uint8 * NV_DEVICE_INFO_SIZE)()
    dev[NV_DEVICE_SM], dev[NV_DEVICE_MAX_WARPS_PER_MP] = sm, WARPS_PER_SM[sm]
    nak = lib.nak_compiler_create(dev)
    if ctypes.c_uint8.from_address(nak).value != sm:  # (nak_compiler starts with the shader model it was made for)
        raise RuntimeError(f"nak_compiler_create did not read nv_device_info as Mesa {MESA_VERSION} lays it out")
    return nak


@dataclass(frozen=True)
class NAKShader:
    """What NAK made of a kernel: its code and the shader info a launch descriptor (QMD) is filled from."""

    sm: int
    num_gprs: int  # registers per thread
    num_control_barriers: int
    num_instrs: int
    max_warps_per_sm: int
    spills: int  # registers spilled to memory
    slm_size: int  # bytes of local (scratch) memory per thread
    crs_size: int  # bytes of the call/return stack per warp
    local_size: tuple[int, int, int]
    smem_size: int  # bytes of shared memory
    info: bytes  # nak_shader_info as NAK wrote it
    code: bytes


def read_nak_binary(binary: bytes) -> NAKShader:
    """A NAKCompiler binary read back; a ValueError where it is not one."""
    n = ctypes.sizeof(NAKShaderInfo)
    if len(binary) < n + 16:
        raise ValueError(f"a NAK binary is a {n}-byte nak_shader_info and the code, got {len(binary)} bytes")
    info = NAKShaderInfo.from_buffer_copy(binary[:n])
    if info.stage != MESA_SHADER_COMPUTE or info.sm not in WARPS_PER_SM:
        raise ValueError(f"not a NAK compute shader's binary (stage {info.stage}, sm {info.sm})")
    return NAKShader(
        info.sm,
        info.num_gprs,
        info.num_control_barriers,
        info.num_instrs,
        info.max_warps_per_sm,
        info.num_spills_to_mem,
        info.slm_size,
        info.crs_size,
        (info.local_size[0], info.local_size[1], info.local_size[2]),
        info.smem_size,
        binary[:n],
        binary[n:],
    )


class NAKCompiler(Compiler):
    """The NIR renderer's shader (NAKRenderer's) -> NAK's binary for one architecture ('sm_75' ... 'sm_120')."""

    def __init__(self, arch: str) -> None:
        self.arch, self.sm = arch, sm_of(arch)
        super().__init__(cachekey=f"nak mesa-{MESA_VERSION} {arch}")

    def compile(self, src: str) -> bytes:
        return self._compile(src, False)[0]

    def disassemble(self, src: str) -> str:
        """NAK's listing of the shader's instructions (after register allocation and scheduling)."""
        return self._compile(src, True)[1]

    def _compile(self, src: str, listing: bool) -> tuple[bytes, str]:
        lib, nak = mesa().lib, nak_compiler(self.sm)
        shader = deserialize(serialized(src), lib.nak_nir_options(nak))
        lib.nak_preprocess_nir(shader, nak)
        out, errors = captured_stderr(lambda: lib.nak_compile_shader(shader, listing, nak, 0, None))
        lib.ralloc_free(shader)
        if not out:
            reason = "\n".join(line for line in errors.splitlines() if not line.startswith(" ")) or "no reason given"
            raise CompileError(f"NAK could not compile the shader for {self.arch}:\n{reason}\n--- NIR ---\n{src}")
        try:
            b = out.contents
            code = ctypes.string_at(b.code, b.code_size)
            text = b.asm_str.decode() if listing and b.asm_str else ""
            return bytes(b.info) + code, text
        finally:
            lib.nak_shader_bin_destroy(out)
