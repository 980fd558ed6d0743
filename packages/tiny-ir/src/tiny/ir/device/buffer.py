"""Buffers: memory on a device, allocated when first needed (or a view of another buffer's, or memory someone else
owns), and the BUFFER nodes of the graph that stand for them."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from tiny.ir.device.interface import Allocator, out_of_memory
from tiny.ir.device.registry import Device
from tiny.ir.dtypes import DType
from tiny.ir.tensorcore import TensorCore  # noqa: F401  (re-exported: renderers declare theirs)
from tiny.ir.uop import Ops, UOp, make_node

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
        # a file's bytes are read into a host-visible buffer by its own copyout (a read, not its mapped pages, which
        # would stay resident in this process beside the copy: a model's weights took their size twice)
        from_file = Device[src.device].file_backed and self.allocator.caps.host_visible
        if same_kind and self.allocator.caps.transfer:
            self.allocator.transfer(self.opaque, src.opaque, self.nbytes, Device[src.device], Device[self.device])
        elif src.allocator.caps.host_visible and not from_file:  # one copy, straight out of the source's memory
            Device[src.device].synchronize()
            self.copyin(src.allocator.as_memoryview(src.opaque, src.nbytes))
        elif self.allocator.caps.host_visible:  # one copy, straight into this buffer's memory
            Device[self.device].synchronize()
            src.copyout(self.allocator.as_memoryview(self.opaque, self.nbytes))
        else:
            self.copyin(src.copyout(memoryview(bytearray(src.nbytes))))

    def release(self) -> None:
        """Give the memory back now; the buffer stays, and is allocated again when next needed (its contents lost).
        Only for a buffer of its own memory, with no views of it in use: theirs would be given back with it."""
        if self._opaque is not None and self.base is None and not self.foreign:
            assert self._allocator is not None
            self._allocator.free(self._opaque, self.size * self.dtype.itemsize or 1)
            self._opaque = self._allocator = None

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
_BUFFER_OP = Ops.BUFFER  # (an Enum member as a global: see tiny.ir.schedule.cache._BUFFER)
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
    entry = _BufferEntry(node, _drop_buffer)  # (_keep_buffer written out: a schedule makes its buffers here)
    entry.key, entry.buffer = id(node), buffer
    _BUFFERS[entry.key] = entry
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
