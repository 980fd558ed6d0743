"""The device contract: what a runtime implements and a renderer provides (versioned by INTERFACE_VERSION).

A runtime package implements `Compiled` (with an `Allocator`, a `Compiler` per language it takes and a `Program`
class) and registers it under the `tiny.devices` entry-point group (tiny.ir.device.registry finds it). A renderer
(kernel -> source) implements `Renderer` and registers under `tiny.renderers`. Kernels reach a device only as lists
of UOps from the device op set (tiny.ir.spec).
"""

from __future__ import annotations

import functools
import math
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar

from tiny.ir.device.collective import Collective
from tiny.ir.diskcache import cache_get, cache_put, digest
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.sint import sym_eval
from tiny.ir.tensorcore import TensorCore  # noqa: F401  (re-exported: renderers declare theirs)
from tiny.ir.uop import UOp

# (major, minor): runtimes pin a compatible major (1.2: Program.launcher; 1.3: Allocator.memory; 1.4: foreign memory,
# AllocatorCaps.foreign with Allocator.wrap and Allocator.address; 1.5: Compiled.default_renderer and describe; 1.6:
# CompiledProgram.grid, a workgroup count over a Variable, and a kernel's fewer workgroups than its gidx ranges;
# Compiler.compile_many and Compiled.compile_many, several kernels in one compiler run; 1.7:
# RendererCaps.narrow_vectors; 1.8: Renderer.unavailable, why a renderer cannot be used here; 1.9:
# Compiled.collective, a device's own all-reduce and all-gather; 1.10: Compiled.launch_with, a kernel that reads
# other devices' memory; 1.11: launchers_changed and LAUNCHERS.epoch, launchers given before to be asked for again;
# 1.12: Ops.DOT4 and RendererCaps.dot4, a renderer that writes the op itself; 1.13: Program.launcher's n_vals, a
# launch given the values of the kernel's Variables after its opaques; 1.14: Ops.SDOT4 and RendererCaps.sdot4; 1.15:
# GraphLaunch.var_names, a graph's replay called with the Variables' values by name beside the launches' buffers;
# 1.16: Ops.COPY_ASYNC, BARRIER "async" and RendererCaps.async_copy; 1.17: RendererCaps.half_pairs; 1.18: BARRIER
# ("async", n), copies grouped by barrier, n groups left in flight)
INTERFACE_VERSION = (1, 18)


# the dtypes kernels compute on in hardware vectors (RendererCaps.vector_lanes; the code generator's vector ops)
VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})

LIST_HINT = " (`python -m tiny.ir.device` lists the devices that start here, and why the others do not)"


class DeviceUnavailable(RuntimeError):
    """A device that cannot start; the message says why (no driver, no compiler ...). Raised by `Device[name]`, it
    names the device and points to the listing; `reason` is the runtime's own words, as the listing shows them."""

    reason: str = ""


class UnknownDevice(ValueError):
    """A device name no installed runtime provides."""


# ---------------------------------------------------------------- renderers


