"""The KFD driver layer and AQL queue against the mock kernel driver: topology, memory, queues, events, and
dispatches built by hand from a kernel compiled here, good ones run and bad ones refused with what is wrong.
Kernels compile with the system's clang and ld.lld (skipped, with the reason, where they are missing) and run on
the PYTHON device (tiny-runtime-misc: `pip install tiny-runtime-amd[mock]`)."""

from __future__ import annotations

import ctypes
import errno
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from amd_helpers import compiler

from tiny.ir.device import load_renderer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.uop import Ops, UOp
from tiny.runtime.amd import aql, driver
from tiny.runtime.amd import mock as mock_module
from tiny.runtime.amd.aql import AQLQueue, DispatchPacket, SignalPool
from tiny.runtime.amd.driver import KFD, gpu_nodes
from tiny.runtime.amd.elf import CodeObject, read_code_object
from tiny.runtime.amd.kfd import host_os
from tiny.runtime.amd.mock import GPU_ID, MockHang, MockKFD, target_version
from tiny.runtime.amd.mock_gpu import PacketError

pytest.importorskip("tiny.runtime.python", reason="the mock runs kernels on tiny-runtime-misc's PYTHON device")

i32, f32 = dtypes.int32, dtypes.float32
GROUPS, LOCAL = 4, 32
N = GROUPS * LOCAL

# ---------------------------------------------------------------- a kernel: out[i] = in[i] * 2 + n


def _glob(i: int, dt: DType) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dt.ptr(N), (), i)


def scale_kernel() -> list[UOp]:
    out, inp = _glob(0, f32), _glob(1, f32)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("n", 0, 1000))
    gid, lid = UOp(Ops.SPECIAL, i32, (), ("gidx0", GROUPS)), UOp(Ops.SPECIAL, i32, (), ("lidx0", LOCAL))
    i = gid * UOp.const(i32, LOCAL) + lid
    x = UOp(Ops.LOAD, f32, (UOp(Ops.INDEX, inp.dtype, (inp, i)),))
    y = x * UOp.const(f32, 2.0) + UOp(Ops.CAST, f32, (n,))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), y))
    return [u for u in UOp(Ops.SINK, dtypes.void, (st,)).toposort if u.op is not Ops.SINK]


@dataclass(frozen=True)
class Built:
    binary: bytes
    code: CodeObject
    uops: list[UOp]
    name: str = "scale"


# a kernel that reads its workgroup size from the implicit (hidden) arguments: out[i] = the workgroup's size
IMPLICIT_IR = """
define amdgpu_kernel void @wgsize(ptr addrspace(1) noalias %out) #0 {
  %g = call i32 @llvm.amdgcn.workgroup.id.x()
  %l = call i32 @llvm.amdgcn.workitem.id.x()
  %imp = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
  %at = getelementptr i8, ptr addrspace(4) %imp, i64 12
  %ws = load i16, ptr addrspace(4) %at, align 4
  %w = zext i16 %ws to i32
  %base = mul i32 %g, %w
  %i = add i32 %base, %l
  %dst = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %w, ptr addrspace(1) %dst
  ret void
}
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workitem.id.x()
declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
attributes #0 = { "amdgpu-flat-work-group-size"="1,32" }
"""


def wgsize_kernel() -> list[UOp]:
    """What the IR kernel computes, as a program the emulator runs."""
    out = _glob(0, i32)
    gid, lid = UOp(Ops.SPECIAL, i32, (), ("gidx0", GROUPS)), UOp(Ops.SPECIAL, i32, (), ("lidx0", LOCAL))
    i = gid * UOp.const(i32, LOCAL) + lid
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), UOp.const(i32, LOCAL)))
    return [u for u in UOp(Ops.SINK, dtypes.void, (st,)).toposort if u.op is not Ops.SINK]


@pytest.fixture(scope="module")
def implicit() -> Built:
    binary = compiler("gfx1100").compile(IMPLICIT_IR)
    return Built(binary, read_code_object(binary), wgsize_kernel(), "wgsize")


@pytest.fixture(scope="module")
def built() -> Built:
    uops = scale_kernel()
    src = load_renderer("AMDGPU")("gfx1100").render("scale", uops)
    binary = compiler("gfx1100").compile(src)
    return Built(binary, read_code_object(binary), uops)


