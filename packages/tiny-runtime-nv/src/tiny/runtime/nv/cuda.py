"""The CUDA device: the CUDA driver API (libcuda) through ctypes, kernels compiled by NVRTC.

`CUDA` is the first GPU, `CUDA:1` the second; `CUDA:PTX` (or `CUDA:1:PTX`) renders PTX with tiny.codegen.renderer.ptx
and lets the driver assemble it, instead of CUDA C compiled by NVRTC to the GPU's own cubin. Each device works in its
GPU's primary context on one stream of its own: launches do not wait, `wait=True` times a launch with two events,
copies to and from the host go through a pinned staging buffer, and copies between two GPUs go straight across
(cuMemcpyPeer) where the driver allows peer access, else through the host. TinyJit replays through a CUDA graph.

What stops CUDA on a machine is said in words (`python -m tiny.ir.device` lists it): no driver, no GPU, no NVRTC,
an NVRTC newer than the driver can take, a GPU older than sm_70.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tiny.ir.config import TF32
from tiny.ir.device import (
    AllocatorCaps,
    Compiled,
    CompileError,
    Compiler,
    DeviceName,
    DeviceUnavailable,
    GraphLaunch,
    GraphReplay,
    LRUAllocator,
    Program,
    fold_grid,
)
from tiny.runtime.nv.nvrtc import NVRTC, CUDACompiler, PTXCompiler, find_nvrtc, split_dynamic_shared

LIBRARY = "libcuda.so.1"
MIN_COMPUTE = 70  # Volta: the oldest GPU the PTX and CUDA C renderers write for
MAX_GRID = 65535  # blocks per grid dimension (y and z; x allows more): bigger grids launch folded, as renderers unfold

_int, _uint, _size, _ptr, _handle = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.POINTER, ctypes.c_void_p
_dptr = ctypes.c_uint64  # CUdeviceptr

_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_uint],
    "cuDriverGetVersion": [_ptr(_int)],
    "cuDeviceGetCount": [_ptr(_int)],
    "cuDeviceGet": [_ptr(_int), _int],
    "cuDeviceGetName": [ctypes.c_char_p, _int, _int],
    "cuDeviceGetAttribute": [_ptr(_int), _int, _int],
    "cuDeviceTotalMem_v2": [_ptr(_size), _int],
    "cuDeviceCanAccessPeer": [_ptr(_int), _int, _int],
    "cuDevicePrimaryCtxRetain": [_ptr(_handle), _int],
    "cuCtxSetCurrent": [_handle],
    "cuCtxEnablePeerAccess": [_handle, _uint],
    "cuStreamCreate": [_ptr(_handle), _uint],
    "cuStreamSynchronize": [_handle],
    "cuMemAlloc_v2": [_ptr(_dptr), _size],
    "cuMemFree_v2": [_dptr],
    "cuMemHostAlloc": [_ptr(_handle), _size, _uint],
    "cuMemFreeHost": [_handle],
    "cuMemcpyHtoDAsync_v2": [_dptr, _handle, _size, _handle],
    "cuMemcpyDtoHAsync_v2": [_handle, _dptr, _size, _handle],
    "cuMemcpyDtoDAsync_v2": [_dptr, _dptr, _size, _handle],
    "cuMemcpyPeerAsync": [_dptr, _handle, _dptr, _handle, _size, _handle],
    "cuModuleLoadDataEx": [_ptr(_handle), ctypes.c_char_p, _uint, _ptr(_int), _ptr(_handle)],
    "cuModuleGetFunction": [_ptr(_handle), _handle, ctypes.c_char_p],
    "cuModuleUnload": [_handle],
    "cuFuncSetAttribute": [_handle, _int, _int],
    "cuLaunchKernel": [_handle, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _handle, _ptr(_handle), _handle],
    "cuEventCreate": [_ptr(_handle), _uint],
    "cuEventRecord": [_handle, _handle],
    "cuEventSynchronize": [_handle],
    "cuEventElapsedTime": [_ptr(ctypes.c_float), _handle, _handle],
    "cuEventDestroy_v2": [_handle],
    "cuGetErrorString": [_int, _ptr(ctypes.c_char_p)],
}
# CUDA graphs (TinyJit's replays): looked up when first used, so that a driver without them still runs kernels.
# The kernel-node calls are the _v2 ones (CUDA 12 and newer) where the driver has them, else the first versions.
_GRAPH_SIGNATURES: dict[str, list[Any]] = {
    "cuGraphCreate": [_ptr(_handle), _uint],
    "cuGraphAddKernelNode": [_ptr(_handle), _handle, _ptr(_handle), _size, _handle],
    "cuGraphInstantiateWithFlags": [_ptr(_handle), _handle, ctypes.c_ulonglong],
    "cuGraphExecKernelNodeSetParams": [_handle, _handle, _handle],
    "cuGraphLaunch": [_handle, _handle],
    "cuGraphExecDestroy": [_handle],
    "cuGraphDestroy": [_handle],
}
_VERSIONED = ("cuGraphAddKernelNode", "cuGraphExecKernelNodeSetParams")

_PREFER_V2 = frozenset({"cuEventElapsedTime"})  # same arguments; CUDA 13's cuda.h maps the name to the _v2 symbol

# the constants of cuda.h that tiny uses
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1
CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 2, 3, 4
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97  # (sm_70+: what a kernel may ask for, past the 48 KiB)
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76
CU_MEMHOSTALLOC_PORTABLE = 1
CU_EVENT_DEFAULT = 0
CU_STREAM_NON_BLOCKING = 1
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
STAGING_BYTES = 16 << 20  # the pinned host buffer that copies go through, in pieces of this size


class CUDAError(RuntimeError):
    """A driver call that failed, with the driver's name for the error."""


