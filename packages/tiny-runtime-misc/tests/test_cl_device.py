"""The CL device on whatever OpenCL driver the machine has (PoCL on CI): opening it, its limits, hand-written and
generated kernels with local memory and barriers, timing, and the errors a user sees. Skips, saying why, where
no OpenCL device opens; the errors for a missing library and a missing device are checked everywhere."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.program import build_program
from tiny.ir.device import Buffer, CompileError, Device, DeviceUnavailable, buffer_of, new_buffer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp
from tiny.runtime import cl
from tiny.runtime.cl import CLCompiler, CLDevice, CLError, CLProgram

f32, i32 = dtypes.float32, dtypes.int32


def _open() -> tuple[CLDevice | None, str]:
    try:
        dev = Device["CL"]
    except Exception as e:  # noqa: BLE001  (any failure to open: skip with the reason)
        return None, f"{type(e).__name__}: {e}"
    assert isinstance(dev, CLDevice)
    return dev, ""


DEV, WHY = _open()
needs_cl = pytest.mark.skipif(DEV is None, reason=f"no OpenCL device opens here: {WHY}")


@pytest.fixture
def dev() -> CLDevice:
    assert DEV is not None
    return DEV


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEDB", str(tmp_path / "cache.db"))


def upload(device: str, dt: DType, values: list) -> Buffer:
    return Buffer(device, len(values), dt).copyin(memoryview(bytearray(struct.pack(f"{len(values)}{dt.fmt}", *values))))


def download(buf: Buffer) -> list:
    return list(struct.unpack(f"{buf.size}{buf.dtype.fmt}", buf.as_bytes()))


def launch(dev: CLDevice, src: str, name: str, *bufs: Buffer, **kw: object) -> float | None:
    prog = CLProgram(dev, name, dev.compile(src))
    return prog(*(b.opaque for b in bufs), **kw)  # type: ignore[arg-type]


REVERSE = """
__kernel void reverse(__global float* out, __global const float* in, int scale) {
  __local float tmp[8];
  int l = get_local_id(0), g = get_group_id(0);
  tmp[l] = in[g * 8 + l];
  barrier(CLK_LOCAL_MEM_FENCE);
  out[g * 8 + l] = tmp[7 - l] * scale;
}
"""


# ---------------------------------------------------------------- the device


@needs_cl
def test_device_opens_with_its_limits_and_features_in_the_renderer(dev: CLDevice) -> None:
    caps, info = dev.renderer.caps, dev.info
    assert dev.renderer_name == "OPENCL" and caps.language == "OpenCL"
    assert caps.has_local and caps.has_shared
    assert caps.local_total_max == info.max_work_group and caps.local_max == info.max_work_items
    assert caps.shared_max == info.local_mem and caps.vector_width >= 4
    assert (dtypes.float16 in caps.dtypes) == ("cl_khr_fp16" in info.extensions)
    assert (dtypes.float64 in caps.dtypes) == ("cl_khr_fp64" in info.extensions)
    assert {dtypes.float32, dtypes.int32, dtypes.int64, dtypes.bfloat16, dtypes.bool} <= caps.dtypes
    assert not dev.allocator.caps.host_visible


@needs_cl
def test_never_the_default_over_cpu() -> None:
    from tiny.runtime.cpu import CPUDevice

    assert CLDevice.priority < CPUDevice.priority


@needs_cl
def test_compiler_cache_key_names_platform_device_and_driver(dev: CLDevice) -> None:
    key = CLCompiler(dev).cachekey
    assert key is not None
    for part in (dev.info.platform_name, dev.info.name, dev.info.driver):
        assert part in key


@needs_cl
def test_buffers_round_trip(dev: CLDevice) -> None:
    values = [float(v) / 3 for v in range(1000)]
    assert download(upload("CL", f32, values)) == pytest.approx(values, rel=1e-7)
    src = upload("CL", i32, list(range(-5, 5)))
    dst = Buffer("CL", 10, i32)
    dst.copy_from(src)
    assert download(dst) == list(range(-5, 5))


# ---------------------------------------------------------------- kernels


@needs_cl
def test_hand_written_kernel_with_local_memory_barrier_and_an_int_argument(dev: CLDevice) -> None:
    out, a = Buffer("CL", 32, f32), upload("CL", f32, [float(v) for v in range(32)])
    seconds = launch(dev, REVERSE, "reverse", out, a, vals=(2,), global_size=(4, 1, 1), local_size=(8, 1, 1), wait=True)
    assert isinstance(seconds, float) and 0 <= seconds < 10
    want = [2.0 * (g * 8 + 7 - lane) for g in range(4) for lane in range(8)]
    assert download(out) == want


@needs_cl
def test_launch_without_waiting_returns_none_and_synchronize_finishes_it(dev: CLDevice) -> None:
    out, a = Buffer("CL", 16, f32), upload("CL", f32, [1.0] * 16)
    assert launch(dev, REVERSE, "reverse", out, a, vals=(3,), global_size=(2, 1, 1), local_size=(8, 1, 1)) is None
    dev.synchronize()
    assert download(out) == [3.0] * 16


@needs_cl
def test_a_cached_binary_loads_without_its_source(dev: CLDevice) -> None:
    binary = CLCompiler(dev).compile(REVERSE)
    cl.library().clReleaseProgram(dev.built.pop(binary))  # as in a new process: only the binary is left
    prog = CLProgram(dev, "reverse", binary)
    out, a = Buffer("CL", 8, f32), upload("CL", f32, [float(v) for v in range(8)])
    prog(out.opaque, a.opaque, vals=(1,), local_size=(8, 1, 1))
    assert download(out) == [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def _grouped_sum(rows: int, cols: int) -> tuple[UOp, Buffer]:
    """The kernel AST of x.sum(axis=1) for a (rows, cols) buffer on CL, and the buffer."""
    node = new_buffer("CL", rows * cols, f32)
    x = UOp(Ops.RESHAPE, f32, (node,), (rows, cols))
    total = UOp(Ops.REDUCE_AXIS, f32, (x,), (Ops.ADD, (1,)))
    (item,) = create_schedule([total]).items
    return item.ast, buffer_of(node)


@needs_cl
def test_generated_grouped_reduction_uses_local_memory_and_a_barrier(dev: CLDevice) -> None:
    rows, cols = 3, 256
    ast, inp = _grouped_sum(rows, cols)
    values = [math.sin(i) for i in range(rows * cols)]
    inp.copyin(memoryview(bytearray(struct.pack(f"{rows * cols}f", *values))))
    prog = build_program(ast, dev, [Opt(OptOps.GROUP, 1, 16), Opt(OptOps.UNROLL, 1, 4)])
    assert "__local float temp0[" in prog.src and "barrier(CLK_LOCAL_MEM_FENCE);" in prog.src
    assert prog.local_size == (16, 1, 1)
    out = Buffer("CL", rows, f32)
    dev.load(prog)(out.opaque, inp.opaque, global_size=prog.global_size, local_size=prog.local_size)
    want = [sum(values[r * cols : (r + 1) * cols]) for r in range(rows)]
    assert download(out) == pytest.approx(want, rel=1e-4, abs=1e-4)


# ---------------------------------------------------------------- errors


@needs_cl
def test_compile_error_carries_the_build_log_and_the_source(dev: CLDevice) -> None:
    src = "__kernel void broken(__global float* out) { out[0] = undeclared_thing; }"
    with pytest.raises(CompileError, match="undeclared_thing") as e:
        CLCompiler(dev).compile(src)
    assert "--- source ---" in str(e.value) and dev.info.name in str(e.value)


@needs_cl
def test_a_kernel_name_the_program_lacks(dev: CLDevice) -> None:
    with pytest.raises(CompileError, match="no kernel named 'nope'"):
        CLProgram(dev, "nope", dev.compile(REVERSE))


@needs_cl
def test_wrong_number_of_arguments(dev: CLDevice) -> None:
    prog = CLProgram(dev, "reverse", dev.compile(REVERSE))
    with pytest.raises(TypeError, match="takes 3 arguments, got 2 buffers and 0 ints"):
        prog(Buffer("CL", 8, f32).opaque, Buffer("CL", 8, f32).opaque)


@needs_cl
def test_a_workgroup_bigger_than_the_device_allows(dev: CLDevice) -> None:
    prog = CLProgram(dev, "reverse", dev.compile(REVERSE))
    too_big = dev.info.max_work_group * 2
    bufs = (Buffer("CL", 8, f32).opaque, Buffer("CL", 8, f32).opaque)
    with pytest.raises(CLError, match="CL_INVALID_WORK_(GROUP|ITEM)_SIZE.*workgroup"):
        prog(*bufs, vals=(1,), global_size=(1, 1, 1), local_size=(too_big, 1, 1))
    with pytest.raises(ValueError, match="3 sizes >= 1"):
        prog(*bufs, vals=(1,), global_size=(0, 1, 1))


@needs_cl
def test_an_allocation_larger_than_the_device_allows_is_a_memory_error(dev: CLDevice) -> None:
    with pytest.raises(MemoryError, match="at most"):
        dev.allocator.alloc(dev.info.max_alloc + 1)


def test_a_device_index_past_the_last_device_says_what_there_is() -> None:
    count = len(cl.devices()) if DEV is not None else 0
    if DEV is None:
        pytest.skip(f"no OpenCL device to count: {WHY}")
    with pytest.raises(DeviceUnavailable, match=f"CL:{count} does not exist: this machine has {count}"):
        CLDevice(f"CL:{count}", "OPENCL")


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cl, "LIBRARY", "libOpenCL-that-is-not-there.so.1")
    cl.library.cache_clear()
    cl.devices.cache_clear()
    yield
    monkeypatch.undo()
    cl.library.cache_clear()
    cl.devices.cache_clear()


def test_a_missing_opencl_library_is_a_clear_device_unavailable(no_library: None) -> None:
    with pytest.raises(DeviceUnavailable, match="OpenCL ICD loader.*not installed.*apt install ocl-icd-libopencl1"):
        CLDevice("CL", "OPENCL")


def test_python_m_tiny_ir_device_lists_cl() -> None:
    r = subprocess.run([sys.executable, "-m", "tiny.ir.device"], capture_output=True, text=True, timeout=300)
    line = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["CL"])
    if DEV is not None:
        assert "yes" in line and "CLDevice, renderer OPENCL" in line
    else:
        assert "no" in line and "DeviceUnavailable" in line
