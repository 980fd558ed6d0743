"""Tensor: a lazy, PyTorch-like n-dimensional array. Ops record UOps; realize() runs them."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiny.ir.device import Device, buffer_of, device_computes, new_buffer
from tiny.ir.device.collective import concat, copy_to
from tiny.ir.dtypes import DType, dtypes, to_dtype
from tiny.ir.multi import devices_of, expand_multi, multi, relayout, shard
from tiny.ir.schedule import Schedule, ScheduleItem, create_schedule, is_memory, is_realized
from tiny.ir.schedule.memory import share_memory
from tiny.ir.sint import check_size, is_size_expr, sym_eval, variables
from tiny.ir.uop import GroupOp, Ops, UOp, substitute
from tiny.tensor.activations import ActivationOps
from tiny.tensor.autograd import NO_GRAD, AutogradOps, no_grad_wrap, record_origins, saves_graphs
from tiny.tensor.binaryfns import BinaryFnOps
from tiny.tensor.checks import check_dtype, const, default_int, on_device, shards_of, wide_ints
from tiny.tensor.conversions import ConversionOps
from tiny.tensor.creation import CreationOps
from tiny.tensor.elementwise import ElementwiseOps
from tiny.tensor.functional import FunctionalOps
from tiny.tensor.indexing import IndexingOps
from tiny.tensor.inplace import InplaceOps
from tiny.tensor.interop import InteropOps
from tiny.tensor.linalg import LinalgOps
from tiny.tensor.live import LiveSet
from tiny.tensor.mathfns import MathOps
from tiny.tensor.movement import MovementOps
from tiny.tensor.realize import JitError, capturing, run_schedule
from tiny.tensor.reduce import ReduceOps
from tiny.tensor.sampling import SamplingOps
from tiny.tensor.tinygrad_names import TinygradNameOps
from tiny.tensor.unpool import UnpoolOps
from tiny.tensor.windows import WindowOps

Scalar = int | float | bool
_new_tensor = object.__new__
_MULTI = Ops.MULTI  # (an Enum member as a global: see tiny.ir.schedule.cache._BUFFER)
_NP_TO_DTYPE = {np.dtype(d.fmt): d for d in dtypes.all() if d.fmt is not None}


class Tensor(
    CreationOps,
    SamplingOps,
    ConversionOps,
    ElementwiseOps,
    BinaryFnOps,
    MathOps,
    ActivationOps,
    ReduceOps,
    MovementOps,
    IndexingOps,
    FunctionalOps,
    WindowOps,
    UnpoolOps,
    LinalgOps,
    InplaceOps,
    InteropOps,
    AutogradOps,
    TinygradNameOps,
):
    """A lazily evaluated n-dimensional array on a device.

    >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(axis=1).tolist()
    [3.0, 7.0]
    """

    __slots__ = ()
    _live: LiveSet[Tensor] = LiveSet()  # every tensor
    # the tensors made with work pending (not memory yet), listed until they are: what realize() looks through for
    # the tensors that read what it computed (a model's hundreds of realized parameters cost it nothing)
    _pending: LiveSet[Tensor] = LiveSet(settled=lambda t: is_realized(t.uop))

    def __init__(
        self,
        data: Scalar | Sequence | np.ndarray | UOp | Tensor | os.PathLike,
        device: str | tuple[str, ...] | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> None:
        self._requires_grad, self.grad = None, None
        if isinstance(data, UOp) and _is_size(data):  # a bound Variable (or a size of them): its value, 0-d
            dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
            self.uop = UOp(Ops.CONST, dtypes.int32, (UOp(Ops.DEVICE, arg=dev),), check_size(data, "Tensor(size)"))
            if dtype is not None:
                self.uop = self.cast(dtype).uop
            self._track()
            return
        if isinstance(data, UOp):  # made by an op: device and dtype are the graph's
            self.uop = _expanded(no_grad_wrap(data))
            self._track()
            return
        if isinstance(device, (tuple, list)):  # the same values on each of several devices
            devices = Device.canonicalize_many(device)
            if isinstance(data, Tensor):
                self.uop = data.to(devices).cast(to_dtype(dtype) if dtype is not None else data.dtype).uop
            else:
                parts = [Tensor(data, d, dtype).uop for d in devices]  # (each uploaded where it lives: no copies)
                self.uop = multi(parts, None)
            self._track()
            if requires_grad is not None:
                self.requires_grad = requires_grad
            return
        if isinstance(data, os.PathLike):  # a file's bytes on DISK, mapped lazily
            self.uop = _map_file(data, dtype, device).uop
            self._track()
            return
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        dt = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, Tensor):
            self.uop = data.to(dev).cast(dt or data.dtype).uop
        elif isinstance(data, (bool, int, float)):
            dt = dt or on_device(dtypes.from_py(data), dev)
            check_dtype(dev, dt)
            self.uop = const(data, dt, dev)
        elif isinstance(data, (list, tuple, np.ndarray)) or hasattr(data, "__array__"):
            if isinstance(data, (list, tuple)):
                inferred = dt or on_device(dtypes.from_py(data), dev)
                arr = np.array(data, dtype=_np_dtype(inferred) if dt != dtypes.bfloat16 else None)
            else:
                arr = np.asarray(data)
            if arr.dtype == object:
                raise TypeError("Tensor() takes numbers, nested lists of numbers of one shape, or NumPy arrays")
            self.uop = _upload(arr, dev, dt)
        else:
            raise TypeError(f"cannot make a Tensor from {type(data).__name__}")
        self._track()
        if requires_grad is not None:
            self.requires_grad = requires_grad

    def _new(self, uop: UOp) -> Tensor:
        """The tensor of an op's result: what Tensor(uop) makes, without dispatching on the argument's type."""
        if type(self) is not Tensor:  # (a subclass: its own constructor)
            return type(self)(uop)
        if NO_GRAD.value:
            uop = no_grad_wrap(uop)
        if type(uop.device) is tuple:  # (_expanded written out: it runs for every op)
            uop = expand_multi(uop)
        t = _new_tensor(Tensor)  # (_operand and _track written out)
        t._requires_grad = t.grad = None
        t.uop = uop
        Tensor._live.add(t)
        if not is_realized(uop):
            Tensor._pending.add(t)
        return t

    def _operand(self, uop: UOp) -> Tensor:
        """A tensor of a node that an op makes for its own use and never hands out (a scalar operand): not listed
        among the live tensors, as nothing looks for it there (it needs no gradient and computes nothing of its own)."""
        if type(self) is not Tensor:
            return type(self)(uop)
        t = _new_tensor(Tensor)
        t._requires_grad = t.grad = None
        t.uop = uop
        return t

    def _track(self) -> None:
        """List a new tensor among the live ones (and the pending ones, unless it is memory already)."""
        Tensor._live.add(self)
        if not is_realized(self.uop):
            Tensor._pending.add(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}>"

    # ---- running

    def schedule(self, *others: Tensor) -> list[ScheduleItem]:
        """The kernels and copies realize() would run, without running them."""
        targets = [u for t in (self, *others) for u in shards_of(t.uop) if not is_realized(u)]
        return create_schedule(targets).items if targets else []

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and others) now; the result lives in a buffer on the device."""
        if others or self.uop.op is _MULTI:  # (a tensor on several devices: each device's part)
            targets = [u for t in (self, *others) for u in shards_of(t.uop) if not is_realized(u)]
        else:  # (the usual call: one tensor)
            targets = [] if is_realized(self.uop) else [self.uop]
        if not targets:
            return self
        sched = create_schedule(targets)
        done = sched.becomes | sched.renamed if sched.renamed else sched.becomes
        # the buffers no tensor reads after this share memory (tiny.ir.schedule.memory), but where a gradient may read
        # them again (autograd keeps the schedule's graphs: saved tensors)
        rebound, held = _rebound(done, len(sched.fresh) > 1 and not saves_graphs(sched.reads))
        if held is not None:
            _share_unheld(sched, done, held)
        run_schedule(sched.items, sched.var_vals)
        record_origins(done, sched.reads)
        for t, u in rebound:  # every tensor reads what was computed from its buffer from now on
            t.uop = u
        return self

    def _buffer(self):  # noqa: ANN202
        self.realize()
        if self.uop.op is Ops.MULTI:
            raise ValueError(f"a tensor on several devices {self.device} has a buffer on each: see _buffers()")
        base = self.uop if self.uop.op is Ops.BUFFER else self.uop.src[0]
        return buffer_of(base)

    def _buffers(self) -> list:
        """The buffer of each device's part (one for a tensor on one device)."""
        self.realize()
        return [buffer_of(u if u.op is Ops.BUFFER else u.src[0]) for u in shards_of(self.uop)]

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (bfloat16 comes back as float32)."""
        if capturing():
            raise JitError(
                "reading a tensor's values (.numpy(), .item(), .tolist(), bool(), float() ...) inside a function that "
                "TinyJit captures: a replay would not read them again, and Python code that depends on them would "
                "not run again. Return the tensor from the function and read it outside."
            )
        if self.uop.op is Ops.MULTI:  # each device's part read, and put side by side along the axis
            self.realize()
            parts = [self._operand(u).numpy() for u in self.uop.src]
            return parts[0] if self.uop.arg is None else np.concatenate(parts, axis=self.uop.arg)
        shape = self.shape
        if symbolic := any(type(s) is not int for s in shape):  # the values the bound Variables give now
            try:
                shape = tuple(sym_eval(s) for s in shape)
            except ValueError as e:
                raise ValueError(f"cannot read the values of a tensor of shape {self.shape}: {e}") from None
        # a view of memory is read through a copy made for this read: realizing the view itself would make this tensor
        # (and every other of the same view) a copy, which no longer sees the memory's later in-place writes (a
        # device that only holds data, DISK, computes no copy: there a view is one range of the file, shared)
        view = is_memory(self.uop) and not is_realized(self.uop) and device_computes(self.device)
        source = self.contiguous() if view else self
        buf = source._buffer()
        if self.dtype == dtypes.bfloat16:
            raw = np.frombuffer(buf.as_bytes(), dtype=np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32)[: math.prod(shape)].reshape(shape)
        if symbolic:  # (its buffer holds the largest size: these values are the first ones)
            whole = np.empty(buf.size, dtype=_np_dtype(self.dtype))
            buf.copyout(memoryview(whole.view(np.uint8)))
            return whole[: math.prod(shape)].reshape(shape).copy()
        out = np.empty(shape, dtype=_np_dtype(self.dtype))
        if out.size:
            buf.copyout(memoryview(out.reshape(-1).view(np.uint8)))
        return out

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous: use .any() or .all()")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def to(self, device: str | tuple[str, ...]) -> Tensor:
        """This tensor on another device; on a tuple of devices, the whole tensor on each (replicated). A tensor on
        several devices comes to one device gathered.

        >>> Tensor([1.0, 2.0]).to(("CPU:0", "CPU:1")).device
        ('CPU', 'CPU:1')
        """
        if isinstance(device, (tuple, list)):
            devices = Device.canonicalize_many(device)
            for d in devices:
                check_dtype(d, self.dtype)
            if self.uop.op is Ops.MULTI and devices_of(self.uop) == devices:
                return self if self.uop.arg is None else self._new(multi(relayout(self.uop, None, None), None))
            source = self if self.uop.op is not Ops.MULTI else self.to(devices[0])
            return self._new(shard(source.uop, devices, None))
        dev = Device.canonicalize(device)
        if dev == self.device:
            return self
        check_dtype(dev, self.dtype)
        if self.uop.op is Ops.MULTI:  # gathered: each part copied to `dev` (one copy, where replicated), side by side
            if self.uop.arg is None:
                return self._new(copy_to(next((u for u in self.uop.src if u.device == dev), self.uop.src[0]), dev))
            return self._new(concat([copy_to(u, dev) for u in self.uop.src], self.uop.arg))
        return Tensor(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=dev))))

    def shard(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """This tensor split along `axis` over several devices, each holding a slice (sizes as torch.tensor_split
        cuts them: the first ones one longer where the size does not divide); with axis=None the whole tensor on
        each (as .to(devices)). Ops run per device; a reduction along the split axis ends in an all-reduce.

        >>> t = Tensor([[1.0, 2.0], [3.0, 4.0]]).shard(("CPU:0", "CPU:1"), axis=0)
        >>> t.device, t.sum(0).tolist()
        (('CPU', 'CPU:1'), [4.0, 6.0])
        """
        devices = Device.canonicalize_many(devices)
        if axis is None:
            return self.to(devices)
        if not isinstance(axis, int) or isinstance(axis, bool) or not -self.ndim <= axis < self.ndim:
            raise ValueError(
                f"shard axis must be an int in [{-self.ndim}, {self.ndim}) for shape {self.shape}, got {axis!r}"
            )
        axis %= self.ndim
        for d in devices:
            check_dtype(d, self.dtype)
        if self.uop.op is Ops.MULTI and devices_of(self.uop) != devices:
            return self.to(devices[0]).shard(devices, axis)
        return self._new(shard(self.uop, devices, axis))

    def shard_(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """shard() in place: this tensor becomes the sharded one (a model's parameters, before training).

        >>> w = Tensor.ones(4, 2).shard_(("CPU:0", "CPU:1"), axis=0); w.device
        ('CPU', 'CPU:1')
        """
        self.uop = self.shard(devices, axis).uop
        if not is_realized(self.uop):  # (listed with the pending tensors, so that realize() updates it)
            Tensor._pending.add(self)
        if self.requires_grad:  # its new memory on each device is a leaf's, as the old was
            self.requires_grad = True
        return self

    def contiguous(self) -> Tensor:
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))


# ---------------------------------------------------------------- helpers


def _expanded(uop: UOp) -> UOp:
    """An op recorded on tensors on several devices (its node on a tuple of devices), as the op on each device."""
    return expand_multi(uop) if type(uop.device) is tuple else uop


def _is_size(u: UOp) -> bool:
    """A bound Variable, or an int expression of them (not a node of a tensor's graph, which has a DEVICE below)."""
    if u.op is Ops.BIND or u.op is Ops.DEFINE_VAR:
        return True
    return u.op in GroupOp.ALU and u.dtype is dtypes.int32 and is_size_expr(u) and variables(u) != []


def _np_dtype(dt: DType) -> np.dtype:
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(dt.fmt)


def _map_file(path: os.PathLike, dtype: DType | str | None, device: str | None) -> Tensor:
    """The bytes of a file as a uint8 tensor on DISK:<path> (read as `dtype` and copied to `device` if given)."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise FileNotFoundError(f"Tensor(Path) maps a file's bytes; {name!r} is not a file")
    node = new_buffer(Device.canonicalize(f"DISK:{name}"), os.path.getsize(name), dtypes.uint8)
    t = Tensor(UOp(Ops.RESHAPE, dtypes.uint8, (node,), node.shape))
    if dtype is not None:
        t = t.bitcast(dtype)
    return t.to(device) if device is not None else t


def _upload(arr: np.ndarray, device: str, dtype: DType | None) -> UOp:
    if arr.dtype not in _NP_TO_DTYPE and arr.dtype != np.float64:
        raise TypeError(f"NumPy dtype {arr.dtype} has no tiny dtype")
    src_dt = _NP_TO_DTYPE.get(arr.dtype, dtypes.float64)
    if dtype is None and src_dt == dtypes.float64 and arr.dtype != np.float64:
        dtype = dtypes.default_float
    if dtype is None and src_dt == dtypes.int64 and (narrow := default_int(device)) != dtypes.int64:
        # NumPy's integers are int64 by default; a device without int64 takes them as its default int if they fit
        info = np.iinfo(_np_dtype(narrow))
        if arr.size and not (info.min <= arr.min() and arr.max() <= info.max):
            wide_ints(device, f"these NumPy integers span {arr.min()}..{arr.max()}, more than {narrow.name} holds")
        dtype = narrow
    dt = dtype or src_dt
    check_dtype(device, dt)
    if dt == dtypes.bfloat16:
        f32 = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32).astype(np.uint64)
        data = (((f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)
        data = np.where(np.isnan(np.asarray(arr, dtype=np.float32)), np.uint16(0x7FC0), data)
    else:
        data = np.ascontiguousarray(arr, dtype=_np_dtype(dt))
    node = new_buffer(device, data.size, dt)
    if data.size:
        buffer_of(node).copyin(memoryview(data.reshape(-1).view(np.uint8)))
    return UOp(Ops.RESHAPE, dt, (node,), tuple(arr.shape))


def _share_unheld(sched: Schedule, done: dict[UOp, UOp], held: set[UOp]) -> None:
    """Let the buffers a schedule makes share memory (tiny.ir.schedule.memory), but those that live tensors read
    (the views of `held` nodes): they outlive the schedule. (A function of its own: a comprehension over `done` in
    Tensor.realize would make it a cell there, on every realize.)"""
    kept = {b for u in held for b in done[u].toposort if b.op is Ops.BUFFER}
    share_memory(sched.items, [buffer_of(b) for b in sched.fresh if b not in kept])


def _rebound(done: dict[UOp, UOp], held_too: bool) -> tuple[list[tuple[Tensor, UOp]], set[UOp] | None]:
    """The live tensors that read computed nodes, each with the graph it holds from now on (reading their buffers);
    with held_too, also the computed nodes those tensors read (their buffers outlive the schedule)."""
    rebound: list[tuple[Tensor, UOp]] = []
    held: set[UOp] | None = set() if held_too else None
    rebuilt: dict[UOp, UOp] | None = None  # (the tensors' graphs share most of their nodes: each is rebuilt once)
    for t in Tensor._pending.alive():
        u = t.uop
        if (view := done.get(u)) is not None:
            rebound.append((t, view))
            if held is not None:
                held.add(u)
        elif not done.keys().isdisjoint(u.toposort):  # (listed pending: not memory)
            rebuilt = {} if rebuilt is None else rebuilt
            rebound.append((t, substitute(u, done, rebuilt)))
            if held is not None:
                held.update(done.keys() & set(u.toposort))
    return rebound, held
