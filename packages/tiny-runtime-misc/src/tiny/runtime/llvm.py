"""LLVM IR compiled in-process with llvmlite for the host CPU, and its machine code loaded into this process.

The compiler parses and verifies the IR, optimizes it for the host CPU and its features (the new pass manager at
O3), and emits an object file: that is the binary the disk cache keeps. Loading an object file links it into the
process with LLVM's MCJIT, resolving the few functions it calls (libm's sinf, exp2f ...) in the process. No C
compiler and no linker are needed. llvmlite comes with tiny-tensor; tiny-runtime-misc alone takes it as an extra
(`pip install tiny-runtime-misc[llvm]`).
"""

from __future__ import annotations

import ctypes
import platform
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from tiny.ir.device import CompileError, Compiler, DeviceUnavailable

INSTALL_HINT = "pip install llvmlite (tiny-tensor brings it; or pip install 'tiny-runtime-misc[llvm]')"
OPT_LEVEL = 3


@cache
def binding() -> Any:
    """llvmlite.binding, imported the first time CPU:LLVM needs it (its LLVM library maps 36 MB into the process: a
    process on the C path alone, a language model's decoding, would hold it for nothing); None where llvmlite cannot
    be imported (the CPU device's LLVM renderer says so when it is chosen)."""
    try:
        import llvmlite.binding
    except ImportError:
        return None
    return llvmlite.binding


def llvmlite_present() -> bool:
    return binding() is not None


def require_llvmlite() -> Any:
    """llvmlite.binding; DeviceUnavailable, saying how to install it, where llvmlite cannot be imported."""
    if (llvm := binding()) is None:
        raise DeviceUnavailable(f"CPU:LLVM compiles with llvmlite, which is not installed: {INSTALL_HINT}")
    return llvm


@dataclass(frozen=True)
class Host:
    """The machine LLVM generates code for: what the compiler cache key and the renderer's target depend on."""

    triple: str
    cpu: str
    features: str
    llvm_version: str

    @property
    def has_f16_conversions(self) -> bool:
        """float <-> half in hardware (x86 F16C; every AArch64): float16 needs no runtime library calls."""
        return "+f16c" in self.features.split(",") or not platform.machine().lower().startswith(("x86", "amd64"))


@cache
def host() -> Host:
    llvm = require_llvmlite()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    version = ".".join(str(v) for v in llvm.llvm_version_info)
    return Host(
        llvm.get_process_triple(),
        llvm.get_host_cpu_name(),
        llvm.get_host_cpu_features().flatten(),
        f"llvmlite {sys.modules['llvmlite'].__version__}, LLVM {version}",
    )


def target_machine() -> Any:
    """A new target machine for the host: an execution engine takes the one it is given and frees it with itself."""
    h = host()
    target = require_llvmlite().Target.from_triple(h.triple)
    return target.create_target_machine(cpu=h.cpu, features=h.features, opt=OPT_LEVEL, reloc="pic", jit=True)


class LLVMCompiler(Compiler):
    """LLVM IR -> an object file for the host CPU."""

    def __init__(self) -> None:
        h = host()
        super().__init__(cachekey=f"llvm:{h.llvm_version}:{h.triple}:{h.cpu}:{h.features}:O{OPT_LEVEL}")

    def compile(self, src: str) -> bytes:
        # a context and a target machine of its own: BEAM compiles on several threads at once
        tm, llvm = target_machine(), require_llvmlite()
        try:
            mod = llvm.parse_assembly(src, context=llvm.create_context())
            mod.verify()
        except RuntimeError as e:
            raise CompileError(f"LLVM rejected generated IR: {e}\n--- source ---\n{src}") from None
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
        tuning.slp_vectorization = True  # as clang's -O2 and up: straight-line lanes into vectors, not only loops
        passes = llvm.create_pass_builder(tm, tuning)
        passes.getModulePassManager().run(mod, passes)
        return tm.emit_object(mod)


class LoadedObject:
    """An object file linked into this process, its functions callable through ctypes."""

    def __init__(self, binary: bytes) -> None:
        # an engine of its own: kernels of the same name in different objects must not meet
        llvm = require_llvmlite()
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
        self.engine.finalize_object()

    def function(self, name: str) -> Any:
        """The function `name` as a ctypes function; it takes the arguments the call passes (c_void_p, c_int)."""
        address = self.engine.get_function_address(name)
        if not address:
            raise CompileError(f"the object file has no function {name!r}")
        return ctypes.CFUNCTYPE(None)(address)
