"""HSA's Architected Queuing Language on KFD: a compute queue, kernel dispatch packets and AMD signals.

A queue is a ring of 64-byte packets in host-visible memory plus an amd_queue_t that holds its read and write
dispatch ids. The CPU writes a packet's body, then its header (which makes it valid), then the write id, then rings
the doorbell with the id of the last packet. The packet processor runs packets in order; with the barrier bit set
each one starts after the one before it has finished. When a dispatch finishes it decrements its completion signal
(an amd_signal_t), writes the kernel's start and end timestamps there (the queue has profiling on), and, since the
signal names an event mailbox, writes the event id into it and interrupts: KFD then wakes WAIT_EVENTS. Waiting for
a signal therefore sleeps in the kernel driver instead of spinning.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

from tiny.runtime.amd.driver import (
    CREATE_QUEUE,
    DESTROY_QUEUE,
    KFD,
    MAP_SHARED,
    MAX_QUEUE_PERCENTAGE,
    MAX_QUEUE_PRIORITY,
    MEM_COHERENT,
    MEM_GTT,
    MEM_NO_SUBSTITUTE,
    MEM_UNCACHED,
    MEM_VRAM,
    MEM_WRITABLE,
    PAGE,
    PROT_READ,
    PROT_WRITE,
    QUEUE_TYPE_COMPUTE_AQL,
    Allocation,
    CreateQueueArgs,
    DestroyQueueArgs,
    round_up,
)

_u16, _u32, _u64, _i64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64

# ---------------------------------------------------------------- packets (hsa.h) and AMD's structures (amd_hsa_*.h)

PACKET_SIZE = 64
PACKET_TYPE_VENDOR, PACKET_TYPE_INVALID, PACKET_TYPE_KERNEL_DISPATCH, PACKET_TYPE_BARRIER_AND = 0, 1, 2, 3
HEADER_TYPE, HEADER_BARRIER, HEADER_ACQUIRE_SCOPE, HEADER_RELEASE_SCOPE = 0, 8, 9, 11  # bit positions
FENCE_SCOPE_NONE, FENCE_SCOPE_AGENT, FENCE_SCOPE_SYSTEM = 0, 1, 2
SETUP_DIMENSIONS = 0  # bit position of the dimension count in a dispatch's setup field


def dispatch_header(barrier: bool = True, scope: int = FENCE_SCOPE_SYSTEM) -> int:
    """A kernel dispatch's header: after the packet before it (barrier), memory visible to the system on both ends."""
    return (
        PACKET_TYPE_KERNEL_DISPATCH << HEADER_TYPE
        | int(barrier) << HEADER_BARRIER
        | scope << HEADER_ACQUIRE_SCOPE
        | scope << HEADER_RELEASE_SCOPE
    )


class DispatchPacket(ctypes.Structure):
    _fields_ = [
        ("header", _u16),
        ("setup", _u16),
        ("workgroup_size_x", _u16),
        ("workgroup_size_y", _u16),
        ("workgroup_size_z", _u16),
        ("reserved0", _u16),
        ("grid_size_x", _u32),  # work-items, not workgroups
        ("grid_size_y", _u32),
        ("grid_size_z", _u32),
        ("private_segment_size", _u32),
        ("group_segment_size", _u32),
        ("kernel_object", _u64),
        ("kernarg_address", _u64),
        ("reserved2", _u64),
        ("completion_signal", _u64),
    ]


class BarrierAndPacket(ctypes.Structure):
    _fields_ = [
        ("header", _u16),
        ("reserved0", _u16),
        ("reserved1", _u32),
        ("dep_signal", _u64 * 5),
        ("reserved2", _u64),
        ("completion_signal", _u64),
    ]


SIGNAL_KIND_USER = 1


class AmdSignal(ctypes.Structure):  # amd_signal_t, 64-byte aligned
    _fields_ = [
        ("kind", _i64),
        ("value", _i64),
        ("event_mailbox_ptr", _u64),
        ("event_id", _u32),
        ("reserved1", _u32),
        ("start_ts", _u64),
        ("end_ts", _u64),
        ("queue_ptr", _u64),
        ("reserved3", _u32 * 2),
    ]


QUEUE_PROPERTIES_IS_PTR64, QUEUE_PROPERTIES_ENABLE_PROFILING = 1 << 1, 1 << 3