# ---------------------------------------------------------------- a process on the mock GPU, by hand


class Rig:
    """The pieces a runtime holds, put together by hand on a mock: the driver, a queue and signals."""

    def __init__(self, target: str = "gfx1100") -> None:
        self.mock = MockKFD(target)
        self.kfd = KFD(self.mock, gpu_nodes(self.mock)[0])
        self.queue = AQLQueue(self.kfd, packets=64)
        self.signals = SignalPool(self.kfd, count=8)

    def load(self, built: Built) -> int:
        """The code object in executable GPU memory; the kernel object's address."""
        self.mock.register(built.binary, built.name, built.uops)
        code = self.kfd.alloc(built.code.load_size, aql.HOST_FLAGS | driver.MEM_EXECUTABLE, host=True)
        ctypes.memmove(code.va, built.code.loaded_image(code.va), built.code.load_size)
        return code.va + built.code.kernels[built.name].descriptor_vaddr

    def kernargs(self, built: Built, out: int, inp: int, n: int, groups: int = GROUPS, local: int = LOCAL) -> int:
        info = built.code.kernels[built.name]
        block = bytearray(info.kernarg_size)
        values = iter((out, inp))
        for a in info.args:
            if a.kind == "global_buffer":
                struct.pack_into("<Q", block, a.offset, next(values))
            elif a.kind == "by_value":
                struct.pack_into("<i", block, a.offset, n)
            elif a.kind in ("hidden_block_count_x", "hidden_group_size_x", "hidden_grid_dims"):
                value = {"hidden_block_count_x": groups, "hidden_group_size_x": local, "hidden_grid_dims": 3}[a.kind]
                block[a.offset : a.offset + a.size] = value.to_bytes(a.size, "little")
            elif a.kind in (
                "hidden_block_count_y",
                "hidden_block_count_z",
                "hidden_group_size_y",
                "hidden_group_size_z",
            ):
                block[a.offset : a.offset + a.size] = (1).to_bytes(a.size, "little")
        mem = self.kfd.alloc(len(block), aql.HOST_FLAGS, host=True)
        mem.view(0, len(block))[:] = block
        return mem.va

    def packet(
        self, built: Built, kernel_object: int, kernargs: int, **fields: int
    ) -> tuple[DispatchPacket, aql.AmdSignal]:
        info = built.code.kernels[built.name]
        signal = self.signals.take(1.0)
        p = DispatchPacket(
            header=aql.dispatch_header(),
            setup=3,
            workgroup_size_x=LOCAL,
            workgroup_size_y=1,
            workgroup_size_z=1,
            grid_size_x=N,
            grid_size_y=1,
            grid_size_z=1,
            group_segment_size=info.group_segment_size,
            kernel_object=kernel_object,
            kernarg_address=kernargs,
            completion_signal=self.signals.address(signal),
        )
        for k, v in fields.items():
            setattr(p, k, v)
        return p, signal

    def buffers(self) -> tuple[driver.Allocation, driver.Allocation]:
        out = self.kfd.alloc(N * 4, aql.HOST_FLAGS, host=True)
        inp = self.kfd.alloc(N * 4, aql.HOST_FLAGS, host=True)
        inp.view(0, N * 4)[:] = struct.pack(f"{N}f", *range(N))
        return out, inp

    def close(self) -> None:
        self.signals.close()
        self.queue.close()
        self.kfd.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


def dispatch(rig: Rig, built: Built, **fields: int) -> tuple[driver.Allocation, aql.AmdSignal]:
    """A good dispatch of the scale kernel, with `fields` of its packet replaced; waits for it."""
    out, inp = rig.buffers()
    kernel_object = fields.pop("kernel_object", None) or rig.load(built)
    p, signal = rig.packet(built, kernel_object, rig.kernargs(built, out.va, inp.va, 5), **fields)
    rig.queue.submit(p)
    rig.signals.wait(signal, 5.0)
    return out, signal


# ---------------------------------------------------------------- topology and the flag


