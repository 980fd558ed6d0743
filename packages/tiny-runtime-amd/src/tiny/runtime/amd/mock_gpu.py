"""The GPU side of the mock kernel driver (tiny.runtime.amd.mock): its memory as the GPU sees it, the AQL packet
processor, and the table of code objects whose kernels it can run.

The packet processor takes each queue's packets from the read pointer up to the one the doorbell announced, checks
each one, runs a dispatched kernel as the linearized program it was compiled from on the PYTHON device, then writes
the timestamps, decrements the completion signal and fires its event. Anything a real GPU would fault on, or that
would make it compute something else than the program says, is a PacketError that names the queue, the packet and
the kernel.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tiny.ir.device import Compiled, Device, Program, Renderer, UnknownDevice
from tiny.ir.dtypes import PtrDType
from tiny.ir.uop import Ops, UOp
from tiny.runtime.amd import aql
from tiny.runtime.amd import driver as kfd
from tiny.runtime.amd.elf import CodeObject, KernelInfo, read_code_object

TICK_NS = 10  # the mock GPU's timestamp counter runs at 100 MHz


class PacketError(RuntimeError):
    """An AQL packet the mock GPU refuses: which queue and packet, and what is wrong with it."""


@dataclass(eq=False)
class GpuMemory:
    handle: int
    va: int
    size: int
    flags: int
    mmap_offset: int  # where its pages are in the mock's memory file (and so the render node's mmap offset)
    view: memoryview  # the GPU's view of it
    gpu_mapped: bool = False
    cpu_mapped: bool = False

    @property
    def host_visible(self) -> bool:
        return bool(self.flags & kfd.MEM_GTT or self.flags & kfd.MEM_PUBLIC)

    def describe(self) -> str:
        kind = "VRAM" if self.flags & kfd.MEM_VRAM else "GTT"
        return f"{kind} allocation {self.handle} ({self.size} bytes at {self.va:#x})"


@dataclass(eq=False)
class GpuQueue:
    queue_id: int
    ring: int
    ring_size: int
    write_ptr: int
    read_ptr: int
    doorbell_slot: int
    uses: tuple[int, ...]  # handles of the allocations it lives in


@dataclass(eq=False)
class GpuEvent:
    event_id: int
    slot: int
    auto_reset: bool
    signaled: bool = False


@dataclass(frozen=True)
class _Kernel:
    """A kernel of a code object the mock knows: the code object, the kernel, and the program it was compiled from."""

    code: CodeObject
    info: KernelInfo
    name: str
    uops: tuple[UOp, ...]


@dataclass
class _Stats:
    dispatches: int = 0
    barriers: int = 0
    ioctls: dict[str, int] = field(default_factory=dict)


class GpuState(Protocol):
    """What the packet processor reads of the mock driver's state."""

    queues: dict[int, GpuQueue]
    events: dict[int, GpuEvent]
    event_page: GpuMemory | None
    doorbells: mmap.mmap
    lds_bytes: int
    gfx_major: int

    def find(self, addr: int, size: int = 1) -> GpuMemory | None: ...
    def gpu_view(self, addr: int, size: int, what: str) -> memoryview: ...


