"""The CL device: OpenCL through ctypes to the system's ICD loader (libOpenCL.so.1), no Python bindings needed.

`CL` is the first OpenCL device of the machine, `CL:1` the second (devices of every platform, in the order the
loader lists them; `clinfo -l` shows it). Kernels are OpenCL C from tiny.codegen.renderer.opencl, built by the driver;
the compiled program binary is what the disk cache keeps. One in-order command queue per device with
profiling on: launches do not wait, and `wait=True` returns the kernel's time from its event.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from tiny.ir.device import (
    AllocatorCaps,
    Compiled,
    CompileError,
    Compiler,
    DeviceName,
    DeviceUnavailable,
    LRUAllocator,
    Program,
)

LIBRARY = "libOpenCL.so.1"

# ---------------------------------------------------------------- the C API, as much of it as tiny uses

_int, _uint, _ulong, _size = ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t
_ptr, _handle = ctypes.POINTER, ctypes.c_void_p
_errp = _ptr(_int)  # where a creating call writes its error code

_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "clGetPlatformIDs": (_int, [_uint, _ptr(_handle), _ptr(_uint)]),
    "clGetPlatformInfo": (_int, [_handle, _uint, _size, _handle, _ptr(_size)]),
    "clGetDeviceIDs": (_int, [_handle, _ulong, _uint, _ptr(_handle), _ptr(_uint)]),
    "clGetDeviceInfo": (_int, [_handle, _uint, _size, _handle, _ptr(_size)]),
    "clCreateContext": (_handle, [_handle, _uint, _ptr(_handle), _handle, _handle, _errp]),
    "clCreateCommandQueue": (_handle, [_handle, _handle, _ulong, _errp]),
    "clCreateBuffer": (_handle, [_handle, _ulong, _size, _handle, _errp]),
    "clReleaseMemObject": (_int, [_handle]),
    "clEnqueueWriteBuffer": (_int, [_handle, _handle, _uint, _size, _size, _handle, _uint, _handle, _handle]),
    "clEnqueueReadBuffer": (_int, [_handle, _handle, _uint, _size, _size, _handle, _uint, _handle, _handle]),
    "clCreateProgramWithSource": (_handle, [_handle, _uint, _ptr(ctypes.c_char_p), _ptr(_size), _errp]),
    "clCreateProgramWithBinary": (
        _handle,
        [_handle, _uint, _ptr(_handle), _ptr(_size), _ptr(ctypes.c_char_p), _ptr(_int), _errp],
    ),
    "clBuildProgram": (_int, [_handle, _uint, _ptr(_handle), ctypes.c_char_p, _handle, _handle]),
    "clGetProgramBuildInfo": (_int, [_handle, _handle, _uint, _size, _handle, _ptr(_size)]),
    "clGetProgramInfo": (_int, [_handle, _uint, _size, _handle, _ptr(_size)]),
    "clReleaseProgram": (_int, [_handle]),
    "clCreateKernel": (_handle, [_handle, ctypes.c_char_p, _errp]),
    "clGetKernelInfo": (_int, [_handle, _uint, _size, _handle, _ptr(_size)]),
    "clSetKernelArg": (_int, [_handle, _uint, _size, _handle]),
    "clReleaseKernel": (_int, [_handle]),
    "clEnqueueNDRangeKernel": (
        _int,
        [_handle, _handle, _uint, _ptr(_size), _ptr(_size), _ptr(_size), _uint, _handle, _ptr(_handle)],
    ),
    "clWaitForEvents": (_int, [_uint, _ptr(_handle)]),
    "clGetEventProfilingInfo": (_int, [_handle, _uint, _size, _handle, _ptr(_size)]),
    "clReleaseEvent": (_int, [_handle]),
    "clFinish": (_int, [_handle]),
}

# the constants of CL/cl.h that tiny uses
CL_TRUE = 1
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_PLATFORM_VERSION, CL_PLATFORM_NAME = 0x0901, 0x0902
CL_DEVICE_MAX_WORK_GROUP_SIZE, CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1004, 0x1005
CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT = 0x100A
CL_DEVICE_MAX_MEM_ALLOC_SIZE, CL_DEVICE_LOCAL_MEM_SIZE = 0x1010, 0x1023
CL_DEVICE_NAME, CL_DRIVER_VERSION, CL_DEVICE_VERSION, CL_DEVICE_EXTENSIONS = 0x102B, 0x102D, 0x102F, 0x1030
CL_QUEUE_PROFILING_ENABLE = 1 << 1
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES = 0x1165, 0x1166
CL_PROGRAM_BUILD_LOG = 0x1183
CL_KERNEL_NUM_ARGS = 0x1191
CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END = 0x1282, 0x1283

_ERRORS = {
    -1: "CL_DEVICE_NOT_FOUND",
    -2: "CL_DEVICE_NOT_AVAILABLE",
    -3: "CL_COMPILER_NOT_AVAILABLE",
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE",
    -5: "CL_OUT_OF_RESOURCES",
    -6: "CL_OUT_OF_HOST_MEMORY",
    -7: "CL_PROFILING_INFO_NOT_AVAILABLE",
    -11: "CL_BUILD_PROGRAM_FAILURE",
    -30: "CL_INVALID_VALUE",
    -33: "CL_INVALID_DEVICE",
    -34: "CL_INVALID_CONTEXT",
    -36: "CL_INVALID_COMMAND_QUEUE",
    -38: "CL_INVALID_MEM_OBJECT",
    -42: "CL_INVALID_BINARY",
    -44: "CL_INVALID_PROGRAM",
    -45: "CL_INVALID_PROGRAM_EXECUTABLE",
    -46: "CL_INVALID_KERNEL_NAME",
    -48: "CL_INVALID_KERNEL",
    -49: "CL_INVALID_ARG_INDEX",
    -50: "CL_INVALID_ARG_VALUE",
    -51: "CL_INVALID_ARG_SIZE",
    -52: "CL_INVALID_KERNEL_ARGS",
    -53: "CL_INVALID_WORK_DIMENSION",
    -54: "CL_INVALID_WORK_GROUP_SIZE",
    -55: "CL_INVALID_WORK_ITEM_SIZE",
    -61: "CL_INVALID_BUFFER_SIZE",
    -63: "CL_INVALID_GLOBAL_WORK_SIZE",
    -1001: "CL_PLATFORM_NOT_FOUND_KHR",
}
_OUT_OF_MEMORY = frozenset({-4, -5, -6, -61})


class CLError(RuntimeError):
    """An OpenCL call that failed, with its error code's name."""

    def __init__(self, call: str, code: int, what: str = "") -> None:
        self.code = code
        super().__init__(f"{call} failed with {_ERRORS.get(code, 'error')} ({code}){': ' + what if what else ''}")