@pytest.mark.parametrize("target,version,xcc", [("gfx1100", 110000, 1), ("gfx942", 90402, 8), ("gfx90a", 90010, 1)])
def test_topology_names_one_gpu_of_the_target(target: str, version: int, xcc: int) -> None:
    mock = MockKFD(target)
    assert target_version(target) == version
    (node,) = gpu_nodes(mock)
    assert node.gpu_id == GPU_ID and node.target == target and node.xcc_count == xcc
    assert node.render_node == "/dev/dri/renderD128" and mock.exists(node.render_node) and mock.exists("/dev/kfd")
    assert node.cu_count > 0 and mock.listdir(driver.TOPOLOGY) == ["0", "1"]


@pytest.mark.parametrize("bad", ["sm_90", "gfx", "gfx803", "gfxzz00"])
def test_mock_refuses_a_target_that_is_no_gfx9_or_later_name(bad: str) -> None:
    with pytest.raises(ValueError, match="gfx"):
        MockKFD(bad)


def test_the_mock_is_chosen_by_the_flag_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMD_MOCK", raising=False)
    assert isinstance(host_os(), driver.LinuxOS)
    monkeypatch.setenv("AMD_MOCK", "gfx942")
    host = host_os()
    assert isinstance(host, MockKFD) and host.target == "gfx942"


# ---------------------------------------------------------------- memory


def test_host_memory_is_one_set_of_pages_for_cpu_and_gpu(rig: Rig) -> None:
    mem = rig.kfd.alloc(10000, aql.HOST_FLAGS, host=True)
    assert mem.size == 12288 and mem.va % driver.PAGE == 0
    mem.view(100, 4)[:] = b"tiny"
    assert bytes(rig.mock.gpu_view(mem.va + 100, 4, "test")) == b"tiny"  # what the GPU sees
    rig.mock.gpu_view(mem.va + 200, 3, "test")[:] = b"gpu"
    assert bytes(mem.view(200, 3)) == b"gpu"
    big = rig.kfd.alloc(3 << 20, aql.VRAM_FLAGS, host=False)
    assert big.va % (1 << 21) == 0  # big allocations on the GPU's 2 MiB pages
    rig.kfd.free(mem)
    with pytest.raises(PacketError, match="outside every live GPU allocation"):
        rig.mock.gpu_view(mem.va, 4, "after free")
    with pytest.raises(ValueError, match="not a live allocation"):
        rig.kfd.free(mem)


def test_vram_without_public_cannot_be_mapped_for_the_cpu(rig: Rig) -> None:
    with pytest.raises(OSError, match="VRAM without PUBLIC"):
        rig.kfd.alloc(4096, aql.VRAM_FLAGS, host=True)
    assert rig.kfd.alloc(4096, aql.VRAM_FLAGS | driver.MEM_PUBLIC, host=True).host


def test_vram_runs_out(rig: Rig) -> None:
    with pytest.raises(MemoryError, match="VRAM"):
        rig.kfd.alloc(64 << 30, aql.VRAM_FLAGS, host=False)


def _raw_ioctl(rig: Rig, request: int, arg: ctypes.Structure) -> None:
    rig.mock.ioctl(rig.kfd.kfd_fd, request, arg)


@pytest.mark.parametrize(
    "flags,va,size,match",
    [
        (driver.MEM_VRAM | driver.MEM_GTT, 1 << 32, 4096, "exactly one"),
        (driver.MEM_USERPTR, 1 << 32, 4096, "VRAM or GTT"),
        (driver.MEM_GTT | 1 << 5, 1 << 32, 4096, "unknown flag bits"),
        (driver.MEM_GTT, (1 << 32) + 12, 4096, "whole pages"),
        (driver.MEM_GTT, 1 << 32, 100, "whole pages"),
        (driver.MEM_GTT, 4096, 4096, "aperture"),
    ],
)
def test_alloc_ioctl_checks_its_arguments(rig: Rig, flags: int, va: int, size: int, match: str) -> None:
    with pytest.raises(OSError, match=match) as e:
        _raw_ioctl(
            rig, driver.ALLOC_MEMORY_OF_GPU, driver.AllocMemoryArgs(va_addr=va, size=size, gpu_id=GPU_ID, flags=flags)
        )
    assert e.value.errno == errno.EINVAL


