"""The CPU device: C from the C renderer compiled by clang or gcc, or (CPU:LLVM) LLVM IR from the LLVM renderer
compiled in-process by llvmlite; either way for the host's vector ISA, and run in-process on the device's threads.

Several CPU devices (`CPU`, `CPU:1` ...: a tensor sharded over them) split the cores between them: each runs its
kernels on its share (the cores this process may run on over the CPU devices open, or THREADS each), in order on a
thread of its own, beside the others (tiny.runtime.cpu_queue). A kernel is compiled for all the cores either way: its
parts run on however many threads its device has.

`CPU` alone takes the fastest path this machine has: C through clang where a clang is on PATH, else LLVM IR through
llvmlite (no compiler needed), else C through gcc. `CC=gcc` (any C compiler), `CPU:C` and `CPU:LLVM` choose."""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import mmap
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cache, cached_property
from typing import Any

from tiny.ir.config import flag
from tiny.ir.device import (
    LAUNCHERS,
    AllocatorCaps,
    Compiled,
    CompileError,
    Compiler,
    DeviceUnavailable,
    GraphLaunch,
    GraphReplay,
    LRUAllocator,
    Program,
    host_memory,
    launchers_changed,
    usable_cores,
)
from tiny.ir.device.collective import SHARED_MEMORY
from tiny.ir.diskcache import cache_get, cache_put, digest
from tiny.runtime.cpu_pool import Pool, kernel_address, supported
from tiny.runtime.cpu_pool import source as pool_source
from tiny.runtime.cpu_queue import Queue, meet
from tiny.runtime.llvm import INSTALL_HINT, LLVMCompiler, LoadedObject, host, llvmlite_present, require_llvmlite

THREADS = flag(
    "THREADS",
    int,
    0,
    "CPU threads one kernel may use (each CPU device's, where several are open); 0: one per core this process may run "
    "on, split evenly over the CPU devices open",
)
CC = flag("CC", str, "", "the C compiler the CPU device uses; empty finds clang, then gcc, on PATH")

ALIGN = 64  # bytes; one cache line, enough for any vector ISA
HUGE_FROM = 1 << 21  # bytes from which an allocation is a mapping of its own, in huge pages (CPUAllocator._mapped)
HUGE_PAGES = hasattr(mmap, "MADV_HUGEPAGE")  # (Linux's transparent huge pages; elsewhere the system's malloc)


@cache
def find_clang() -> str | None:
    """The newest clang on PATH (clang-19 before clang-14 before clang), or None."""
    clangs = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if os.path.isdir(d):
            clangs += [
                f for f in os.listdir(d) if re.fullmatch(r"clang(-\d+)?", f) and os.access(os.path.join(d, f), os.X_OK)
            ]
    return max(clangs, key=lambda c: int(c.split("-")[1]) if "-" in c else 0) if clangs else None


@cache
def find_compiler() -> str:
    """The C compiler to use: $CC, else the newest clang on PATH, else gcc."""
    if CC.value:
        if shutil.which(CC.value) is None:
            raise DeviceUnavailable(f"CC={CC.value!r} is not on PATH")
        return CC.value
    if (clang := find_clang()) is not None:
        return clang
    if shutil.which("gcc"):
        return "gcc"
    hint = "" if llvmlite_present() else f"; or, with no compiler, {INSTALL_HINT} and use CPU:LLVM"
    raise DeviceUnavailable(f"CPU:C needs a C compiler: neither clang nor gcc is on PATH (apt install clang){hint}")