def _check(call: str, code: int, what: str = "") -> None:
    if code != 0:
        if code in _OUT_OF_MEMORY:
            raise MemoryError(str(CLError(call, code, what)))
        raise CLError(call, code, what)


@functools.cache
def library() -> ctypes.CDLL:
    """The OpenCL ICD loader, with the signatures of the calls tiny makes."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise DeviceUnavailable(
            f"{LIBRARY} (the OpenCL ICD loader) is not installed: {e}. On Debian: "
            "apt install ocl-icd-libopencl1 and a driver (pocl-opencl-icd runs OpenCL on the CPU)"
        ) from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _create(call: str, *args: Any) -> int:
    """Call a clCreate* function; its handle, or a CLError (MemoryError when memory ran out)."""
    err = _int(0)
    handle = getattr(library(), call)(*args, ctypes.byref(err))
    _check(call, err.value)
    return handle


def _info_bytes(call: str, handle: Any, param: int, *extra: Any) -> bytes:
    fn, size = getattr(library(), call), _size(0)
    _check(call, fn(handle, *extra, param, 0, None, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    _check(call, fn(handle, *extra, param, size.value, buf, None))
    return buf.raw


def _info_str(call: str, handle: Any, param: int, *extra: Any) -> str:
    return _info_bytes(call, handle, param, *extra).rstrip(b"\0").decode(errors="replace").strip()


def _info_int(call: str, handle: Any, param: int, ctype: Any = _size) -> int:
    value = ctype(0)
    _check(call, getattr(library(), call)(handle, param, ctypes.sizeof(value), ctypes.byref(value), None))
    return int(value.value)


# ---------------------------------------------------------------- finding devices


@dataclass(frozen=True)
class DeviceInfo:
    """One OpenCL device and what tiny needs to know of it."""

    platform: int  # cl_platform_id
    device: int  # cl_device_id
    platform_name: str
    platform_version: str
    name: str
    version: str
    driver: str
    extensions: frozenset[str]
    max_work_group: int
    max_work_items: tuple[int, int, int]
    local_mem: int
    max_alloc: int
    float_vector: int

    def __str__(self) -> str:
        return f"{self.name} ({self.version}, driver {self.driver}, platform {self.platform_name})"


def _handles(call: str, *args: Any) -> list[int]:
    fn, count = getattr(library(), call), _uint(0)
    code = fn(*args, 0, None, ctypes.byref(count))
    if code in (-1, -1001) or (code == 0 and count.value == 0):  # no device, no platform
        return []
    _check(call, code)
    out = (_handle * count.value)()
    _check(call, fn(*args, count.value, out, None))
    return [int(h) for h in out]


def _describe(platform: int, device: int) -> DeviceInfo:
    def dev_str(param: int) -> str:
        return _info_str("clGetDeviceInfo", device, param)

    def dev_int(param: int, ctype: Any = _size) -> int:
        return _info_int("clGetDeviceInfo", device, param, ctype)

    items = ctypes.cast(_info_bytes("clGetDeviceInfo", device, CL_DEVICE_MAX_WORK_ITEM_SIZES), _ptr(_size))
    return DeviceInfo(
        platform=platform,
        device=device,
        platform_name=_info_str("clGetPlatformInfo", platform, CL_PLATFORM_NAME),
        platform_version=_info_str("clGetPlatformInfo", platform, CL_PLATFORM_VERSION),
        name=dev_str(CL_DEVICE_NAME),
        version=dev_str(CL_DEVICE_VERSION),
        driver=dev_str(CL_DRIVER_VERSION),
        extensions=frozenset(dev_str(CL_DEVICE_EXTENSIONS).split()),
        max_work_group=dev_int(CL_DEVICE_MAX_WORK_GROUP_SIZE),
        max_work_items=(int(items[0]), int(items[1]), int(items[2])),
        local_mem=dev_int(CL_DEVICE_LOCAL_MEM_SIZE, _ulong),
        max_alloc=dev_int(CL_DEVICE_MAX_MEM_ALLOC_SIZE, _ulong),
        float_vector=dev_int(CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, _uint),
    )


@functools.cache
def devices() -> tuple[DeviceInfo, ...]:
    """Every OpenCL device of the machine: each platform's devices, platforms in the loader's order."""
    found = []
    for platform in _handles("clGetPlatformIDs"):
        for device in _handles("clGetDeviceIDs", platform, CL_DEVICE_TYPE_ALL):
            found.append(_describe(platform, device))
    return tuple(found)


def _choose(index: int) -> DeviceInfo:
    found = devices()
    if not found:
        raise DeviceUnavailable(
            f"{LIBRARY} loads but finds no OpenCL device: no driver is registered in /etc/OpenCL/vendors "
            "(on Debian: apt install pocl-opencl-icd for the CPU, or your GPU vendor's OpenCL driver)"
        )
    if index >= len(found):
        listed = "; ".join(f"CL:{i} {d}" for i, d in enumerate(found))
        raise DeviceUnavailable(f"CL:{index} does not exist: this machine has {len(found)} OpenCL device(s): {listed}")
    return found[index]


# ---------------------------------------------------------------- compiling and launching


def _build_log(program: int, device: int) -> str:
    return _info_str("clGetProgramBuildInfo", program, CL_PROGRAM_BUILD_LOG, device)


def _build(dev: CLDevice, program: int, what: str, src: str = "") -> None:
    """Build a program for the device; a CompileError with the driver's build log (and the source) when it fails."""
    device = _handle(dev.info.device)
    code = library().clBuildProgram(program, 1, ctypes.byref(device), b"", None, None)
    if code != 0:
        log = _build_log(program, dev.info.device)
        library().clReleaseProgram(program)
        source = f"\n--- source ---\n{src}" if src else ""
        raise CompileError(f"{dev.info.name} did not build {what} ({_ERRORS.get(code, code)}):\n{log}{source}")


