"""The AMD device, talking to the kernel driver (KFD).

This release of tiny-runtime-amd finds the driver, the GPUs and the toolchain and reports what stops
the device on a machine; launching kernels on AMD GPUs is not in this release, so the device never
starts and says so.
"""

from __future__ import annotations

from tiny.ir.device import Compiled, DeviceUnavailable
from tiny.runtime.amd.discovery import find_stack


class AMDDevice(Compiled):
    priority = 100
    renderers = ("AMDGPU",)

    def __init__(self, name: str, renderer: str) -> None:
        stack = find_stack()
        if stack.problem is not None:
            raise DeviceUnavailable(stack.problem)
        raise DeviceUnavailable(
            f"found GPU(s) {', '.join(stack.gfx_targets)} with {stack.clang} and {stack.lld}, but this release of "
            "tiny-runtime-amd does not launch kernels yet"
        )