class AmdQueue(ctypes.Structure):  # amd_queue_t: an hsa_queue_t and what AMD's packet processor reads besides
    _fields_ = [
        ("hsa_type", _u32),
        ("hsa_features", _u32),
        ("hsa_base_address", _u64),
        ("hsa_doorbell_signal", _u64),
        ("hsa_size", _u32),  # packets
        ("hsa_reserved1", _u32),
        ("hsa_id", _u64),
        ("caps", _u32),
        ("reserved1", _u32 * 3),
        ("write_dispatch_id", _u64),
        ("group_segment_aperture_base_hi", _u32),
        ("private_segment_aperture_base_hi", _u32),
        ("max_cu_id", _u32),
        ("max_wave_id", _u32),
        ("max_legacy_doorbell_dispatch_id_plus_1", _u64),
        ("legacy_doorbell_lock", _u32),
        ("reserved2", _u32 * 9),
        ("read_dispatch_id", _u64),
        ("read_dispatch_id_field_base_byte_offset", _u32),
        ("compute_tmpring_size", _u32),
        ("scratch_resource_descriptor", _u32 * 4),
        ("scratch_backing_memory_location", _u64),
        ("scratch_backing_memory_byte_size", _u64),
        ("scratch_wave64_lane_byte_size", _u32),
        ("queue_properties", _u32),
        ("reserved3", _u32 * 2),
        ("queue_inactive_signal", _u64),
        ("reserved4", _u32 * 14),
    ]


assert ctypes.sizeof(DispatchPacket) == ctypes.sizeof(BarrierAndPacket) == PACKET_SIZE
assert ctypes.sizeof(AmdSignal) == 64 and ctypes.sizeof(AmdQueue) == 256
WRITE_ID_OFFSET, READ_ID_OFFSET = AmdQueue.write_dispatch_id.offset, AmdQueue.read_dispatch_id.offset

# ---------------------------------------------------------------- memory kinds the queue uses

HOST_FLAGS = MEM_GTT | MEM_WRITABLE | MEM_COHERENT | MEM_UNCACHED  # rings, signals, kernargs: CPU and GPU, uncached
VRAM_FLAGS = MEM_VRAM | MEM_WRITABLE | MEM_NO_SUBSTITUTE

# ---------------------------------------------------------------- signals