class CLCompiler(Compiler):
    """OpenCL C -> the driver's program binary for one device (cached on disk by driver and source)."""

    def __init__(self, dev: CLDevice) -> None:
        self.dev = dev
        i = dev.info
        super().__init__(cachekey=f"opencl:{i.platform_name}:{i.platform_version}:{i.name}:{i.version}:{i.driver}")

    def compile(self, src: str) -> bytes:
        text, length = ctypes.c_char_p(src.encode()), _size(len(src.encode()))
        program = _create("clCreateProgramWithSource", self.dev.context, 1, ctypes.byref(text), ctypes.byref(length))
        _build(self.dev, program, "generated code", src)
        try:
            (size,) = ctypes.cast(_info_bytes("clGetProgramInfo", program, CL_PROGRAM_BINARY_SIZES), _ptr(_size))[:1]
            binary = ctypes.create_string_buffer(size)
            pointers = (ctypes.c_char_p * 1)(ctypes.cast(binary, ctypes.c_char_p))
            _check(
                "clGetProgramInfo",
                library().clGetProgramInfo(program, CL_PROGRAM_BINARIES, ctypes.sizeof(pointers), pointers, None),
            )
        except BaseException:
            library().clReleaseProgram(program)
            raise
        # loading this binary in this process takes the program built here instead of building it again
        if binary.raw in self.dev.built:  # the same kernel compiled twice
            library().clReleaseProgram(program)
        else:
            self.dev.built[binary.raw] = program
        return binary.raw