def test_ioctls_check_structures_gpu_ids_and_overlaps(rig: Rig) -> None:
    with pytest.raises(OSError, match="takes a AllocMemoryArgs of 40 bytes, got FreeMemoryArgs"):
        _raw_ioctl(rig, driver.ALLOC_MEMORY_OF_GPU, driver.FreeMemoryArgs())
    with pytest.raises(OSError, match="not a GPU of the topology"):
        _raw_ioctl(
            rig, driver.ALLOC_MEMORY_OF_GPU, driver.AllocMemoryArgs(va_addr=1 << 32, size=4096, gpu_id=7, flags=2)
        )
    mem = rig.kfd.alloc(8192, aql.HOST_FLAGS, host=True)
    with pytest.raises(OSError, match="overlap"):
        _raw_ioctl(
            rig,
            driver.ALLOC_MEMORY_OF_GPU,
            driver.AllocMemoryArgs(va_addr=mem.va + 4096, size=4096, gpu_id=GPU_ID, flags=2),
        )
    with pytest.raises(OSError, match="still mapped to the GPU") as e:
        _raw_ioctl(rig, driver.FREE_MEMORY_OF_GPU, driver.FreeMemoryArgs(handle=mem.handle))
    assert e.value.errno == errno.EBUSY
    ids = (ctypes.c_uint32 * 1)(99)
    with pytest.raises(OSError, match="gpu_id 0x63 in the device list"):
        _raw_ioctl(
            rig,
            driver.MAP_MEMORY_TO_GPU,
            driver.MapMemoryArgs(handle=mem.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1),
        )
    with pytest.raises(OSError, match="unknown ioctl"):
        _raw_ioctl(rig, 0xC0DE, driver.FreeMemoryArgs())
    with pytest.raises(OSError, match="not /dev/kfd"):
        rig.mock.ioctl(rig.kfd.drm_fd, driver.GET_VERSION, driver.GetVersionArgs())


def test_memory_needs_a_vm_first() -> None:
    mock = MockKFD("gfx1100")
    fd = mock.open("/dev/kfd", driver.O_RDWR)
    with pytest.raises(OSError, match="ACQUIRE_VM"):
        mock.ioctl(
            fd, driver.ALLOC_MEMORY_OF_GPU, driver.AllocMemoryArgs(va_addr=1 << 32, size=4096, gpu_id=GPU_ID, flags=2)
        )
    with pytest.raises(OSError, match="not an open render node"):
        mock.ioctl(fd, driver.ACQUIRE_VM, driver.AcquireVmArgs(drm_fd=fd, gpu_id=GPU_ID))
    with pytest.raises(FileNotFoundError):
        mock.open("/dev/dri/renderD129", driver.O_RDWR)


# ---------------------------------------------------------------- queues and events


def test_queue_lives_in_checked_memory_and_rings_its_doorbell(rig: Rig) -> None:
    q = rig.queue
    assert q.queue_id in rig.mock.queues
    headers = {struct.unpack_from("<H", rig.mock.gpu_view(q.ring.va + i * 64, 2, "ring"))[0] for i in range(q.packets)}
    assert headers == {aql.PACKET_TYPE_INVALID}  # every slot starts INVALID
    q.doorbell.value = 1234
    slot = rig.mock.queues[q.queue_id].doorbell_slot
    assert struct.unpack_from("<Q", rig.mock.doorbells, slot * 8)[0] == 1234  # the mock sees the doorbell page
    q.doorbell.value = 0
    with pytest.raises(OSError, match="holds parts of queue") as e:
        rig.kfd.free(q.ring)
    assert e.value.errno == errno.EBUSY


def _queue_args(rig: Rig) -> driver.CreateQueueArgs:
    """What the rig's queue was created with: a CREATE_QUEUE the mock accepts."""
    q, sizes = rig.queue, rig.mock.queue_sizes
    return driver.CreateQueueArgs(
        ring_base_address=q.ring.va,
        write_pointer_address=q.queue_mem.va + aql.WRITE_ID_OFFSET,
        read_pointer_address=q.queue_mem.va + aql.READ_ID_OFFSET,
        ring_size=q.ring.size,
        gpu_id=GPU_ID,
        queue_type=driver.QUEUE_TYPE_COMPUTE_AQL,
        eop_buffer_address=q.eop.va,
        eop_buffer_size=sizes["eop_buffer_size"],
        ctx_save_restore_address=q.ctx_save.va,
        ctx_save_restore_size=sizes["cwsr_size"],
        ctl_stack_size=sizes["ctl_stack_size"],
    )