@dataclass(frozen=True)
class RendererCaps:
    """What a renderer's language and target can do; the code generator reads this, never probes."""

    language: str  # "C", "CUDA", "PTX", "OpenCL", "PYTHON" ...
    has_local: bool = False  # kernels index with hardware global/local ids instead of loops
    has_shared: bool = False  # local (workgroup) memory and barriers
    global_max: tuple[int, ...] | None = None  # per-dimension limit of the global size
    local_max: tuple[int, ...] | None = None  # per-dimension limit of the local size
    local_total_max: int = 0  # product limit of the local size
    shared_max: int = 0  # bytes of local memory a kernel may use
    vector_width: int = 1  # floats per hardware vector, for upcasting loads, stores and math
    # vectors of 8- and 16-bit lanes beside float32's (as many lanes as a float32 vector): loads of int8/uint8/
    # int16/uint16/float16, bitwise ops and constant shifts on the integers, and conversions of them to float32
    narrow_vectors: bool = False
    threads: int = 1  # CPU threads one kernel may use: its global dim 0, run as separate calls on a loop device
    dtypes: frozenset[DType] = frozenset(dtypes.all())  # dtypes it computes on
    tensor_cores: tuple[TensorCore, ...] = ()
    max_buffers: int = 0  # buffers and variables one kernel may bind (WebGPU: the adapter's limit); 0: no limit
    max_loop_iterations: int = 0  # loop iterations one thread may run in all (llvmpipe stops at 65535); 0: no limit
    supports_float_div: bool = True
    # Ops.DOT4 (four byte products summed, tiny.ir.uop) in the renderer's own words, fast on the target (x86's VNNI);
    # off: the code generator writes it out in shifts, products and sums, and no renderer sees the op
    dot4: bool = False
    # Ops.SDOT4 (signed bytes both) as fast as DOT4 or faster (x86's AVX2 without VNNI: DOT4's unsigned bytes there
    # take two byte products, SDOT4's one): a quantized product of signed quants (Q8_0) takes it; else DOT4 over
    # quants offset by 128, less 128 times the input's sum. Only with dot4 on (the renderer writes SDOT4 as DOT4).
    sdot4: bool = False
    # Ops.COPY_ASYNC (a copy of 4, 8 or 16 bytes from global into local memory that lands by a BARRIER ("async", n):
    # NVIDIA's cp.async, sm_80 and newer): tensor-core tiles staged n + 1 K steps ahead (STAGE n + 1)
    async_copy: bool = False
    # a STORE of two 16-bit values (a VECTORIZE of two float16 or bfloat16) as one 32-bit store where the address is
    # aligned (two where not): a tensor core's C fragment's neighbours (NVIDIA's c0, c1) are stored so
    half_pairs: bool = False

    def vector_lanes(self, dtype: DType) -> int:
        """How many values of dtype one hardware vector holds (1: this dtype is not vectorized)."""
        if dtype not in VECTOR_DTYPES:
            return 1
        return max(1, self.vector_width * 4 // dtype.itemsize)


class Renderer:
    """Turns a linearized kernel (UOps of the device op set) into source or binary for one language."""

    caps: RendererCaps

    def __init__(self, target: str = "") -> None:
        self.target = target

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this renderer cannot be used on this machine (a library it builds kernels with is missing), or None."""
        return None

    def render(self, name: str, uops: list[UOp]) -> str:
        raise NotImplementedError


# ---------------------------------------------------------------- compilers and programs


@dataclass(frozen=True)
class CompiledProgram:
    """A kernel ready to launch: what it is, how to call it, and its binary."""

    name: str
    device: str
    language: str
    src: str
    binary: bytes
    n_buffers: int  # buffer arguments, output(s) first
    outs: tuple[int, ...]  # which buffer arguments are written
    var_names: tuple[str, ...]  # integer arguments after the buffers, in order
    global_size: tuple[Any, Any, Any] = (1, 1, 1)  # workgroups: ints, or sizes over the Variables (see grid)
    local_size: tuple[int, int, int] = (1, 1, 1)
    flops: int = 0  # estimated operations per launch (at the Variables' largest values)
    mem_bytes: int = 0  # estimated bytes moved per launch

    def grid(self, vals: tuple[int, ...] = ()) -> tuple[int, int, int]:
        """The workgroups of a launch with these values of var_names: a count over a Variable takes its value."""
        if all(type(g) is int for g in self.global_size):
            return self.global_size
        values = dict(zip(self.var_names, vals))
        x, y, z = (sym_eval(g, values) for g in self.global_size)
        return (x, y, z)


class CompileError(RuntimeError):
    """The compiler refused generated code: a bug in tiny, reported with the source."""


class Compiler:
    """Source -> binary, cached on disk by (cachekey, source) unless cachekey is None."""

    def __init__(self, cachekey: str | None = None) -> None:
        self.cachekey = cachekey

    def compile(self, src: str) -> bytes:
        raise NotImplementedError

    def compile_many(self, srcs: list[str]) -> list[bytes]:
        """Several sources, a binary each (one binary may serve several: a library of their kernels). A compiler
        whose every run has a fixed cost (a process to start) takes them in one run; this one takes them one by one."""
        return [self.compile(src) for src in srcs]

    def _key(self, src: str) -> str:
        return digest(f"{self.cachekey}\0{src}".encode())

    def compile_cached(self, src: str) -> bytes:
        return self.compile_many_cached([src])[0]

    def compile_many_cached(self, srcs: list[str]) -> list[bytes]:
        """compile_many, with each source's binary from the disk cache where it is there already."""
        if self.cachekey is None:
            return self.compile_many(srcs)
        keys = [self._key(src) for src in srcs]
        out: list[bytes | None] = [cache_get("compile", key) for key in keys]
        missing = [i for i, b in enumerate(out) if b is None]
        if missing:
            for i, binary in zip(missing, self.compile_many([srcs[i] for i in missing])):
                cache_put("compile", keys[i], binary)
                out[i] = binary
        return [b for b in out if b is not None]


class Program:
    """A loaded kernel. Calling it launches it; with wait=True it returns the seconds it took."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        self.device, self.name, self.binary = device, name, binary

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        raise NotImplementedError

    def launcher(
        self, n_bufs: int, global_size: tuple[int, int, int], local_size: tuple[int, int, int], n_vals: int = 0
    ) -> Callable[..., None]:
        """A call that launches the kernel on the opaques of `n_bufs` buffers, then the values of its `n_vals` integer
        variables, with this grid, without waiting: what realize() and TinyJit call for each kernel they run, so a
        runtime may give a leaner one than __call__ (the CPU's is the ctypes function itself)."""
        if n_vals:
            return lambda *args: self(
                *args[:n_bufs], global_size=global_size, local_size=local_size, vals=args[n_bufs:]
            )
        return functools.partial(self, global_size=global_size, local_size=local_size)


class _Launchers:
    """How many times a runtime said that the launchers it gave before (Program.launcher) are stale: `epoch`, read
    as an attribute (asked at every schedule run; a call would cost more than the read)."""

    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0


LAUNCHERS = _Launchers()


def launchers_changed() -> None:
    """A runtime's launchers given before (Program.launcher) no longer launch as they must now (the CPU devices went
    from one, where a launch runs as it is given, to several, each running its own on a thread): callers that keep
    launchers (realize's programs, TinyJit's recordings) ask for them again when LAUNCHERS.epoch has moved."""
    LAUNCHERS.epoch += 1


GraphReplay = Callable[[list[tuple[Any, ...]], Mapping[str, int]], None]  # a device's replay of captured launches


@dataclass(frozen=True)
class GraphLaunch:
    """One kernel launch of a captured sequence that a device's graph executor replays."""

    program: Program
    args: tuple[Any, ...]  # buffer handles (allocator opaques), output(s) first
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    vals: tuple[int, ...] = ()
    var_names: tuple[str, ...] = ()  # Variables whose values each replay passes after the buffers (vals then empty)


# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class AllocatorCaps:
    host_visible: bool = False  # as_memoryview gives the device memory itself (no copy)
    transfer: bool = False  # transfer() copies between two devices of this kind without the host
    aligned: int = 16  # alignment of every allocation, bytes
    views: bool = False  # offset() gives a sub-range of an allocation that shares its memory
    foreign: bool = False  # wrap() takes memory someone else owns at an address, address() tells where an allocation is


class Allocator:
    """alloc/free/copyin/copyout of device memory; optional zero-copy views and device-to-device copies."""

    caps: AllocatorCaps = AllocatorCaps()

    def alloc(self, size: int) -> Any:
        raise NotImplementedError

    def free(self, opaque: Any, size: int) -> None:
        pass

    def copyin(self, dest: Any, src: memoryview) -> None:
        raise NotImplementedError

    def copyout(self, dest: memoryview, src: Any) -> None:
        raise NotImplementedError

    def memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of the memory this allocator takes from, for an error that says why an allocation
        failed; None where the device does not say."""
        return None

    def as_memoryview(self, opaque: Any, size: int) -> memoryview:
        raise NotImplementedError(f"{type(self).__name__} memory is not host visible")

    def offset(self, opaque: Any, offset: int, size: int) -> Any:
        """The `size` bytes of an allocation that start `offset` bytes in, sharing its memory."""
        raise NotImplementedError(f"{type(self).__name__} has no views into its allocations")

    def transfer(self, dest: Any, src: Any, size: int, src_device: Compiled, dest_device: Compiled) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no device-to-device transfer")

    def wrap(self, address: int, size: int) -> Any:
        """An opaque for the `size` bytes at `address`, memory of this device that someone else owns (no copy); it is
        never given to free()."""
        raise NotImplementedError(f"{type(self).__name__} cannot wrap memory it did not allocate")

    def address(self, opaque: Any) -> int:
        """The address of an allocation (or of a view of one), as another library takes it."""
        raise NotImplementedError(f"{type(self).__name__} does not tell the address of its allocations")


def host_memory() -> tuple[int, int] | None:
    """(available, total) bytes of the host's physical memory, as the OS reports them (None where it does not)."""
    if not hasattr(os, "sysconf"):
        return None
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError):
        return None


def _gib(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / 2**30:.3g} GiB)"


