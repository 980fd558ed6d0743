"""NVRTC through ctypes: CUDA C -> cubin (or PTX), and the PTX compiler of `CUDA:PTX`.

libnvrtc comes from the `nvidia-cuda-nvrtc` wheel (CUDA 13: nvidia/cu13/lib) or `nvidia-cuda-nvrtc-cu12` (CUDA 12:
nvidia/cuda_nvrtc/lib), else from a CUDA toolkit on the system. Where several are installed, the newest one the
driver can take is used: PTX and cubins of a newer major CUDA release than the driver's do not load.

A cubin for the GPU's own architecture is what `CUDACompiler` makes when it knows the architecture: the driver
loads it as it is, with no PTX JIT, so an NVRTC newer than the driver (within one major release) still works.
PTX is the fallback (no architecture known, an architecture NVRTC has no cubin for).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any

from tiny.ir.device import CompileError, Compiler, DeviceUnavailable

_ptr, _size, _char_p = ctypes.POINTER, ctypes.c_size_t, ctypes.c_char_p
_program = ctypes.c_void_p

_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "nvrtcVersion": (ctypes.c_int, [_ptr(ctypes.c_int), _ptr(ctypes.c_int)]),
    "nvrtcGetErrorString": (_char_p, [ctypes.c_int]),
    "nvrtcCreateProgram": (
        ctypes.c_int,
        [_ptr(_program), _char_p, _char_p, ctypes.c_int, _ptr(_char_p), _ptr(_char_p)],
    ),
    "nvrtcDestroyProgram": (ctypes.c_int, [_ptr(_program)]),
    "nvrtcCompileProgram": (ctypes.c_int, [_program, ctypes.c_int, _ptr(_char_p)]),
    "nvrtcGetProgramLogSize": (ctypes.c_int, [_program, _ptr(_size)]),
    "nvrtcGetProgramLog": (ctypes.c_int, [_program, ctypes.c_char_p]),
    "nvrtcGetPTXSize": (ctypes.c_int, [_program, _ptr(_size)]),
    "nvrtcGetPTX": (ctypes.c_int, [_program, ctypes.c_char_p]),
    "nvrtcGetCUBINSize": (ctypes.c_int, [_program, _ptr(_size)]),
    "nvrtcGetCUBIN": (ctypes.c_int, [_program, ctypes.c_char_p]),
    "nvrtcGetNumSupportedArchs": (ctypes.c_int, [_ptr(ctypes.c_int)]),
    "nvrtcGetSupportedArchs": (ctypes.c_int, [_ptr(ctypes.c_int)]),
}


@dataclass(frozen=True)
class NVRTC:
    """A loaded libnvrtc: where it is, its version, the architectures it compiles for, its functions."""

    path: str
    version: tuple[int, int]
    archs: tuple[int, ...]  # compute capabilities as 80, 90 ...: what it makes cubins for
    lib: Any

    def __str__(self) -> str:
        return f"NVRTC {self.version[0]}.{self.version[1]} ({self.path})"


def candidates() -> list[str]:
    """libnvrtc from the pip wheels first (CUDA 13's nvidia/cu13, CUDA 12's nvidia/cuda_nvrtc), then from a CUDA
    toolkit on the system ($CUDA_HOME, /usr/local/cuda, the distribution's library folder)."""
    out: list[str] = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for sub in ("cu13", "cuda_nvrtc"):
            out += sorted(glob.glob(os.path.join(root, sub, "lib", "libnvrtc.so*")))
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr/lib/x86_64-linux-gnu"):
        if root:
            out += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
            out += sorted(glob.glob(os.path.join(root, "libnvrtc.so*")))
    libs = [p for p in out if "builtins" not in os.path.basename(p) and ".alt." not in os.path.basename(p)]
    return list(dict.fromkeys(libs))


def _open(path: str) -> NVRTC | None:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.restype, fn.argtypes = restype, argtypes
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    n = ctypes.c_int(0)
    archs: tuple[int, ...] = ()
    if lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)) == 0 and n.value > 0:
        found = (ctypes.c_int * n.value)()
        if lib.nvrtcGetSupportedArchs(found) == 0:
            archs = tuple(int(a) for a in found)
    return NVRTC(path, (major.value, minor.value), archs, lib)


