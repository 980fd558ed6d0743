"""The HIP device where there is no AMD GPU: the reasons it gives (no libamdhip64; the library but no GPU), that it
is a device of its own beside AMD, and the kernel arguments it packs from a real code object's metadata.
Launching needs an AMD GPU: those tests skip with the reason where the device does not start."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import numpy as np
import pytest
from amd_helpers import compile_ir

from tiny.ir.config import FLAGS
from tiny.ir.device import Device, DeviceUnavailable, device_entry_points
from tiny.runtime.amd import hip
from tiny.runtime.amd.elf import read_code_object
from tiny.runtime.amd.hip import HIPDevice, load_library, pack_kernargs
from tiny.runtime.amd.kfd import AMDDevice


def test_no_library_is_a_plain_reason() -> None:
    with pytest.raises(DeviceUnavailable, match=r"no HIP runtime: none of libnothere\.so\.9 loads .*libamdhip64"):
        load_library(("libnothere.so.9",))


def _library_or_skip() -> hip.HIPLibrary:
    try:
        return load_library()
    except DeviceUnavailable as e:
        pytest.skip(str(e))


def test_no_kernel_driver_is_said_without_loading_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no /dev/kfd, HIP can find no GPU: the device says so without loading libamdhip64 (which, with
    ROCm's runtime, stayed mapped in every process that looked for a default device)."""

    def loaded() -> hip.HIPLibrary:
        raise AssertionError("libamdhip64 was loaded")

    monkeypatch.setattr(hip, "KFD_PATH", "/dev/not-a-kfd")
    monkeypatch.setattr(hip, "_library", loaded)
    with pytest.raises(DeviceUnavailable, match=r"HIP finds no AMD GPU without /dev/not-a-kfd: no amdgpu kernel"):
        HIPDevice("HIP", "AMDGPU")


def test_library_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The library is there (and, as far as the device can see, the kernel driver: a file stands in for /dev/kfd)
    but HIP finds no GPU: the library's own answer, with its version."""
    lib = _library_or_skip()
    monkeypatch.setattr(hip, "KFD_PATH", str(tmp_path))
    count = ctypes.c_int(0)
    if lib.lib.hipInit(0) == 0 and lib.lib.hipGetDeviceCount(ctypes.byref(count)) == 0 and count.value > 0:
        pytest.skip("HIP finds a GPU here")
    with pytest.raises(
        DeviceUnavailable, match=r"libamdhip64.*\(HIP \d+\.\d+\.\d+\) finds no AMD GPU: hip\w+ returned"
    ):
        HIPDevice("HIP", "AMDGPU")


def test_errors_are_named() -> None:
    lib = _library_or_skip()
    assert lib.error_name(2) == "hipErrorOutOfMemory"
    with pytest.raises(hip.HIPError, match=r"hipFoo failed: hipErrorInvalidValue \(1\)"):
        lib.check("hipFoo", 1)


def test_amd_is_the_kernel_driver_device_and_hip_its_own() -> None:
    """One name per runtime: `AMD` is the KFD device, `HIP` the HIP one (no flag switches what `AMD` is)."""
    found = device_entry_points()
    assert found["AMD"].load() is AMDDevice and found["HIP"].load() is HIPDevice
    assert "AMD_IFACE" not in FLAGS


KERNEL = """
define amdgpu_kernel void @k(ptr addrspace(1) %out, ptr addrspace(1) %a, i32 %n, i32 %m) {
  %i = call i32 @llvm.amdgcn.workitem.id.x()
  %p = getelementptr i32, ptr addrspace(1) %a, i32 %i
  %v = load i32, ptr addrspace(1) %p
  %x = mul i32 %v, %n
  %y = add i32 %x, %m
  %q = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %y, ptr addrspace(1) %q
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
"""


def test_kernel_arguments_are_packed_at_their_metadata_offsets() -> None:
    info = read_code_object(compile_ir(KERNEL)).kernels["k"]
    packed = pack_kernargs(info, (0x1000, 0x2000_0000_0000), (7, -3))
    assert len(packed) == 24 and struct.unpack("<QQii", packed) == (0x1000, 0x2000_0000_0000, 7, -3)
    with pytest.raises(ValueError, match="kernel k takes 4 arguments, got 2 \\+ 1"):
        pack_kernargs(info, (1, 2), (3,))


def test_runs_a_kernel_where_hip_has_a_gpu() -> None:
    try:
        dev = Device["HIP"]
    except DeviceUnavailable as e:
        pytest.skip(str(e))
    binary = dev.compile(
        KERNEL.replace("define amdgpu_kernel", 'target triple = "amdgcn-amd-amdhsa"\ndefine amdgpu_kernel')
    )
    prog = hip.HIPProgram(dev, "k", binary)
    a = np.arange(64, dtype=np.int32)
    out, src = dev.allocator.alloc(256), dev.allocator.alloc(256)
    dev.allocator.copyin(src, memoryview(a).cast("B"))
    t = prog(out, src, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(3, 1), wait=True)
    got = np.empty(64, np.int32)
    dev.allocator.copyout(memoryview(got).cast("B"), out)
    assert t is not None and t > 0
    np.testing.assert_array_equal(got, a * 3 + 1)
