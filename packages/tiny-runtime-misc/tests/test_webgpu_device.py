"""The WEBGPU device: opening it through the entry points, its buffers (sizes that are not whole words), hand-written
WGSL programs with variables, folded grids and timing, compile errors with the source, and why it is missing where
wgpu or an adapter is. Skips with the reason where wgpu or an adapter is absent."""

from __future__ import annotations

import struct

import pytest

from tiny.ir.device import (
    Buffer,
    CompileError,
    Device,
    DeviceUnavailable,
    available,
    device_entry_points,
    fold_grid,
)
from tiny.ir.dtypes import dtypes
from tiny.runtime import webgpu
from tiny.runtime.webgpu import WebGPUDevice


@pytest.fixture(scope="module")
def dev() -> WebGPUDevice:
    try:
        d = Device["WEBGPU"]
    except DeviceUnavailable as e:
        pytest.skip(f"WEBGPU cannot open here: {e}")
    assert isinstance(d, WebGPUDevice)
    return d


def test_registered_and_never_the_default_over_cpu() -> None:
    assert "WEBGPU" in device_entry_points()
    cls = device_entry_points()["WEBGPU"].load()
    assert cls is WebGPUDevice and cls.renderers == ("WGSL",)
    assert cls.priority < device_entry_points()["CPU"].load().priority
    status = {s.name: s for s in available()}["WEBGPU"]
    assert status.ok or status.reason  # present, or says why not


def test_missing_wgpu_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wgpu(name, *args, **kwargs):
        if name == "wgpu":
            raise ImportError("No module named 'wgpu'")
        return real_import(name, *args, **kwargs)

    webgpu._wgpu.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_wgpu)
    try:
        with pytest.raises(DeviceUnavailable, match=r"needs wgpu-py: pip install 'tiny-runtime-misc\[webgpu\]'"):
            webgpu._wgpu()
    finally:
        monkeypatch.undo()
        webgpu._wgpu.cache_clear()


def test_no_adapter_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        wgpu = webgpu._wgpu()
    except DeviceUnavailable as e:
        pytest.skip(str(e))
    webgpu._gpu_device.cache_clear()
    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: [])
    try:
        with pytest.raises(DeviceUnavailable, match="wgpu found no adapter .*mesa-vulkan-drivers"):
            webgpu._gpu_device()
    finally:
        monkeypatch.undo()
        webgpu._gpu_device.cache_clear()


class _Adapter:
    def __init__(self, backend: str, kind: str, name: str) -> None:
        self.info = {"backend_type": backend, "adapter_type": kind, "device": name}


def test_an_opengl_adapter_is_refused_with_the_reason() -> None:
    """wgpu offers Mesa's llvmpipe through OpenGL where no Vulkan driver is installed; integer % is wrong there."""
    with pytest.raises(DeviceUnavailable, match=r"llvmpipe through OpenGL: integer % and / .*mesa-vulkan-drivers"):
        webgpu.choose_adapter([_Adapter("OpenGL", "CPU", "llvmpipe")])


def test_the_most_capable_trusted_adapter_is_chosen() -> None:
    adapters = [
        _Adapter("OpenGL", "DiscreteGPU", "gl"),
        _Adapter("Vulkan", "CPU", "lavapipe"),
        _Adapter("Vulkan", "IntegratedGPU", "igpu"),
    ]
    assert webgpu.choose_adapter(adapters).info["device"] == "igpu"
    assert webgpu.choose_adapter(adapters[:2]).info["device"] == "lavapipe"


def test_the_device_never_runs_on_opengl(dev: WebGPUDevice) -> None:
    """On a machine whose wgpu offers both (this one: lavapipe through Vulkan, llvmpipe through OpenGL), Vulkan."""
    assert dev.gpu.adapter.info["backend_type"] not in webgpu.UNTRUSTED_BACKENDS


def test_renderer_target_reads_the_adapter(dev: WebGPUDevice) -> None:
    caps = dev.renderer.caps
    assert caps.language == "WGSL" and caps.has_local and caps.has_shared
    assert dtypes.float64 not in caps.dtypes and dtypes.int64 not in caps.dtypes
    assert (dtypes.float16 in caps.dtypes) == ("shader-f16" in dev.gpu.features)
    assert caps.local_total_max == dev.gpu.limits["max-compute-invocations-per-workgroup"]
    assert caps.shared_max == dev.gpu.limits["max-compute-workgroup-storage-size"]
    assert caps.max_buffers == dev.gpu.limits["max-storage-buffers-per-shader-stage"]
    assert caps.max_loop_iterations == (65535 if "llvmpipe" in str(dev.gpu.adapter.info).lower() else 0)


@pytest.mark.parametrize("n", [1, 3, 4, 7, 1001])
def test_buffers_round_trip_any_size(dev: WebGPUDevice, n: int) -> None:
    data = bytes((i * 37 + 11) % 256 for i in range(n))
    buf = Buffer("WEBGPU", n, dtypes.uint8).copyin(memoryview(data))
    assert buf.as_bytes() == data
    other = Buffer("WEBGPU", n, dtypes.uint8)
    other.copy_from(buf)
    assert other.as_bytes() == data


