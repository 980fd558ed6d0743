"""The AMD device, talking to the kernel driver (KFD) directly: no ROCm libraries.

`AMD` is the first GPU of the KFD topology, `AMD:1` the second. Kernels are LLVM IR from tiny.codegen.renderer.amdgpu,
built into code objects by clang and ld.lld (tiny.runtime.amd.compiler) for the GPU's gfx target, which the topology
names. A program's code object is placed in GPU memory (its PT_LOAD segments at their addresses, relocations
applied); a launch writes the kernel's arguments where the code object's metadata puts them, and a kernel dispatch
packet into the device's AQL queue (tiny.runtime.amd.aql). Launches do not wait; `wait=True` and synchronize sleep
in KFD's WAIT_EVENTS until the completion signal drops, and the time of a kernel comes from the timestamps the
packet processor writes into its signal.

Memory: buffers are VRAM the CPU can map (large-BAR / resizable-BAR GPUs), or GTT (system memory the GPU reaches
over PCIe) where VRAM cannot be mapped; copies in and out are CPU copies through that mapping, no SDMA. Kernels
that need scratch memory (register spills, private arrays) get it: the queue's scratch grows to the largest private
segment launched so far (tiny.runtime.amd.aql.AQLQueue.ensure_scratch).

With AMD_MOCK=<gfx target> the device talks to tiny.runtime.amd.mock instead of the operating system: a kernel
driver that checks every call and packet and runs kernels on the PYTHON emulator. It is never chosen otherwise.
"""

from __future__ import annotations

import ctypes
import struct
import time
from dataclasses import dataclass
from typing import Any

from tiny.ir.config import flag
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
from tiny.runtime.amd.aql import (
    FENCE_SCOPE_SYSTEM,
    HOST_FLAGS,
    AmdSignal,
    AQLQueue,
    DispatchPacket,
    SignalPool,
    dispatch_header,
)
from tiny.runtime.amd.compiler import amdgpu_compiler
from tiny.runtime.amd.driver import (
    KFD,
    KFD_PATH,
    MEM_EXECUTABLE,
    MEM_GTT,
    MEM_PUBLIC,
    MEM_VRAM,
    MEM_WRITABLE,
    Allocation,
    GpuNode,
    HostOS,
    LinuxOS,
    gpu_nodes,
    round_up,
)
from tiny.runtime.amd.elf import CodeObjectError, KernelArg, KernelInfo, read_code_object
from tiny.runtime.amd.mock import MockKFD

AMD_MOCK = flag(
    "AMD_MOCK",
    str,
    "",
    "a gfx target (gfx1100, gfx942 ...): the AMD device talks to a mock kernel driver (tiny.runtime.amd.mock) that "
    "checks every call and AQL packet and runs kernels on the PYTHON emulator; empty: the real /dev/kfd",
)

TIMEOUT_S = 60.0  # how long a wait for the GPU may take before it is called a hang
KERNARG_ARENA = 4 << 20  # bytes of host-visible memory that kernel arguments are written into, as a ring


def host_os() -> HostOS:
    """The operating system the AMD device talks to: the real one, or the mock kernel driver when AMD_MOCK names a
    target. Nothing else ever chooses the mock."""
    return MockKFD(AMD_MOCK.value) if AMD_MOCK.value else LinuxOS()


def find_gpu(host: HostOS, index: int) -> GpuNode:
    """The index-th GPU of the KFD topology, or DeviceUnavailable saying what is missing."""
    if not host.exists(KFD_PATH):
        raise DeviceUnavailable(f"no AMD kernel driver: {KFD_PATH} is missing or not accessible")
    nodes = gpu_nodes(host)
    if not nodes:
        raise DeviceUnavailable("the AMD kernel driver lists no GPU")
    if index >= len(nodes):
        listed = ", ".join(f"AMD:{i} {n.target}" for i, n in enumerate(nodes))
        raise DeviceUnavailable(f"AMD:{index} does not exist: the topology has {len(nodes)} GPU(s): {listed}")
    return nodes[index]


@dataclass(frozen=True)
class DeviceMemory:
    """A buffer on the GPU: `size` bytes at `va` (the same address for the CPU) inside an allocation."""

    va: int
    size: int
    allocation: Allocation


class AMDAllocator(LRUAllocator):
    """Host-visible GPU memory: CPU-mapped VRAM where the GPU allows, else GTT. Copies are CPU copies."""

    caps = AllocatorCaps(host_visible=True, aligned=4096, views=True)

    def __init__(self, dev: AMDDevice) -> None:
        super().__init__()
        self.dev = dev

    def _alloc(self, size: int) -> DeviceMemory:
        return DeviceMemory((mem := self.dev.host_memory(size, MEM_WRITABLE)).va, size, mem)

    def _free(self, opaque: DeviceMemory, size: int) -> None:
        self.dev.synchronize()  # a kernel still in flight may use it
        self.dev.kfd.free(opaque.allocation)

    def copyin(self, dest: DeviceMemory, src: memoryview) -> None:
        self.dev.synchronize()
        src = src if src.format == "B" and src.ndim == 1 else src.cast("B")
        self.as_memoryview(dest, len(src))[:] = src

    def copyout(self, dest: memoryview, src: DeviceMemory) -> None:
        self.dev.synchronize()
        dest = dest if dest.format == "B" and dest.ndim == 1 else dest.cast("B")
        dest[:] = self.as_memoryview(src, len(dest))

    def as_memoryview(self, opaque: DeviceMemory, size: int) -> memoryview:
        return memoryview((ctypes.c_char * size).from_address(opaque.va)).cast("B")

    def offset(self, opaque: DeviceMemory, offset: int, size: int) -> DeviceMemory:
        if offset < 0 or offset + size > opaque.size:
            raise ValueError(f"bytes {offset}..{offset + size} are outside a buffer of {opaque.size} bytes")
        return DeviceMemory(opaque.va + offset, size, opaque.allocation)


