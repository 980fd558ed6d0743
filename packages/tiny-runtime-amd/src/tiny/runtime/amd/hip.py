"""The HIP device: AMD GPUs through ROCm's HIP runtime (libamdhip64) over ctypes, the conservative alternative to
the KFD device. No HIP headers and no Python bindings are needed, only the library.

`HIP` is the first GPU HIP lists, `HIP:1` the second (`DEVICE=HIP` makes it the default device). It takes LLVM IR
(the AMDGPU renderer, the default) or HIP C, both compiled to code objects by the local clang and ld.lld for the
GPU's gfx target (LLVM IR by COMGR where they cannot: tiny.runtime.amd.compiler); HIP loads a code object with
hipModuleLoadData. Kernel arguments are packed where the code object's metadata puts them (tiny.runtime.amd.elf)
and passed as one buffer (HIP_LAUNCH_PARAM_BUFFER_POINTER); HIP fills the hidden ones. Launches go to the null
stream and do not wait; `wait=True` times the kernel with a pair of events.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
from functools import cache
from typing import Any

from tiny.ir.device import (
    AllocatorCaps,
    Compiled,
    Compiler,
    DeviceName,
    DeviceUnavailable,
    LRUAllocator,
    Program,
)
from tiny.runtime.amd.compiler import HIPCompiler, amdgpu_compiler
from tiny.runtime.amd.discovery import KFD as KFD_PATH
from tiny.runtime.amd.elf import KernelInfo, read_code_object

LIBRARIES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")
INSTALL_HINT = "install ROCm's HIP runtime (Debian: apt install libamdhip64-5)"

_int, _uint, _size, _ptr, _handle = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.POINTER, ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "hipInit": (_int, [_uint]),
    "hipGetErrorName": (ctypes.c_char_p, [_int]),
    "hipRuntimeGetVersion": (_int, [_ptr(_int)]),
    "hipGetDeviceCount": (_int, [_ptr(_int)]),
    "hipSetDevice": (_int, [_int]),
    "hipGetDeviceProperties": (_int, [_handle, _int]),
    "hipMalloc": (_int, [_ptr(_handle), _size]),
    "hipFree": (_int, [_handle]),
    "hipMemcpy": (_int, [_handle, _handle, _size, _int]),
    "hipModuleLoadData": (_int, [_ptr(_handle), _handle]),
    "hipModuleGetFunction": (_int, [_ptr(_handle), _handle, ctypes.c_char_p]),
    "hipModuleUnload": (_int, [_handle]),
    "hipModuleLaunchKernel": (
        _int,
        [_handle, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _handle, _ptr(_handle), _ptr(_handle)],
    ),
    "hipDeviceSynchronize": (_int, []),
    "hipEventCreate": (_int, [_ptr(_handle)]),
    "hipEventRecord": (_int, [_handle, _handle]),
    "hipEventSynchronize": (_int, [_handle]),
    "hipEventElapsedTime": (_int, [_ptr(ctypes.c_float), _handle, _handle]),
    "hipEventDestroy": (_int, [_handle]),
}

HIP_SUCCESS, HIP_ERROR_OUT_OF_MEMORY = 0, 2
MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3
# the `extra` argument of hipModuleLaunchKernel: a key, its value, ..., the end marker
LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END = 1, 2, 3
PROPERTIES_BYTES = 8192  # hipDeviceProp_t is under 2 KiB in every ROCm; room to spare for the next
_GFX = re.compile(rb"gfx[0-9a-f]{3,4}(?::[a-z0-9_]+[+-])*")


class HIPError(RuntimeError):
    """A HIP call that failed, with its error's name."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code = call, code


