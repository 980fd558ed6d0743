"""A mock of the AMD kernel driver (KFD), for testing the AMD runtime on machines without an AMD GPU.

`MockKFD(target)` is a `HostOS` (tiny.runtime.amd.driver): the AMD device opens /dev/kfd and a render node, reads
the topology, allocates and maps memory, creates queues and events and waits on them through it exactly as it does
through the real operating system, and cannot tell the difference. It plays one GPU of the given gfx target.

- Every ioctl is checked like the real driver checks it, and more strictly: the structure's size against the
  request, gpu ids, flags, that addresses lie inside live allocations; a bad call is an OSError with the errno the
  driver would give and a message saying what was wrong.
- Memory is real host memory: one sparse memfd holds every allocation's pages at its own offset (which is the
  render node's mmap offset the driver returns). The mock reads and writes it through one mapping of the whole file,
  as the GPU would through its page tables, and an mmap of the render node maps the same pages at the address the
  runtime asks for; freeing gives the pages back. Doorbells are a memfd page mapped the same way.
- The GPU runs when the runtime would block: on WAIT_EVENTS the mock's packet processor takes the AQL packets
  between each queue's read pointer and the doorbell, checks each (header, dimensions, workgroup and grid sizes,
  that kernel_object is the descriptor of a kernel of a code object loaded at that address, the kernarg block and
  its buffer pointers and hidden values against the code object's metadata, the completion signal), runs the
  kernel, then writes the timestamps, decrements the signal and fires its event. A bad packet is a PacketError.
- A kernel runs as the linearized program it was compiled from, on the PYTHON device (tiny-runtime-misc's
  emulator, reached through the device registry and needed only here: `pip install tiny-runtime-amd[mock]`).
  `watch(device)` wraps the AMD device's renderer and compile so the mock learns which program each code object
  holds; `register` tells it directly. Tensor-core kernels (WMMA) run too: the emulator has the same layouts.
  The GPU side (packet processor, kernel table) is tiny.runtime.amd.mock_gpu.

The mock is chosen only by the AMD_MOCK flag (tiny.runtime.amd.kfd.host_os), never automatically.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tiny.ir.device import Compiled
from tiny.ir.uop import UOp
from tiny.runtime.amd import aql
from tiny.runtime.amd import driver as kfd
from tiny.runtime.amd.mock_gpu import TICK_NS, GpuEvent, GpuMemory, GpuQueue, MockGPU, PacketError


class MockHang(RuntimeError):
    """The runtime waits for something that can never happen (on a real GPU it would sleep forever)."""


# the GPUs the mock can play: compute units, SIMDs per CU, XCCs (dies of one GPU), LDS KiB
@dataclass(frozen=True)
class MockGpu:
    cus: int
    simd_per_cu: int
    xcc: int = 1
    lds_kb: int = 64


GPUS = {
    "gfx900": MockGpu(64, 4),
    "gfx906": MockGpu(60, 4),
    "gfx908": MockGpu(120, 4),
    "gfx90a": MockGpu(110, 4),
    "gfx942": MockGpu(304, 4, xcc=8),
    "gfx950": MockGpu(256, 4, xcc=8, lds_kb=160),
    "gfx1030": MockGpu(80, 2),
    "gfx1100": MockGpu(96, 2),
    "gfx1101": MockGpu(60, 2),
    "gfx1102": MockGpu(32, 2),
    "gfx1200": MockGpu(32, 2),
    "gfx1201": MockGpu(64, 2),
}
GPU_ID = 0x4A1D  # the mock GPU's gpu_id in the topology
RENDER_MINOR = 128
VRAM_BYTES = 16 << 30  # how much VRAM the mock GPU claims (host memory is used only where pages are touched)
MEMORY_FILE_BYTES = 1 << 40  # the sparse file behind all of the mock's VRAM and GTT allocations
GPUVM_BASE, GPUVM_LIMIT = 0x1000000, (1 << 47) - 1
CWSR_PER_CU = 0x70000  # context-save bytes per compute unit: registers, LDS and wave state
DOORBELL_BYTES = 8192
MMAP_TYPE_DOORBELL = 3 << 62


def target_version(target: str) -> int:
    """gfx1100 -> 110000, gfx942 -> 90402, gfx90a -> 90010: KFD's gfx_target_version."""
    name = target.split(":")[0]
    digits = name[3:]
    if not name.startswith("gfx") or len(digits) < 3 or not all(c in "0123456789abcdef" for c in digits):
        raise ValueError(f"AMD_MOCK must be a gfx target such as gfx1100 or gfx942, got {target!r}")
    major, minor, step = int(digits[:-2]), int(digits[-2], 16), int(digits[-1], 16)
    if major < 9:
        raise ValueError(f"AMD_MOCK={target}: tiny generates code for gfx9 and later")
    return major * 10000 + minor * 100 + step


