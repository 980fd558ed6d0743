"""The NULL device: renders C like the CPU device, then compiles and runs nothing.

It measures what everything above the hardware costs (scheduling, lowering, rendering); its buffers
hold nothing and read back as zeros.
"""

from __future__ import annotations

from typing import Any

from tiny.ir.device import Allocator, AllocatorCaps, Compiled, Compiler, Program


class NullCompiler(Compiler):
    def compile(self, src: str) -> bytes:
        return b""


class NullAllocator(Allocator):
    caps = AllocatorCaps()

    def alloc(self, size: int) -> Any:
        return size

    def copyin(self, dest: Any, src: memoryview) -> None:
        pass

    def copyout(self, dest: memoryview, src: Any) -> None:
        dest[:] = bytes(len(dest))


class NullProgram(Program):
    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False) -> float | None:
        return 0.0 if wait else None


class NullDevice(Compiled):
    priority = -100  # never the default
    renderers = ("C",)

    def __init__(self, name: str, renderer: str) -> None:
        super().__init__(name, NullAllocator(), NullProgram, renderer)

    def compiler(self) -> Compiler:
        return NullCompiler()