def out_of_memory(device: str, nbytes: int, what: str, allocator: Allocator, why: str = "") -> str:
    """The message of a MemoryError: what was asked for, on which device, and how much memory the device has."""
    has = allocator.memory()
    text = f"{device} cannot allocate {_gib(nbytes)} for {what}: "
    text += f"it has {_gib(has[0])} free of {_gib(has[1])}" if has else "it does not say how much memory it has"
    return text + (f"; {why}" if why else "")


class LRUAllocator(Allocator):
    """Keeps freed allocations by size and hands them out again; frees them for real when alloc fails."""

    def __init__(self) -> None:
        self.cache: dict[int, list[Any]] = defaultdict(list)

    def alloc(self, size: int) -> Any:
        if self.cache[size]:
            return self.cache[size].pop()
        try:
            return self._alloc(size)
        except MemoryError:
            self.free_cache()
            return self._alloc(size)

    def free(self, opaque: Any, size: int) -> None:
        self.cache[size].append(opaque)

    def free_cache(self) -> None:
        for size, opaques in self.cache.items():
            for o in opaques:
                self._free(o, size)
        self.cache.clear()

    def _alloc(self, size: int) -> Any:
        raise NotImplementedError

    def _free(self, opaque: Any, size: int) -> None:
        pass


# ---------------------------------------------------------------- devices


