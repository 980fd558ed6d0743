"""Compiling kernels to AMDGPU code objects with the LLVM toolchain found on the system (discovery.find_toolchain).

`AMDGPUCompiler` takes LLVM IR for amdgcn-amd-amdhsa (tiny.codegen.renderer.amdgpu) through `clang -c` for the target
processor and links the object with `ld.lld -shared` into a code object; `HIPCompiler` takes HIP C
(tiny.codegen.renderer.hip) and compiles it as device code only, without ROCm's headers or device libraries. Each checks
the code object it made with tiny.runtime.amd.elf, so a runtime only ever loads what that reader understands.
The compile cache key names the compiler, the target and the toolchain's version. `amdgpu_compiler` falls back to
COMGR (tiny.runtime.amd.comgr) for LLVM IR where the toolchain is missing or does not know the target.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from tiny.ir.device import CompileError, Compiler, DeviceUnavailable
from tiny.runtime.amd.comgr import COMGRCompiler
from tiny.runtime.amd.discovery import Toolchain, find_toolchain
from tiny.runtime.amd.elf import CodeObjectError, read_code_object

OPT_LEVEL = "-O3"
# HIP's clang fuses a * b + c into one rounding by default; a value computed again in another kernel, fused there and
# not here, would differ (a max's gradient compares a value with the max over it). The HIP renderer asks for the
# fusion where it is wanted: a reduction's accumulator (#pragma STDC FP_CONTRACT ON around it)
HIP_FLAGS = ("-std=c++17", OPT_LEVEL, "-ffp-contract=off")
TRIPLE = "amdgcn-amd-amdhsa"


def amdgpu_compiler(target: str) -> Compiler:
    """The compiler from LLVM IR to code objects for `target`: the system's clang and ld.lld where they know it, else
    COMGR where it is installed and knows it; DeviceUnavailable saying what is missing where neither does."""
    try:
        return AMDGPUCompiler(target)
    except DeviceUnavailable as no_toolchain:
        try:
            return COMGRCompiler(target)
        except DeviceUnavailable as no_comgr:
            cls = UnsupportedTarget if isinstance(no_toolchain, UnsupportedTarget) else DeviceUnavailable
            raise cls(f"{no_toolchain}; and {no_comgr}") from None


class UnsupportedTarget(DeviceUnavailable):
    """The toolchain here cannot generate code for this GPU target (an older LLVM than the GPU)."""


def require_toolchain(target: str) -> Toolchain:
    """The toolchain, checked to know `target`; DeviceUnavailable (UnsupportedTarget) saying what is missing."""
    toolchain = find_toolchain()
    if toolchain is None:
        raise DeviceUnavailable("no LLVM toolchain with the AMDGPU target: clang and ld.lld (apt install clang lld)")
    if not toolchain.knows(target):
        known = " ".join(sorted(p for p in toolchain.processors if re.fullmatch(r"gfx(9[0-9a-f]{2}|1[12][0-9]{2})", p)))
        raise UnsupportedTarget(
            f"{toolchain.clang} ({toolchain.version}) does not know the AMDGPU target {target}; of the recent ones it "
            f"knows {known}"
        )
    return toolchain


class _ToolchainCompiler(Compiler):
    """What both compilers share: the toolchain, the target, running a tool and checking the code object."""

    language = ""
    flags: tuple[str, ...] = (OPT_LEVEL,)

    def __init__(self, target: str = "gfx1100") -> None:
        self.target = target
        self.toolchain = require_toolchain(target)
        super().__init__(cachekey=f"amd:{self.language}:{target}:{self.toolchain.version}:{' '.join(self.flags)}")

    def run(self, args: list[str], src: str, what: str) -> None:
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{what} failed for {self.target}:\n{r.stderr.strip()}\n--- source ---\n{src}")

    def checked(self, binary: bytes, src: str) -> bytes:
        try:
            read_code_object(binary, expect_target=self.target)
        except CodeObjectError as e:
            what = f"the code object built for {self.target} is not loadable: {e}"
            raise CompileError(f"{what}\n--- source ---\n{src}") from e
        return binary


class AMDGPUCompiler(_ToolchainCompiler):
    """LLVM IR -> code object: clang -c for amdgcn-amd-amdhsa -mcpu=<target>, then ld.lld -shared."""

    language = "llvmir"

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tiny-amd-") as tmp:
            ll, obj, co = Path(tmp, "kernel.ll"), Path(tmp, "kernel.o"), Path(tmp, "kernel.co")
            ll.write_text(src)
            tc = self.toolchain
            clang = [tc.clang, "-x", "ir", f"--target={TRIPLE}", f"-mcpu={self.target}", "-nogpulib", OPT_LEVEL]
            self.run([*clang, "-c", str(ll), "-o", str(obj)], src, f"{tc.clang} (LLVM IR -> object)")
            self.run([tc.lld, "-shared", "--no-undefined", str(obj), "-o", str(co)], src, f"{tc.lld} (link)")
            return self.checked(co.read_bytes(), src)


class HIPCompiler(_ToolchainCompiler):
    """HIP C -> code object: clang as a HIP device-only compile, without ROCm's headers (-nogpuinc) or libraries."""

    language = "hip"
    flags = HIP_FLAGS

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tiny-amd-") as tmp:
            hip, co = Path(tmp, "kernel.hip"), Path(tmp, "kernel.co")
            hip.write_text(src)
            tc = self.toolchain
            args = [tc.clang, "-x", "hip", f"--offload-arch={self.target}", "-nogpuinc", "-nogpulib"]
            args += ["--cuda-device-only", "--no-gpu-bundle-output", *self.flags, "-c", str(hip)]
            self.run([*args, "-o", str(co)], src, f"{tc.clang} (HIP -> code object)")
            return self.checked(co.read_bytes(), src)
