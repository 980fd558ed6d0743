"""The AMD kernel driver (KFD) as tiny uses it: its ioctls as ctypes structures, the topology in sysfs, and GPU memory.

Every touch of the operating system (open, close, ioctl, mmap, munmap, reading sysfs) goes through one `HostOS`
object. `LinuxOS` is the real one; tiny.runtime.amd.mock provides another that plays /dev/kfd, a render node and the
topology of one GPU, and the code here cannot tell the two apart.

Memory is mapped at the same address for the CPU and the GPU: the address range is reserved with an anonymous
mmap, ALLOC_MEMORY_OF_GPU places the allocation at that address in the GPU's VM, and a host-visible allocation is
then mmapped over the reservation from the render node at the offset the driver returns.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from tiny.ir.device import DeviceUnavailable

KFD_PATH = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
PAGE = 4096

# ---------------------------------------------------------------- include/uapi/linux/kfd_ioctl.h, as much as tiny uses

_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64


class GetVersionArgs(ctypes.Structure):
    _fields_ = [("major_version", _u32), ("minor_version", _u32)]


class CreateQueueArgs(ctypes.Structure):
    _fields_ = [
        ("ring_base_address", _u64),
        ("write_pointer_address", _u64),
        ("read_pointer_address", _u64),
        ("doorbell_offset", _u64),
        ("ring_size", _u32),
        ("gpu_id", _u32),
        ("queue_type", _u32),
        ("queue_percentage", _u32),
        ("queue_priority", _u32),
        ("queue_id", _u32),
        ("eop_buffer_address", _u64),
        ("eop_buffer_size", _u64),
        ("ctx_save_restore_address", _u64),
        ("ctx_save_restore_size", _u32),
        ("ctl_stack_size", _u32),
    ]


class DestroyQueueArgs(ctypes.Structure):
    _fields_ = [("queue_id", _u32), ("pad", _u32)]


class GetClockCountersArgs(ctypes.Structure):
    _fields_ = [
        ("gpu_clock_counter", _u64),
        ("cpu_clock_counter", _u64),
        ("system_clock_counter", _u64),
        ("system_clock_freq", _u64),
        ("gpu_id", _u32),
        ("pad", _u32),
    ]


class ProcessDeviceApertures(ctypes.Structure):
    _fields_ = [
        ("lds_base", _u64),
        ("lds_limit", _u64),
        ("scratch_base", _u64),
        ("scratch_limit", _u64),
        ("gpuvm_base", _u64),
        ("gpuvm_limit", _u64),
        ("gpu_id", _u32),
        ("pad", _u32),
    ]


class GetProcessAperturesNewArgs(ctypes.Structure):
    _fields_ = [("kfd_process_device_apertures_ptr", _u64), ("num_of_nodes", _u32), ("pad", _u32)]


class CreateEventArgs(ctypes.Structure):
    _fields_ = [
        ("event_page_offset", _u64),
        ("event_trigger_data", _u32),
        ("event_type", _u32),
        ("auto_reset", _u32),
        ("node_id", _u32),
        ("event_id", _u32),
        ("event_slot_index", _u32),
    ]


class DestroyEventArgs(ctypes.Structure):
    _fields_ = [("event_id", _u32), ("pad", _u32)]


class EventData(ctypes.Structure):
    _fields_ = [
        ("exception_data", ctypes.c_uint8 * 32),  # the union of memory and hardware exception data, from KFD
        ("kfd_event_data_ext", _u64),
        ("event_id", _u32),
        ("pad", _u32),
    ]


class WaitEventsArgs(ctypes.Structure):
    _fields_ = [
        ("events_ptr", _u64),
        ("num_events", _u32),
        ("wait_for_all", _u32),
        ("timeout", _u32),  # milliseconds
        ("wait_result", _u32),
    ]


class AcquireVmArgs(ctypes.Structure):
    _fields_ = [("drm_fd", _u32), ("gpu_id", _u32)]


class AllocMemoryArgs(ctypes.Structure):
    _fields_ = [
        ("va_addr", _u64),
        ("size", _u64),
        ("handle", _u64),
        ("mmap_offset", _u64),
        ("gpu_id", _u32),
        ("flags", _u32),
    ]


class FreeMemoryArgs(ctypes.Structure):
    _fields_ = [("handle", _u64)]


class MapMemoryArgs(ctypes.Structure):  # also UNMAP_MEMORY_FROM_GPU's
    _fields_ = [("handle", _u64), ("device_ids_array_ptr", _u64), ("n_devices", _u32), ("n_success", _u32)]


def _ioc(direction: int, nr: int, struct: type[ctypes.Structure]) -> int:
    return (direction << 30) | (ctypes.sizeof(struct) << 16) | (ord("K") << 8) | nr


_W, _R, _RW = 1, 2, 3
GET_VERSION = _ioc(_R, 0x01, GetVersionArgs)
CREATE_QUEUE = _ioc(_RW, 0x02, CreateQueueArgs)
DESTROY_QUEUE = _ioc(_RW, 0x03, DestroyQueueArgs)
GET_CLOCK_COUNTERS = _ioc(_RW, 0x05, GetClockCountersArgs)
CREATE_EVENT = _ioc(_RW, 0x08, CreateEventArgs)
DESTROY_EVENT = _ioc(_W, 0x09, DestroyEventArgs)
WAIT_EVENTS = _ioc(_RW, 0x0C, WaitEventsArgs)
GET_PROCESS_APERTURES_NEW = _ioc(_RW, 0x14, GetProcessAperturesNewArgs)
ACQUIRE_VM = _ioc(_W, 0x15, AcquireVmArgs)
ALLOC_MEMORY_OF_GPU = _ioc(_RW, 0x16, AllocMemoryArgs)
FREE_MEMORY_OF_GPU = _ioc(_W, 0x17, FreeMemoryArgs)
MAP_MEMORY_TO_GPU = _ioc(_RW, 0x18, MapMemoryArgs)
UNMAP_MEMORY_FROM_GPU = _ioc(_RW, 0x19, MapMemoryArgs)

IOCTL_NAMES = {
    GET_VERSION: "GET_VERSION",
    CREATE_QUEUE: "CREATE_QUEUE",
    DESTROY_QUEUE: "DESTROY_QUEUE",
    GET_CLOCK_COUNTERS: "GET_CLOCK_COUNTERS",
    CREATE_EVENT: "CREATE_EVENT",
    DESTROY_EVENT: "DESTROY_EVENT",
    WAIT_EVENTS: "WAIT_EVENTS",
    GET_PROCESS_APERTURES_NEW: "GET_PROCESS_APERTURES_NEW",
    ACQUIRE_VM: "ACQUIRE_VM",
    ALLOC_MEMORY_OF_GPU: "ALLOC_MEMORY_OF_GPU",
    FREE_MEMORY_OF_GPU: "FREE_MEMORY_OF_GPU",
    MAP_MEMORY_TO_GPU: "MAP_MEMORY_TO_GPU",
    UNMAP_MEMORY_FROM_GPU: "UNMAP_MEMORY_FROM_GPU",
}

QUEUE_TYPE_COMPUTE_AQL = 2
MAX_QUEUE_PERCENTAGE, MAX_QUEUE_PRIORITY = 100, 15
EVENT_SIGNAL = 0
WAIT_COMPLETE, WAIT_TIMEOUT, WAIT_FAIL = 0, 1, 2
SIGNAL_EVENT_LIMIT = 4096  # slots of the event page, 8 bytes each

MEM_VRAM, MEM_GTT, MEM_USERPTR, MEM_DOORBELL = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MEM_WRITABLE, MEM_EXECUTABLE, MEM_PUBLIC, MEM_NO_SUBSTITUTE = 1 << 31, 1 << 30, 1 << 29, 1 << 28
MEM_AQL_QUEUE_MEM, MEM_COHERENT, MEM_UNCACHED = 1 << 27, 1 << 26, 1 << 25

# the KFD interface versions tiny speaks: 1.x from x = 2 on (GET_PROCESS_APERTURES_NEW, ACQUIRE_VM, ALLOC_MEMORY_OF_GPU)
KFD_MAJOR, KFD_MIN_MINOR = 1, 2

# ---------------------------------------------------------------- the operating system, as one replaceable object

O_RDWR, O_CLOEXEC = os.O_RDWR, getattr(os, "O_CLOEXEC", 0)
PROT_NONE, PROT_READ, PROT_WRITE = mmap.PROT_NONE if hasattr(mmap, "PROT_NONE") else 0, mmap.PROT_READ, mmap.PROT_WRITE
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE = 0x4000


class HostOS(Protocol):
    """What the AMD runtime asks of the operating system. Errors are OSError with the errno, as the calls give."""

    def open(self, path: str, flags: int) -> int: ...
    def close(self, fd: int) -> None: ...
    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None: ...
    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int: ...
    def munmap(self, addr: int, length: int) -> None: ...
    def read_text(self, path: str) -> str: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long],
    )
    libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    libc.ioctl.restype, libc.ioctl.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    return libc


LIBC = _libc()
MAP_FAILED = ctypes.c_void_p(-1).value


def os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def host_mmap(addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    """libc mmap; the mapped address, or OSError."""
    ptr = LIBC.mmap(addr or None, length, prot, flags, fd, offset)
    if ptr is None or ptr == MAP_FAILED:
        raise os_error(f"mmap of {length} bytes at {addr:#x} (fd {fd}, offset {offset:#x})")
    return ptr


def host_munmap(addr: int, length: int) -> None:
    if LIBC.munmap(addr, length) != 0:
        raise os_error(f"munmap of {length} bytes at {addr:#x}")


class LinuxOS:
    """The real operating system."""

    def open(self, path: str, flags: int) -> int:
        return os.open(path, flags)

    def close(self, fd: int) -> None:
        os.close(fd)

    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
        if LIBC.ioctl(fd, request, ctypes.addressof(arg)) < 0:
            raise os_error(f"ioctl {IOCTL_NAMES.get(request, hex(request))}")

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        return host_mmap(addr, length, prot, flags, fd, offset)

    def munmap(self, addr: int, length: int) -> None:
        host_munmap(addr, length)

    def read_text(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)


# ---------------------------------------------------------------- the topology


def gfx_name(version: int) -> str:
    """KFD's gfx_target_version (e.g. 110000, 90402) as a target name (gfx1100, gfx942)."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


