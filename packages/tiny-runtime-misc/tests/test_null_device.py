"""The NULL device: it takes everything a device takes, runs nothing, and reads back zeros."""

from __future__ import annotations

import ctypes

from tiny.ir.device import Buffer, CompiledProgram, Device, available
from tiny.ir.dtypes import dtypes
from tiny.runtime.null import NullAllocator, NullCompiler, NullDevice, NullProgram


def test_null_through_entry_points() -> None:
    dev = Device["NULL"]
    assert isinstance(dev, NullDevice) and Device["null"] is dev
    assert dev.renderer_name == "C"
    assert NullDevice.priority < 0  # never chosen as the default
    status = {s.name: s for s in available()}
    assert status["NULL"].ok


def test_null_compiles_to_nothing() -> None:
    assert NullCompiler().compile("this is not C at all {") == b""
    assert Device["NULL"].compile("void k(void) {}") == b""


def test_null_programs_run_nothing() -> None:
    dev = Device["NULL"]
    prog = dev.load(CompiledProgram("k", "NULL", "C", "void k(void) {}", b"", 1, (0,), ()))
    assert isinstance(prog, NullProgram)
    buf = dev.allocator.alloc(16)
    assert prog(buf, global_size=(4, 1, 1), vals=(3,)) is None
    assert prog(buf, wait=True) == 0.0


def test_null_memory_reads_back_zeros() -> None:
    alloc = NullAllocator()
    opaque = alloc.alloc(8)
    alloc.copyin(opaque, memoryview(b"abcdefgh"))
    out = bytearray(b"\xff" * 8)
    alloc.copyout(memoryview(out), opaque)
    assert out == bytes(8)
    alloc.free(opaque, 8)


def test_null_buffers() -> None:
    buf = Buffer("NULL", 4, dtypes.float32)
    buf.copyin(memoryview((ctypes.c_float * 4)(1, 2, 3, 4)))
    assert buf.is_allocated and buf.as_bytes() == bytes(16)
    other = Buffer("NULL", 4, dtypes.float32)
    other.copy_from(buf)
    assert other.as_bytes() == bytes(16)