class Compiled:
    """One device: its allocator, the renderers it takes (the first is the default), a compiler for each
    renderer's language, and the Program class that launches binaries."""

    priority: ClassVar[int] = 0  # higher is tried first when DEVICE is unset
    renderers: ClassVar[tuple[str, ...]] = ()  # names in the tiny.renderers group, default first
    computes: ClassVar[bool] = True  # False: a device that only holds data (DISK): no kernels run on it
    file_backed: ClassVar[bool] = False  # its names are BASE:<file path> (DISK:/data/model.safetensors)
    # how tensors on several devices of this class are combined; None: copies around a ring (RingCollective)
    collective: ClassVar[Collective | None] = None

    def __init__(self, name: str, allocator: Allocator, program: type[Program], renderer: str) -> None:
        self.name = name
        self.allocator = allocator
        self.program = program
        self.renderer_name = renderer

    @classmethod
    def default_renderer(cls) -> str:
        """The renderer of a name that names none ('CPU'): the first of `renderers`, unless the device picks by what
        this machine has (the CPU: C where clang is here, else LLVM in-process, else C through gcc)."""
        return cls.renderers[0] if cls.renderers else ""

    def compiler(self) -> Compiler:
        """The compiler for this device's chosen renderer."""
        raise NotImplementedError

    def describe(self) -> str:
        """What this device compiles with, in words (a compiler and its version), for `python -m tiny.ir.device`
        and DEBUG=1; empty where there is nothing to say."""
        return ""

    def renderer_target(self) -> str:
        """The target the renderer generates for (an ISA, a GPU architecture ...)."""
        return ""

    @functools.cached_property
    def renderer(self) -> Renderer:
        return load_renderer(self.renderer_name)(self.renderer_target())

    def use_renderer(self, renderer: Renderer) -> None:
        """Render this device's kernels with `renderer` from now on (a mock device's wraps the real one to see what
        it renders)."""
        self.__dict__["renderer"] = renderer

    @functools.cached_property
    def _compiler(self) -> Compiler:
        return self.compiler()

    def synchronize(self) -> None:
        pass

    def launch_with(
        self,
        others: tuple[Compiled, ...],
        runner: Program,
        args: tuple[Any, ...],
        global_size: tuple[int, int, int],
        local_size: tuple[int, int, int],
        vals: tuple[int, ...] = (),
    ) -> None:
        """Launch a kernel of this device that reads memory of the devices `others` too (devices that share memory,
        whose collective reads each device's part where it lies): after what each of them was given before, and
        before what each is given after. This one waits for them all, runs the kernel to its end, and goes on."""
        for device in others:
            device.synchronize()
        runner(*args, global_size=global_size, local_size=local_size, vals=vals, wait=True)

    def graph(self, launches: list[GraphLaunch]) -> GraphReplay | None:
        """A replay of kernels TinyJit captured, in one submission (a CUDA graph ...): a callable that takes each
        launch's buffer arguments (changed where the inputs did) and the values of the launches' Variables by name,
        and runs them all. None: replay kernel by kernel (a device's graph may decline launches with var_names)."""
        return None

    def load(self, program: CompiledProgram) -> Program:
        return _load_program(self, program.name, program.binary)

    def compile(self, src: str) -> bytes:
        return self._compiler.compile_cached(src)

    def compile_many(self, srcs: list[str]) -> list[bytes]:
        return self._compiler.compile_many_cached(srcs)


