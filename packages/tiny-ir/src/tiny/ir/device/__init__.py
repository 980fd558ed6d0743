"""The device interface: the contract between tiny and a piece of hardware.

A runtime package implements `Compiled` (with an `Allocator`, a `Compiler` per language it takes and a
`Program` class) and registers it under the `tiny.devices` entry-point group. A renderer (kernel ->
source) implements `Renderer` and registers under `tiny.renderers`. Kernels reach a device only as
lists of UOps from the device op set (tiny.ir.spec).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import os
import re
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from tiny.ir.config import DEBUG, DEVICE
from tiny.ir.diskcache import cache_get, cache_put
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.sint import sym_eval
from tiny.ir.tensorcore import TensorCore  # noqa: F401  (re-exported: renderers declare theirs)
from tiny.ir.uop import Ops, UOp, make_node

# (major, minor): runtimes pin a compatible major (1.2: Program.launcher; 1.3: Allocator.memory; 1.4: foreign memory,
# AllocatorCaps.foreign with Allocator.wrap and Allocator.address; 1.5: Compiled.default_renderer and describe; 1.6:
# CompiledProgram.grid, a workgroup count over a Variable, and a kernel's fewer workgroups than its gidx ranges;
# Compiler.compile_many and Compiled.compile_many, several kernels in one compiler run)
INTERFACE_VERSION = (1, 6)


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
    threads: int = 1  # CPU threads one kernel may use: its global dim 0, run as separate calls on a loop device
    dtypes: frozenset[DType] = frozenset(dtypes.all())  # dtypes it computes on
    tensor_cores: tuple[TensorCore, ...] = ()
    max_buffers: int = 0  # buffers and variables one kernel may bind (WebGPU: the adapter's limit); 0: no limit
    max_loop_iterations: int = 0  # loop iterations one thread may run in all (llvmpipe stops at 65535); 0: no limit
    supports_float_div: bool = True


class Renderer:
    """Turns a linearized kernel (UOps of the device op set) into source or binary for one language."""

    caps: RendererCaps

    def __init__(self, target: str = "") -> None:
        self.target = target

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
        return hashlib.sha256(f"{self.cachekey}\0{src}".encode()).hexdigest()

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
        self, n_bufs: int, global_size: tuple[int, int, int], local_size: tuple[int, int, int]
    ) -> Callable[..., None]:
        """A call that launches the kernel on the opaques of `n_bufs` buffers (and no integer variables) with this
        grid, without waiting: what realize() calls for each kernel it runs, so a runtime may give a leaner one than
        __call__ (the CPU's is the ctypes function itself)."""
        return functools.partial(self, global_size=global_size, local_size=local_size)


@dataclass(frozen=True)
class GraphLaunch:
    """One kernel launch of a captured sequence that a device's graph executor replays."""

    program: Program
    args: tuple[Any, ...]  # buffer handles (allocator opaques), output(s) first
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    vals: tuple[int, ...] = ()


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

    @functools.cached_property
    def _compiler(self) -> Compiler:
        return self.compiler()

    def synchronize(self) -> None:
        pass

    def graph(self, launches: list[GraphLaunch]) -> Callable[[list[tuple[Any, ...]]], None] | None:
        """A replay of kernels TinyJit captured, in one submission (a CUDA graph ...): a callable that takes each
        launch's buffer arguments (changed where the inputs did) and runs them all. None: replay kernel by kernel."""
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


@dataclass(frozen=True)
class DeviceName:
    """A parsed device string: 'cuda:1' -> CUDA index 1; 'CPU:LLVM' -> CPU with the LLVM renderer."""

    base: str
    index: int = 0
    renderer: str | None = None

    def __str__(self) -> str:
        return self.base + (f":{self.index}" if self.index else "") + (f":{self.renderer}" if self.renderer else "")

    @staticmethod
    def parse(name: str) -> DeviceName:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(:[A-Za-z0-9_]+){0,2}", name):
            raise UnknownDevice(f"device must be a string like 'CPU', 'cuda:1' or 'CPU:LLVM', got {name!r}")
        base, *rest = name.split(":")
        indices = [int(p) for p in rest if p.isdigit()]
        renderers = [p.upper() for p in rest if not p.isdigit()]
        if len(indices) > 1 or len(renderers) > 1:
            raise UnknownDevice(
                f"device {name!r} names more than one index or renderer; expected NAME[:INDEX][:RENDERER]"
            )
        return DeviceName(base.upper(), indices[0] if indices else 0, renderers[0] if renderers else None)


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


class _Registry:
    """`Device["CPU"]` opens (once) and returns a device; `Device.DEFAULT` is the default device's name."""

    def __init__(self) -> None:
        self._open: dict[str, Compiled] = {}
        self._default: str | None = None

    def canonicalize(self, name: str) -> str:
        """'cuda:1' -> 'CUDA:1'; a device's default renderer is left out ('CPU:C' -> 'CPU'); a file-backed
        device's path is made absolute ('disk:w.bin' -> 'DISK:/home/me/w.bin')."""
        if isinstance(name, str) and name in self._open:  # an opened device's name is canonical (each op asks again)
            return name
        if (path := _file_path(name)) is not None:
            return path
        parsed = DeviceName.parse(name)
        if parsed.base not in device_entry_points():
            known = ", ".join(sorted(device_entry_points())) or "none (is a tiny runtime package installed?)"
            raise UnknownDevice(f"unknown device {name!r}; known devices: {known}")
        if parsed.renderer is not None:
            cls = device_entry_points()[parsed.base].load()
            if cls.renderers and parsed.renderer == cls.default_renderer():
                parsed = DeviceName(parsed.base, parsed.index)
        return str(parsed)

    def __getitem__(self, name: str) -> Compiled:
        if (opened := self._open.get(name)) is not None:  # a canonical name, as buffers and tensors hold
            return opened
        canon = self.canonicalize(name)
        if canon not in self._open:
            if _file_path(canon) is not None:
                self._open[canon] = device_entry_points()[canon.split(":", 1)[0]].load()(canon, "")
                return self._open[canon]
            parsed = DeviceName.parse(canon)
            cls = device_entry_points()[parsed.base].load()
            renderer = parsed.renderer or cls.default_renderer()
            if cls.renderers and renderer not in cls.renderers:
                raise UnknownDevice(f"device {parsed.base} takes the renderers {list(cls.renderers)}, not {renderer!r}")
            try:
                dev = cls(canon, renderer)
            except DeviceUnavailable as e:
                opened = DeviceUnavailable(f"{canon}: {e}{LIST_HINT}")
                opened.reason = str(e)  # what the listing shows
                raise opened from None
            if DEBUG >= 1:
                print(f"opened device {canon} with renderer {renderer}" + (f" ({d})" if (d := dev.describe()) else ""))
            self._open[canon] = dev
        return self._open[canon]

    @property
    def DEFAULT(self) -> str:  # noqa: N802
        if DEVICE.value:
            return self.canonicalize(DEVICE.value)
        if self._default is None:
            self._default = _fastest_present()
        return self._default

    def set_default(self, name: str | None) -> None:
        self._default = None if name is None else self.canonicalize(name)


Device = _Registry()


def _file_path(name: str) -> str | None:
    """'disk:w.bin' -> 'DISK:/abs/w.bin' when the base names a file-backed device; None for every other name."""
    if not isinstance(name, str) or ":" not in name:
        return None
    base, path = name.split(":", 1)
    ep = device_entry_points().get(base.upper())
    if ep is None or not getattr(ep.load(), "file_backed", False):
        return None
    if not path:
        raise UnknownDevice(f"device {name!r} needs a file path after the colon, e.g. 'DISK:/data/model.safetensors'")
    return f"{base.upper()}:{os.path.abspath(os.path.expanduser(path))}"


@functools.cache
def device_computes(name: str) -> bool:
    """Whether kernels run on the device (False for DISK, which only holds data); a name no runtime provides
    is taken to compute (the scheduler plans for devices it cannot open)."""
    return _class_computes(name.split(":", 1)[0].upper())


def opened_caps(name: str) -> RendererCaps | None:
    """The renderer caps of an opened device that computes (its limits: buffers per kernel, loop iterations ...);
    None for a device not opened: the scheduler plans for devices it has not opened as unlimited."""
    opened = Device._open.get(name)
    return opened.renderer.caps if isinstance(opened, Compiled) and opened.computes else None


@functools.cache
def _class_computes(base: str) -> bool:
    ep = device_entry_points().get(base)
    return ep is None or bool(getattr(ep.load(), "computes", True))


def _fastest_present() -> str:
    order = sorted(device_entry_points(), key=lambda n: -_priority(n))
    for name in order:
        try:
            Device[name]
            return name
        except Exception:  # noqa: BLE001  (any failure to start means "not this one")
            continue
    raise DeviceUnavailable(f"no device could start; tried {order}. See `python -m tiny.ir.device`")


def _priority(name: str) -> int:
    try:
        return int(device_entry_points()[name].load().priority)
    except Exception:  # noqa: BLE001
        return -1


@dataclass(frozen=True)
class DeviceStatus:
    name: str
    ok: bool
    reason: str  # why it is absent, or what it is when present
    renderers: tuple[str, ...] = field(default=())
    renderer: str = ""  # the one it opened with


def available() -> list[DeviceStatus]:
    """Every known device (installed runtime), whether it starts here, and why not when it does not."""
    out = []
    for name, ep in sorted(device_entry_points().items()):
        try:
            cls = ep.load()
            if cls.file_backed:
                out.append(DeviceStatus(name, True, f"{cls.__name__}, one device per file: {name}:/path/to/file"))
                continue
            dev = Device[name]
            what = f"{type(dev).__name__}, renderer {dev.renderer_name}" + (f" ({d})" if (d := dev.describe()) else "")
            out.append(DeviceStatus(name, True, what, cls.renderers, dev.renderer_name))
        except Exception as e:  # noqa: BLE001
            why = getattr(e, "reason", "") or str(e)
            out.append(DeviceStatus(name, False, f"{type(e).__name__}: {why}"))
    return out


# ---------------------------------------------------------------- buffers


class Buffer:
    """Memory on a device for `size` elements of `dtype`, allocated when first needed; or a view of another
    buffer's memory, `offset` bytes in (`base` is then that buffer); or memory someone else owns (`foreign`)."""

    __slots__ = (
        "device",
        "size",
        "dtype",
        "base",
        "offset",
        "_opaque",
        "_allocator",
        "foreign",
        "owner",
        "__weakref__",
    )

    def __init__(self, device: str, size: int, dtype: DType, base: Buffer | None = None, offset: int = 0) -> None:
        self.device, self.size, self.dtype = device, size, dtype
        self.base, self.offset = base, offset
        self._opaque: Any = None
        self._allocator: Allocator | None = None  # the allocator that gave _opaque (and takes it back)
        self.foreign = False  # memory tiny did not allocate (Buffer.wrap): never freed here
        self.owner: Any = None  # what keeps foreign memory alive, held as long as this buffer

    @staticmethod
    def wrap(device: str, address: int, size: int, dtype: DType, owner: Any = None) -> Buffer:
        """A buffer over `size` elements of `dtype` at `address`, memory of `device` that someone else owns (no copy):
        `owner` is kept alive as long as the buffer, and the memory is never freed here."""
        allocator = Device[device].allocator
        if not allocator.caps.foreign:
            raise ValueError(
                f"{device} cannot wrap memory it did not allocate ({type(allocator).__name__} does not declare "
                "AllocatorCaps.foreign); expected a device such as CPU or CUDA"
            )
        if not isinstance(address, int) or isinstance(address, bool) or address <= 0:
            raise ValueError(f"the address of foreign memory must be a positive int, got {address!r}")
        buffer = Buffer(device, size, dtype)
        buffer._opaque, buffer._allocator = allocator.wrap(address, size * dtype.itemsize), allocator
        buffer.foreign, buffer.owner = True, owner
        return buffer

    @property
    def address(self) -> int:
        """Where the memory is, as another library takes it (on devices whose allocator declares `foreign`)."""
        return self.allocator.address(self.opaque)

    def __repr__(self) -> str:
        state = "allocated" if self._opaque is not None else "lazy"
        at = f" at byte {self.offset} of {self.base!r}" if self.base is not None else ""
        return f"<Buffer {self.device} {self.size} x {self.dtype.name} {state}{at}>"

    def view(self, size: int, dtype: DType, offset: int) -> Buffer:
        """`size` elements of `dtype` starting `offset` bytes into this buffer, sharing its memory."""
        if not self.allocator.caps.views:
            raise NotImplementedError(f"{self.device} has no views into its buffers")
        if offset < 0 or offset + size * dtype.itemsize > self.nbytes:
            raise ValueError(
                f"a view of {size} x {dtype.name} at byte {offset} does not fit a buffer of {self.nbytes} bytes"
            )
        base = self.base if self.base is not None else self
        return Buffer(self.device, size, dtype, base, self.offset + offset)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._opaque is not None

    @property
    def allocator(self) -> Allocator:
        return Device[self.device].allocator

    def ensure_allocated(self) -> Buffer:
        if self._opaque is None:
            if (device := Device._open.get(self.device)) is None:  # (opened already: without the registry's call)
                device = Device[self.device]
            allocator, nbytes = device.allocator, self.size * self.dtype.itemsize
            if self.base is not None:
                self._opaque = allocator.offset(self.base.opaque, self.offset, nbytes)
            else:
                try:
                    self._opaque = allocator.alloc(nbytes or 1)
                except MemoryError as e:
                    what = f"{self.size} {self.dtype.name} values"
                    raise MemoryError(out_of_memory(self.device, nbytes, what, allocator, str(e))) from None
            self._allocator = allocator
        return self

    @property
    def opaque(self) -> Any:
        if (opaque := self._opaque) is None:
            opaque = self.ensure_allocated()._opaque
        return opaque

    def copyin(self, src: memoryview) -> Buffer:
        src = src.cast("B") if src.format != "B" or src.ndim != 1 else src
        if src.nbytes != self.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {self.nbytes} bytes")
        if self.nbytes:
            self.allocator.copyin(self.opaque, src)
        return self

    def copyout(self, dest: memoryview) -> memoryview:
        dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
        if dest.nbytes != self.nbytes:
            raise ValueError(f"copyout of a buffer of {self.nbytes} bytes into {dest.nbytes} bytes")
        if self.nbytes:
            Device[self.device].synchronize()
            self.allocator.copyout(dest, self.opaque)
        return dest

    def as_bytes(self) -> bytes:
        return bytes(self.copyout(memoryview(bytearray(self.nbytes))))

    def copy_from(self, src: Buffer) -> None:
        """Copy another buffer's contents here, through the host unless both allocators can transfer."""
        if src.nbytes != self.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into a buffer of {self.nbytes} bytes")
        if not self.nbytes:
            return
        same_kind = type(Device[src.device]) is type(Device[self.device])
        if same_kind and self.allocator.caps.transfer:
            self.allocator.transfer(self.opaque, src.opaque, self.nbytes, Device[src.device], Device[self.device])
        elif src.allocator.caps.host_visible:  # one copy, straight out of the source's memory (a file's pages)
            Device[src.device].synchronize()
            self.copyin(src.allocator.as_memoryview(src.opaque, src.nbytes))
        elif self.allocator.caps.host_visible:  # one copy, straight into this buffer's memory
            Device[self.device].synchronize()
            src.copyout(self.allocator.as_memoryview(self.opaque, self.nbytes))
        else:
            self.copyin(src.copyout(memoryview(bytearray(src.nbytes))))

    def __del__(self) -> None:
        if self._opaque is not None and self.base is None and not self.foreign:
            try:
                self._allocator.free(self._opaque, self.size * self.dtype.itemsize or 1)
            except Exception:  # noqa: BLE001  (interpreter shutdown)
                pass


_buffer_ids = itertools.count()


class _BufferEntry(weakref.ref):
    """A BUFFER node's entry in _BUFFERS: a weak reference to the node that holds the node's Buffer. The entry (and
    with it the Buffer) goes when the node dies."""

    __slots__ = ("key", "buffer")


def _drop_buffer(entry: _BufferEntry) -> None:
    """A BUFFER node died: drop its entry, which frees its Buffer (by reference count) unless a view holds it."""
    if _BUFFERS.get(entry.key) is entry:
        del _BUFFERS[entry.key]


# each BUFFER node's Buffer, kept apart from the node (not in its __dict__): a node can sit in a reference cycle (its
# cached toposort holds it), and a Buffer finalized by the cycle collector together with its device memory object
# would hand that freed memory back to the allocator's cache (WEBGPU: a released wgpu buffer). This weak table frees
# the Buffer by reference count when its node dies, the memory object still alive. It is keyed by the node's id: a
# dead node's entry is dropped as it dies (the weak reference's callback runs before its memory, and so its id, can
# be reused), and an id is looked up without making a weak reference (as a WeakKeyDictionary's get does).
_BUFFERS: dict[int, _BufferEntry] = {}
_ON_DEVICE: dict[str, tuple[UOp]] = {}  # (the DEVICE node,) by name, kept (a handful): each new BUFFER's sources
_BUFFER_OP = Ops.BUFFER  # (an Enum member as a global: see tiny.ir.schedule._BUFFER)
_new_object = object.__new__


def device_node(name: str) -> UOp:
    """The DEVICE node of a device name."""
    return _sources_on(name)[0]


def _sources_on(name: str) -> tuple[UOp]:
    if (src := _ON_DEVICE.get(name)) is None:
        src = _ON_DEVICE[name] = (UOp(Ops.DEVICE, arg=name),)
    return src


def _keep_buffer(node: UOp, buffer: Buffer) -> None:
    entry = _BufferEntry(node, _drop_buffer)
    entry.key, entry.buffer = id(node), buffer
    _BUFFERS[entry.key] = entry


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A BUFFER node for fresh (lazily allocated) memory; the Buffer lives as long as the node."""
    src = _ON_DEVICE.get(device) or _sources_on(device)
    node = make_node(UOp, _BUFFER_OP, dtype, src, (next(_buffer_ids), size))  # (UOp(...): see make_node)
    buffer = _new_object(Buffer)  # Buffer(device, size, dtype), its __init__ called from here rather than from C
    buffer.__init__(device, size, dtype)
    _keep_buffer(node, buffer)
    return node


def new_foreign_buffer(device: str, address: int, size: int, dtype: DType, owner: Any = None) -> UOp:
    """A BUFFER node over memory someone else owns at `address` (see Buffer.wrap); `owner` lives as long as it."""
    node = UOp(Ops.BUFFER, dtype, _sources_on(device), (next(_buffer_ids), size))
    _keep_buffer(node, Buffer.wrap(device, address, size, dtype, owner))
    return node


def new_buffer_view(base: UOp, size: int, dtype: DType, offset: int) -> UOp:
    """A BUFFER node for `size` elements of `dtype` that start `offset` bytes into the memory of BUFFER `base`."""
    node = UOp(Ops.BUFFER, dtype, base.src, (next(_buffer_ids), size))
    _keep_buffer(node, buffer_of(base).view(size, dtype, offset))
    return node


def buffer_of(node: UOp) -> Buffer:
    """The Buffer behind a BUFFER node."""
    if (entry := _BUFFERS.get(id(node))) is None:
        raise KeyError(f"{node.op} node {node.arg} has no Buffer: only new_buffer and new_buffer_view make them")
    return entry.buffer


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


def device_supports(device: str, dtype: DType) -> bool:
    dev = Device[device]
    return not dev.computes or dtype.scalar in dev.renderer.caps.dtypes  # memory of a data-only device holds any
