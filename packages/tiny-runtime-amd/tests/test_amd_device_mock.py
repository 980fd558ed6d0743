"""The AMD device (tiny.runtime.amd.kfd) on the mock kernel driver (AMD_MOCK): memory and copies, loading code
objects and launching them with their kernargs laid out per the metadata (hidden arguments included), timing,
the clear reports when it cannot start or cannot run a kernel, and tensors end to end."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from amd_helpers import compiler
from test_amd_kfd_mock import GROUPS, IMPLICIT_IR, LOCAL, N, scale_kernel, wgsize_kernel

from tiny.ir.device import CompileError, DeviceUnavailable
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp
from tiny.runtime.amd.kfd import AMDDevice, DeviceMemory, hidden_value
from tiny.runtime.amd.mock import MockKFD
from tiny.runtime.amd.mock_gpu import PacketError

pytest.importorskip("tiny.runtime.python", reason="the mock runs kernels on tiny-runtime-misc's PYTHON device")


@pytest.fixture(scope="module")
def dev() -> Iterator[AMDDevice]:
    compiler("gfx1100")  # skips where the toolchain is missing
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMD_MOCK", "gfx1100")
        yield AMDDevice("AMD", "AMDGPU")


def mock(dev: AMDDevice) -> MockKFD:
    host = dev.kfd.host
    assert isinstance(host, MockKFD)
    return host


def test_device_reads_its_target_from_the_topology(dev: AMDDevice) -> None:
    assert dev.target == "gfx1100" and dev.renderer.target == "gfx1100"
    assert dev.node.cu_count == 96 and dev.timestamp_hz > 0


def test_memory_copies_and_views(dev: AMDDevice) -> None:
    a = dev.allocator
    buf = a.alloc(1000)
    assert isinstance(buf, DeviceMemory) and buf.va % 4096 == 0
    a.copyin(buf, memoryview(bytes(range(200)) * 5))
    out = bytearray(1000)
    a.copyout(memoryview(out), buf)
    assert out == bytes(range(200)) * 5
    view = a.offset(buf, 200, 100)
    assert bytes(a.as_memoryview(view, 100)) == bytes(range(100))
    assert bytes(mock(dev).gpu_view(view.va, 100, "test")) == bytes(range(100))  # the GPU sees the same bytes
    with pytest.raises(ValueError, match="outside a buffer of 1000 bytes"):
        a.offset(buf, 990, 20)
    a.free(buf, 1000)


def _load(dev: AMDDevice, name: str, src: str, uops: list) -> object:
    binary = dev.compile(src)
    mock(dev).register(binary, name, uops)
    return dev.program(dev, name, binary)


def test_program_runs_with_buffers_and_ints_and_reports_its_time(dev: AMDDevice) -> None:
    uops = scale_kernel()
    prog = _load(dev, "scale", dev.renderer.render("scale", uops), uops)
    out, inp = dev.allocator.alloc(N * 4), dev.allocator.alloc(N * 4)
    dev.allocator.copyin(inp, memoryview(struct.pack(f"{N}f", *range(N))))
    before = mock(dev).stats.dispatches
    assert prog(out, inp, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), vals=(7,)) is None  # no wait
    t = prog(out, inp, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), vals=(3,), wait=True)
    assert isinstance(t, float) and t > 0  # from the signal's timestamps
    result = bytearray(N * 4)
    dev.allocator.copyout(memoryview(result), out)
    assert list(struct.unpack(f"{N}f", result)) == [i * 2.0 + 3 for i in range(N)]
    assert mock(dev).stats.dispatches == before + 2
    with pytest.raises(TypeError, match="takes 2 buffers and 1 ints, got 1 buffers and 1 ints"):
        prog(out, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), vals=(3,))
    with pytest.raises(ValueError, match="exceeds its 32 work-items"):
        prog(out, inp, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(3,))


def test_hidden_arguments_are_filled_as_the_metadata_asks(dev: AMDDevice) -> None:
    prog = _load(dev, "wgsize", IMPLICIT_IR, wgsize_kernel())
    out = dev.allocator.alloc(N * 4)
    prog(out, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), wait=True)
    result = bytearray(N * 4)
    dev.allocator.copyout(memoryview(result), out)
    assert list(struct.unpack(f"{N}i", result)) == [LOCAL] * N


@pytest.mark.parametrize(
    "kind,value",
    [
        ("hidden_block_count_x", 4),
        ("hidden_block_count_z", 2),
        ("hidden_group_size_y", 8),
        ("hidden_remainder_x", 0),
        ("hidden_grid_dims", 3),
        ("hidden_queue_ptr", 0x1000),
        ("hidden_printf_buffer", 0),
    ],
)
def test_hidden_values(kind: str, value: int) -> None:
    assert hidden_value(kind, (4, 3, 2), (16, 8, 1), 0x1000) == value


SCRATCH_IR = """
define amdgpu_kernel void @spill(ptr addrspace(1) %out, i32 %n) {
  %a = alloca [64 x i32], align 4, addrspace(5)
  %p = getelementptr [64 x i32], ptr addrspace(5) %a, i32 0, i32 %n
  store volatile i32 1, ptr addrspace(5) %p
  %q = getelementptr [64 x i32], ptr addrspace(5) %a, i32 0, i32 3
  %v = load volatile i32, ptr addrspace(5) %q
  store i32 %v, ptr addrspace(1) %out
  ret void
}
"""


def spill_kernel() -> list[UOp]:
    """What SCRATCH_IR computes for n = 3, as a program: out[0] = n - 2."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(1), (), 0)
    n = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 0, 63))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, UOp.const(dtypes.int32, 0))), n - 2))
    return [u for u in UOp(Ops.SINK, dtypes.void, (st,)).toposort if u.op is not Ops.SINK]