# ---------------------------------------------------------------- programs

_HIDDEN_PER_DIM = {"hidden_block_count": 0, "hidden_group_size": 1, "hidden_remainder": 2}


def hidden_value(kind: str, global_size: tuple[int, ...], local_size: tuple[int, ...], queue_ptr: int) -> int:
    """What a hidden kernel argument holds for a launch of global_size workgroups of local_size work-items (a
    kind not listed here, such as the printf or hostcall buffers tiny's kernels never use, is 0)."""
    stem, _, dim = kind.rpartition("_")
    if stem in _HIDDEN_PER_DIM and dim in ("x", "y", "z"):
        i = "xyz".index(dim)
        return (global_size[i], local_size[i], 0)[_HIDDEN_PER_DIM[stem]]  # whole workgroups: no remainder
    if kind == "hidden_grid_dims":
        return 3
    if kind == "hidden_queue_ptr":
        return queue_ptr
    return 0


_INT_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


@dataclass(frozen=True)
class ArgLayout:
    """Where a kernel's buffers, integers and hidden values go in its kernarg block."""

    buffers: tuple[KernelArg, ...]
    values: tuple[KernelArg, ...]
    hidden: tuple[KernelArg, ...]

    @staticmethod
    def of(info: KernelInfo) -> ArgLayout:
        explicit = [a for a in info.args if not a.kind.startswith("hidden_")]
        buffers = tuple(a for a in explicit if a.kind == "global_buffer")
        values = tuple(a for a in explicit if a.kind == "by_value")
        if explicit != [*buffers, *values]:
            kinds = [a.kind for a in explicit]
            raise CompileError(f"kernel {info.name}: expected its buffers, then its integers, got arguments {kinds}")
        for a in buffers:
            if a.size != 8:
                raise CompileError(f"kernel {info.name}: a buffer argument of {a.size} bytes, expected 8")
        for a in values:
            if a.size not in (4, 8):
                raise CompileError(f"kernel {info.name}: an integer argument of {a.size} bytes, expected 4 or 8")
        hidden = tuple(a for a in info.args if a.kind.startswith("hidden_") and a.size in _INT_FORMATS)
        return ArgLayout(buffers, values, hidden)