@functools.cache
def library() -> ctypes.CDLL:
    """libcuda with the signatures of the calls tiny makes; DeviceUnavailable when there is no driver."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise DeviceUnavailable(f"no NVIDIA driver: {LIBRARY} does not load ({e})") from None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, f"{name}_v2", None) if name in _PREFER_V2 else None  # what cuda.h of CUDA 13 calls
        fn = fn or getattr(lib, name, None)
        if fn is None:
            raise DeviceUnavailable(f"the NVIDIA driver's {LIBRARY} has no {name}: the driver is too old for tiny")
        fn.restype, fn.argtypes = _int, argtypes
        setattr(lib, name, fn)  # lib.<name> is the function chosen (the _v2 one where preferred)
    return lib


@functools.cache
def graph_api() -> tuple[dict[str, Any], bool] | None:
    """The CUDA graph calls (name -> function) and whether the kernel-node ones are the _v2 forms; None when the
    driver lacks them (TinyJit then replays kernel by kernel)."""
    lib = library()
    v2 = all(hasattr(lib, f"{n}_v2") for n in _VERSIONED)
    fns = {}
    for name, argtypes in _GRAPH_SIGNATURES.items():
        fn = getattr(lib, f"{name}_v2" if v2 and name in _VERSIONED else name, None)
        if fn is None:
            return None
        fn.restype, fn.argtypes = _int, argtypes
        fns[name] = fn
    return fns, v2


def _error_text(status: int) -> str:
    text = ctypes.c_char_p()
    library().cuGetErrorString(status, ctypes.byref(text))
    return text.value.decode() if text.value else f"CUresult {status}"


def check(call: str, status: int, what: str = "") -> None:
    if status == 0:
        return
    message = f"{call} failed: {_error_text(status)} ({status}){': ' + what if what else ''}"
    if status == CUDA_ERROR_OUT_OF_MEMORY:
        raise MemoryError(message)
    raise CUDAError(message)


def _call(name: str, *args: Any, what: str = "") -> None:
    check(name, getattr(library(), name)(*args), what)


def _get_int(name: str, *args: Any) -> int:
    out = _int(0)
    _call(name, ctypes.byref(out), *args)
    return out.value


# ---------------------------------------------------------------- the machine


@dataclass(frozen=True)
class GPU:
    """One GPU as the driver describes it."""

    ordinal: int
    handle: int  # CUdevice
    name: str
    compute: tuple[int, int]  # compute capability (9, 0) for H100
    max_threads: int
    max_block: tuple[int, int, int]
    shared_per_block: int
    memory: int

    @property
    def arch(self) -> str:
        return f"sm_{self.compute[0]}{self.compute[1]}"


@functools.cache
def driver_version() -> int:
    """cuDriverGetVersion: 12040 is CUDA 12.4."""
    return _get_int("cuDriverGetVersion")


@functools.cache
def gpus() -> tuple[GPU, ...]:
    status = library().cuInit(0)
    if status != 0:
        raise DeviceUnavailable(f"the NVIDIA driver does not start: cuInit failed with {_error_text(status)}")
    found = []
    for i in range(_get_int("cuDeviceGetCount")):
        dev = _get_int("cuDeviceGet", i)
        name = ctypes.create_string_buffer(256)
        _call("cuDeviceGetName", name, 256, dev)
        attr = functools.partial(_get_int, "cuDeviceGetAttribute")
        mem = _size(0)
        _call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev)
        found.append(
            GPU(
                ordinal=i,
                handle=dev,
                name=name.value.decode(),
                compute=(
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                ),
                max_threads=attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev),
                max_block=(
                    attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, dev),
                    attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, dev),
                    attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, dev),
                ),
                shared_per_block=_shared_per_block(dev),
                memory=mem.value,
            )
        )
    return tuple(found)


def _shared_per_block(dev: int) -> int:
    """The shared memory a block may have: what a kernel may opt in to where the driver says (an H100 227 KiB, as
    dynamic shared memory past the 48 KiB of static arrays: tiny.codegen.renderer.shared), else the 48 KiB."""
    static = _get_int("cuDeviceGetAttribute", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, dev)
    out = _int(0)
    status = library().cuDeviceGetAttribute(
        ctypes.byref(out), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev
    )
    return max(static, out.value) if status == 0 else static


def choose_gpu(index: int) -> GPU:
    """GPU `index` of the machine, or DeviceUnavailable saying what the machine has."""
    found = gpus()
    if not found:
        raise DeviceUnavailable("the NVIDIA driver sees no GPU")
    if index >= len(found):
        listed = "; ".join(f"CUDA:{g.ordinal} {g.name} ({g.arch})" for g in found)
        raise DeviceUnavailable(f"CUDA:{index} does not exist: this machine has {len(found)} GPU(s): {listed}")
    gpu = found[index]
    if gpu.compute[0] * 10 + gpu.compute[1] < MIN_COMPUTE:
        raise DeviceUnavailable(
            f"{gpu.name} is {gpu.arch}; tiny's CUDA runtime needs sm_{MIN_COMPUTE} (Volta) or newer"
        )
    return gpu


# ---------------------------------------------------------------- programs


class CUDAProgram(Program):
    """A kernel of a loaded module (cubin or PTX). Buffers are device pointers; vals are its int arguments."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        assert isinstance(device, CUDADevice)
        self.dev = device
        binary, self.shared = split_dynamic_shared(binary)
        device.activate()
        self.module, self.function = _handle(), _handle()
        log = ctypes.create_string_buffer(16384)
        options = (_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (_handle * 2)(ctypes.cast(log, _handle).value, len(log))
        status = library().cuModuleLoadDataEx(ctypes.byref(self.module), binary, 2, options, values)
        if status != 0:
            kind = "PTX" if binary.lstrip().startswith(b"//") or b".target" in binary[:4096] else "cubin"
            raise CompileError(
                f"the driver (CUDA {driver_version() // 1000}.{driver_version() % 1000 // 10}) did not load the "
                f"{kind} of kernel {name} for {device.gpu.arch}: {_error_text(status)}\n"
                f"{log.value.decode(errors='replace')}"
            )
        _call("cuModuleGetFunction", ctypes.byref(self.function), self.module, name.encode(), what=f"kernel {name}")
        if self.shared:  # (past 48 KiB a kernel must be allowed its dynamic shared memory first)
            limit = device.gpu.shared_per_block
            if self.shared > limit:
                raise CompileError(
                    f"kernel {name} needs {self.shared} bytes of shared memory, {device.gpu.name} gives a block {limit}"
                )
            check(
                "cuFuncSetAttribute",
                library().cuFuncSetAttribute(
                    self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared
                ),
                f"kernel {name}, {self.shared} bytes of dynamic shared memory",
            )

    def arguments(self, bufs: tuple[Any, ...], vals: tuple[int, ...]) -> tuple[Any, Any]:
        """The kernel's argument array (void** to each value) and the values it points to (keep them alive)."""
        values = [_dptr(b) for b in bufs] + [ctypes.c_int32(v) for v in vals]
        pointers = (_handle * max(len(values), 1))(*(ctypes.cast(ctypes.byref(v), _handle).value for v in values))
        return pointers, values

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        if len(global_size) != 3 or len(local_size) != 3 or min(*global_size, *local_size) < 1:
            raise ValueError(f"kernel {self.name}: grid {global_size} and block {local_size} need 3 sizes >= 1")
        self.dev.activate()
        pointers, _keep = self.arguments(bufs, vals)
        lib, stream = library(), self.dev.stream
        if wait:
            _call("cuEventRecord", self.dev.events[0], stream)
        grid = fold_grid(global_size, MAX_GRID)
        check(
            "cuLaunchKernel",
            lib.cuLaunchKernel(self.function, *grid, *local_size, self.shared, stream, pointers, None),
            f"kernel {self.name}, grid {global_size}, block {local_size}",
        )
        if not wait:
            return None
        _call("cuEventRecord", self.dev.events[1], stream)
        _call("cuEventSynchronize", self.dev.events[1])
        ms = ctypes.c_float(0)
        _call("cuEventElapsedTime", ctypes.byref(ms), self.dev.events[0], self.dev.events[1])
        return ms.value * 1e-3

    def __del__(self) -> None:
        try:
            library().cuModuleUnload(self.module)
        except Exception:  # noqa: BLE001  (half-built, or interpreter shutdown)
            pass


_KERNEL_NODE_FIELDS = [
    ("func", _handle),
    ("gridDimX", _uint),
    ("gridDimY", _uint),
    ("gridDimZ", _uint),
    ("blockDimX", _uint),
    ("blockDimY", _uint),
    ("blockDimZ", _uint),
    ("sharedMemBytes", _uint),
    ("kernelParams", _ptr(_handle)),
    ("extra", _ptr(_handle)),
]


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS, the first version (cuGraphAddKernelNode)."""

    _fields_ = _KERNEL_NODE_FIELDS


class _KernelNodeParamsV2(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuGraphAddKernelNode_v2): a CUkernel instead of func (unused: NULL) and the
    context (NULL: the current one)."""

    _fields_ = [*_KERNEL_NODE_FIELDS, ("kern", _handle), ("ctx", _handle)]


class CUDAGraph:
    """Kernels captured by TinyJit as one CUDA graph (a chain of kernel nodes): a replay is one cuGraphLaunch, after
    cuGraphExecKernelNodeSetParams for each kernel whose buffers changed."""

    def __init__(self, dev: CUDADevice, launches: list[GraphLaunch]) -> None:
        api = graph_api()
        assert api is not None, "the driver has no CUDA graphs"
        self.fns, self.v2 = api
        self.dev = dev
        dev.activate()
        self.graph, self.exec = _handle(), _handle()
        self._call("cuGraphCreate", ctypes.byref(self.graph), 0)
        self.nodes: list[Any] = []
        self.params: list[ctypes.Structure] = []
        self.keep: list[Any] = []  # what the node parameters point to
        self.args: list[tuple[Any, ...]] = []
        for ln in launches:
            assert isinstance(ln.program, CUDAProgram)
            params = self._params(ln.program, ln.args, ln.vals, ln.global_size, ln.local_size)
            node = _handle()
            deps = (_handle * 1)(self.nodes[-1].value) if self.nodes else None
            n_deps = 1 if self.nodes else 0  # a chain: each kernel after the one before
            self._call("cuGraphAddKernelNode", ctypes.byref(node), self.graph, deps, n_deps, ctypes.byref(params))
            self.nodes.append(node)
            self.params.append(params)
            self.args.append(tuple(ln.args))
        self.launches = launches
        self._call("cuGraphInstantiateWithFlags", ctypes.byref(self.exec), self.graph, 0)

    def _call(self, name: str, *args: Any) -> None:
        check(name, self.fns[name](*args))

    def _params(
        self, prog: CUDAProgram, bufs: Any, vals: tuple[int, ...], grid: tuple[int, ...], block: tuple[int, ...]
    ) -> ctypes.Structure:
        pointers, values = prog.arguments(tuple(bufs), vals)
        self.keep.append((pointers, values))
        kind = _KernelNodeParamsV2 if self.v2 else _KernelNodeParams
        return kind(prog.function, *fold_grid(grid, MAX_GRID), *block, prog.shared, pointers, None)

    def __call__(self, args: list[tuple[Any, ...]], values: Mapping[str, int] | None = None) -> None:
        self.dev.activate()
        for i, (ln, new) in enumerate(zip(self.launches, args)):
            if tuple(new) != self.args[i]:
                assert isinstance(ln.program, CUDAProgram)
                params = self._params(ln.program, new, ln.vals, ln.global_size, ln.local_size)
                self._call("cuGraphExecKernelNodeSetParams", self.exec, self.nodes[i], ctypes.byref(params))
                self.params[i], self.args[i] = params, tuple(new)
        if len(self.keep) > 4 * len(self.launches):  # drop argument arrays no node points to any more
            self.keep = self.keep[-2 * len(self.launches) :]
        self._call("cuGraphLaunch", self.exec, self.dev.stream)

    def __del__(self) -> None:
        try:
            self.fns["cuGraphExecDestroy"](self.exec)
            self.fns["cuGraphDestroy"](self.graph)
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------- memory


class CUDAAllocator(LRUAllocator):
    """Device memory (cuMemAlloc); copies from and to the host through a pinned staging buffer, between GPUs peer to
    peer where the driver allows."""

    caps = AllocatorCaps(host_visible=False, transfer=True, aligned=256, views=True, foreign=True)

    def __init__(self, dev: CUDADevice) -> None:
        super().__init__()
        self.dev = dev
        self._staging: Any = None

    def _alloc(self, size: int) -> int:
        self.dev.activate()
        ptr = _dptr(0)
        _call("cuMemAlloc_v2", ctypes.byref(ptr), size, what=f"{size} bytes on {self.dev.name}")
        return ptr.value

    def _free(self, opaque: int, size: int) -> None:
        self.dev.activate()
        library().cuMemFree_v2(opaque)

    def staging(self) -> Any:
        if self._staging is None:
            self.dev.activate()
            host = _handle()
            _call("cuMemHostAlloc", ctypes.byref(host), STAGING_BYTES, CU_MEMHOSTALLOC_PORTABLE)
            self._staging = host
        return self._staging

    def copyin(self, dest: int, src: memoryview) -> None:
        self.dev.activate()
        stage = self.staging()
        for at in range(0, src.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, src.nbytes - at)
            _call("cuStreamSynchronize", self.dev.stream)  # the staging buffer is free again
            ctypes.memmove(stage.value, (ctypes.c_char * n).from_buffer_copy(src[at : at + n]), n)
            _call("cuMemcpyHtoDAsync_v2", dest + at, stage, n, self.dev.stream)
        _call("cuStreamSynchronize", self.dev.stream)

    def copyout(self, dest: memoryview, src: int) -> None:
        self.dev.activate()
        stage = self.staging()
        out = (ctypes.c_char * dest.nbytes).from_buffer(dest)
        for at in range(0, dest.nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, dest.nbytes - at)
            _call("cuMemcpyDtoHAsync_v2", stage, src + at, n, self.dev.stream)
            _call("cuStreamSynchronize", self.dev.stream)
            ctypes.memmove(ctypes.addressof(out) + at, stage.value, n)

    def transfer(self, dest: Any, src: Any, size: int, src_device: Compiled, dest_device: Compiled) -> None:
        assert isinstance(src_device, CUDADevice) and isinstance(dest_device, CUDADevice)
        if src_device is dest_device:
            dest_device.activate()
            _call("cuMemcpyDtoDAsync_v2", dest, src, size, dest_device.stream)
            return
        src_device.synchronize()  # what the source's stream writes is there before the copy reads it
        if dest_device.peer(src_device):
            dest_device.activate()
            _call("cuMemcpyPeerAsync", dest, dest_device.context, src, src_device.context, size, dest_device.stream)
            return
        data = memoryview(bytearray(size))
        src_device.allocator.copyout(data, src)
        self.copyin(dest, data)

    def offset(self, opaque: Any, offset: int, size: int) -> Any:
        return opaque + offset

    def wrap(self, address: int, size: int) -> int:
        return address  # a device pointer (CUdeviceptr) of this device's context, as an allocation's opaque is

    def address(self, opaque: int) -> int:
        return opaque


# ---------------------------------------------------------------- the device


class CUDADevice(Compiled):
    """An NVIDIA GPU through the CUDA driver: `CUDA`, `CUDA:1` ...; `CUDA:PTX` renders PTX instead of CUDA C."""

    priority = 100
    renderers = ("CUDA", "PTX")

    def __init__(self, name: str, renderer: str) -> None:
        library()
        self.gpu = choose_gpu(DeviceName.parse(name).index)
        self.tf32 = bool(TF32.value)  # (read as the device opens: its renderer's precision for its life)
        self.nvrtc: NVRTC | None = find_nvrtc(driver_version()) if renderer == "CUDA" else None
        ctx = _handle()
        _call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.gpu.handle)
        self.context = ctx
        self.activate()
        stream = _handle()
        _call("cuStreamCreate", ctypes.byref(stream), CU_STREAM_NON_BLOCKING)
        self.stream = stream
        self.events = []
        for _ in range(2):
            ev = _handle()
            _call("cuEventCreate", ctypes.byref(ev), CU_EVENT_DEFAULT)
            self.events.append(ev)
        self._peers: dict[int, bool] = {}
        super().__init__(name, CUDAAllocator(self), CUDAProgram, renderer)

    def activate(self) -> None:
        _call("cuCtxSetCurrent", self.context)

    def compiler(self) -> Compiler:
        if self.renderer_name == "PTX":
            return PTXCompiler(self.gpu.arch, driver_version())
        assert self.nvrtc is not None
        return CUDACompiler(self.gpu.arch, self.nvrtc)

    def renderer_target(self) -> str:
        """The GPU's architecture and limits, and tf32=1 where TF32 is set (float32 products on tensor cores: part
        of the target, so BEAM's cache keeps the plans of either precision apart)."""
        g = self.gpu
        return (
            f"arch={g.arch};vector_width=4;local_max={','.join(str(n) for n in g.max_block)};"
            f"local_total_max={g.max_threads};shared_max={g.shared_per_block};max_grid={MAX_GRID}"
            + (";tf32=1" if self.tf32 else "")
        )

    def synchronize(self) -> None:
        self.activate()
        _call("cuStreamSynchronize", self.stream)

    def peer(self, other: CUDADevice) -> bool:
        """Whether this GPU reads and writes the other's memory directly (peer access, enabled on first use)."""
        if other.gpu.ordinal not in self._peers:
            can = _get_int("cuDeviceCanAccessPeer", self.gpu.handle, other.gpu.handle) == 1
            if can:
                self.activate()
                status = library().cuCtxEnablePeerAccess(other.context, 0)
                can = status in (0, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
            self._peers[other.gpu.ordinal] = can
        return self._peers[other.gpu.ordinal]

    def graph(self, launches: list[GraphLaunch]) -> GraphReplay | None:
        """One CUDA graph for the kernels TinyJit captured, when all run on this device."""
        if not launches or any(
            not isinstance(ln.program, CUDAProgram) or ln.program.dev is not self or ln.var_names for ln in launches
        ):
            return None  # (a kernel node's values are fixed: launches of Variables replay one by one)
        return CUDAGraph(self, launches)