class CLProgram(Program):
    """A kernel of a built program. Buffers are cl_mem handles; vals are the kernel's int arguments after them."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        assert isinstance(device, CLDevice)
        self.dev = device
        self.program = device.built.pop(binary, None) or self._from_binary(binary)
        try:
            self.kernel = _create("clCreateKernel", self.program, name.encode())
        except CLError as e:
            library().clReleaseProgram(self.program)
            raise CompileError(f"the OpenCL program has no kernel named {name!r}: {e}") from None
        self.n_args = _info_int("clGetKernelInfo", self.kernel, CL_KERNEL_NUM_ARGS, _uint)

    def _from_binary(self, binary: bytes) -> int:
        dev_handle = _handle(self.dev.info.device)
        blob, length, status = ctypes.c_char_p(binary), _size(len(binary)), _int(0)
        program = _create(
            "clCreateProgramWithBinary",
            self.dev.context,
            1,
            ctypes.byref(dev_handle),
            ctypes.byref(length),
            ctypes.byref(blob),
            ctypes.byref(status),
        )
        _build(self.dev, program, f"the binary of kernel {self.name}")
        return program

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        if len(bufs) + len(vals) != self.n_args:
            raise TypeError(
                f"kernel {self.name} takes {self.n_args} arguments, got {len(bufs)} buffers and {len(vals)} ints"
            )
        if len(global_size) != 3 or len(local_size) != 3 or min(*global_size, *local_size) < 1:
            raise ValueError(f"kernel {self.name}: grid {global_size} and workgroup {local_size} need 3 sizes >= 1")
        lib = library()
        for i, b in enumerate(bufs):
            mem = _handle(b)
            _check("clSetKernelArg", lib.clSetKernelArg(self.kernel, i, ctypes.sizeof(mem), ctypes.byref(mem)))
        for i, v in enumerate(vals, start=len(bufs)):
            arg = _int(v)
            _check("clSetKernelArg", lib.clSetKernelArg(self.kernel, i, ctypes.sizeof(arg), ctypes.byref(arg)))
        total = (_size * 3)(*(g * lo for g, lo in zip(global_size, local_size)))
        local = (_size * 3)(*local_size)
        event = _handle()
        code = lib.clEnqueueNDRangeKernel(
            self.dev.queue, self.kernel, 3, None, total, local, 0, None, ctypes.byref(event) if wait else None
        )
        _check("clEnqueueNDRangeKernel", code, f"kernel {self.name}, grid {global_size}, workgroup {local_size}")
        if not wait:
            return None
        try:
            _check("clWaitForEvents", lib.clWaitForEvents(1, ctypes.byref(event)))
            start = _info_int("clGetEventProfilingInfo", event, CL_PROFILING_COMMAND_START, _ulong)
            end = _info_int("clGetEventProfilingInfo", event, CL_PROFILING_COMMAND_END, _ulong)
        finally:
            lib.clReleaseEvent(event)
        return (end - start) * 1e-9

    def __del__(self) -> None:
        try:
            library().clReleaseKernel(self.kernel)
            library().clReleaseProgram(self.program)
        except Exception:  # noqa: BLE001  (half-built, or interpreter shutdown)
            pass


# ---------------------------------------------------------------- memory and the device


class CLAllocator(LRUAllocator):
    """cl_mem buffers of the device's context; the host reaches them only by copies."""

    caps = AllocatorCaps(host_visible=False, aligned=128)

    def __init__(self, dev: CLDevice) -> None:
        super().__init__()
        self.dev = dev

    def _alloc(self, size: int) -> int:
        if size > self.dev.info.max_alloc:
            raise MemoryError(f"{self.dev.name}: one buffer holds at most {self.dev.info.max_alloc} bytes, not {size}")
        return _create("clCreateBuffer", self.dev.context, CL_MEM_READ_WRITE, size, None)

    def _free(self, opaque: int, size: int) -> None:
        library().clReleaseMemObject(opaque)

    def copyin(self, dest: int, src: memoryview) -> None:
        data = (
            (ctypes.c_char * src.nbytes).from_buffer_copy(src) if src.readonly else (ctypes.c_char * 0).from_buffer(src)
        )
        code = library().clEnqueueWriteBuffer(self.dev.queue, dest, CL_TRUE, 0, src.nbytes, data, 0, None, None)
        _check("clEnqueueWriteBuffer", code, f"{src.nbytes} bytes to {self.dev.name}")

    def copyout(self, dest: memoryview, src: int) -> None:
        data = (ctypes.c_char * 0).from_buffer(dest)
        code = library().clEnqueueReadBuffer(self.dev.queue, src, CL_TRUE, 0, dest.nbytes, data, 0, None, None)
        _check("clEnqueueReadBuffer", code, f"{dest.nbytes} bytes from {self.dev.name}")