class AMDProgram(Program):
    """A kernel of a code object loaded into GPU memory. Buffers are DeviceMemory; vals the kernel's integers."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        assert isinstance(device, AMDDevice)
        self.dev = device
        try:
            co = read_code_object(binary, expect_target=device.target)
        except CodeObjectError as e:
            raise CompileError(f"kernel {name}: not a loadable code object for {device.target}: {e}") from None
        if name not in co.kernels:
            raise CompileError(f"the code object has no kernel named {name!r}; it has {sorted(co.kernels)}")
        self.info = info = co.kernels[name]
        if info.uses_dynamic_stack:
            raise CompileError(f"kernel {name} uses a dynamic stack (recursion or alloca): its scratch has no bound")
        self.layout = ArgLayout.of(info)
        self.code = device.host_memory(co.load_size, MEM_EXECUTABLE | MEM_WRITABLE)
        ctypes.memmove(self.code.va, co.loaded_image(self.code.va), co.load_size)
        self.kernel_object = self.code.va + info.descriptor_vaddr

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        info, layout = self.info, self.layout
        if len(bufs) != len(layout.buffers) or len(vals) != len(layout.values):
            raise TypeError(
                f"kernel {self.name} takes {len(layout.buffers)} buffers and {len(layout.values)} ints, "
                f"got {len(bufs)} buffers and {len(vals)} ints"
            )
        global_size, local_size = tuple(global_size), tuple(local_size)
        if len(global_size) != 3 or len(local_size) != 3 or min(*global_size, *local_size) < 1:
            raise ValueError(f"kernel {self.name}: grid {global_size} and workgroup {local_size} need 3 sizes >= 1")
        threads = local_size[0] * local_size[1] * local_size[2]
        limit = info.max_flat_workgroup_size or 1024
        if threads > limit or max(local_size) > 0xFFFF:
            raise ValueError(f"kernel {self.name}: a workgroup of {local_size} exceeds its {limit} work-items")
        grid = tuple(g * lo for g, lo in zip(global_size, local_size))
        if max(grid) > 0xFFFFFFFF:
            raise ValueError(f"kernel {self.name}: a grid of {grid} work-items exceeds 2**32 - 1 in a dimension")
        block = bytearray(info.kernarg_size)
        for a, b in zip(layout.buffers, bufs):
            if not isinstance(b, DeviceMemory):
                raise TypeError(f"kernel {self.name}: buffers are AMD device memory, got {type(b).__name__}")
            struct.pack_into("<Q", block, a.offset, b.va)
        for a, v in zip(layout.values, vals):
            struct.pack_into("<i" if a.size == 4 else "<q", block, a.offset, int(v))
        for a in layout.hidden:
            value = hidden_value(a.kind, global_size, local_size, self.dev.queue.queue_mem.va)
            struct.pack_into(_INT_FORMATS[a.size], block, a.offset, value & ((1 << (8 * a.size)) - 1))
        return self.dev.dispatch(self, bytes(block), grid, local_size, wait)

    def __del__(self) -> None:
        try:
            self.dev.synchronize()
            self.dev.kfd.free(self.code)
        except Exception:  # noqa: BLE001  (half-built, or interpreter shutdown)
            pass


# ---------------------------------------------------------------- the device


class AMDDevice(Compiled):
    priority = 100
    renderers = ("AMDGPU",)

    def __init__(self, name: str, renderer: str) -> None:
        host = host_os()
        self.node = find_gpu(host, DeviceName.parse(name).index)
        self.target = self.node.target
        self._amdgpu_compiler = amdgpu_compiler(self.target)  # DeviceUnavailable where no compiler knows this GPU
        self.kfd = KFD(host, self.node)
        super().__init__(name, AMDAllocator(self), AMDProgram, renderer)
        self.queue = AQLQueue(self.kfd)
        self.signals = SignalPool(self.kfd)
        self.kernargs = self.kfd.alloc(KERNARG_ARENA, HOST_FLAGS, host=True)
        self.kernarg_next = 0
        self.last: AmdSignal | None = None
        self.timestamp_hz = self._timestamp_frequency()
        if isinstance(host, MockKFD):
            host.watch(self)  # the mock learns which kernel each code object holds

    def renderer_target(self) -> str:
        return self.target

    def compiler(self) -> Compiler:
        return self._amdgpu_compiler

    def host_memory(self, size: int, flags: int) -> Allocation:
        """Memory both the CPU and the GPU reach at one address: mappable VRAM, else GTT."""
        try:
            return self.kfd.alloc(size, MEM_VRAM | MEM_PUBLIC | flags, host=True)
        except (OSError, MemoryError):
            return self.kfd.alloc(size, MEM_GTT | flags, host=True)

    def _timestamp_frequency(self) -> float:
        """Ticks per second of the GPU's timestamp counter, measured against the system clock over a few ms."""
        first = self.kfd.clock_counters()
        time.sleep(0.005)
        second = self.kfd.clock_counters()
        seconds = (second.system_clock_counter - first.system_clock_counter) / max(first.system_clock_freq, 1)
        ticks = second.gpu_clock_counter - first.gpu_clock_counter
        return ticks / seconds if seconds > 0 and ticks > 0 else 100e6  # 100 MHz: the usual reference clock

    def _kernarg_block(self, block: bytes, align: int) -> int:
        size = round_up(max(len(block), 1), 64)
        at = round_up(self.kernarg_next, max(align, 64))
        if at + size > self.kernargs.size:  # the ring wraps: the kernels reading the old blocks must be done
            self.synchronize()
            at = 0
        self.kernarg_next = at + size
        ctypes.memmove(self.kernargs.va + at, block, len(block))
        return self.kernargs.va + at

    def dispatch(
        self, prog: AMDProgram, kernargs: bytes, grid: tuple[int, ...], local: tuple[int, ...], wait: bool
    ) -> float | None:
        info = prog.info
        if info.private_segment_size > self.queue.scratch_per_lane:  # more scratch: only while the queue is idle
            self.synchronize()
            self.queue.ensure_scratch(info.private_segment_size, info.wavefront_size)
        signal = self.signals.take(TIMEOUT_S)
        packet = DispatchPacket(
            header=dispatch_header(barrier=True, scope=FENCE_SCOPE_SYSTEM),
            setup=3,  # three dimensions, always: unused ones are 1
            workgroup_size_x=local[0],
            workgroup_size_y=local[1],
            workgroup_size_z=local[2],
            grid_size_x=grid[0],
            grid_size_y=grid[1],
            grid_size_z=grid[2],
            private_segment_size=info.private_segment_size,
            group_segment_size=info.group_segment_size,
            kernel_object=prog.kernel_object,
            kernarg_address=self._kernarg_block(kernargs, info.kernarg_align),
            completion_signal=self.signals.address(signal),
        )
        self.queue.submit(packet, TIMEOUT_S)
        self.last = signal
        if not wait:
            return None
        self.signals.wait(signal, TIMEOUT_S, f"kernel {prog.name}")
        return max(signal.end_ts - signal.start_ts, 0) / self.timestamp_hz

    def synchronize(self) -> None:
        if self.last is not None:
            self.signals.wait(self.last, TIMEOUT_S)
            self.last = None