@functools.cache
def installed() -> tuple[NVRTC, ...]:
    """Every libnvrtc that loads here, newest first."""
    found = [n for n in (_open(p) for p in candidates()) if n is not None]
    return tuple(sorted({n.version: n for n in found}.values(), key=lambda n: n.version, reverse=True))


def find_nvrtc(driver_version: int | None = None) -> NVRTC:
    """The newest NVRTC the driver can take (driver_version as cuDriverGetVersion gives it: 12040 is CUDA 12.4);
    any NVRTC when the driver is not known. DeviceUnavailable, saying what was found, when none fits."""
    found = installed()
    if not found:
        raise DeviceUnavailable(
            "no NVRTC: pip install nvidia-cuda-nvrtc (CUDA 13 drivers) or nvidia-cuda-nvrtc-cu12 (CUDA 12 drivers), "
            "or install a CUDA toolkit"
        )
    if driver_version is None:
        return found[0]
    major = driver_version // 1000
    fits = [n for n in found if n.version[0] <= major]
    if not fits:
        have = ", ".join(str(n) for n in found)
        raise DeviceUnavailable(
            f"the NVIDIA driver supports CUDA {major}.{driver_version % 1000 // 10}, older than every NVRTC "
            f"installed ({have}): code from a newer major CUDA release does not load. Install "
            f"nvidia-cuda-nvrtc-cu{major} or update the driver"
        )
    return fits[0]


def _check(n: NVRTC, call: str, status: int) -> None:
    if status != 0:
        text = n.lib.nvrtcGetErrorString(status)
        raise CompileError(f"{call} failed: {text.decode() if text else status}")


