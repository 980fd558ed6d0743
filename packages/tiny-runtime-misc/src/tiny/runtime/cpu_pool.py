"""A CPU device's worker threads, written in C (cpu_pool.c): a kernel's two parts handed out and collected in about
2 us (the ctypes call included) while the workers are awake, where Python's ThreadPoolExecutor took about 20 (a
decode step's small products spent longer handing out their parts than computing them).

The pool is compiled once by the CPU device's C compiler (and kept in the disk cache). Where it cannot be -- no C
compiler (CPU:LLVM alone), a platform whose calling convention passes an int otherwise than a 64-bit integer, a
kernel of more arguments than the pool passes -- the device hands its parts to Python threads instead."""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from tiny.ir.config import flag

SPIN = flag(
    "CPU_SPIN",
    int,
    200,
    "microseconds a CPU device's worker threads stay awake after a kernel, waiting for the next, before they sleep "
    "(a launch of two parts takes about 2 us while they are awake, about 13 when one must be woken)",
)


def source() -> str:
    with open(os.path.join(os.path.dirname(__file__), "cpu_pool.c")) as f:
        return f.read()


def supported() -> bool:
    """Whether this platform passes a kernel's arguments (pointers and ints) as the pool passes them: each as a 64-bit
    integer, in a register or an 8-byte stack slot (x86-64 and AArch64, except Apple's, which packs the stack)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return True
    return machine in ("aarch64", "arm64") and platform.system() != "Darwin"


class Pool:
    """`workers` threads in C beside the thread that gives a kernel, awake `spin_us` after each (CPU_SPIN); `run`
    takes a kernel's address, its arguments (addresses and ints) and its number of parts."""

    def __init__(self, library: ctypes.CDLL, workers: int, spin_us: int | None = None) -> None:
        self.library = library  # (held: the threads run its code)
        new, self._run, stop, most = (
            library.tiny_pool_new,
            library.tiny_pool_run,
            library.tiny_pool_stop,
            library.tiny_pool_most_args,
        )
        new.restype, new.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_int64]
        self._run.restype = None
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        stop.restype, stop.argtypes = None, [ctypes.c_void_p]
        self._batch = library.tiny_pool_batch
        self._batch.restype = None
        self._batch.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 4
        self.most_args: int = most()
        self.handle = new(workers, max(0, SPIN.value if spin_us is None else spin_us) * 1000)
        if not self.handle:
            raise MemoryError("the CPU device's worker threads could not be made")
        library.tiny_pool_workers.argtypes = [ctypes.c_void_p]
        self.workers: int = library.tiny_pool_workers(self.handle)  # (those the system let it make)
        # the workers end at exit (the handle is never freed: a thread may still be leaving it); not in a forked
        # child, which has none of them (and may have a lock one of them held)
        pid = os.getpid()
        atexit.register(lambda: os.getpid() == pid and stop(self.handle))

    def run(self, kernel: int, args: Sequence[int], parts: int) -> None:
        """kernel(*args, part) for each part in range(parts), on this thread and the workers; back when all are done
        (ctypes lets go of the GIL meanwhile)."""
        self._run(self.handle, kernel, len(args), (ctypes.c_int64 * len(args))(*args), parts)

    def launcher(self, kernel: int, n_args: int, parts: int) -> Callable[..., None]:
        """run() of one kernel and count of parts as a function of its n_args arguments alone: what a launch repeated
        many times calls (a decode step launches a few hundred), without looking up anything else each time."""
        run, handle, array = self._run, self.handle, ctypes.c_int64 * n_args
        return lambda *args: run(handle, kernel, n_args, array(*args), parts)

    def batch(self, kernels: Sequence[int], n_args: Sequence[int], parts: Sequence[int]) -> Callable[[Any], None]:
        """The kernels (addresses) run one after another as run() runs each, by one call (tiny_pool_batch), as a
        function of their arguments: an array of c_int64, each kernel's n_args[i] after the one before's."""
        n, call, handle = len(kernels), self._batch, self.handle
        k, a, p = (ctypes.c_void_p * n)(*kernels), (ctypes.c_int * n)(*n_args), (ctypes.c_int * n)(*parts)
        return lambda args: call(handle, n, k, a, p, args)


def kernel_address(function: Callable[..., None]) -> int:
    """The address of the C function behind a ctypes function object."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    assert address is not None
    return address