class CLDevice(Compiled):
    """An OpenCL device: `CL` the first one, `CL:1` the second (see `tiny.runtime.cl.devices()`)."""

    priority = 5  # below CPU: never the default over it
    renderers = ("OPENCL",)

    def __init__(self, name: str, renderer: str) -> None:
        self.info = _choose(DeviceName.parse(name).index)
        device = _handle(self.info.device)
        self.context = _create("clCreateContext", None, 1, ctypes.byref(device), None, None)
        self.queue = _create("clCreateCommandQueue", self.context, self.info.device, CL_QUEUE_PROFILING_ENABLE)
        self.built: dict[bytes, int] = {}  # binary -> its program, built by this process's compiler, not loaded yet
        super().__init__(name, CLAllocator(self), CLProgram, renderer)

    def compiler(self) -> Compiler:
        return CLCompiler(self)

    def renderer_target(self) -> str:
        """The device's limits and features, as tiny.codegen.renderer.cstyle.GPUCStyleRenderer reads them."""
        i = self.info
        features = [f for f, ext in (("fp16", "cl_khr_fp16"), ("fp64", "cl_khr_fp64")) if ext in i.extensions]
        vector_width = min(max(i.float_vector, 4), 16)  # floats per vector load: at least 128 bits
        return (
            f"vector_width={vector_width};local_max={','.join(str(n) for n in i.max_work_items)};"
            f"local_total_max={i.max_work_group};shared_max={i.local_mem};features={','.join(features)}"
        )

    def synchronize(self) -> None:
        _check("clFinish", library().clFinish(self.queue))