_MVEC = (
    "typedef float v8 __attribute__((vector_size(32)));\nv8 _ZGVdN8v_exp2f(v8);\n"
    "int main(void) { v8 x = {0}; return (int)_ZGVdN8v_exp2f(x)[0] - 1; }"
)
FEATURE_PROBES = {  # each feature: the compiler's flags (the first before the source) and a source it must take
    "f16": (("-c",), "_Float16 f(_Float16 a, _Float16 b) { return a * b + (_Float16)1; }"),
    "mvec": (("-march=native", "-lmvec"), _MVEC),  # (and the program must run: an AVX2 host)
    "vnni": (("-c", "-march=native"), "#if !defined(__AVX512VNNI__) && !defined(__AVXVNNI__)\n#error\n#endif\n"),
    "avx2": (("-c", "-march=native"), "#if !defined(__AVX2__)\n#error\n#endif\n"),
    "avx512fp16": (("-c", "-march=native"), "#if !defined(__AVX512FP16__)\n#error\n#endif\n"),
    "avx10": (("-c", "-march=native"), "#if !defined(__AVX10_1__)\n#error\n#endif\n"),
}


@cache
def compiler_features(cc: str) -> frozenset[str]:
    """What this compiler can do on this host, found by compiling tiny probes: 'f16' (_Float16), 'mvec' (glibc's
    vector math library for AVX2, linked with -lmvec), 'vnni' (x86's int8 dot products, AVX-512 VNNI or AVX-VNNI, in
    what -march=native targets: the renderer's DOT4), 'avx2' (AVX2 there: its byte products, pmaddubsw, make the
    renderer's DOT4 where there is no VNNI), 'avx512fp16' (half arithmetic in hardware there: see NO_NATIVE_HALF),
    'avx10' (AVX10.1 there, which brings AVX512-FP16 back unless it is turned off too: NO_AVX10).
    The probes run side by side, once per compiler and host: the answer is kept in the disk cache under the
    compiler's file (path, size, time), the C library's version and the host's CPU flags (a process's start would
    otherwise wait for five compilers' runs)."""
    key = _features_key(cc)
    if key is not None and (known := cache_get("compiler_features", key)) is not None:
        return frozenset(known)
    found = _probed_features(cc)
    if key is not None:
        cache_put("compiler_features", key, sorted(found))
    return found


def _features_key(cc: str) -> str | None:
    """The disk cache's key of a compiler's features on this host; None where the compiler's file is not found."""
    if (path := shutil.which(cc)) is None:
        return None
    real = os.path.realpath(path)
    st = os.stat(real)
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        cpu = platform.processor()
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else platform.libc_ver()
    return digest(repr((real, st.st_size, st.st_mtime_ns, libc, platform.machine(), cpu, FEATURE_PROBES)).encode())


def _probed_features(cc: str) -> frozenset[str]:
    out = set()
    with tempfile.TemporaryDirectory() as d:
        runs = {}
        for name, (flags, src) in FEATURE_PROBES.items():  # started together, then waited for
            exe = os.path.join(d, name)
            args = [cc, *flags[:1], "-x", "c", "-", *flags[1:], "-o", exe]
            proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # (a compiler that stops before reading it: its status says)
                proc.stdin.write(src.encode())
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            runs[name] = (proc, exe)
        for name, (proc, exe) in runs.items():
            ok = proc.wait() == 0
            if name == "mvec" and ok:  # it must run too: an AVX2 host
                ok = subprocess.run([exe], capture_output=True).returncode == 0
            if ok:
                out.add(name)
    return frozenset(out)


@cache
def _cpuinfo() -> str:
    """/proc/cpuinfo's text; empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


@cache
def host_vector_width() -> int:
    """float32 lanes of the host's widest vector unit, read from /proc/cpuinfo where there is one."""
    flags = _cpuinfo()
    if " avx512f" in flags:
        return 16
    if " avx2" in flags or " avx " in flags:
        return 8
    return 4


def prefetch_locality() -> int:
    """How the kernels' prefetches of streams treat their lines (tiny.codegen.renderer.prefetch.locality), by the
    vendor in /proc/cpuinfo (locality_for)."""
    return locality_for(_cpuinfo())


