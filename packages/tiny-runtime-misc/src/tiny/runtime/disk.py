"""The DISK device: a file, memory-mapped, holding tensors' bytes where they lie.

`DISK:/path/to/file` is one device per file. Its buffers are byte ranges of the mapping: nothing is read
when a buffer is made or viewed, and a copy to a compute device reads the file's pages straight into that
device's memory (the operating system brings them in as they are touched). No kernel runs on DISK: a tensor
there can be reshaped, sliced to one contiguous range and bitcast, then copied with `.to()`.

Writing works too: copying a tensor to `DISK:/path` makes the file as large as it needs and writes it. A
file this process may not write is mapped read-only, and writing to it is an error that says so.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

from tiny.ir.device import Allocator, AllocatorCaps, Compiled, Compiler, DeviceUnavailable


@dataclass(frozen=True)
class DiskRange:
    """`size` bytes of the file, `offset` bytes in, seen through the mapping `mem`."""

    mem: memoryview
    offset: int
    size: int
    writable: bool

    @property
    def view(self) -> memoryview:
        return self.mem[self.offset : self.offset + self.size]


class DiskAllocator(Allocator):
    caps = AllocatorCaps(host_visible=True, views=True, aligned=1)

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        self._mem: memoryview = memoryview(b"")
        self._writable = False

    def _mapping(self, size: int) -> tuple[memoryview, bool]:
        """The file's mapping, at least `size` bytes long; a file too short is grown where it may be written."""
        if self._map is not None and len(self._mem) >= size:
            return self._mem, self._writable
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            writable = True
        except PermissionError:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except OSError as e:
                raise DeviceUnavailable(f"DISK cannot open {self.path}: {e.strerror}") from None
            writable = False
        except OSError as e:
            raise DeviceUnavailable(f"DISK cannot open {self.path}: {e.strerror}") from None
        try:
            length = os.fstat(fd).st_size
            if length < size:
                if not writable:
                    raise ValueError(f"{self.path} holds {length} bytes; {size} were asked for, and it is read-only")
                os.ftruncate(fd, size)
                length = size
            if length == 0:  # mmap cannot map nothing
                return memoryview(bytearray(0)), writable
            self._map = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        # earlier ranges keep the earlier mapping alive through their own memoryview of it
        self._mem, self._writable = memoryview(self._map), writable
        return self._mem, writable

    def alloc(self, size: int) -> DiskRange:
        mem, writable = self._mapping(size)
        return DiskRange(mem, 0, size, writable)

    def offset(self, opaque: DiskRange, offset: int, size: int) -> DiskRange:
        return DiskRange(opaque.mem, opaque.offset + offset, size, opaque.writable)

    def as_memoryview(self, opaque: DiskRange, size: int) -> memoryview:
        return opaque.view[:size]

    def copyin(self, dest: DiskRange, src: memoryview) -> None:
        if not dest.writable:
            raise PermissionError(f"{self.path} is mapped read-only: this process may not write it")
        dest.view[: src.nbytes] = src

    def copyout(self, dest: memoryview, src: DiskRange) -> None:
        """Read with the file's descriptor, not through the mapping: the pages read stay the page cache's, not this
        process's (a model's weights copied to a device held their file's size mapped besides, until exit)."""
        out = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
        fd = os.open(self.path, os.O_RDONLY)
        try:
            done = 0
            while done < out.nbytes:
                n = os.preadv(fd, [out[done:]], src.offset + done)
                if n == 0:
                    raise EOFError(f"{self.path} ends {src.offset + done} bytes in; {src.size} were to be read")
                done += n
        finally:
            os.close(fd)


class DiskCompiler(Compiler):
    def compile(self, src: str) -> bytes:
        raise RuntimeError("no kernels run on DISK: copy the tensor to a compute device with .to() first")


class DiskDevice(Compiled):
    """One file: `DISK:/path/to/file`."""

    priority = -1000  # never the default
    computes = False
    file_backed = True

    def __init__(self, name: str, renderer: str = "") -> None:
        if ":" not in name:
            raise DeviceUnavailable("DISK is one device per file: name it DISK:/path/to/file")
        self.path = name.split(":", 1)[1]
        super().__init__(name, DiskAllocator(self.path), _NoProgram, renderer)

    def compiler(self) -> Compiler:
        return DiskCompiler()


class _NoProgram:
    def __init__(self, *args: Any) -> None:
        raise RuntimeError("no kernels run on DISK: copy the tensor to a compute device with .to() first")
