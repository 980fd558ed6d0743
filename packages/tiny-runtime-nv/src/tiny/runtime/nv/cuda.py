"""The CUDA device.

This release of tiny-runtime-nv finds the driver and NVRTC and reports what stops CUDA on a machine;
launching kernels on NVIDIA GPUs is not in this release, so the device never starts and says so.
"""

from __future__ import annotations

from tiny.ir.device import Compiled, DeviceUnavailable
from tiny.runtime.nv.discovery import find_stack


class CUDADevice(Compiled):
    priority = 100
    renderers = ("CUDA",)

    def __init__(self, name: str, renderer: str) -> None:
        stack = find_stack()
        if stack.problem is not None:
            raise DeviceUnavailable(stack.problem)
        raise DeviceUnavailable(
            f"found {stack.gpu_count} GPU(s), driver {stack.driver_version}, NVRTC {stack.nvrtc_version}, but this "
            "release of tiny-runtime-nv does not launch kernels yet"
        )