def locality_for(cpuinfo: str) -> int:
    """The prefetch locality for a host /proc/cpuinfo describes: 0 (non-temporal) on AMD's CPUs, where it read fastest
    (an EPYC's float16 products over 23 MB: 33 -> 46 GB/s); 3 (into every cache level) elsewhere: a Sapphire Rapids
    Xeon read the same products over 1.1 GB at 10.7 GB/s with 0 and at 31 with 3 (24 with no prefetch)."""
    return 0 if re.search(r"^vendor_id\s*:\s*(AuthenticAMD|HygonGenuine)\s*$", cpuinfo, re.MULTILINE) else 3


def thread_count() -> int:
    """The parts a kernel is compiled to split into (a thread each): THREADS, else the cores this process may run on."""
    return THREADS.value if THREADS.value > 0 else usable_cores()


# the indices of the CPU devices this process has opened: CPU and CPU:LLVM are one device under two compilers, which a
# program uses one after the other, so they do not split the cores (asked at every launch: kept as devices open)
_indices: set[str] = set()


def _index(name: str) -> str:
    parts = name.split(":")
    return parts[1] if len(parts) > 1 and parts[1].isdigit() else "0"


def share() -> int:
    """Threads each CPU device runs its kernels on: THREADS, else its share of the cores over the CPU devices open."""
    return THREADS.value if THREADS.value > 0 else max(1, usable_cores() // max(1, len(_indices)))


def queued() -> bool:
    """Whether CPU launches go to their device's thread (CPU devices of several indices are open), rather than run
    where given."""
    return len(_indices) > 1


@cache
def _threads(name: str, workers: int) -> ThreadPoolExecutor:
    """A device's Python threads (its share of the cores), where its pool in C cannot be had: its kernels share them,
    so that the devices together never run more threads than there are cores."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"tiny-{name}")


@cache
def _pool(name: str, workers: int, cc: str, pid: int) -> Pool | None:
    """A device's pool of worker threads in C (its share of the cores less the thread that launches), built by the
    C compiler `cc`; None where there is none to build it with or the platform passes arguments otherwise. One per
    process (pid): a forked child has none of its parent's threads."""
    if not cc or not supported():
        return None
    try:  # (a C compiler without C11's atomics or POSIX threads: the Python threads serve)
        binary = ClangCompiler(cc).compile_cached(pool_source())
    except CompileError:
        return None
    return Pool(load_library(binary, "cpu_pool"), workers - 1)


# a forked child has none of its parent's pool threads: the launchers given before (each calls a pool) are asked for
# again there, and find the child's own pool
os.register_at_fork(after_in_child=launchers_changed)


def _pool_compiler(device: Compiled) -> str:
    """The C compiler that builds a device's pool: the device's own, else (CPU:LLVM) any on PATH, else none."""
    return getattr(device, "cc", "") or _any_compiler()


@cache
def _any_compiler() -> str:
    """find_compiler's answer, or "" where there is none (asked once: a launch asks for its pool each time)."""
    try:
        return find_compiler()
    except DeviceUnavailable:
        return ""


# how every kernel is compiled (with -march/-mcpu native); part of the disk cache's key, so a binary compiled with
# other flags is not taken for one compiled with these
CC_FLAGS = (
    "-O2",
    "-fno-math-errno",
    # no fused multiply-add where the compiler sees fit: which products it fuses depends on the kernel around them,
    # and a value computed again in another kernel must round the same (a max's gradient compares the max's input
    # with it); the renderer asks for fma itself in reductions (tiny_fma_*)
    "-ffp-contract=off",
    "-fwrapv",
)
# clang's only: no SLP vectorizer. The renderer writes the vectors it wants, and clang 19's SLP pass miscompiles some
# unrolled reductions for AVX-512 (a matrix product's gradient, 2 x 3 x 5 summed over 4, all written out: 4 of 30
# outputs wrong at -O2 -march=native; right at -O1, with -march=x86-64-v3, without SLP, and with gcc; found by the
# autograd fuzz, seed 1438)
CLANG_FLAGS = ("-fno-slp-vectorize",)
# where -march=native has AVX512-FP16 (Sapphire Rapids on): no hardware half arithmetic. Without it the compiler
# computes a kernel's _Float16 expressions in float32 and rounds where a value is stored or cast, as on any other x86;
# with it every op rounds to half. A ViT's float16 logits went from 0.9x to 3.1x torch's float16 error (0.0015 against
# 0.00048) on such a host, and a kernel's half results would differ between hosts
NO_NATIVE_HALF = ("-mno-avx512fp16",)
# where -march=native has AVX10.1 as well (clang 19 on a host whose CPUID reports it): AVX10.1 includes AVX512-FP16,
# and clang turns that back on for it after -mno-avx512fp16; without AVX10.1 the same AVX-512 sets stay on
NO_AVX10 = ("-mno-avx10.1-256",)


class ClangCompiler(Compiler):
    def __init__(self, cc: str) -> None:
        self.cc, version = cc, _version(cc)
        features = compiler_features(cc)
        no_half = (NO_NATIVE_HALF + (NO_AVX10 if "avx10" in features else ())) if "avx512fp16" in features else ()
        self.flags = CC_FLAGS + (CLANG_FLAGS if "clang" in version else ()) + no_half
        super().__init__(cachekey=f"cpu:{cc}:{platform.machine()}:{version}:{' '.join(self.flags)}")

    def _args(self, sources: list[str], out: str) -> list[str]:
        arch = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else ["-mcpu=native"]
        libs = ["-lm", *(["-lmvec"] if "mvec" in compiler_features(self.cc) else [])]
        return [self.cc, "-shared", "-fPIC", *self.flags, *arch, "-x", "c", *sources, "-o", out, *libs]

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "kernel.so")
            r = subprocess.run(self._args(["-"], out), input=src.encode(), capture_output=True)
            if r.returncode != 0:
                raise CompileError(f"{self.cc} failed on generated code:\n{r.stderr.decode()}\n--- source ---\n{src}")
            with open(out, "rb") as f:
                return f.read()

    def compile_many(self, srcs: list[str]) -> list[bytes]:
        """One compiler run per library of kernels with different names (each source its own file, so their static
        helpers stay apart): starting the compiler costs about as much as compiling a kernel. Every source of a
        library gets the library as its binary. A library that fails is compiled source by source, so the error
        names its source."""
        out: list[bytes] = [b""] * len(srcs)
        for group in _libraries(srcs):
            if len(group) == 1:
                out[group[0]] = self.compile(srcs[group[0]])
                continue
            with tempfile.TemporaryDirectory() as d:
                files = []
                for i in group:
                    files.append(os.path.join(d, f"k{i}.c"))
                    with open(files[-1], "w") as f:
                        f.write(srcs[i])
                lib = os.path.join(d, "kernels.so")
                if subprocess.run(self._args(files, lib), capture_output=True).returncode != 0:
                    for i in group:
                        out[i] = self.compile(srcs[i])
                    continue
                with open(lib, "rb") as f:
                    binary = f.read()
            for i in group:
                out[i] = binary
        return out