def test_queue_buffers_are_sized_as_the_topology_says() -> None:
    mock = MockKFD("gfx942")
    (node,) = gpu_nodes(mock)
    sizes = aql.QueueBufferSizes.of(node.props, node.cu_count, node.xcc_count)
    published = mock.queue_sizes
    assert (sizes.eop, sizes.ctl_stack, sizes.ctx_save) == (4096, published["ctl_stack_size"], published["cwsr_size"])
    assert sizes.ctx_save_area == driver.round_up((published["cwsr_size"] + published["debug_memory_size"]) * 8, 4096)
    # a kernel that publishes nothing: an estimate, the control stack inside the area, an area per XCC
    estimate = aql.QueueBufferSizes.of({"gfx_target_version": 90402}, 304, 8)
    assert 0 < estimate.ctl_stack < estimate.ctx_save and estimate.ctx_save_area >= 8 * estimate.ctx_save


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("ctl_stack_size", 1024, "ctl_stack_size 1024: the topology says"),
        ("ctx_save_restore_size", 4096, "ctx_save_restore_size 4096: the topology's cwsr_size is"),
        ("eop_buffer_size", 8192, "eop_buffer_size 8192"),
        ("queue_type", 1, "AQL compute queues"),
        ("ring_size", 1000, "a power of two"),
        ("ctx_save_restore_address", "eop", "the context-save area .* must be an allocation of its own"),
        ("write_pointer_address", "two pages", "the write pointer's page .* must be an allocation of its own"),
        ("read_pointer_address", "unaligned", "not 8-byte aligned"),
    ],
)
def test_create_queue_checks_its_buffers(rig: Rig, field: str, value: object, match: str) -> None:
    args = _queue_args(rig)
    if value == "eop":
        value = rig.queue.eop.va
    elif value == "two pages":
        value = rig.kfd.alloc(2 * driver.PAGE, aql.HOST_FLAGS, host=True).va
    elif value == "unaligned":
        value = args.read_pointer_address + 4
    setattr(args, field, value)
    with pytest.raises(OSError, match=match) as e:
        _raw_ioctl(rig, driver.CREATE_QUEUE, args)
    assert e.value.errno == errno.EINVAL


def test_waiting_on_a_signal_nothing_will_lower_is_a_hang(rig: Rig) -> None:
    s = rig.signals.take(1.0)  # armed, but no packet carries it
    with pytest.raises(MockHang, match="would sleep forever"):
        rig.signals.wait(s, 5.0)


def test_wait_event_with_no_timeout_polls(rig: Rig) -> None:
    rig.signals.take(1.0)
    data = driver.EventData(event_id=rig.signals.event_id)
    args = driver.WaitEventsArgs(events_ptr=ctypes.addressof(data), num_events=1, wait_for_all=1, timeout=0)
    _raw_ioctl(rig, driver.WAIT_EVENTS, args)
    assert args.wait_result == driver.WAIT_TIMEOUT


# ---------------------------------------------------------------- dispatches


def test_hand_built_dispatch_runs_the_kernel_and_completes_its_signal(rig: Rig, built: Built) -> None:
    out, signal = dispatch(rig, built)
    assert list(struct.unpack(f"{N}f", out.view(0, N * 4))) == [i * 2.0 + 5 for i in range(N)]
    assert signal.value == 0 and signal.end_ts >= signal.start_ts > 0  # the queue has profiling on
    assert rig.queue.read_id == rig.queue.write_id == 1
    mailbox = struct.unpack_from("<Q", rig.kfd.event_page.view(0), (rig.signals.mailbox - rig.kfd.event_page.va))[0]
    assert mailbox == rig.signals.event_id  # the completion wrote the event id into its mailbox
    assert rig.mock.stats.dispatches == 1


