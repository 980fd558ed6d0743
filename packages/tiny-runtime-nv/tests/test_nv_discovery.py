import ctypes.util

import pytest

from tiny.ir.device import DeviceUnavailable
from tiny.runtime.nv import find_stack
from tiny.runtime.nv.cuda import CUDADevice
from tiny.runtime.nv.nvrtc import candidates as nvrtc_candidates


def test_stack_names_the_missing_piece() -> None:
    stack = find_stack()
    if stack.libcuda is None:
        assert stack.problem is not None and "libcuda" in stack.problem
        assert stack.gpu_count == 0 and stack.driver_version is None
    if stack.nvrtc is not None:
        assert stack.nvrtc_version is not None and stack.nvrtc_version[0] >= 11


def test_nvrtc_candidates_are_libraries() -> None:
    for path in nvrtc_candidates():
        assert "libnvrtc.so" in path and "builtins" not in path


def test_device_says_why_it_cannot_start() -> None:
    if find_stack().problem is None:
        pytest.skip("a CUDA GPU opens here; the refusals are tested with stand-ins in test_cuda_device.py")
    with pytest.raises(DeviceUnavailable) as e:
        CUDADevice("CUDA", "CUDA")
    if ctypes.util.find_library("cuda") is None:
        assert "driver" in str(e.value)