KERNEL_NAME = re.compile(r"^void (\w+)\(", re.MULTILINE)  # (the C renderer's kernel; its helpers are static)
LIBRARY_MOST = 16  # kernels compiled into one library


def _libraries(srcs: list[str]) -> list[list[int]]:
    """The sources in groups of at most LIBRARY_MOST whose kernels' names differ (one library exports each once)."""
    groups: list[tuple[list[int], set[str]]] = []
    for i, src in enumerate(srcs):
        names = set(KERNEL_NAME.findall(src))
        home = next((g for g in groups if len(g[0]) < LIBRARY_MOST and not names & g[1]), None)
        if home is None:
            groups.append(home := ([], set()))
        home[0].append(i)
        home[1].update(names)
    return [g[0] for g in groups]


@cache
def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


class CPUAllocator(LRUAllocator):
    """Host memory, aligned to ALIGN. An allocation's opaque is its address (an int): what a kernel's ctypes function
    takes for a pointer as it is, so that a launch converts nothing. The ctypes array that owns the memory is kept
    by address until it is freed for real."""

    # (transfer: a copy between two CPU devices is a memmove when both queues have come to it)
    caps = AllocatorCaps(host_visible=True, aligned=ALIGN, views=True, foreign=True, transfer=True)

    def __init__(self, queue: Queue | None = None) -> None:
        super().__init__()
        # the device's launches: done before the host touches its memory (alone: launches that always run when given)
        self.queue = queue if queue is not None else Queue("CPU", lambda: False)
        self.owners: dict[int, Any] = {}  # each allocation's address -> the ctypes object that holds its memory

    def _alloc(self, size: int) -> Any:
        if size >= HUGE_FROM and HUGE_PAGES:
            return self._mapped(size)
        try:
            raw = (ctypes.c_uint8 * (size + ALIGN))()
        except OverflowError:  # (ctypes: larger than the address space)
            raise MemoryError(f"{size} bytes are more than this process can address") from None
        addr = (ctypes.addressof(raw) + ALIGN - 1) // ALIGN * ALIGN
        self.owners[addr] = raw
        return addr

    def _mapped(self, size: int) -> int:
        """Memory of a mapping of its own, which the system backs with its transparent huge pages (2 MB on x86-64)
        where it has them free: a model's weights read through them miss the TLB far less (a 1B model's decode step
        on 2 AVX-512 cores: float32 49 -> 44 ms, Q4_0 1.7% and float16 1% faster). Only the pages written are
        allocated, as with any other."""
        try:
            mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError):  # (ENOMEM, or past what an mmap length holds)
            raise MemoryError(f"{size} bytes could not be mapped") from None
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # (a kernel built without transparent huge pages: small pages, as malloc's)
            pass
        raw = ctypes.c_uint8.from_buffer(mapping)  # (which holds the mapping: unmapped once it is dropped)
        addr = ctypes.addressof(raw)
        self.owners[addr] = raw
        return addr

    def _free(self, opaque: Any, size: int) -> None:
        self.queue.synchronize()  # (a launch given before may still read it)
        del self.owners[opaque]

    def memory(self) -> tuple[int, int] | None:
        return host_memory()

    def as_memoryview(self, opaque: Any, size: int) -> memoryview:
        return memoryview((ctypes.c_uint8 * size).from_address(opaque)).cast("B")

    def wrap(self, address: int, size: int) -> Any:
        return address  # (an opaque is an address already)

    def offset(self, opaque: Any, offset: int, size: int) -> Any:
        return opaque + offset  # (the view's memory is owned by the allocation it is in)

    def address(self, opaque: Any) -> int:
        return opaque

    def copyin(self, dest: Any, src: memoryview) -> None:
        self.queue.synchronize()
        self.as_memoryview(dest, src.nbytes)[:] = src

    def copyout(self, dest: memoryview, src: Any) -> None:
        self.queue.synchronize()
        dest[:] = self.as_memoryview(src, dest.nbytes)

    def transfer(self, dest: Any, src: Any, size: int, src_device: Compiled, dest_device: Compiled) -> None:
        assert isinstance(src_device, CPUDevice) and isinstance(dest_device, CPUDevice)
        meet([src_device.queue, dest_device.queue], ctypes.memmove, dest, src, size)