@functools.lru_cache(maxsize=4096)
def _load_program(device: Compiled, name: str, binary: bytes) -> Program:
    return device.program(device, name, binary)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fold_grid(global_size: tuple[int, int, int], max_per_dim: int) -> tuple[int, int, int]:
    """The workgroup counts to launch a grid on a device that allows at most max_per_dim in each dimension: the
    grid itself where it fits, else its workgroups folded into up to three dimensions (x fastest), for a kernel that
    unfolds its flat workgroup number again (the WGSL renderer's do)."""
    if max(global_size) <= max_per_dim:
        return global_size
    total = math.prod(global_size)
    x = min(total, max_per_dim)
    y = min(-(-total // x), max_per_dim)
    z = -(-total // (x * y))
    if z > max_per_dim:
        raise ValueError(f"a grid of {global_size} workgroups is more than a device can launch ({max_per_dim}**3)")
    return (x, y, z)


# ---------------------------------------------------------------- entry points: how runtimes and renderers are found


def _group(group: str) -> dict[str, Any]:
    return {ep.name.upper(): ep for ep in entry_points(group=group)}


@functools.cache
def device_entry_points() -> dict[str, Any]:
    return _group("tiny.devices")


@functools.cache
def renderer_entry_points() -> dict[str, Any]:
    return _group("tiny.renderers")


def load_renderer(name: str) -> type[Renderer]:
    eps = renderer_entry_points()
    if name not in eps:
        raise UnknownDevice(f"no renderer named {name!r} is installed; installed renderers: {sorted(eps)}")
    return eps[name].load()