class HIPLibrary:
    """libamdhip64, its functions typed as tiny uses them."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        for fn, (restype, argtypes) in _SIGNATURES.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = restype, argtypes

    def error_name(self, code: int) -> str:
        name = self.lib.hipGetErrorName(code)
        return name.decode() if name else f"hipError {code}"

    def check(self, call: str, code: int) -> None:
        if code != HIP_SUCCESS:
            raise HIPError(call, code, self.error_name(code))

    def __call__(self, fn: str, *args: Any) -> None:
        self.check(fn, getattr(self.lib, fn)(*args))

    def version(self) -> str:
        v = _int()
        self("hipRuntimeGetVersion", ctypes.byref(v))
        return f"{v.value // 10_000_000}.{v.value // 100_000 % 100}.{v.value % 100_000}"


def load_library(names: tuple[str, ...] = LIBRARIES) -> HIPLibrary:
    """The HIP runtime library; DeviceUnavailable saying how to get it where none of `names` loads."""
    errors = []
    for name in names:
        try:
            return HIPLibrary(ctypes.CDLL(name), name)
        except OSError as e:
            errors.append(str(e))
    raise DeviceUnavailable(f"no HIP runtime: none of {', '.join(names)} loads ({errors[-1]}); {INSTALL_HINT}")


@cache
def _library() -> HIPLibrary:
    return load_library()


def open_gpu(hip: HIPLibrary, index: int) -> str:
    """Initialize HIP, select GPU `index` and return its gfx target; DeviceUnavailable saying why where there is
    no such GPU (the library is there but HIP finds no GPU: no /dev/kfd, no amdgpu driver, no permission)."""
    where = f"{hip.path} (HIP {hip.version()})"
    code = hip.lib.hipInit(0)
    if code != HIP_SUCCESS:
        why = "" if os.path.exists(KFD_PATH) else f"; {KFD_PATH} is missing (no amdgpu kernel driver)"
        raise DeviceUnavailable(f"{where} finds no AMD GPU: hipInit returned {hip.error_name(code)} ({code}){why}")
    count = _int(0)
    code = hip.lib.hipGetDeviceCount(ctypes.byref(count))
    if code != HIP_SUCCESS or count.value == 0:
        raise DeviceUnavailable(f"{where} finds no AMD GPU: hipGetDeviceCount returned {hip.error_name(code)}")
    if not 0 <= index < count.value:
        raise DeviceUnavailable(f"HIP has {count.value} GPU(s); there is no GPU {index}")
    hip("hipSetDevice", index)
    props = ctypes.create_string_buffer(PROPERTIES_BYTES)
    hip("hipGetDeviceProperties", props, index)
    found = _GFX.search(props.raw)
    if found is None:
        raise DeviceUnavailable(f"HIP GPU {index}: its properties name no gfx target (gcnArchName)")
    return found.group().decode()


def pack_kernargs(info: KernelInfo, buffers: tuple[int, ...], vals: tuple[int, ...]) -> bytes:
    """The explicit arguments of a kernel (its buffers' addresses, then the int32 variables) at the offsets of its
    metadata; HIP adds the hidden arguments after them."""
    explicit = [a for a in info.args if not a.kind.startswith("hidden_")]
    values = [*buffers, *vals]
    if len(explicit) != len(values):
        raise ValueError(f"kernel {info.name} takes {len(explicit)} arguments, got {len(buffers)} + {len(vals)}")
    out = bytearray(max((a.offset + a.size for a in explicit), default=0))
    for a, v in zip(explicit, values, strict=True):
        if a.kind == "global_buffer" and a.size == 8:
            struct.pack_into("<Q", out, a.offset, v)
        elif a.kind == "by_value" and a.size == 4:
            struct.pack_into("<i", out, a.offset, v)
        else:
            raise ValueError(f"kernel {info.name}: argument {a.name or a.offset} is {a.kind} of {a.size} bytes")
    return bytes(out)


# ---------------------------------------------------------------- the device


class HIPAllocator(LRUAllocator):
    caps = AllocatorCaps(transfer=True, aligned=256, views=True)

    def __init__(self, dev: HIPDevice) -> None:
        super().__init__()
        self.dev = dev

    def _alloc(self, size: int) -> int:
        self.dev.select()
        ptr = _handle()
        code = self.dev.hip.lib.hipMalloc(ctypes.byref(ptr), size)
        if code == HIP_ERROR_OUT_OF_MEMORY:
            raise MemoryError(f"{self.dev.name}: out of GPU memory allocating {size} bytes")
        self.dev.hip.check("hipMalloc", code)
        return int(ptr.value or 0)

    def _free(self, opaque: int, size: int) -> None:
        self.dev.hip("hipFree", opaque)

    def copyin(self, dest: int, src: memoryview) -> None:
        host = (ctypes.c_char * src.nbytes).from_buffer_copy(src)
        self.dev.hip("hipMemcpy", dest, host, src.nbytes, MEMCPY_HOST_TO_DEVICE)

    def copyout(self, dest: memoryview, src: int) -> None:
        host = (ctypes.c_char * dest.nbytes).from_buffer(dest)
        self.dev.hip("hipMemcpy", host, src, dest.nbytes, MEMCPY_DEVICE_TO_HOST)

    def offset(self, opaque: int, offset: int, size: int) -> int:
        return opaque + offset

    def transfer(self, dest: int, src: int, size: int, src_device: Compiled, dest_device: Compiled) -> None:
        src_device.synchronize()
        self.dev.hip("hipMemcpy", dest, src, size, MEMCPY_DEVICE_TO_DEVICE)


class HIPProgram(Program):
    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        assert isinstance(device, HIPDevice)
        self.hip = device.hip
        self.info = read_code_object(binary, expect_target=device.target).kernels[name]
        device.select()
        self.module, self.function = _handle(), _handle()
        self.hip("hipModuleLoadData", ctypes.byref(self.module), binary)
        self.hip("hipModuleGetFunction", ctypes.byref(self.function), self.module, name.encode())

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        args = pack_kernargs(self.info, tuple(bufs), tuple(vals))
        block = (ctypes.c_char * max(len(args), 1)).from_buffer_copy(args or b"\0")
        size = _size(len(args))
        extra = (_handle * 5)(
            LAUNCH_PARAM_BUFFER_POINTER,
            ctypes.addressof(block),
            LAUNCH_PARAM_BUFFER_SIZE,
            ctypes.addressof(size),
            LAUNCH_PARAM_END,
        )
        self.device.select()
        events = [self.device.event() for _ in range(2)] if wait else []
        if events:
            self.hip("hipEventRecord", events[0], None)
        self.hip("hipModuleLaunchKernel", self.function, *global_size, *local_size, 0, None, None, extra)
        if not events:
            return None
        self.hip("hipEventRecord", events[1], None)
        self.hip("hipEventSynchronize", events[1])
        ms = ctypes.c_float()
        self.hip("hipEventElapsedTime", ctypes.byref(ms), events[0], events[1])
        for e in events:
            self.hip("hipEventDestroy", e)
        return ms.value / 1e3

    def __del__(self) -> None:
        try:
            self.hip.lib.hipModuleUnload(self.module)
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


class HIPDevice(Compiled):
    """An AMD GPU through libamdhip64; kernels are code objects the local toolchain builds."""

    priority = 90  # after the KFD device, which needs no ROCm library
    renderers = ("AMDGPU", "HIP")

    def __init__(self, name: str, renderer: str) -> None:
        if os.name == "posix" and not os.path.exists(KFD_PATH):  # (ROCm's HIP reaches its GPUs through /dev/kfd)
            # the library is not loaded to find that out: it and ROCm's runtime behind it stayed mapped in every
            # process that opened a device without naming one (4 MB resident, and its start-up's allocations)
            raise DeviceUnavailable(f"HIP finds no AMD GPU without {KFD_PATH}: no amdgpu kernel driver is loaded")
        self.hip = _library()
        self.index = DeviceName.parse(name).index
        self.target = open_gpu(self.hip, self.index)
        super().__init__(name, HIPAllocator(self), HIPProgram, renderer)
        self.compiler_name = type(self._compiler).__name__  # DeviceUnavailable where no compiler knows this GPU

    def select(self) -> None:
        if self.index:
            self.hip("hipSetDevice", self.index)

    def event(self) -> Any:
        e = _handle()
        self.hip("hipEventCreate", ctypes.byref(e))
        return e

    def renderer_target(self) -> str:
        return self.target

    def compiler(self) -> Compiler:
        return HIPCompiler(self.target) if self.renderer_name == "HIP" else amdgpu_compiler(self.target)

    def synchronize(self) -> None:
        self.select()
        self.hip("hipDeviceSynchronize")