SCALE = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> inp: array<f32>;
@group(0) @binding(2) var<storage, read> tiny_vars: array<i32>;
@compute @workgroup_size(4, 1, 1)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = i32(wid.x) * 4 + i32(lid.x);
  out[i] = inp[i] * f32(tiny_vars[0]) + f32(tiny_vars[1]);
}
"""


def test_a_program_with_variables(dev: WebGPUDevice) -> None:
    binary = dev.compile(SCALE)
    prog = dev.program(dev, "scale", binary)
    inp = Buffer("WEBGPU", 8, dtypes.float32).copyin(memoryview(struct.pack("8f", *range(8))))
    out = Buffer("WEBGPU", 8, dtypes.float32)
    elapsed = prog(out.opaque, inp.opaque, global_size=(2, 1, 1), local_size=(4, 1, 1), vals=(3, -1), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    assert struct.unpack("8f", out.as_bytes()) == tuple(3.0 * i - 1 for i in range(8))
    with pytest.raises(ValueError, match="takes 3 bindings"):
        prog(out.opaque, inp.opaque, global_size=(2, 1, 1))


FOLDED = """
@group(0) @binding(0) var<storage, read_write> out: array<i32>;
@compute @workgroup_size(1, 1, 1)
fn count(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let flat = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
  if (flat < 70000u) { out[flat] = i32(flat); }
}
"""


def test_a_grid_over_the_limit_is_dispatched_folded(dev: WebGPUDevice) -> None:
    assert fold_grid((10, 2, 1), 16) == (10, 2, 1)
    assert fold_grid((100, 1, 1), 16) == (16, 7, 1)
    with pytest.raises(ValueError, match="more than a device can launch"):
        fold_grid((5000, 1, 1), 16)
    n = 70000
    assert n > dev.max_workgroups or dev.max_workgroups > 65535
    prog = dev.program(dev, "count", dev.compile(FOLDED))
    out = Buffer("WEBGPU", n, dtypes.int32)
    prog(out.opaque, global_size=(n, 1, 1))
    assert struct.unpack(f"{n}i", out.as_bytes()) == tuple(range(n))


def test_bad_wgsl_is_a_compile_error_with_the_source(dev: WebGPUDevice) -> None:
    bad = "@compute @workgroup_size(1) fn broken() { let x: i32 = 1.5f; }"
    with pytest.raises(CompileError, match="refused the generated WGSL") as e:
        dev.compile(bad)
    assert "fn broken()" in str(e.value)


def test_a_buffer_over_the_adapter_limit_is_refused(dev: WebGPUDevice) -> None:
    too_big = dev.allocator.max_size + 1
    with pytest.raises(MemoryError, match="over the adapter's limit"):
        Buffer("WEBGPU", too_big, dtypes.uint8).ensure_allocated()


def test_too_many_buffers_for_the_adapter_is_a_clear_compile_error(dev: WebGPUDevice) -> None:
    limit = dev.gpu.limits["max-storage-buffers-per-shader-stage"]
    decls = "".join(f"@group(0) @binding({i}) var<storage, read> b{i}: array<f32>;\n" for i in range(limit + 1))
    src = decls + "@compute @workgroup_size(1) fn k() { }\n"
    with pytest.raises(CompileError, match=f"binds {limit + 1} storage buffers.*allows {limit}"):
        dev.compile(src)


def test_a_kernel_reading_more_tensors_than_the_adapter_binds_is_split(dev: WebGPUDevice) -> None:
    Tensor = pytest.importorskip("tiny.tensor").Tensor  # (installed by the webgpu session)

    limit = dev.renderer.caps.max_buffers
    parts = [Tensor([float(i), -float(i)], device="WEBGPU") for i in range(limit + 9)]
    out = Tensor.cat(*parts) * 2
    items = out.schedule()
    assert len(items) >= 2 and all(len(item.buffers) <= limit for item in items)
    assert out.tolist() == [v for i in range(limit + 9) for v in (2.0 * i, -2.0 * i)]


def test_long_reductions_are_split_under_the_drivers_loop_limit(dev: WebGPUDevice) -> None:
    """On llvmpipe a thread stops after 65535 loop iterations: a sum of 10**6 elements per output runs as two
    kernels of about 1000 iterations each, and every output is right."""
    Tensor = pytest.importorskip("tiny.tensor").Tensor  # (installed by the webgpu session)

    x = (Tensor.arange(64, dtype="int32", device="WEBGPU") % 7).realize()
    out = x.reshape(64, 1, 1).expand(64, 1000, 1000).sum((1, 2))
    if dev.renderer.caps.max_loop_iterations:
        assert len(out.schedule()) == 2
    assert out.tolist() == [i % 7 * 10**6 for i in range(64)]
