"""ir3, the Qualcomm Adreno compiler of Mesa's freedreno and turnip: NIR from the NIR renderer compiled for Adreno
6xx and 7xx (a630, a660, a730 ...), through libtinymesa.so with ctypes. Compile-only, the first step of a QCOM
device: tiny has no device that loads its output yet.

Arguments stay where the NIR renderer puts them, uniform block 0 (`load_ubo`): ir3 moves the block into the
constant file (its `ubo_ranges`), where a launch uploads it. The compiler makes an ir3 compiler for the GPU from
freedreno's device table (`fd_dev_info_raw`), deserializes the shader with ir3's NIR options, finalizes it
(`ir3_finalize_nir`: ir3's NIR passes), makes an ir3 shader of it and compiles its one variant (the default key).
The binary is the variant's code (with the shader's constant data after the instructions, as ir3 lays it out);
`IR3Compiler.disassemble` gives freedreno's disassembly of it (`disasm_a3xx`).

Three fields of ir3_shader_variant are read: `bin`, and in its `ir3_info` the binary's size in bytes and the
instructions' in dwords. Their offsets follow ir3_shader.h (bin after the disassembly info, then the const state
and the info), checked on tinymesa 25.2.7.2's library; each compile disassembles the instructions and requires
them to end in `end` with every word decoded, so a library laid out otherwise is an error, not a wrong binary.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from tiny.codegen.renderer.mesa import MESA_VERSION, captured_stderr, deserialize, mesa, print_to_string
from tiny.codegen.renderer.nir import NIR_DTYPES, NIRRenderer, serialized
from tiny.ir.device import CompileError, Compiler, RendererCaps
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import UOp

# Adreno GPUs by name: (gpu_id, chip_id) as freedreno's device table knows them (7xx by chip id)
GPUS = {"a630": (630, 0), "a640": (640, 0), "a660": (660, 0), "a690": (690, 0), "a730": (0, 0x07030001)}
NO_DTYPES = frozenset({dtypes.float64})  # Adreno 6xx/7xx have no float64

# ir3_shader_variant's fields read here: bin (the code), and in its ir3_info the binary's size in bytes and the
# instructions' in dwords
VARIANT_BIN, VARIANT_SIZE, VARIANT_SIZEDWORDS = 192, 224, 232
_OPTIONS_SIZE = 512  # (zeroed ir3_compiler_options, ir3_shader_options and ir3_shader_key: the defaults)


def gpu_id(gpu: str) -> tuple[int, int]:
    if gpu not in GPUS:
        raise ValueError(f"ir3 compiles here for the Adreno GPUs {sorted(GPUS)}, got {gpu!r}")
    return GPUS[gpu]


class IR3Renderer(NIRRenderer):
    """NIR for ir3: workgroups and shared memory within an Adreno 6xx/7xx's limits; float64 refused."""

    caps = RendererCaps(
        language="NIR",
        has_local=True,
        has_shared=True,
        global_max=(65535, 65535, 65535),
        local_max=(1024, 1024, 64),
        local_total_max=1024,
        shared_max=32768,
        vector_width=4,
        dtypes=NIR_DTYPES - NO_DTYPES,
    )

    def render(self, name: str, uops: list[UOp]) -> str:
        for u in uops:
            if u.dtype.scalar in NO_DTYPES:
                raise NotImplementedError(
                    f"IR3Renderer cannot take {u.dtype.scalar!r} ({u.op.name}): Adreno GPUs have no float64"
                )
        return super().render(name, uops)


class _DevId(ctypes.Structure):
    """freedreno's fd_dev_id."""

    _fields_ = [("gpu_id", ctypes.c_uint32), ("chip_id", ctypes.c_uint64)]


_P = ctypes.c_void_p
_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "fd_dev_info_raw": (_P, [ctypes.POINTER(_DevId)]),
    "ir3_compiler_create": (_P, [_P, ctypes.POINTER(_DevId), _P, _P]),
    "ir3_get_compiler_options": (_P, [_P]),
    "ir3_finalize_nir": (None, [_P, _P, _P]),
    "ir3_shader_from_nir": (_P, [_P, _P, _P, _P]),
    "ir3_shader_get_variant": (_P, [_P, _P, ctypes.c_bool, ctypes.c_bool, ctypes.POINTER(ctypes.c_bool)]),
    "ir3_shader_destroy": (None, [_P]),
    "disasm_a3xx": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, _P, ctypes.c_uint]),
}
_ZEROS = (ctypes.c_uint8 * _OPTIONS_SIZE)()


@cache
def ir3_compiler(gpu: str) -> int:
    """ir3's compiler for one Adreno GPU, made once."""
    lib = mesa().lib
    for fn, (restype, argtypes) in _FUNCTIONS.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    dev = _DevId(*gpu_id(gpu))
    info = lib.fd_dev_info_raw(ctypes.byref(dev))
    if not info:
        raise ValueError(f"freedreno's device table in this libtinymesa has no {gpu}")
    return lib.ir3_compiler_create(None, ctypes.byref(dev), info, _ZEROS)


@dataclass(frozen=True)
class IR3Shader:
    """What ir3 made of a kernel: its code and freedreno's disassembly of the instructions."""

    code: bytes
    disassembly: str


class IR3Compiler(Compiler):
    """The NIR renderer's shader (IR3Renderer's) -> ir3's code for one Adreno GPU ('a630', 'a660', 'a730' ...)."""

    def __init__(self, gpu: str) -> None:
        gpu_id(gpu)
        self.gpu = gpu
        super().__init__(cachekey=f"ir3 mesa-{MESA_VERSION} {gpu}")

    def compile(self, src: str) -> bytes:
        return self.shader(src).code

    def disassemble(self, src: str) -> str:
        return self.shader(src).disassembly

    def shader(self, src: str) -> IR3Shader:
        lib, compiler = mesa().lib, ir3_compiler(self.gpu)
        nir = deserialize(serialized(src), lib.ir3_get_compiler_options(compiler))
        lib.ir3_finalize_nir(compiler, _ZEROS, nir)
        shader = lib.ir3_shader_from_nir(compiler, nir, _ZEROS, None)  # (it takes the NIR shader)
        try:
            created = ctypes.c_bool()
            variant, errors = captured_stderr(
                partial(lib.ir3_shader_get_variant, shader, _ZEROS, False, False, ctypes.byref(created))
            )
            if not variant:
                raise CompileError(f"ir3 could not compile the shader for {self.gpu}:\n{errors}\n--- NIR ---\n{src}")
            code_at = ctypes.c_void_p.from_address(variant + VARIANT_BIN).value
            size = ctypes.c_uint32.from_address(variant + VARIANT_SIZE).value
            sizedwords = ctypes.c_uint16.from_address(variant + VARIANT_SIZEDWORDS).value
            ok = code_at and 0 < 4 * sizedwords <= size
            text = _disassembly(code_at, sizedwords, int(self.gpu[1:])) if ok else ""
            if not re.search(r"^\s*end$", text, re.MULTILINE) or "no match" in text:
                raise RuntimeError(
                    f"libtinymesa's ir3_shader_variant is not laid out as tiny measured on Mesa {MESA_VERSION}'s"
                )
            return IR3Shader(ctypes.string_at(code_at, size), text)
        finally:
            lib.ir3_shader_destroy(shader)


def _disassembly(code: int, sizedwords: int, gpu: int) -> str:
    """freedreno's disassembly of `sizedwords` dwords of code for GPU number `gpu` (630 ...) (disasm_a3xx)."""
    return print_to_string(lambda stream: mesa().lib.disasm_a3xx(code, sizedwords, 0, stream, gpu))