def test_many_dispatches_wrap_the_ring(rig: Rig, built: Built) -> None:
    out, inp = rig.buffers()
    ko, ka = rig.load(built), rig.kernargs(built, out.va, inp.va, 1)
    for _ in range(3 * rig.queue.packets // 2):  # the ring holds 64 packets: it wraps
        p, signal = rig.packet(built, ko, ka)
        rig.queue.submit(p)
        if rig.queue.write_id % 16 == 0:
            rig.signals.wait(signal, 5.0)
    rig.signals.wait(signal, 5.0)
    assert rig.mock.stats.dispatches == 96 and rig.queue.read_id == 96


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"workgroup_size_x": 0}, r"sizes must be at least 1"),
        ({"grid_size_x": N + 1}, r"not a whole number of workgroups"),
        ({"workgroup_size_x": 64, "grid_size_x": 2 * N}, r"exceeds its max_flat_workgroup_size 32"),
        (
            {"workgroup_size_x": 16, "grid_size_x": N // 2},
            r"built for \(32, 1, 1\) work-items per workgroup, the packet gives \(16, 1, 1\)",
        ),
        ({"setup": 0}, r"dimension count"),
        ({"setup": 1, "grid_size_y": 2, "workgroup_size_y": 1}, r"not 1 beyond them"),
        ({"workgroup_size_x": 1024, "workgroup_size_y": 2, "grid_size_x": 4096, "grid_size_y": 2}, r"more than 1024"),
        ({"header": aql.PACKET_TYPE_INVALID}, r"still INVALID"),
        ({"header": 0}, r"never set to INVALID"),
        ({"header": aql.dispatch_header() | 3 << aql.HEADER_ACQUIRE_SCOPE}, r"fence scopes"),
        ({"group_segment_size": 1 << 20}, r"group_segment_size"),
        ({"reserved2": 1}, r"reserved fields"),
    ],
)
def test_bad_packets_are_refused_saying_what_is_wrong(rig: Rig, built: Built, fields: dict, match: str) -> None:
    with pytest.raises(PacketError, match=match):
        dispatch(rig, built, **fields)
    assert rig.mock.stats.dispatches == 0


def test_kernel_object_must_be_a_loaded_descriptor(rig: Rig, built: Built) -> None:
    ko = rig.load(built)
    with pytest.raises(PacketError, match="not 64-byte aligned"):
        dispatch(rig, built, kernel_object=ko + 8)


def test_kernel_object_in_memory_that_is_not_executable(rig: Rig, built: Built) -> None:
    data = rig.kfd.alloc(8192, aql.HOST_FLAGS, host=True)
    with pytest.raises(PacketError, match="without EXECUTABLE"):
        dispatch(rig, built, kernel_object=data.va)


def test_kernel_object_whose_code_was_overwritten(rig: Rig, built: Built) -> None:
    ko = rig.load(built)
    info = built.code.kernels["scale"]
    ctypes.memset(ko - info.descriptor_vaddr + info.code_vaddr, 0, 16)  # the first instructions, clobbered
    with pytest.raises(PacketError, match="not the descriptor of a kernel of any code object loaded there"):
        dispatch(rig, built, kernel_object=ko)


def test_kernargs_are_checked_against_the_metadata(rig: Rig, built: Built) -> None:
    out, inp = rig.buffers()
    ko = rig.load(built)
    cases = [
        (rig.kernargs(built, 0xDEAD0000, inp.va, 5), r"buffer 0 \(kernarg offset 0\) is 0xdead0000, in no mapped"),
        (rig.kernargs(built, out.va + 4096 - 8, inp.va, 5), r"buffer 0 at .* holds 512 bytes for the kernel"),
        (rig.kernargs(built, out.va, inp.va, 5) + 8, r"not aligned"),
    ]
    for address, match in cases:
        p, _ = rig.packet(built, ko, address)
        rig.queue.submit(p)
        with pytest.raises(PacketError, match=match):
            rig.mock.gpu.run_queues()
        rig.queue.amd_queue.read_dispatch_id += 1  # past the refused packet, as a queue reset would
    big = rig.kfd.alloc(4096, aql.HOST_FLAGS, host=True)
    p, _ = rig.packet(built, ko, big.va + 4096 - 16)  # the block runs past the end of its allocation
    rig.queue.submit(p)
    with pytest.raises(PacketError, match=r"the kernarg block of \d+ bytes"):
        rig.mock.gpu.run_queues()