def _bytes(n: NVRTC, prog: Any, size_fn: str, get_fn: str) -> bytes:
    size = _size(0)
    _check(n, size_fn, getattr(n.lib, size_fn)(prog, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    _check(n, get_fn, getattr(n.lib, get_fn)(prog, buf))
    return buf.raw


# no multiply-add fused where NVRTC sees fit: which products it fuses depends on the kernel around them, and a value
# computed again in another kernel must round the same (a max's gradient compares a value with the max); the renderer
# asks for fma itself in reductions' accumulators (tiny_fma)
CUDA_OPTIONS = ("--fmad=false",)


def compile_cuda(n: NVRTC, src: str, arch: str, cubin: bool, options: tuple[str, ...] = ()) -> bytes:
    """CUDA C -> a cubin for `arch` ('sm_90') or PTX for it (`cubin=False`, NUL-terminated as the driver reads it).
    A CompileError with NVRTC's log and the source when it refuses."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"a CUDA architecture is written like 'sm_90', got {arch!r}")
    prog = _program()
    status = n.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None)
    _check(n, "nvrtcCreateProgram", status)
    try:
        flavour = "sm" if cubin else "compute"
        opts = [f"--gpu-architecture={flavour}_{arch[3:]}", "-default-device", "--std=c++17", *options]
        args = (_char_p * len(opts))(*(o.encode() for o in opts))
        status = n.lib.nvrtcCompileProgram(prog, len(opts), args)
        if status != 0:
            log = _bytes(n, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode(errors="replace")
            raise CompileError(f"{n} did not compile the kernel for {arch}:\n{log}\n--- source ---\n{src}")
        if cubin:
            return _bytes(n, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        return _bytes(n, prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
    finally:
        n.lib.nvrtcDestroyProgram(ctypes.byref(prog))


# a kernel whose local buffers take over 48 KiB has them in dynamic shared memory, its size said on a line of its
# source (tiny.codegen.renderer.shared); the compilers carry it after the image, where CUDAProgram finds it
_SHARED_LINE = re.compile(r"^// dynamic shared memory: (\d+) bytes$", re.MULTILINE)
_SHARED_TRAILER = re.compile(rb"\0tiny dynamic shared memory: (\d+)\Z")


def with_dynamic_shared(src: str, image: bytes) -> bytes:
    """The compiled image, and after it the dynamic shared memory the source asks for (none: the image alone)."""
    found = _SHARED_LINE.search(src)
    return image + b"\0tiny dynamic shared memory: " + found.group(1).encode() if found else image


def split_dynamic_shared(binary: bytes) -> tuple[bytes, int]:
    """The image the driver loads, and the bytes of dynamic shared memory each launch gives the kernel (0: none)."""
    found = _SHARED_TRAILER.search(binary[-64:])
    if found is None:
        return binary, 0
    return binary[: len(binary) - len(found.group(0))], int(found.group(1))


class CUDACompiler(Compiler):
    """CUDA C -> the GPU's own cubin (nvrtcGetCUBIN) when NVRTC knows its architecture, else PTX that the driver
    assembles. Cached on disk by NVRTC's version, the architecture and the source."""

    def __init__(self, arch: str, nvrtc: NVRTC | None = None) -> None:
        self.nvrtc = nvrtc if nvrtc is not None else find_nvrtc()
        self.arch = arch
        cc = int(arch[3:].rstrip("af")) if re.fullmatch(r"sm_\d+[af]?", arch) else -1
        if cc < 0:
            raise ValueError(f"a CUDA architecture is written like 'sm_90', got {arch!r}")
        self.cubin = not self.nvrtc.archs or cc in self.nvrtc.archs
        major, minor = self.nvrtc.version
        kind = "cubin" if self.cubin else "ptx"
        super().__init__(cachekey=f"cuda:nvrtc{major}.{minor}:{arch}:{kind}:{' '.join(CUDA_OPTIONS)}")

    def compile(self, src: str) -> bytes:
        return with_dynamic_shared(src, compile_cuda(self.nvrtc, src, self.arch, self.cubin, CUDA_OPTIONS))


# the CUDA release (as cuDriverGetVersion gives it) that brought each PTX ISA version: a driver older than that cannot
# assemble the PTX
PTX_ISA_CUDA = {(6, 0): 9000, (6, 1): 9010, (6, 3): 10000, (6, 4): 10010, (6, 5): 10020, (7, 0): 11000}
PTX_ISA_CUDA |= {(7, 1): 11010, (7, 2): 11020, (7, 3): 11030, (7, 4): 11040, (7, 5): 11050, (7, 6): 11060}
PTX_ISA_CUDA |= {(7, 7): 11070, (7, 8): 11080, (8, 0): 12000, (8, 1): 12010, (8, 2): 12020, (8, 3): 12030}
PTX_ISA_CUDA |= {(8, 4): 12040, (8, 5): 12050, (8, 6): 12070, (8, 7): 12080, (8, 8): 12090, (9, 0): 13000}


def _cuda(version: int) -> str:
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


class PTXCompiler(Compiler):
    """PTX from tiny.codegen.renderer.ptx -> what the driver loads: the PTX itself, NUL-terminated (cuModuleLoadData
    assembles it for the GPU). The renderer writes `.target` for the architecture and the lowest `.version` that
    has it; PTX for another architecture, or of a PTX ISA newer than the driver (`driver_version`, as
    cuDriverGetVersion gives it), is a CompileError here rather than an error from the driver."""

    def __init__(self, arch: str, driver_version: int | None = None) -> None:
        if not re.fullmatch(r"sm_\d+[af]?", arch):
            raise ValueError(f"a CUDA architecture is written like 'sm_90', got {arch!r}")
        self.arch, self.driver_version = arch, driver_version
        super().__init__(cachekey=None)  # nothing to gain: the text is the binary

    def compile(self, src: str) -> bytes:
        target = re.search(r"^\s*\.target\s+(\S+)", src, re.MULTILINE)
        if target is None or target.group(1).rstrip(",") != self.arch:
            got = target.group(1) if target else "no .target line"
            raise CompileError(f"PTX for {self.arch} must say `.target {self.arch}`, it says {got}:\n{src}")
        version = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", src, re.MULTILINE)
        if version is None:
            raise CompileError(f"PTX must start with its `.version`:\n{src}")
        isa = (int(version.group(1)), int(version.group(2)))
        needs = PTX_ISA_CUDA.get(isa)
        if self.driver_version is not None and needs is not None and self.driver_version < needs:
            raise CompileError(
                f"the NVIDIA driver ({_cuda(self.driver_version)}) cannot assemble PTX ISA {isa[0]}.{isa[1]}, which "
                f"needs {_cuda(needs)} or newer: update the driver"
            )
        return with_dynamic_shared(src, src.encode() + b"\0")