def _dlclose(handle: int) -> None:
    _ctypes.dlclose(handle)


def load_library(binary: bytes, name: str) -> ctypes.CDLL:
    """A shared library loaded from its bytes, unloaded when the last of it and its ctypes functions is gone."""
    # a file of its own name each time: the dynamic loader would hand back an earlier library by name
    with tempfile.NamedTemporaryFile(prefix=f"tiny_{name}_", suffix=".so", delete=False) as f:
        f.write(binary)
    try:
        lib = ctypes.CDLL(f.name)
    finally:
        os.unlink(f.name)
    # unloaded when the last of the program and its ctypes functions (each holds the library) is gone: a process
    # that builds many thousand kernels would otherwise run out of memory maps (vm.max_map_count, 5 a library)
    weakref.finalize(lib, _dlclose, lib._handle).atexit = False
    return lib


class CPUProgram(Program):
    """A kernel of a shared library (what the C compiler makes), run by the calling thread or the pool."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        self.lib = self.load(binary)
        self.fn = self.symbol()  # (undeclared: what a caller that knows the C signature may declare and call)
        self.declared: dict[tuple[int, int, bool], Any] = {}  # a ctypes function of the kernel for each signature

    def load(self, binary: bytes) -> Any:
        return load_library(binary, self.name)

    @cached_property
    def address(self) -> int:
        """The kernel's address, where the pool in C calls it."""
        return kernel_address(self.fn)

    def symbol(self) -> Any:
        """A new ctypes function object of the kernel (each with argtypes of its own), returning nothing."""
        fn = self.lib[self.name]
        fn.restype = None
        return fn

    def function(self, n_bufs: int, n_vals: int, threaded: bool) -> Any:
        """The kernel as a ctypes function declared for its C signature: buffer addresses, ints, then the thread
        number if threaded. One per signature: declaring another never changes one handed out."""
        key = (n_bufs, n_vals, threaded)
        if (fn := self.declared.get(key)) is None:
            fn = self.declared[key] = self.symbol()
            fn.argtypes = [ctypes.c_void_p] * n_bufs + [ctypes.c_int] * (n_vals + threaded)
        return fn

    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False) -> float | None:
        if not wait:
            self.device.queue.submit(self.run, bufs, global_size[0], tuple(vals))
            return None
        self.device.synchronize()
        start = time.perf_counter()
        self.run(bufs, global_size[0], tuple(vals))
        return time.perf_counter() - start

    def run(self, bufs: tuple[Any, ...], threads: int, vals: tuple[int, ...] = ()) -> None:
        """The kernel on the calling thread, now: one call, or one per part (its number last, gidx0) on this thread and
        the device's pool (cpu_pool); ctypes lets go of the GIL during each."""
        fn = self.function(len(bufs), len(vals), threads > 1)
        if threads == 1:
            fn(*bufs, *vals)  # (addresses and ints: ctypes converts them by the declared argtypes)
            return
        if (workers := share()) == 1:
            for t in range(threads):
                fn(*bufs, *vals, t)
            return
        if (pool := self._pool(workers, len(bufs) + len(vals))) is not None:
            pool.run(self.address, (*bufs, *vals), threads)
            return
        # the first part on this thread, which would only wait: a launch wakes one worker fewer
        python_threads = _threads(self.device.name, workers)
        parts = [python_threads.submit(fn, *bufs, *vals, t) for t in range(1, threads)]
        fn(*bufs, *vals, 0)
        for f in parts:
            f.result()

    def _pool(self, workers: int, n_args: int) -> Pool | None:
        """The device's pool in C for `workers` threads (this one among them), where it takes n_args arguments."""
        pool = _pool(self.device.name, workers, _pool_compiler(self.device), os.getpid())
        return pool if pool is not None and n_args <= pool.most_args else None

    def launcher(
        self, n_bufs: int, global_size: tuple[int, int, int], local_size: tuple[int, int, int], n_vals: int = 0
    ) -> Callable[..., None]:
        threads = global_size[0]
        if threads == 1:  # one thread: the ctypes function itself, which takes the opaques (addresses) as is
            run: Callable[..., None] = self.function(n_bufs, n_vals, False)
        elif (workers := share()) > 1 and (pool := self._pool(workers, n_bufs + n_vals)) is not None:
            run = pool.launcher(self.address, n_bufs + n_vals, threads)  # (straight to the pool, found now)
        else:
            run = lambda *args: self.run(args[:n_bufs], threads, args[n_bufs:])  # noqa: E731
        # the threads a device shares out and its pool change only as devices open, which makes this launcher stale
        # (launchers_changed, see CPUDevice.__init__): with one CPU device open a launch runs where it is given, with
        # no call between; with several, on the device's thread
        if queued():
            put = self.device.queue._put
            return lambda *bufs: put(run, bufs)
        return run