def test_completion_signal_must_be_armed_and_valid(rig: Rig, built: Built) -> None:
    out, inp = rig.buffers()
    ko, ka = rig.load(built), rig.kernargs(built, out.va, inp.va, 5)
    p, signal = rig.packet(built, ko, ka)
    signal.value = 0  # never armed
    rig.queue.submit(p)
    with pytest.raises(PacketError, match="completion signal's value is 0"):
        rig.mock.gpu.run_queues()
    rig.queue.amd_queue.read_dispatch_id += 1
    p, signal = rig.packet(built, ko, ka, completion_signal=rig.signals.address(signal) + 8)
    rig.queue.submit(p)
    with pytest.raises(PacketError, match="not 64-byte aligned"):
        rig.mock.gpu.run_queues()


def test_a_packet_the_doorbell_has_not_announced_does_not_run(rig: Rig, built: Built) -> None:
    out, inp = rig.buffers()
    p, signal = rig.packet(built, rig.load(built), rig.kernargs(built, out.va, inp.va, 5))
    rig.queue.submit(p)
    rig.queue.doorbell.value = 5  # announces packets that were never written
    with pytest.raises(PacketError, match="doorbell announces packet 5, but the write id is 1"):
        rig.mock.gpu.run_queues()


def test_sizes_must_be_the_ones_the_program_was_built_for(rig: Rig, built: Built) -> None:
    out, inp = rig.buffers()
    ka = rig.kernargs(built, out.va, inp.va, 5, groups=8, local=16)  # consistent with the packet, not the program
    p, _ = rig.packet(built, rig.load(built), ka, workgroup_size_x=16)
    rig.queue.submit(p)
    with pytest.raises(PacketError, match=r"built for \(4, 1, 1\) workgroups, the packet gives \(8, 1, 1\)"):
        rig.mock.gpu.run_queues()


def test_hidden_arguments_are_checked(rig: Rig, implicit: Built) -> None:
    kinds = {a.kind for a in implicit.code.kernels["wgsize"].args}
    assert {"hidden_block_count_x", "hidden_group_size_x"} <= kinds
    out = rig.kfd.alloc(N * 4, aql.HOST_FLAGS, host=True)
    good = rig.kernargs(implicit, out.va, 0, 0)
    p, signal = rig.packet(implicit, rig.load(implicit), good)
    rig.queue.submit(p)
    rig.signals.wait(signal, 5.0)
    assert list(struct.unpack(f"{N}i", out.view(0, N * 4))) == [LOCAL] * N
    p, _ = rig.packet(implicit, rig.load(implicit), rig.kernargs(implicit, out.va, 0, 0, groups=3))
    rig.queue.submit(p)
    with pytest.raises(PacketError, match=r"hidden_block_count_x at kernarg offset \d+ is 3, expected 4"):
        rig.mock.gpu.run_queues()


def test_memory_outside_the_gpu_vm_aperture_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mock_module, "GPUVM_LIMIT", (1 << 32) - 1)  # a 4 GiB VM: the CPU gives higher addresses
    host = MockKFD("gfx1100")
    kfd = KFD(host, gpu_nodes(host)[0])
    with pytest.raises(MemoryError, match="outside the GPU's VM aperture"):
        kfd.alloc(4096, aql.HOST_FLAGS, host=True)
    kfd.close()


def test_freed_memory_goes_back_and_is_reused(rig: Rig) -> None:
    a = rig.kfd.alloc(3 * 4096, aql.HOST_FLAGS, host=True)
    a.view(0, 4)[:] = b"abcd"
    offset = rig.mock.memory[a.handle].mmap_offset
    rig.kfd.free(a)
    b = rig.kfd.alloc(2 * 4096, aql.HOST_FLAGS, host=True)  # first fit: the hole a left
    assert rig.mock.memory[b.handle].mmap_offset == offset
    assert bytes(b.view(0, 4)) == bytes(4)  # its pages were given back: fresh zeros
    holes = rig.mock._holes
    assert all(o1 + n1 < o2 for (o1, n1), (o2, _) in zip(holes, holes[1:]))  # sorted, neighbours merged