class SignalPool:
    """amd_signal_t's in one host-visible allocation, each tied to the one KFD event the pool waits on."""

    def __init__(self, kfd: KFD, count: int = 256) -> None:
        self.kfd = kfd
        self.memory = kfd.alloc(count * ctypes.sizeof(AmdSignal), HOST_FLAGS, host=True)
        self.event_id, self.mailbox = kfd.create_event()
        self.signals = [AmdSignal.from_address(self.memory.va + i * 64) for i in range(count)]
        self.next = 0
        for s in self.signals:
            s.kind, s.value, s.event_mailbox_ptr, s.event_id = SIGNAL_KIND_USER, 0, self.mailbox, self.event_id

    def take(self, wait_s: float) -> AmdSignal:
        """The next signal, waited for if it is still in use (the pool is a ring), set to 1."""
        s = self.signals[self.next]
        self.next = (self.next + 1) % len(self.signals)
        self.wait(s, wait_s)
        s.start_ts = s.end_ts = 0
        s.value = 1
        return s

    def address(self, s: AmdSignal) -> int:
        return ctypes.addressof(s)

    def wait(self, s: AmdSignal, timeout_s: float, what: str = "the GPU") -> None:
        """Sleep in WAIT_EVENTS until the signal's value drops to 0 or less; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while s.value > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what} did not finish within {timeout_s:g} s (signal value {s.value}): a hang?")
            self.kfd.wait_event(self.event_id, max(1, min(int(left * 1000), 1000)))

    def close(self) -> None:
        self.kfd.destroy_event(self.event_id)
        self.kfd.free(self.memory)


# ---------------------------------------------------------------- the queue


class AQLQueue:
    """One AQL compute queue of a GPU: ring, amd_queue_t, doorbell, and the buffers KFD asks for."""

    def __init__(self, kfd: KFD, packets: int = 4096) -> None:
        if packets & (packets - 1) or packets < 16:
            raise ValueError(f"an AQL ring holds a power of two of at least 16 packets, got {packets}")
        self.kfd, self.packets = kfd, packets
        node = kfd.node
        self.ring = kfd.alloc(packets * PACKET_SIZE, HOST_FLAGS, host=True)
        self.queue_mem = kfd.alloc(PAGE, HOST_FLAGS, host=True)
        self.amd_queue = AmdQueue.from_address(self.queue_mem.va)
        sizes = QueueBufferSizes.of(node.props, node.cu_count, node.xcc_count)
        self.eop = kfd.alloc(sizes.eop, VRAM_FLAGS, host=False)  # the packet processor's end-of-pipe buffer
        self.ctx_save = kfd.alloc(sizes.ctx_save_area, VRAM_FLAGS, host=False)  # where preempted waves are saved
        for i in range(packets):  # nothing valid in the ring yet
            _u16.from_address(self.ring.va + i * PACKET_SIZE).value = PACKET_TYPE_INVALID << HEADER_TYPE
        q = self.amd_queue
        q.hsa_base_address, q.hsa_size = self.ring.va, packets
        q.write_dispatch_id = q.read_dispatch_id = 0
        q.read_dispatch_id_field_base_byte_offset = READ_ID_OFFSET
        q.queue_properties = QUEUE_PROPERTIES_IS_PTR64 | QUEUE_PROPERTIES_ENABLE_PROFILING
        q.max_cu_id = node.cu_count * node.xcc_count - 1
        q.max_wave_id = max(node.props.get("max_waves_per_simd", 16), 1) * 4 - 1
        args = CreateQueueArgs(
            ring_base_address=self.ring.va,
            write_pointer_address=self.queue_mem.va + WRITE_ID_OFFSET,
            read_pointer_address=self.queue_mem.va + READ_ID_OFFSET,
            ring_size=self.ring.size,
            gpu_id=kfd.gpu_id,
            queue_type=QUEUE_TYPE_COMPUTE_AQL,
            queue_percentage=MAX_QUEUE_PERCENTAGE,
            queue_priority=MAX_QUEUE_PRIORITY,
            eop_buffer_address=self.eop.va,
            eop_buffer_size=self.eop.size,
            ctx_save_restore_address=self.ctx_save.va,
            ctx_save_restore_size=sizes.ctx_save,
            ctl_stack_size=sizes.ctl_stack,
        )
        kfd.ioctl(CREATE_QUEUE, args)
        self.queue_id = args.queue_id
        # the doorbell: a page of /dev/kfd at the offset the driver gave, this queue's 64-bit slot inside it
        self.doorbell_page = args.doorbell_offset & ~(PAGE * 2 - 1)
        self.doorbell_map = kfd.host.mmap(
            0, PAGE * 2, PROT_READ | PROT_WRITE, MAP_SHARED, kfd.kfd_fd, self.doorbell_page
        )
        self.doorbell = _u64.from_address(self.doorbell_map + args.doorbell_offset - self.doorbell_page)
        self.write_id = 0
        self.scratch: Allocation | None = None
        self.scratch_per_lane = 0  # private bytes per work-item the scratch memory has room for

    @property
    def read_id(self) -> int:
        return self.amd_queue.read_dispatch_id

    def submit(self, packet: DispatchPacket | BarrierAndPacket, wait_s: float = 30.0) -> int:
        """Put one packet in the ring (its header written last) and ring the doorbell; the packet's dispatch id."""
        deadline = time.monotonic() + wait_s
        while self.write_id - self.read_id >= self.packets:  # full: the packet processor has not caught up
            if time.monotonic() > deadline:
                raise TimeoutError(f"the AQL queue stayed full for {wait_s:g} s: the GPU is hung?")
            time.sleep(0.0001)
        slot = self.ring.va + (self.write_id % self.packets) * PACKET_SIZE
        raw = bytes(packet)
        ctypes.memmove(slot + 4, raw[4:], PACKET_SIZE - 4)  # the body first ...
        _u32.from_address(slot).value = int.from_bytes(raw[:4], "little")  # ... then header and setup in one store
        dispatch_id = self.write_id
        self.write_id += 1
        self.amd_queue.write_dispatch_id = self.write_id
        self.doorbell.value = dispatch_id
        return dispatch_id

    def ensure_scratch(self, per_lane: int, lanes: int) -> None:
        """Scratch memory (private segments) for kernels of `per_lane` bytes per work-item in waves of `lanes`: enough
        for every wave slot of the GPU, described in the amd_queue_t where the packet processor looks for it. Grows
        only; the caller makes sure no packet is in flight when it does."""
        per_lane = round_up(per_lane, 16)
        if per_lane <= self.scratch_per_lane:
            return
        node, major = self.kfd.node, self.kfd.node.props.get("gfx_target_version", 0) // 10000
        align = 256 if major >= 11 else 1024  # COMPUTE_TMPRING_SIZE.WAVESIZE counts these
        wave_bytes = round_up(per_lane * max(lanes, 64 if major < 10 else 32), align)
        slots = node.cu_count * max(node.props.get("max_slots_scratch_cu", 32), 1)  # wave slots of all XCCs
        size = wave_bytes * slots
        memory = self.kfd.alloc(size, VRAM_FLAGS, host=False)
        if self.scratch is not None:
            self.kfd.free(self.scratch)
        self.scratch, self.scratch_per_lane = memory, per_lane
        q = self.amd_queue
        q.scratch_backing_memory_location = memory.va
        q.scratch_backing_memory_byte_size = size // node.xcc_count  # per XCC
        q.scratch_wave64_lane_byte_size = wave_bytes // 64
        engines = max(node.props.get("array_count", 1) // max(node.props.get("simd_arrays_per_engine", 1), 1), 1)
        waves = slots // node.xcc_count // (engines if major >= 11 else 1)  # gfx11+: waves per shader engine
        q.compute_tmpring_size = min(waves, 0xFFF) | (wave_bytes // align) << 12
        q.scratch_resource_descriptor[:] = scratch_descriptor(memory.va, size, major)

    def close(self) -> None:
        self.kfd.ioctl(DESTROY_QUEUE, DestroyQueueArgs(queue_id=self.queue_id))
        self.kfd.host.munmap(self.doorbell_map, PAGE * 2)
        for mem in (self.ctx_save, self.eop, self.queue_mem, self.ring, self.scratch):
            if mem is not None:
                self.kfd.free(mem)


def scratch_descriptor(base: int, size: int, major: int) -> tuple[int, int, int, int]:
    """The buffer resource (V#) of a queue's scratch memory: swizzled, one element of 4 bytes per lane."""
    sel_xyzw = 4 | 5 << 3 | 6 << 6 | 7 << 9  # DST_SEL_X..W = SQ_SEL_X..W
    if major >= 11:  # FORMAT 32_UINT, ADD_TID_ENABLE, OOB_SELECT 2 (no bounds check when swizzled)
        word1, word3 = 1 << 30, sel_xyzw | 20 << 12 | 1 << 23 | 2 << 28
    elif major == 10:  # the same and RESOURCE_LEVEL
        word1, word3 = 1 << 31, sel_xyzw | 20 << 12 | 1 << 23 | 1 << 24 | 2 << 28
    else:  # gfx9: NUM_FORMAT UINT, DATA_FORMAT 32, ELEMENT_SIZE 4, INDEX_STRIDE 64, ADD_TID_ENABLE
        word1, word3 = 1 << 31, sel_xyzw | 4 << 12 | 4 << 15 | 1 << 19 | 3 << 21 | 1 << 23
    return base & 0xFFFFFFFF, (base >> 32) & 0xFFFF | word1, size & 0xFFFFFFFF, word3


@dataclass(frozen=True)
class QueueBufferSizes:
    """The sizes of the buffers a compute queue gives KFD. Kernels from 6.11 on check them against the topology's
    published values (eop_buffer_size, ctl_stack_size, cwsr_size, debug_memory_size), and each buffer's allocation
    against its exact size; older ones publish none, and then a generous estimate serves (they only need enough)."""

    eop: int  # end-of-pipe buffer bytes
    ctl_stack: int  # control stack bytes, at the start of each XCC's context-save area
    ctx_save: int  # context-save area bytes per XCC (ctx_save_restore_size)
    ctx_save_area: int  # the allocation: every XCC's area and the debugger's memory, whole pages

    @staticmethod
    def of(props: dict[str, int], cu_count: int, xcc: int) -> QueueBufferSizes:
        eop = props.get("eop_buffer_size", 0) or PAGE
        if props.get("ctl_stack_size", 0) and props.get("cwsr_size", 0):
            ctl_stack, cwsr = props["ctl_stack_size"], props["cwsr_size"]
            return QueueBufferSizes(
                eop, ctl_stack, cwsr, round_up((cwsr + props.get("debug_memory_size", 0)) * xcc, PAGE)
            )
        major = props.get("gfx_target_version", 0) // 10000
        waves = cu_count * 32 if major >= 10 else cu_count * 40
        ctl_stack = round_up(40 + waves * (12 if major >= 10 else 8) + 8, PAGE)
        if major == 10:
            ctl_stack = min(ctl_stack, 0x7000)
        per_cu = 0x60000 + 0x4000 + 0x10000 + 0x1000  # vector and scalar registers, LDS and hardware registers of a CU
        ctx_save = ctl_stack + round_up(cu_count * per_cu, PAGE)
        debug = round_up(waves * 32, 64)
        return QueueBufferSizes(eop, ctl_stack, ctx_save, round_up((ctx_save + debug) * xcc, PAGE))