class LLVMProgram(CPUProgram):
    """A kernel of an object file (what llvmlite makes), linked into the process; called as CPUProgram calls."""

    def load(self, binary: bytes) -> Any:
        return LoadedObject(binary)

    def symbol(self) -> Any:
        return self.lib.function(self.name)


class CPUGraph:
    """Kernels TinyJit captured, replayed by one call into the device's pool in C (tiny_pool_batch), with no Python
    between them: a 1B model's Q4_0 decode step launches 455 kernels, which launched one by one from Python took it
    17.4-18.0 ms at best on 2 AVX2 cores, 16.0-16.8 so. Their arguments are one array of 64-bit integers; a replay
    writes into it only what changed: the buffers of the launches given other ones (the inputs'), and the values of
    the launches' Variables."""

    def __init__(self, device: CPUDevice, launches: list[GraphLaunch]) -> None:
        self.device, self.launches = device, launches
        self.given = [tuple(ln.args) for ln in launches]  # each launch's buffers, as the array holds them
        self.starts: list[int] = []  # where each launch's arguments begin in the array
        self.slots: list[tuple[int, str]] = []  # (place in the array, Variable) each replay writes its value at
        flat: list[int] = []
        for ln in launches:
            self.starts.append(len(flat))
            flat += [*ln.args, *ln.vals]
            self.slots += [(len(flat) + i, name) for i, name in enumerate(ln.var_names)]
            flat += [0] * len(ln.var_names)
        self.array = (ctypes.c_int64 * len(flat))(*flat)
        self.sizes = [len(ln.args) + len(ln.vals) + len(ln.var_names) for ln in launches]
        self.epoch = -1  # the LAUNCHERS.epoch `run` was made in: the pool and where launches run change with it
        self.run: Callable[[Any, Mapping[str, int]], None] = self._kernel_by_kernel

    def __call__(self, args: list[tuple[Any, ...]], values: Mapping[str, int]) -> None:
        array, given = self.array, self.given
        for i, new in enumerate(args):
            if new is not given[i] and new != given[i]:
                start = self.starts[i]
                for j, a in enumerate(new):
                    array[start + j] = a
                given[i] = new
        for at, name in self.slots:
            array[at] = values[name]
        if self.epoch != LAUNCHERS.epoch:
            self.epoch, self.run = LAUNCHERS.epoch, self._runner()
        self.run(array, values)

    def _runner(self) -> Callable[[Any, Mapping[str, int]], None]:
        """How a replay runs now: one call into the device's pool, on the device's thread where several CPU devices
        are open (on a copy of the arguments, which the next replay leaves alone), kernel by kernel where no pool
        can be had (a forked child without a compiler)."""
        pool = _pool(self.device.name, share(), _pool_compiler(self.device), os.getpid())
        if pool is None:
            return self._kernel_by_kernel
        kernels = [ln.program.address for ln in self.launches]  # type: ignore[attr-defined]
        batch = pool.batch(kernels, self.sizes, [ln.global_size[0] for ln in self.launches])
        if queued():
            submit, copy = self.device.queue.submit, type(self.array).from_buffer_copy
            return lambda array, values: submit(batch, copy(array))
        return lambda array, values: batch(array)

    def _kernel_by_kernel(self, array: Any, values: Mapping[str, int]) -> None:
        for ln, a in zip(self.launches, self.given):
            vals = ln.vals or tuple(values[name] for name in ln.var_names)
            ln.program(*a, global_size=ln.global_size, local_size=ln.local_size, vals=vals)