class MockGPU:
    """The packet processor and the kernels it knows (code object descriptor -> kernels with that descriptor)."""

    def __init__(self, mem: GpuState) -> None:
        self.mem = mem
        self.kernels: dict[bytes, list[_Kernel]] = {}
        self._programs: dict[int, Program] = {}  # id of a _Kernel -> its PYTHON program
        self._rendered: dict[str, tuple[str, tuple[UOp, ...]]] = {}  # source -> (name, uops), from watch()
        self.stats = _Stats()

    # ---------------------------------------------------------------- which program a code object holds

    def watch(self, device: Compiled) -> None:
        """Learn the program behind each code object the device compiles: its renderer records what it renders,
        its compile ties the binary to that."""
        inner = device.renderer
        device.use_renderer(_RecordingRenderer(inner, self._rendered))
        compile_ = device.compile

        def compile(src: str) -> bytes:
            binary = compile_(src)
            if (known := self._rendered.get(src)) is not None:
                self.register(binary, *known)
            return binary

        compile_many = device.compile_many

        def compile_together(srcs: list[str]) -> list[bytes]:  # (several kernels of a schedule, as get_programs asks)
            binaries = compile_many(srcs)
            for src, binary in zip(srcs, binaries):
                if (known := self._rendered.get(src)) is not None:
                    self.register(binary, *known)
            return binaries

        device.compile = compile  # type: ignore[method-assign]
        device.compile_many = compile_together  # type: ignore[method-assign]

    def register(self, binary: bytes, name: str, uops: tuple[UOp, ...] | list[UOp]) -> None:
        """Tell the mock that kernel `name` of code object `binary` was compiled from the linearized `uops`."""
        code = read_code_object(binary)
        if name not in code.kernels:
            raise ValueError(f"the code object has no kernel {name!r}; it has {sorted(code.kernels)}")
        info = code.kernels[name]
        known = self.kernels.setdefault(info.descriptor, [])
        if not any(k.code.image == binary and k.name == name for k in known):
            known.append(_Kernel(code, info, name, tuple(uops)))

    def _kernel_at(self, address: int, where: str) -> tuple[_Kernel, int]:
        if address % 64:
            raise PacketError(f"{where}: kernel_object {address:#x} is not 64-byte aligned")
        mem = self.mem.find(address)
        if mem is None or not mem.flags & kfd.MEM_EXECUTABLE:
            what = mem.describe() + " without EXECUTABLE" if mem is not None else "no allocation"
            raise PacketError(f"{where}: kernel_object {address:#x} is in {what}")
        descriptor = bytes(self.mem.gpu_view(address, 64, f"{where}: the kernel descriptor"))
        for k in self.kernels.get(descriptor, ()):
            base = address - k.info.descriptor_vaddr
            if base < mem.va or base + k.code.load_size > mem.va + mem.size:
                continue
            if bytes(self.mem.gpu_view(base, k.code.load_size, where)) == k.code.loaded_image(base):
                return k, base
        raise PacketError(
            f"{where}: kernel_object {address:#x} is not the descriptor of a kernel of any code object loaded there "
            f"({len(self.kernels.get(descriptor, ()))} known kernel(s) have these 64 bytes; the loaded segments "
            "must match the code object's, relocated to their base)"
        )

    # ---------------------------------------------------------------- the packet processor

    def run_queues(self) -> None:
        """Run every packet the doorbells announced, in order, queue by queue."""
        for q in list(self.mem.queues.values()):
            where = f"queue {q.queue_id}"
            doorbell = struct.unpack_from("<Q", self.mem.doorbells, q.doorbell_slot * 8)[0]
            write = self._u64(q.write_ptr, f"{where}: the write pointer")
            read = self._u64(q.read_ptr, f"{where}: the read pointer")
            packets = q.ring_size // aql.PACKET_SIZE
            if write < read or write - read > packets:
                raise PacketError(f"{where}: write id {write} and read id {read}: the writer is behind or a ring ahead")
            if write == read:
                continue
            if doorbell >= write:
                raise PacketError(f"{where}: the doorbell announces packet {doorbell}, but the write id is {write}")
            for pid in range(read, doorbell + 1):
                slot = q.ring + (pid % packets) * aql.PACKET_SIZE
                raw = self.mem.gpu_view(slot, aql.PACKET_SIZE, f"{where}, packet {pid}")
                self._packet(q, pid, bytes(raw))
                struct.pack_into("<H", raw, 0, aql.PACKET_TYPE_INVALID)  # the slot is free again
                self._put_u64(q.read_ptr, pid + 1, f"{where}: the read pointer")

    def _packet(self, q: GpuQueue, pid: int, raw: bytes) -> None:
        header = struct.unpack_from("<H", raw)[0]
        kind = header & 0xFF
        where = f"queue {q.queue_id}, packet {pid}"
        acquire, release = (header >> aql.HEADER_ACQUIRE_SCOPE) & 3, (header >> aql.HEADER_RELEASE_SCOPE) & 3
        if acquire > aql.FENCE_SCOPE_SYSTEM or release > aql.FENCE_SCOPE_SYSTEM:
            raise PacketError(f"{where}: fence scopes acquire {acquire}, release {release}: 0 to 2")
        if kind == aql.PACKET_TYPE_KERNEL_DISPATCH:
            self._dispatch(q, f"{where} (kernel dispatch)", aql.DispatchPacket.from_buffer_copy(raw))
        elif kind == aql.PACKET_TYPE_BARRIER_AND:
            self._barrier(q, f"{where} (barrier-AND)", aql.BarrierAndPacket.from_buffer_copy(raw))
        elif kind == aql.PACKET_TYPE_INVALID:
            raise PacketError(f"{where}: the doorbell announced it, but its header is still INVALID (type 1)")
        else:
            raise PacketError(
                f"{where}: packet type {kind}; the mock runs kernel dispatch (2) and barrier-AND (3) packets"
                + (" (type 0: a ring slot that was never set to INVALID?)" if kind == 0 else "")
            )

    def _signal(self, address: int, where: str) -> aql.AmdSignal | None:
        """The amd_signal_t at `address` (None for no signal), checked."""
        if address == 0:
            return None
        if address % 64:
            raise PacketError(f"{where}: signal {address:#x} is not 64-byte aligned")
        raw = self.mem.gpu_view(address, 64, f"{where}: the signal")
        s = aql.AmdSignal.from_buffer_copy(raw)
        if s.kind != aql.SIGNAL_KIND_USER:
            raise PacketError(f"{where}: signal {address:#x} has kind {s.kind}, not a user signal (1)")
        return s

    def _complete(self, address: int, s: aql.AmdSignal | None, start: int, end: int, where: str) -> None:
        if s is None:
            return
        raw = self.mem.gpu_view(address, 64, f"{where}: the signal")
        s = aql.AmdSignal.from_buffer_copy(raw)
        s.start_ts, s.end_ts = start, end
        s.value -= 1
        raw[:] = bytes(s)
        if s.event_mailbox_ptr:
            page = self.mem.event_page
            slot = (s.event_mailbox_ptr - page.va) // 8 if page is not None else -1
            if page is None or s.event_mailbox_ptr % 8 or not 0 <= slot < page.size // 8:
                raise PacketError(
                    f"{where}: the signal's event mailbox {s.event_mailbox_ptr:#x} is not in the event page"
                )
            event = self.mem.events.get(s.event_id)
            if event is None or event.slot != slot:
                raise PacketError(f"{where}: the signal names event {s.event_id}, but its mailbox is slot {slot}'s")
            self._put_u64(s.event_mailbox_ptr, s.event_id, f"{where}: the event mailbox")
            event.signaled = True

    def _barrier(self, q: GpuQueue, where: str, p: aql.BarrierAndPacket) -> None:
        for i, dep in enumerate(p.dep_signal):
            s = self._signal(dep, f"{where}: dependency {i}")
            if s is not None and s.value > 0:
                raise PacketError(f"{where}: dependency {i} ({dep:#x}) has value {s.value}; nothing can lower it now")
        done = self._signal(p.completion_signal, f"{where}: completion")
        now = time.perf_counter_ns() // TICK_NS
        self._complete(p.completion_signal, done, now, now, where)
        self.stats.barriers += 1

    def _dispatch(self, q: GpuQueue, where: str, p: aql.DispatchPacket) -> None:
        dims = p.setup & 3
        wg = (p.workgroup_size_x, p.workgroup_size_y, p.workgroup_size_z)
        grid = (p.grid_size_x, p.grid_size_y, p.grid_size_z)
        if not 1 <= dims <= 3 or p.setup >> 2:
            raise PacketError(f"{where}: setup {p.setup:#x}: the dimension count (bits 0-1) is 1 to 3, the rest 0")
        if p.reserved0 or p.reserved2:
            raise PacketError(f"{where}: the reserved fields must be 0")
        if min(wg[:dims]) < 1 or min(grid[:dims]) < 1:
            raise PacketError(
                f"{where}: workgroup {wg} and grid {grid} sizes must be at least 1 in {dims} dimension(s)"
            )
        if any(w != 1 or g != 1 for w, g in zip(wg[dims:], grid[dims:])):
            raise PacketError(f"{where}: {dims} dimension(s), but workgroup {wg} or grid {grid} is not 1 beyond them")
        if wg[0] * wg[1] * wg[2] > 1024:
            raise PacketError(f"{where}: a workgroup of {wg} is more than 1024 work-items")
        if any(g % w for g, w in zip(grid, wg)):
            raise PacketError(
                f"{where}: grid {grid} is not a whole number of workgroups {wg} (tiny launches no partial ones)"
            )
        kernel, _ = self._kernel_at(p.kernel_object, where)
        info = kernel.info
        where = f"{where} of kernel {kernel.name}"
        if info.max_flat_workgroup_size and wg[0] * wg[1] * wg[2] > info.max_flat_workgroup_size:
            raise PacketError(
                f"{where}: workgroup {wg} exceeds its max_flat_workgroup_size {info.max_flat_workgroup_size}"
            )
        if p.group_segment_size < info.group_segment_size or p.group_segment_size > self.mem.lds_bytes:
            raise PacketError(
                f"{where}: group_segment_size {p.group_segment_size}: the kernel needs {info.group_segment_size}, "
                f"the GPU has {self.mem.lds_bytes}"
            )
        if p.private_segment_size < info.private_segment_size:
            raise PacketError(f"{where}: private_segment_size {p.private_segment_size} < {info.private_segment_size}")
        if info.private_segment_size:
            self._check_scratch(q, info, where)
        groups = tuple(g // w for g, w in zip(grid, wg))
        bufs, vals = self._kernargs(p.kernarg_address, info, kernel, groups, wg, dims, where)
        signal = self._signal(p.completion_signal, f"{where}: completion")
        if signal is not None and signal.value <= 0:
            raise PacketError(f"{where}: the completion signal's value is {signal.value}; it is set above 0 to wait on")
        self._check_launch(kernel, groups, wg, where)
        start = time.perf_counter_ns() // TICK_NS
        self._program(kernel)(*bufs, global_size=groups, local_size=wg, vals=tuple(vals))
        end = time.perf_counter_ns() // TICK_NS
        properties = self._u64(q.write_ptr - aql.WRITE_ID_OFFSET + aql.AmdQueue.queue_properties.offset, where)
        profiled = properties & aql.QUEUE_PROPERTIES_ENABLE_PROFILING
        self._complete(p.completion_signal, signal, start if profiled else 0, end if profiled else 0, where)
        self.stats.dispatches += 1

    def _check_scratch(self, q: GpuQueue, info: KernelInfo, where: str) -> None:
        """A kernel with a private segment finds scratch memory for it described in the queue's amd_queue_t."""
        raw = self.mem.gpu_view(q.write_ptr - aql.WRITE_ID_OFFSET, ctypes.sizeof(aql.AmdQueue), f"{where}: amd_queue_t")
        amd = aql.AmdQueue.from_buffer_copy(raw)
        need = info.private_segment_size * info.wavefront_size  # bytes per wave
        base, size = amd.scratch_backing_memory_location, amd.scratch_backing_memory_byte_size
        what = f"{where}: the kernel needs {info.private_segment_size} bytes of scratch per work-item"
        mem = self.mem.find(base)
        if base == 0 or mem is None or not mem.gpu_mapped or base + size > mem.va + mem.size or size < need:
            raise PacketError(f"{what}, but the queue's scratch is {size} bytes at {base:#x}, not in GPU memory")
        align = 256 if self.mem.gfx_major >= 11 else 1024
        wave_size, waves = (amd.compute_tmpring_size >> 12) * align, amd.compute_tmpring_size & 0xFFF
        if amd.scratch_wave64_lane_byte_size * 64 < need or wave_size < need or waves == 0:
            raise PacketError(
                f"{what} ({need} per wave), but the queue gives waves {amd.scratch_wave64_lane_byte_size * 64} bytes "
                f"(COMPUTE_TMPRING_SIZE: {waves} waves of {wave_size} bytes)"
            )
        srd = list(amd.scratch_resource_descriptor)
        if srd[0] | (srd[1] & 0xFFFF) << 32 != base or srd[2] == 0:
            raise PacketError(f"{what}, but the scratch buffer descriptor {srd} does not describe {base:#x}")

    def _kernargs(
        self,
        address: int,
        info: KernelInfo,
        kernel: _Kernel,
        groups: tuple[int, ...],
        wg: tuple[int, ...],
        dims: int,
        where: str,
    ) -> tuple[list[memoryview], list[int]]:
        """The kernel's buffers (views of GPU memory) and integers, from its kernarg block, every value checked."""
        if address % max(info.kernarg_align, 16):
            raise PacketError(f"{where}: kernarg_address {address:#x} is not aligned to {max(info.kernarg_align, 16)}")
        block = bytes(
            self.mem.gpu_view(address, info.kernarg_size, f"{where}: the kernarg block of {info.kernarg_size} bytes")
        )
        globals_ = sorted((u for u in kernel.uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
        variables = [u for u in kernel.uops if u.op is Ops.DEFINE_VAR]
        pointers = [a for a in info.args if a.kind == "global_buffer"]
        values = [a for a in info.args if a.kind == "by_value"]
        if len(pointers) != len(globals_) or len(values) != len(variables):
            raise PacketError(
                f"{where}: the metadata lists {len(pointers)} buffers and {len(values)} values, the program "
                f"{len(globals_)} buffers and {len(variables)} variables"
            )
        bufs = []
        for n, (a, g) in enumerate(zip(pointers, globals_)):
            ptr = struct.unpack_from("<Q", block, a.offset)[0]
            mem = self.mem.find(ptr)
            if mem is None or not mem.gpu_mapped:
                raise PacketError(
                    f"{where}: buffer {n} (kernarg offset {a.offset}) is {ptr:#x}, in no mapped allocation"
                )
            dt = g.dtype
            need = dt.size * dt.base.itemsize if isinstance(dt, PtrDType) and dt.base and dt.size > 0 else 0
            end = mem.va + mem.size
            if ptr + need > end:
                raise PacketError(
                    f"{where}: buffer {n} at {ptr:#x} holds {need} bytes for the kernel, but {mem.describe()} ends "
                    f"{end - ptr} bytes after it"
                )
            bufs.append(memoryview(mem.view)[ptr - mem.va : ptr - mem.va + need if need else mem.size])
        vals = [struct.unpack_from("<i" if a.size == 4 else "<q", block, a.offset)[0] for a in values]
        expected = {"hidden_grid_dims": dims}
        for i, d in enumerate("xyz"):
            expected |= {f"hidden_block_count_{d}": groups[i], f"hidden_group_size_{d}": wg[i]}
            expected |= {f"hidden_remainder_{d}": 0, f"hidden_global_offset_{d}": 0}
        for a in info.args:
            if a.kind in expected:
                got = int.from_bytes(block[a.offset : a.offset + a.size], "little")
                if got != expected[a.kind]:
                    raise PacketError(
                        f"{where}: {a.kind} at kernarg offset {a.offset} is {got}, expected {expected[a.kind]}"
                    )
        return bufs, vals

    def _check_launch(self, kernel: _Kernel, groups: tuple[int, ...], wg: tuple[int, ...], where: str) -> None:
        """The packet's sizes are the ones the program was built for (its gidx/lidx ranges); a kernel that takes
        Variables may have fewer workgroups (a count over a Variable: its gidx range is the largest count)."""
        sizes = {"gidx": groups, "lidx": wg}
        seen = {"gidx": [1, 1, 1], "lidx": [1, 1, 1]}
        for u in kernel.uops:
            if u.op is Ops.SPECIAL:
                name, size = u.arg[0], u.arg[1]
                seen[name[:4]][int(name[4])] = size
        symbolic = any(u.op is Ops.DEFINE_VAR for u in kernel.uops)
        for kind, built in seen.items():
            fewer = kind == "gidx" and symbolic and all(1 <= n <= b for n, b in zip(sizes[kind], built))
            if tuple(built) != tuple(sizes[kind]) and not fewer:
                what = "workgroups" if kind == "gidx" else "work-items per workgroup"
                raise PacketError(
                    f"{where}: the program was built for {tuple(built)} {what}, the packet gives {sizes[kind]}"
                )

    def _program(self, kernel: _Kernel) -> Program:
        """The kernel's program on the PYTHON device (tiny-runtime-misc, found through the device registry)."""
        if (prog := self._programs.get(id(kernel))) is None:
            try:
                python = Device["PYTHON"]
            except UnknownDevice:
                raise RuntimeError(
                    "the AMD mock runs kernels on the PYTHON device of tiny-runtime-misc, which is not installed: "
                    "pip install tiny-runtime-amd[mock]"
                ) from None
            binary = python.compile(python.renderer.render(kernel.name, list(kernel.uops)))
            prog = self._programs[id(kernel)] = python.program(python, kernel.name, binary)
        return prog

    def _u64(self, addr: int, what: str) -> int:
        return struct.unpack("<Q", self.mem.gpu_view(addr, 8, what))[0]

    def _put_u64(self, addr: int, value: int, what: str) -> None:
        struct.pack_into("<Q", self.mem.gpu_view(addr, 8, what), 0, value & (2**64 - 1))


class _RecordingRenderer(Renderer):
    """The AMD device's renderer, noting for each source the kernel name and linearized program it came from."""

    def __init__(self, inner: Renderer, table: dict[str, tuple[str, tuple[UOp, ...]]]) -> None:
        self.inner, self.table = inner, table
        self.target = inner.target
        self.caps = inner.caps  # tensor cores too: the PYTHON emulator runs WMMA by the same layouts

    def render(self, name: str, uops: list[UOp]) -> str:
        src = self.inner.render(name, uops)
        self.table[src] = (name, tuple(uops))
        return src

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