@dataclass
class _Stats:
    dispatches: int = 0
    barriers: int = 0
    ioctls: dict[str, int] = field(default_factory=dict)


class MockKFD:
    """/dev/kfd, one render node and the topology of one GPU of `target`, as a HostOS."""

    def __init__(self, target: str) -> None:
        self.version = target_version(target)
        self.target = target.split(":")[0]
        self.spec = GPUS.get(self.target, MockGpu(32, 2 if self.version >= 100000 else 4))
        self.render_path = f"/dev/dri/renderD{RENDER_MINOR}"
        self.files = self._topology()
        self.fds: dict[int, str] = {}  # fd -> "kfd" or "render"
        self._next_fd = 1 << 20  # far above the real ones, so a mock fd given to the real OS fails loudly
        self.vm_acquired = False
        self.memory: dict[int, GpuMemory] = {}  # handle -> allocation
        self.heap_fd = os.memfd_create("tiny-amd-mock-memory", os.MFD_CLOEXEC)  # sparse: pages exist once touched
        os.ftruncate(self.heap_fd, MEMORY_FILE_BYTES)
        self.heap = mmap.mmap(self.heap_fd, MEMORY_FILE_BYTES)
        self._holes: list[tuple[int, int]] = [(0, MEMORY_FILE_BYTES)]  # free (offset, size) of the file, sorted
        self._starts: list[int] = []  # sorted allocation addresses, for finding the one holding an address
        self._by_va: dict[int, GpuMemory] = {}
        self._next_handle = 1
        self.vram_used = 0
        self.queues: dict[int, GpuQueue] = {}
        self.doorbell_fd = os.memfd_create("tiny-amd-mock-doorbells", os.MFD_CLOEXEC)
        os.ftruncate(self.doorbell_fd, DOORBELL_BYTES)
        self.doorbells = mmap.mmap(self.doorbell_fd, DOORBELL_BYTES)
        self.event_page: GpuMemory | None = None
        self.events: dict[int, GpuEvent] = {}
        self.gpu = MockGPU(self)  # the packet processor, and the kernels it can run
        self.stats = self.gpu.stats
        self._ioctls: dict[int, tuple[type[ctypes.Structure], Callable[[Any], None]]] = {
            kfd.GET_VERSION: (kfd.GetVersionArgs, self._get_version),
            kfd.ACQUIRE_VM: (kfd.AcquireVmArgs, self._acquire_vm),
            kfd.GET_PROCESS_APERTURES_NEW: (kfd.GetProcessAperturesNewArgs, self._apertures),
            kfd.ALLOC_MEMORY_OF_GPU: (kfd.AllocMemoryArgs, self._alloc),
            kfd.FREE_MEMORY_OF_GPU: (kfd.FreeMemoryArgs, self._free),
            kfd.MAP_MEMORY_TO_GPU: (kfd.MapMemoryArgs, self._map),
            kfd.UNMAP_MEMORY_FROM_GPU: (kfd.MapMemoryArgs, self._unmap),
            kfd.CREATE_QUEUE: (kfd.CreateQueueArgs, self._create_queue),
            kfd.DESTROY_QUEUE: (kfd.DestroyQueueArgs, self._destroy_queue),
            kfd.CREATE_EVENT: (kfd.CreateEventArgs, self._create_event),
            kfd.DESTROY_EVENT: (kfd.DestroyEventArgs, self._destroy_event),
            kfd.WAIT_EVENTS: (kfd.WaitEventsArgs, self._wait_events),
            kfd.GET_CLOCK_COUNTERS: (kfd.GetClockCountersArgs, self._clock_counters),
        }

    # ---------------------------------------------------------------- files: the devices and the topology

    def _topology(self) -> dict[str, str]:
        g = self.spec
        gpu_props = {
            "cpu_cores_count": 0,
            "simd_count": g.cus * g.simd_per_cu,
            "mem_banks_count": 1,
            "lds_size_in_kb": g.lds_kb,
            "gfx_target_version": self.version,
            "simd_per_cu": g.simd_per_cu,
            "max_waves_per_simd": 16 if self.version >= 100000 else 8,
            "wave_front_size": 64,
            "array_count": 4 * g.xcc,
            "simd_arrays_per_engine": 2,
            "cu_per_simd_array": max(g.cus // (4 * g.xcc), 1),
            "num_xcc": g.xcc,
            "drm_render_minor": RENDER_MINOR,
            "local_mem_size": VRAM_BYTES,
        } | self.queue_sizes
        nodes = kfd.TOPOLOGY
        return {
            f"{nodes}/0/gpu_id": "0\n",
            f"{nodes}/0/name": "\n",
            f"{nodes}/0/properties": "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\n",
            f"{nodes}/1/gpu_id": f"{GPU_ID}\n",
            f"{nodes}/1/name": f"{self.target}\n",
            f"{nodes}/1/properties": "".join(f"{k} {v}\n" for k, v in gpu_props.items()),
        }

    def _dirs(self) -> set[str]:
        out = set()
        for path in (*self.files, kfd.KFD_PATH, self.render_path):
            parts = path.split("/")
            out.update("/".join(parts[:i]) or "/" for i in range(1, len(parts)))
        return out

    def exists(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        return path in self.files or path in (kfd.KFD_PATH, self.render_path) or path in self._dirs()

    def listdir(self, path: str) -> list[str]:
        path = path.rstrip("/")
        if path not in self._dirs():
            raise FileNotFoundError(errno.ENOENT, f"mock KFD: no directory {path}")
        prefix = path + "/"
        everything = (*self.files, kfd.KFD_PATH, self.render_path)
        return sorted({p[len(prefix) :].split("/")[0] for p in everything if p.startswith(prefix)})

    def read_text(self, path: str) -> str:
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, f"mock KFD: no file {path}")
        return self.files[path]

    def open(self, path: str, flags: int) -> int:
        kind = {kfd.KFD_PATH: "kfd", self.render_path: "render"}.get(path)
        if kind is None:
            raise FileNotFoundError(
                errno.ENOENT, f"mock KFD: no device {path} (it has {kfd.KFD_PATH}, {self.render_path})"
            )
        if not flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, f"mock KFD: {path} is opened read-write (O_RDWR), got flags {flags:#x}")
        fd, self._next_fd = self._next_fd, self._next_fd + 1
        self.fds[fd] = kind
        return fd

    def close(self, fd: int) -> None:
        if self.fds.pop(fd, None) is None:
            raise OSError(errno.EBADF, f"mock KFD: close of fd {fd}, which it did not open")

    # ---------------------------------------------------------------- mmap

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        if fd == -1:  # anonymous memory (an address reservation): the real thing
            if not flags & kfd.MAP_ANONYMOUS:
                raise OSError(errno.EBADF, "mock KFD: mmap of fd -1 without MAP_ANONYMOUS")
            return kfd.host_mmap(addr, length, prot, flags, -1, 0)
        kind = self.fds.get(fd)
        if kind is None:
            raise OSError(errno.EBADF, f"mock KFD: mmap of fd {fd}, which is not /dev/kfd or its render node")
        if not flags & kfd.MAP_SHARED:
            raise OSError(errno.EINVAL, "mock KFD: device memory is mapped MAP_SHARED")
        if kind == "kfd":
            if offset != MMAP_TYPE_DOORBELL | (GPU_ID << 46) or length > DOORBELL_BYTES:
                raise OSError(
                    errno.EINVAL,
                    f"mock KFD: mmap of /dev/kfd at offset {offset:#x} ({length} bytes): the doorbell page is at "
                    f"{MMAP_TYPE_DOORBELL | (GPU_ID << 46):#x}, {DOORBELL_BYTES} bytes",
                )
            return kfd.host_mmap(addr, length, prot, flags, self.doorbell_fd, 0)
        mem = next((m for m in self.memory.values() if m.mmap_offset == offset), None)
        if mem is None:
            raise OSError(errno.EINVAL, f"mock KFD: mmap of the render node at offset {offset:#x}, no allocation's")
        if length != mem.size or addr != mem.va or not flags & kfd.MAP_FIXED:
            raise OSError(
                errno.EINVAL,
                f"mock KFD: {mem.describe()} must be mapped whole (MAP_FIXED) at its GPU address {mem.va:#x}, "
                f"got {length} bytes at {addr:#x}",
            )
        if not mem.host_visible:
            raise OSError(errno.EINVAL, f"mock KFD: {mem.describe()} is VRAM without PUBLIC: the CPU cannot map it")
        mem.cpu_mapped = True
        return kfd.host_mmap(addr, length, prot, flags, self.heap_fd, mem.mmap_offset)

    def munmap(self, addr: int, length: int) -> None:
        if (mem := self._by_va.get(addr)) is not None and length == mem.size:
            mem.cpu_mapped = False
        kfd.host_munmap(addr, length)

    # ---------------------------------------------------------------- ioctl

    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
        if self.fds.get(fd) != "kfd":
            raise OSError(errno.ENOTTY, f"mock KFD: ioctl on fd {fd}, which is not /dev/kfd")
        if request not in self._ioctls:
            raise OSError(errno.EINVAL, f"mock KFD: unknown ioctl request {request:#x}")
        struct_type, handler = self._ioctls[request]
        name = kfd.IOCTL_NAMES[request]
        size = (request >> 16) & 0x3FFF
        if type(arg) is not struct_type or ctypes.sizeof(arg) != size:
            raise OSError(
                errno.EINVAL,
                f"mock KFD: {name} takes a {struct_type.__name__} of {size} bytes, got {type(arg).__name__} of "
                f"{ctypes.sizeof(arg)} bytes",
            )
        self.stats.ioctls[name] = self.stats.ioctls.get(name, 0) + 1
        handler(arg)

    def _fail(self, code: int, call: str, what: str) -> OSError:
        return OSError(code, f"mock KFD {call}: {what}")

    def _check_gpu(self, call: str, gpu_id: int) -> None:
        if gpu_id != GPU_ID:
            raise self._fail(
                errno.EINVAL, call, f"gpu_id {gpu_id:#x} is not a GPU of the topology (it has {GPU_ID:#x})"
            )
        if call != "ACQUIRE_VM" and not self.vm_acquired:
            raise self._fail(errno.EINVAL, call, "the process has no GPU VM yet: ACQUIRE_VM with a render node first")

    def _get_version(self, a: kfd.GetVersionArgs) -> None:
        a.major_version, a.minor_version = 1, 16

    def _acquire_vm(self, a: kfd.AcquireVmArgs) -> None:
        self._check_gpu("ACQUIRE_VM", a.gpu_id)
        if self.fds.get(a.drm_fd) != "render":
            raise self._fail(errno.EINVAL, "ACQUIRE_VM", f"drm_fd {a.drm_fd} is not an open render node")
        if self.vm_acquired:
            raise self._fail(errno.EBUSY, "ACQUIRE_VM", "the VM of this GPU is already acquired")
        self.vm_acquired = True

    def _apertures(self, a: kfd.GetProcessAperturesNewArgs) -> None:
        if a.num_of_nodes == 0:  # the first call asks how many there are
            a.num_of_nodes = 1
            return
        if not a.kfd_process_device_apertures_ptr:
            raise self._fail(errno.EFAULT, "GET_PROCESS_APERTURES_NEW", "a null kfd_process_device_apertures_ptr")
        ap = kfd.ProcessDeviceApertures.from_address(a.kfd_process_device_apertures_ptr)
        ap.gpu_id, ap.gpuvm_base, ap.gpuvm_limit = GPU_ID, GPUVM_BASE, GPUVM_LIMIT
        ap.lds_base, ap.lds_limit = 1 << 61, (1 << 61) + 0xFFFFFFFF
        ap.scratch_base, ap.scratch_limit = 2 << 61, (2 << 61) + 0xFFFFFFFF
        a.num_of_nodes = 1

    # -- memory

    _KNOWN_FLAGS = (
        kfd.MEM_VRAM
        | kfd.MEM_GTT
        | kfd.MEM_WRITABLE
        | kfd.MEM_EXECUTABLE
        | kfd.MEM_PUBLIC
        | kfd.MEM_NO_SUBSTITUTE
        | kfd.MEM_AQL_QUEUE_MEM
        | kfd.MEM_COHERENT
        | kfd.MEM_UNCACHED
    )

    def _alloc(self, a: kfd.AllocMemoryArgs) -> None:
        call = "ALLOC_MEMORY_OF_GPU"
        self._check_gpu(call, a.gpu_id)
        kinds = a.flags & (kfd.MEM_VRAM | kfd.MEM_GTT | kfd.MEM_USERPTR | kfd.MEM_DOORBELL)
        if kinds not in (kfd.MEM_VRAM, kfd.MEM_GTT):
            raise self._fail(errno.EINVAL, call, f"flags {a.flags:#x}: the mock allocates VRAM or GTT, exactly one")
        if a.flags & ~self._KNOWN_FLAGS:
            raise self._fail(errno.EINVAL, call, f"unknown flag bits {a.flags & ~self._KNOWN_FLAGS:#x}")
        if a.size == 0 or a.size % kfd.PAGE or a.va_addr % kfd.PAGE:
            raise self._fail(errno.EINVAL, call, f"{a.size} bytes at {a.va_addr:#x}: both must be whole pages")
        if a.va_addr < GPUVM_BASE or a.va_addr + a.size > GPUVM_LIMIT:
            raise self._fail(errno.EINVAL, call, f"address {a.va_addr:#x} is outside the GPU VM aperture")
        if (other := self.find(a.va_addr, a.size)) is not None:
            raise self._fail(errno.EINVAL, call, f"{a.size} bytes at {a.va_addr:#x} overlap {other.describe()}")
        if a.flags & kfd.MEM_VRAM and self.vram_used + a.size > VRAM_BYTES:
            raise self._fail(errno.ENOMEM, call, f"{a.size} bytes of VRAM: {VRAM_BYTES - self.vram_used} are free")
        offset = self._heap_take(a.size)
        if offset is None:
            raise self._fail(errno.ENOMEM, call, f"{a.size} bytes: the mock's {MEMORY_FILE_BYTES >> 30} GiB are taken")
        view = memoryview(self.heap)[offset : offset + a.size]
        mem = GpuMemory(self._next_handle, a.va_addr, a.size, a.flags, offset, view)
        self._next_handle += 1
        self.vram_used += a.size if a.flags & kfd.MEM_VRAM else 0
        self.memory[mem.handle] = mem
        self._by_va[mem.va] = mem
        bisect.insort(self._starts, mem.va)
        a.handle, a.mmap_offset = mem.handle, mem.mmap_offset

    def _heap_take(self, size: int) -> int | None:
        """The offset of `size` free bytes of the memory file (first fit), or None."""
        for i, (offset, hole) in enumerate(self._holes):
            if hole >= size:
                self._holes[i : i + 1] = [(offset + size, hole - size)] if hole > size else []
                return offset
        return None

    def _heap_give(self, offset: int, size: int) -> None:
        """Free `size` bytes at `offset`: their pages go back to the system, the hole joins its neighbours."""
        self.heap.madvise(mmap.MADV_REMOVE, offset, size)
        i = bisect.bisect(self._holes, (offset, size))
        self._holes.insert(i, (offset, size))
        merged: list[tuple[int, int]] = []
        for o, n in self._holes[max(i - 1, 0) : i + 2]:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self._holes[max(i - 1, 0) : i + 2] = merged

    def _memory(self, call: str, handle: int) -> GpuMemory:
        if (mem := self.memory.get(handle)) is None:
            raise self._fail(errno.EINVAL, call, f"handle {handle} is no live allocation")
        return mem

    def _free(self, a: kfd.FreeMemoryArgs) -> None:
        mem = self._memory("FREE_MEMORY_OF_GPU", a.handle)
        if mem.gpu_mapped:
            raise self._fail(
                errno.EBUSY, "FREE_MEMORY_OF_GPU", f"{mem.describe()} is still mapped to the GPU: unmap it"
            )
        self._check_unused("FREE_MEMORY_OF_GPU", mem)
        del self.memory[mem.handle], self._by_va[mem.va]
        self._starts.remove(mem.va)
        self.vram_used -= mem.size if mem.flags & kfd.MEM_VRAM else 0
        self._heap_give(mem.mmap_offset, mem.size)  # a CPU mapping still there now reads zeros

    def _check_unused(self, call: str, mem: GpuMemory) -> None:
        for q in self.queues.values():
            if mem.handle in q.uses:
                raise self._fail(errno.EBUSY, call, f"{mem.describe()} holds parts of queue {q.queue_id}: destroy it")
        if mem is self.event_page and self.events:
            raise self._fail(errno.EBUSY, call, f"{mem.describe()} is the event page of {len(self.events)} event(s)")

    def _devices(self, call: str, a: kfd.MapMemoryArgs) -> None:
        if a.n_devices == 0 or not a.device_ids_array_ptr:
            raise self._fail(errno.EINVAL, call, "an empty device list (n_devices 0 or a null device_ids_array_ptr)")
        for gpu_id in (ctypes.c_uint32 * a.n_devices).from_address(a.device_ids_array_ptr):
            if gpu_id != GPU_ID:
                raise self._fail(errno.EINVAL, call, f"gpu_id {gpu_id:#x} in the device list is not this GPU's")

    def _map(self, a: kfd.MapMemoryArgs) -> None:
        mem = self._memory("MAP_MEMORY_TO_GPU", a.handle)
        self._devices("MAP_MEMORY_TO_GPU", a)
        mem.gpu_mapped = True
        a.n_success = a.n_devices

    def _unmap(self, a: kfd.MapMemoryArgs) -> None:
        mem = self._memory("UNMAP_MEMORY_FROM_GPU", a.handle)
        self._devices("UNMAP_MEMORY_FROM_GPU", a)
        if not mem.gpu_mapped:
            raise self._fail(errno.EINVAL, "UNMAP_MEMORY_FROM_GPU", f"{mem.describe()} is not mapped to the GPU")
        self._check_unused("UNMAP_MEMORY_FROM_GPU", mem)
        mem.gpu_mapped = False
        a.n_success = a.n_devices

    def find(self, addr: int, size: int = 1) -> GpuMemory | None:
        """The allocation that overlaps [addr, addr + size)."""
        i = bisect.bisect_right(self._starts, addr + size - 1) - 1
        if i >= 0:
            mem = self._by_va[self._starts[i]]
            if mem.va + mem.size > addr:
                return mem
        return None

    def gpu_view(self, addr: int, size: int, what: str) -> memoryview:
        """`size` bytes of GPU memory at `addr` as the GPU sees them; PacketError where the GPU would fault."""
        mem = self.find(addr)
        if mem is None or addr + size > mem.va + mem.size:
            raise PacketError(f"{what}: {size} bytes at {addr:#x} are outside every live GPU allocation")
        if not mem.gpu_mapped:
            raise PacketError(f"{what}: {mem.describe()} is not mapped to the GPU (MAP_MEMORY_TO_GPU)")
        return memoryview(mem.view)[addr - mem.va : addr - mem.va + size]

    # -- queues

    def _region(self, call: str, addr: int, size: int, what: str, host: bool = False) -> GpuMemory:
        mem = self.find(addr)
        if size <= 0 or mem is None or addr + size > mem.va + mem.size:
            raise self._fail(errno.EINVAL, call, f"{what}: {size} bytes at {addr:#x} are not inside one allocation")
        if not mem.gpu_mapped:
            raise self._fail(errno.EINVAL, call, f"{what}: {mem.describe()} is not mapped to the GPU")
        if host and not mem.host_visible:
            raise self._fail(errno.EINVAL, call, f"{what}: {mem.describe()} is not memory the CPU can reach")
        return mem

    def _buffer(self, call: str, addr: int, size: int, what: str, host: bool = False) -> GpuMemory:
        """The allocation that is exactly the queue buffer at addr: it starts on addr's page and holds size bytes."""
        mem = self._region(call, addr, 1, what, host)
        if mem.va != addr & ~(kfd.PAGE - 1) or mem.size != kfd.round_up(size, kfd.PAGE):
            raise self._fail(
                errno.EINVAL,
                call,
                f"{what} at {addr:#x} must be an allocation of its own of {size} bytes, but it is in {mem.describe()}",
            )
        return mem

    @property
    def queue_sizes(self) -> dict[str, int]:
        """What the topology publishes for queue buffers (a made-up but self-consistent set for the mock GPU)."""
        waves = self.spec.cus * 32
        ctl_stack = kfd.round_up(40 + waves * 12 + 8, kfd.PAGE)
        cwsr = ctl_stack + kfd.round_up(self.spec.cus * CWSR_PER_CU, kfd.PAGE)
        return {
            "eop_buffer_size": 4096,
            "ctl_stack_size": ctl_stack,
            "cwsr_size": cwsr,
            "debug_memory_size": waves * 32,
        }

    def _create_queue(self, a: kfd.CreateQueueArgs) -> None:
        call = "CREATE_QUEUE"
        self._check_gpu(call, a.gpu_id)
        if a.queue_type != kfd.QUEUE_TYPE_COMPUTE_AQL:
            raise self._fail(errno.EINVAL, call, f"queue_type {a.queue_type}: the mock runs AQL compute queues (2)")
        if a.queue_percentage > kfd.MAX_QUEUE_PERCENTAGE or a.queue_priority > kfd.MAX_QUEUE_PRIORITY:
            raise self._fail(errno.EINVAL, call, f"percentage {a.queue_percentage}, priority {a.queue_priority}")
        if a.ring_size < 16 * aql.PACKET_SIZE or a.ring_size & (a.ring_size - 1) or a.ring_base_address % 256:
            raise self._fail(
                errno.EINVAL,
                call,
                f"ring of {a.ring_size} bytes at {a.ring_base_address:#x}: a power of two of "
                "at least 16 packets, 256-byte aligned",
            )
        # as KFD does from Linux 6.11 on: sizes as the topology publishes them, each buffer exactly one allocation
        sizes = self.queue_sizes
        for what, got in (("eop_buffer_size", a.eop_buffer_size), ("ctl_stack_size", a.ctl_stack_size)):
            if got != sizes[what]:
                raise self._fail(errno.EINVAL, call, f"{what} {got}: the topology says {sizes[what]}")
        if a.ctx_save_restore_size != sizes["cwsr_size"]:
            raise self._fail(
                errno.EINVAL,
                call,
                f"ctx_save_restore_size {a.ctx_save_restore_size}: the topology's cwsr_size is {sizes['cwsr_size']}",
            )
        area = kfd.round_up((sizes["cwsr_size"] + sizes["debug_memory_size"]) * self.spec.xcc, kfd.PAGE)
        uses = [
            self._buffer(call, a.ring_base_address, a.ring_size, "the ring", host=True),
            self._buffer(call, a.write_pointer_address, kfd.PAGE, "the write pointer's page", host=True),
            self._buffer(call, a.read_pointer_address, kfd.PAGE, "the read pointer's page", host=True),
            self._buffer(call, a.eop_buffer_address, a.eop_buffer_size, "the EOP buffer"),
            self._buffer(call, a.ctx_save_restore_address, area, f"the context-save area ({self.spec.xcc} XCC)"),
        ]
        for what, addr in (("write pointer", a.write_pointer_address), ("read pointer", a.read_pointer_address)):
            if addr % 8:
                raise self._fail(errno.EINVAL, call, f"the {what} at {addr:#x} is not 8-byte aligned")
        queue_id = next(i for i in range(1, 1024) if i not in self.queues)
        q = GpuQueue(
            queue_id,
            a.ring_base_address,
            a.ring_size,
            a.write_pointer_address,
            a.read_pointer_address,
            queue_id,
            tuple(m.handle for m in uses),
        )
        self.queues[queue_id] = q
        struct.pack_into("<Q", self.doorbells, q.doorbell_slot * 8, 0)
        a.queue_id = queue_id
        a.doorbell_offset = MMAP_TYPE_DOORBELL | (GPU_ID << 46) | q.doorbell_slot * 8

    def _destroy_queue(self, a: kfd.DestroyQueueArgs) -> None:
        if self.queues.pop(a.queue_id, None) is None:
            raise self._fail(errno.EINVAL, "DESTROY_QUEUE", f"queue {a.queue_id} does not exist")

    # -- events

    def _create_event(self, a: kfd.CreateEventArgs) -> None:
        call = "CREATE_EVENT"
        if a.event_type != kfd.EVENT_SIGNAL:
            raise self._fail(errno.EINVAL, call, f"event_type {a.event_type}: the mock has signal events (0)")
        if self.event_page is None:
            page = self.memory.get(a.event_page_offset)
            if page is None or not page.flags & kfd.MEM_GTT or page.size < kfd.SIGNAL_EVENT_LIMIT * 8:
                raise self._fail(
                    errno.EINVAL,
                    call,
                    f"the first signal event needs the event page: the handle of a GTT "
                    f"allocation of {kfd.SIGNAL_EVENT_LIMIT * 8} bytes or more, got {a.event_page_offset}",
                )
            self.event_page = page
        elif a.event_page_offset not in (0, self.event_page.handle):
            raise self._fail(errno.EINVAL, call, "the event page is set already, to another allocation")
        slot = next((i for i in range(1, kfd.SIGNAL_EVENT_LIMIT) if i not in self.events), None)
        if slot is None:
            raise self._fail(errno.ENOMEM, call, f"all {kfd.SIGNAL_EVENT_LIMIT} signal event slots are taken")
        self.events[slot] = GpuEvent(slot, slot, bool(a.auto_reset))
        a.event_id = a.event_trigger_data = a.event_slot_index = slot

    def _destroy_event(self, a: kfd.DestroyEventArgs) -> None:
        if self.events.pop(a.event_id, None) is None:
            raise self._fail(errno.EINVAL, "DESTROY_EVENT", f"event {a.event_id} does not exist")

    def _wait_events(self, a: kfd.WaitEventsArgs) -> None:
        call = "WAIT_EVENTS"
        if a.num_events == 0 or not a.events_ptr:
            raise self._fail(errno.EINVAL, call, "no events to wait for")
        ids = [d.event_id for d in (kfd.EventData * a.num_events).from_address(a.events_ptr)]
        if unknown := [i for i in ids if i not in self.events]:
            raise self._fail(errno.EINVAL, call, f"event(s) {unknown} do not exist")
        self.gpu.run_queues()  # the GPU runs while the CPU sleeps
        fired = [self.events[i].signaled for i in ids]
        if all(fired) if a.wait_for_all else any(fired):
            for i in ids:
                if self.events[i].auto_reset:
                    self.events[i].signaled = False
            a.wait_result = kfd.WAIT_COMPLETE
        elif a.timeout == 0:
            a.wait_result = kfd.WAIT_TIMEOUT
        else:
            raise MockHang(
                f"WAIT_EVENTS for event(s) {ids} would sleep forever: every packet the doorbells announced has run "
                "and none of them signaled these events"
            )

    @property
    def lds_bytes(self) -> int:
        return self.spec.lds_kb * 1024

    @property
    def gfx_major(self) -> int:
        return self.version // 10000

    def watch(self, device: Compiled) -> None:
        """Learn the program behind each code object `device` compiles (MockGPU.watch)."""
        self.gpu.watch(device)

    def register(self, binary: bytes, name: str, uops: tuple[UOp, ...] | list[UOp]) -> None:
        """Tell the mock that kernel `name` of code object `binary` was compiled from the linearized `uops`."""
        self.gpu.register(binary, name, uops)

    def _clock_counters(self, a: kfd.GetClockCountersArgs) -> None:
        self._check_gpu("GET_CLOCK_COUNTERS", a.gpu_id)
        a.gpu_clock_counter = time.perf_counter_ns() // TICK_NS
        a.cpu_clock_counter = a.system_clock_counter = time.monotonic_ns()
        a.system_clock_freq = 1_000_000_000