class CPUDevice(Compiled):
    """C (the default) compiled by clang or gcc, or LLVM IR (CPU:LLVM) compiled by llvmlite: no C compiler needed."""

    priority = 10
    renderers = ("C", "LLVM")
    collective = SHARED_MEMORY  # (the CPU devices of a process read each other's memory)

    @classmethod
    def default_renderer(cls) -> str:
        """C where clang is here (or CC names a compiler), else LLVM where llvmlite is, else C through gcc: clang and
        LLVM make code of one speed, gcc's vector code is slower (see bench/RESULTS.md, by compiler)."""
        if CC.value or find_clang() is not None or not llvmlite_present():
            return "C"
        return "LLVM"

    def describe(self) -> str:
        if self.renderer_name == "LLVM":
            return f"{host().llvm_version}, in-process"
        return f"{self.cc}: {_version(self.cc)}"

    def __init__(self, name: str, renderer: str) -> None:
        if renderer == "LLVM":
            require_llvmlite()
            self.cc = ""
        else:
            self.cc = find_compiler()
        self.threads = thread_count()  # (the parts each kernel is compiled to split into)
        self.queue = Queue(name, queued)
        super().__init__(name, CPUAllocator(self.queue), LLVMProgram if renderer == "LLVM" else CPUProgram, renderer)
        if (index := _index(name)) not in _indices:
            _indices.add(index)
            if len(_indices) == 2:  # launches given to run where given now go to the devices' threads
                launchers_changed()

    def synchronize(self) -> None:
        self.queue.synchronize()

    def graph(self, launches: list[GraphLaunch]) -> GraphReplay | None:
        """One call into the device's pool in C for the kernels TinyJit captured (CPUGraph), where there is a pool
        and each kernel takes no more arguments than it passes."""
        pool = _pool(self.name, share(), _pool_compiler(self), os.getpid())
        if not launches or pool is None:
            return None
        for ln in launches:
            if not isinstance(ln.program, CPUProgram) or ln.program.device is not self:
                return None
            if len(ln.args) + len(ln.vals) + len(ln.var_names) > pool.most_args or len(ln.var_names) and ln.vals:
                return None
        return CPUGraph(self, launches)

    def launch_with(
        self,
        others: tuple[Compiled, ...],
        runner: Program,
        args: tuple[Any, ...],
        global_size: tuple[int, int, int],
        local_size: tuple[int, int, int],
        vals: tuple[int, ...] = (),
    ) -> None:
        """The kernel when all the devices' queues have come to it (see cpu_queue.meet)."""
        assert isinstance(runner, CPUProgram) and all(isinstance(o, CPUDevice) for o in others)
        meet([self.queue, *(o.queue for o in others)], runner.run, args, global_size[0], vals)  # type: ignore[attr-defined]

    def set_compiler(self, cc: str) -> None:
        """Compile this device's C with `cc` (a C compiler on PATH) from now on, whatever CC says: one process can
        hold CPU:1 with clang and CPU:2 with gcc side by side (the benchmark's --compiler axis)."""
        if self.renderer_name != "C":
            raise ValueError(f"{self.name} renders {self.renderer_name}, not C: it takes no C compiler")
        if shutil.which(cc) is None:
            raise DeviceUnavailable(f"the C compiler {cc!r} is not on PATH")
        self.cc = cc
        for cached in ("_compiler", "renderer"):  # both were made for the old compiler (its features), if at all
            self.__dict__.pop(cached, None)

    def compiler(self) -> Compiler:
        return LLVMCompiler() if self.renderer_name == "LLVM" else ClangCompiler(self.cc)

    def renderer_target(self) -> str:
        if self.renderer_name == "LLVM":
            features = ["f16"] if host().has_f16_conversions else []
        else:
            features = sorted(compiler_features(self.cc))
        return (
            f"{platform.machine()};vector_width={host_vector_width()};threads={self.threads};"
            f"prefetch_locality={prefetch_locality()};" + ",".join(features)
        )
