"""The AMD device on a real GPU through /dev/kfd: skipped, with the reason, on a machine without one (the same
launches run against the mock kernel driver in test_amd_device_mock.py everywhere)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest
from test_amd_device_mock import SCRATCH_IR
from test_amd_kfd_mock import GROUPS, IMPLICIT_IR, LOCAL, N, scale_kernel

from tiny.ir.device import DeviceUnavailable
from tiny.runtime.amd.kfd import AMDDevice

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/kfd"), reason="no /dev/kfd: no AMD GPU driver here")


@pytest.fixture(scope="module")
def dev() -> Iterator[AMDDevice]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("AMD_MOCK", raising=False)
        try:
            yield AMDDevice("AMD", "AMDGPU")
        except DeviceUnavailable as e:
            pytest.skip(f"/dev/kfd exists, but the AMD device does not start: {e}")


def _out(dev: AMDDevice, buf: object, n: int, fmt: str) -> list:
    result = bytearray(n * 4)
    dev.allocator.copyout(memoryview(result), buf)
    return list(struct.unpack(f"{n}{fmt}", result))


def test_scale_kernel_runs_and_is_timed(dev: AMDDevice) -> None:
    uops = scale_kernel()
    src = dev.renderer.render("scale", uops)
    prog = dev.program(dev, "scale", dev.compile(src))
    out, inp = dev.allocator.alloc(N * 4), dev.allocator.alloc(N * 4)
    dev.allocator.copyin(inp, memoryview(struct.pack(f"{N}f", *range(N))))
    t = prog(out, inp, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), vals=(3,), wait=True)
    assert isinstance(t, float) and t > 0
    assert _out(dev, out, N, "f") == [i * 2.0 + 3 for i in range(N)]


def test_hidden_arguments_on_the_gpu(dev: AMDDevice) -> None:
    prog = dev.program(dev, "wgsize", dev.compile(IMPLICIT_IR))
    out = dev.allocator.alloc(N * 4)
    prog(out, global_size=(GROUPS, 1, 1), local_size=(LOCAL, 1, 1), wait=True)
    assert _out(dev, out, N, "i") == [LOCAL] * N


def test_scratch_on_the_gpu(dev: AMDDevice) -> None:
    prog = dev.program(dev, "spill", dev.compile(SCRATCH_IR))
    out = dev.allocator.alloc(4)
    prog(out, vals=(3,), wait=True)
    assert _out(dev, out, 1, "i") == [1]