@dataclass(frozen=True)
class GpuNode:
    """One GPU of the topology: its KFD node number, gpu_id and properties."""

    node: int
    gpu_id: int
    props: dict[str, int] = field(hash=False)

    @property
    def target(self) -> str:
        return gfx_name(self.props["gfx_target_version"])

    @property
    def render_node(self) -> str:
        return f"/dev/dri/renderD{self.props['drm_render_minor']}"

    @property
    def cu_count(self) -> int:
        return self.props["simd_count"] // max(self.props.get("simd_per_cu", 1), 1)

    @property
    def xcc_count(self) -> int:
        return max(self.props.get("num_xcc", 1), 1)


def parse_properties(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        if m := re.fullmatch(r"\s*(\w+)\s+(-?\d+)\s*", line):
            out[m.group(1)] = int(m.group(2))
    return out


def gpu_nodes(host: HostOS, topology: str = TOPOLOGY) -> list[GpuNode]:
    """The GPUs of the topology in node order (CPU nodes, with gpu_id 0, left out)."""
    if not host.exists(topology):
        return []
    found = []
    for name in sorted((n for n in host.listdir(topology) if n.isdigit()), key=int):
        base = f"{topology}/{name}"
        try:
            gpu_id = int(host.read_text(f"{base}/gpu_id").strip() or 0)
            props = parse_properties(host.read_text(f"{base}/properties"))
        except (OSError, ValueError):
            continue
        if gpu_id != 0 and props.get("gfx_target_version", 0) != 0:
            found.append(GpuNode(int(name), gpu_id, props))
    return found


# ---------------------------------------------------------------- the driver


@dataclass(eq=False)
class Allocation:
    """GPU memory mapped at `va` for the GPU (and, when host is True, for the CPU at the same address)."""

    va: int
    size: int
    handle: int
    flags: int
    host: bool

    def view(self, offset: int = 0, size: int | None = None) -> memoryview:
        """The bytes of a host-visible allocation."""
        if not self.host:
            raise ValueError(f"GPU memory at {self.va:#x} is not mapped for the CPU")
        size = self.size - offset if size is None else size
        if offset < 0 or offset + size > self.size:
            raise ValueError(f"bytes {offset}..{offset + size} are outside an allocation of {self.size} bytes")
        return memoryview((ctypes.c_char * size).from_address(self.va + offset)).cast("B")


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class KFD:
    """An open KFD process on one GPU: its VM (from the render node), memory, queues and events."""

    def __init__(self, host: HostOS, node: GpuNode) -> None:
        self.host, self.node, self.gpu_id = host, node, node.gpu_id
        self.kfd_fd = host.open(KFD_PATH, O_RDWR | O_CLOEXEC)
        version = self.ioctl(GET_VERSION, GetVersionArgs())
        self.version = (version.major_version, version.minor_version)
        if version.major_version != KFD_MAJOR or version.minor_version < KFD_MIN_MINOR:
            raise DeviceUnavailable(
                f"the AMD kernel driver speaks KFD {self.version[0]}.{self.version[1]}; tiny needs "
                f"{KFD_MAJOR}.{KFD_MIN_MINOR} or newer (a newer kernel or amdgpu-dkms)"
            )
        self.drm_fd = host.open(node.render_node, O_RDWR | O_CLOEXEC)
        self.ioctl(ACQUIRE_VM, AcquireVmArgs(drm_fd=self.drm_fd, gpu_id=self.gpu_id))
        self.aperture = self._aperture()
        self._ids = (_u32 * 1)(self.gpu_id)  # the device-id array of map/unmap calls
        self.allocations: dict[int, Allocation] = {}
        self.event_page: Allocation | None = None

    def ioctl(self, request: int, arg: Any) -> Any:
        self.host.ioctl(self.kfd_fd, request, arg)
        return arg

    def _aperture(self) -> ProcessDeviceApertures:
        count = self.ioctl(GET_PROCESS_APERTURES_NEW, GetProcessAperturesNewArgs(num_of_nodes=0)).num_of_nodes
        table = (ProcessDeviceApertures * max(count, 1))()
        args = GetProcessAperturesNewArgs(kfd_process_device_apertures_ptr=ctypes.addressof(table), num_of_nodes=count)
        self.ioctl(GET_PROCESS_APERTURES_NEW, args)
        for ap in table[: args.num_of_nodes]:
            if ap.gpu_id == self.gpu_id:
                return ap
        raise DeviceUnavailable(f"the AMD kernel driver lists no address apertures for GPU {self.gpu_id}")

    # -- memory

    def alloc(self, size: int, flags: int, host: bool) -> Allocation:
        """`size` bytes (whole pages) of VRAM or GTT (flags), mapped for the GPU, and for the CPU when `host`."""
        if size <= 0:
            raise ValueError(f"an allocation needs a positive size, got {size}")
        size = round_up(size, PAGE)
        va = self._reserve(size)
        ap = self.aperture
        if va < ap.gpuvm_base or va + size - 1 > ap.gpuvm_limit:
            self.host.munmap(va, size)
            raise MemoryError(
                f"the address range the CPU gave ({va:#x}, {size} bytes) is outside the GPU's VM aperture "
                f"{ap.gpuvm_base:#x}..{ap.gpuvm_limit:#x}"
            )
        args = AllocMemoryArgs(va_addr=va, size=size, gpu_id=self.gpu_id, flags=flags)
        try:
            self.ioctl(ALLOC_MEMORY_OF_GPU, args)
        except OSError as e:
            self.host.munmap(va, size)
            if e.errno == errno.ENOMEM:
                raise MemoryError(f"the GPU has no {size} bytes left ({_mem_kind(flags)}): {e}") from None
            raise
        mem = Allocation(va, size, args.handle, flags, host)
        try:
            if host:
                self.host.mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.drm_fd, args.mmap_offset)
            self.ioctl(
                MAP_MEMORY_TO_GPU, MapMemoryArgs(handle=mem.handle, device_ids_array_ptr=self._ids_ptr(), n_devices=1)
            )
        except BaseException:
            self._release(mem, mapped=False)
            raise
        self.allocations[va] = mem
        return mem

    def _reserve(self, size: int) -> int:
        """An address range of `size` bytes nobody else maps; big ones on 2 MiB boundaries (the GPU's big pages)."""
        align = 1 << 21 if size >= 1 << 21 else PAGE
        extra = align - PAGE
        reserved = self.host.mmap(0, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        va = round_up(reserved, align)
        if va > reserved:
            self.host.munmap(reserved, va - reserved)
        if reserved + extra > va:
            self.host.munmap(va + size, reserved + extra - va)
        return va

    def _ids_ptr(self) -> int:
        return ctypes.addressof(self._ids)

    def free(self, mem: Allocation) -> None:
        if self.allocations.get(mem.va) is not mem:
            raise ValueError(f"GPU memory at {mem.va:#x} is not a live allocation of this device")
        self._release(mem, mapped=True)
        del self.allocations[mem.va]

    def _release(self, mem: Allocation, mapped: bool) -> None:
        if mapped:
            self.ioctl(
                UNMAP_MEMORY_FROM_GPU,
                MapMemoryArgs(handle=mem.handle, device_ids_array_ptr=self._ids_ptr(), n_devices=1),
            )
        self.ioctl(FREE_MEMORY_OF_GPU, FreeMemoryArgs(handle=mem.handle))
        self.host.munmap(mem.va, mem.size)

    # -- events

    def create_event(self) -> tuple[int, int]:
        """A signal event (auto reset): its id and the address of its mailbox slot in the event page."""
        if self.event_page is None:
            self.event_page = self.alloc(
                SIGNAL_EVENT_LIMIT * 8, MEM_GTT | MEM_WRITABLE | MEM_COHERENT | MEM_UNCACHED, True
            )
            page_handle = self.event_page.handle
        else:
            page_handle = 0
        args = self.ioctl(
            CREATE_EVENT, CreateEventArgs(event_page_offset=page_handle, event_type=EVENT_SIGNAL, auto_reset=1)
        )
        return args.event_id, self.event_page.va + args.event_slot_index * 8

    def wait_event(self, event_id: int, timeout_ms: int) -> bool:
        """Block until the event fires (True) or `timeout_ms` pass (False)."""
        data = EventData(event_id=event_id)
        args = WaitEventsArgs(events_ptr=ctypes.addressof(data), num_events=1, wait_for_all=1, timeout=timeout_ms)
        self.ioctl(WAIT_EVENTS, args)
        if args.wait_result == WAIT_FAIL:
            raise RuntimeError(f"KFD WAIT_EVENTS failed for event {event_id} (a GPU fault or reset?)")
        return args.wait_result == WAIT_COMPLETE

    def destroy_event(self, event_id: int) -> None:
        self.ioctl(DESTROY_EVENT, DestroyEventArgs(event_id=event_id))

    # -- clocks

    def clock_counters(self) -> GetClockCountersArgs:
        return self.ioctl(GET_CLOCK_COUNTERS, GetClockCountersArgs(gpu_id=self.gpu_id))

    def close(self) -> None:
        for mem in list(self.allocations.values()):
            try:
                self.free(mem)
            except OSError:
                pass
        for fd in (self.drm_fd, self.kfd_fd):
            try:
                self.host.close(fd)
            except OSError:
                pass


def _mem_kind(flags: int) -> str:
    return "VRAM" if flags & MEM_VRAM else "GTT" if flags & MEM_GTT else f"flags {flags:#x}"