def test_a_kernel_that_needs_scratch_gets_it(dev: AMDDevice) -> None:
    prog = _load(dev, "spill", SCRATCH_IR, spill_kernel())
    assert prog.info.private_segment_size >= 256  # the 64 ints live in scratch
    out = dev.allocator.alloc(4)
    prog(out, vals=(3,), wait=True)
    result = bytearray(4)
    dev.allocator.copyout(memoryview(result), out)
    assert struct.unpack("i", result)[0] == 1
    q = dev.queue
    assert q.scratch is not None and q.scratch_per_lane >= prog.info.private_segment_size
    assert q.amd_queue.scratch_backing_memory_location == q.scratch.va and q.amd_queue.compute_tmpring_size
    location = q.amd_queue.scratch_backing_memory_location
    q.amd_queue.scratch_backing_memory_location = 0  # the mock checks what the packet processor would use
    try:
        with pytest.raises(PacketError, match="needs .* bytes of scratch per work-item, but the queue's scratch"):
            prog(out, vals=(3,), wait=True)
    finally:
        q.amd_queue.scratch_backing_memory_location = location
        q.amd_queue.read_dispatch_id = q.write_id  # past the refused packet, its signal released
        assert dev.last is not None
        dev.last.value, dev.last = 0, None


def test_a_code_object_without_the_kernel(dev: AMDDevice) -> None:
    with pytest.raises(CompileError, match="no kernel named 'nope'"):
        dev.program(dev, "nope", dev.compile(IMPLICIT_IR))


def test_a_gfx_target_the_toolchain_does_not_know_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    known = compiler("gfx1100").toolchain.processors
    target = next(t for t in ("gfx950", "gfx1036", "gfx1250", "gfx9ff") if t not in known)
    monkeypatch.setenv("AMD_MOCK", target)
    with pytest.raises(DeviceUnavailable, match=f"does not know the AMDGPU target {target}"):
        AMDDevice("AMD", "AMDGPU")


def test_a_second_gpu_that_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMD_MOCK", "gfx1100")
    with pytest.raises(DeviceUnavailable, match="AMD:1 does not exist: the topology has 1 GPU"):
        AMDDevice("AMD:1", "AMDGPU")


def test_tensors_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    compiler("gfx1100")  # skips where the toolchain is missing
    np = pytest.importorskip("numpy")
    tensor = pytest.importorskip("tiny.tensor")
    pytest.importorskip("tiny.codegen")
    monkeypatch.setenv("AMD_MOCK", "gfx1100")
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    t = tensor.Tensor(x, device="AMD")
    got = ((t * 2 + 1).sum(axis=1) + (t @ t.T).max()).numpy()
    np.testing.assert_allclose(got, (x * 2 + 1).sum(axis=1) + (x @ x.T).max(), rtol=1e-6)
