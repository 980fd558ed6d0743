"""Helpers of the tiny-runtime-amd tests: the GPU targets tiny generates code for, and compiling with the toolchain
found here, skipping (with the reason) where it is missing or does not know a target."""

from __future__ import annotations

import pytest

from tiny.ir.device import DeviceUnavailable
from tiny.runtime.amd.compiler import AMDGPUCompiler, HIPCompiler

TARGETS = ("gfx1100", "gfx1201", "gfx942", "gfx950")  # RDNA3, RDNA4, CDNA3 (MI300), CDNA4 (MI350)
WAVE = {"gfx1100": 32, "gfx1201": 32, "gfx942": 64, "gfx950": 64}


def compiler(target: str, hip: bool = False) -> AMDGPUCompiler | HIPCompiler:
    try:
        return HIPCompiler(target) if hip else AMDGPUCompiler(target)
    except DeviceUnavailable as e:
        pytest.skip(str(e))


def compile_ir(src: str, target: str = "gfx1100") -> bytes:
    return compiler(target).compile(src)
