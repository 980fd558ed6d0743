"""Tensor: a lazy, PyTorch-like n-dimensional array. Ops record UOps; realize() runs them."""

from __future__ import annotations

import math
import weakref
from typing import Any, Iterable, Sequence

import numpy as np

from tiny.ir.device import Device, buffer_of, device_supports, new_buffer
from tiny.ir.dtypes import DType, dtypes, least_upper_dtype, to_dtype, truncate
from tiny.ir.schedule import ScheduleItem, create_schedule, is_realized
from tiny.ir.uop import GroupOp, Ops, UOp, substitute
from tiny.tensor.realize import run_schedule

Scalar = int | float | bool
_NP_TO_DTYPE = {np.dtype(d.fmt): d for d in dtypes.all() if d.fmt is not None}


def _np_dtype(dt: DType) -> np.dtype:
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(dt.fmt)


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IndexError(f"axis {axis} is out of range for a tensor with {ndim} dimension(s)")
    return axis % max(ndim, 1)


def _prod(xs: Iterable[int]) -> int:
    return math.prod(xs)


class Tensor:
    """A lazily evaluated n-dimensional array on a device.

    >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(axis=1).tolist()
    [3.0, 7.0]
    """

    __slots__ = ("uop", "__weakref__")
    _live: weakref.WeakSet[Tensor] = weakref.WeakSet()

    def __init__(
        self,
        data: Scalar | Sequence | np.ndarray | UOp | Tensor,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        dt = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, UOp):
            self.uop = data
        elif isinstance(data, Tensor):
            self.uop = data.to(dev).cast(dt or data.dtype).uop
        elif isinstance(data, (bool, int, float)):
            dt = dt or dtypes.from_py(data)
            _check_dtype(dev, dt)
            self.uop = _const(data, dt, dev)
        elif isinstance(data, (list, tuple, np.ndarray)) or hasattr(data, "__array__"):
            if isinstance(data, (list, tuple)):
                arr = np.array(data, dtype=_np_dtype(dt or dtypes.from_py(data)) if dt != dtypes.bfloat16 else None)
            else:
                arr = np.asarray(data)
            if arr.dtype == object:
                raise TypeError("Tensor() takes numbers, nested lists of numbers of one shape, or NumPy arrays")
            self.uop = _upload(arr, dev, dt)
        else:
            raise TypeError(f"cannot make a Tensor from {type(data).__name__}")
        Tensor._live.add(self)

    # ---- properties

    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def device(self) -> str:
        return self.uop.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return _prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}>"

    # ---- running

    def schedule(self, *others: Tensor) -> list[ScheduleItem]:
        """The kernels and copies realize() would run, without running them."""
        targets = [t.uop for t in (self, *others) if not is_realized(t.uop)]
        return create_schedule(targets).items if targets else []

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and others) now; the result lives in a buffer on the device."""
        tensors = [self, *others]
        targets = [t.uop for t in tensors if not is_realized(t.uop)]
        if not targets:
            return self
        sched = create_schedule(targets)
        run_schedule(sched.items)
        for t in list(Tensor._live):
            if t.uop in sched.becomes:
                t.uop = sched.becomes[t.uop]
            elif not is_realized(t.uop):
                t.uop = substitute(t.uop, {k: v for k, v in sched.becomes.items()})
        return self

    def _buffer(self):  # noqa: ANN202
        self.realize()
        base = self.uop if self.uop.op is Ops.BUFFER else self.uop.src[0]
        return buffer_of(base)

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (bfloat16 comes back as float32)."""
        buf = self._buffer()
        if self.dtype == dtypes.bfloat16:
            raw = np.frombuffer(buf.as_bytes(), dtype=np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32).reshape(self.shape)
        out = np.empty(self.shape, dtype=_np_dtype(self.dtype))
        if out.size:
            buf.copyout(memoryview(out.reshape(-1).view(np.uint8)))
        return out

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def to(self, device: str) -> Tensor:
        """This tensor on another device."""
        dev = Device.canonicalize(device)
        if dev == self.device:
            return self
        _check_dtype(dev, self.dtype)
        return Tensor(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=dev))))

    def contiguous(self) -> Tensor:
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    # ---- creation

    @staticmethod
    def full(shape: Sequence[int] | int, fill: Scalar, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        shape = _shape_arg(shape)
        return Tensor(fill, device=device, dtype=dtype).reshape((1,) * len(shape)).expand(shape)

    @staticmethod
    def zeros(*shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return Tensor.full(_shape_arg(shape), 0, dtype or dtypes.default_float, device)

    @staticmethod
    def ones(*shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return Tensor.full(_shape_arg(shape), 1, dtype or dtypes.default_float, device)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: DType | str | None = None,
               device: str | None = None) -> Tensor:
        """Evenly spaced values in [start, stop), like torch.arange."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange() step must not be zero")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        return Tensor(np.arange(n, dtype=np.float64) * step + start if dt.is_float else
                      np.arange(start, stop, step, dtype=np.int64), device=device, dtype=dt)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        m = n if m is None else m
        rows = Tensor.arange(n, device=device).reshape(n, 1)
        cols = Tensor.arange(m, device=device).reshape(1, m)
        return (rows == cols).cast(dtype or dtypes.default_float)

    _seed: int = 0
    _rng_counter: int = 0

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        Tensor._seed, Tensor._rng_counter = seed, 0

    @staticmethod
    def _random_bits(shape: tuple[int, ...], device: str | None) -> Tensor:
        """Uniform uint32 bits from a counter-based hash: the same numbers on every device."""
        Tensor._rng_counter += 1
        key = _mix32(_mix32(Tensor._seed & 0xFFFFFFFF) ^ Tensor._rng_counter)
        n = _prod(shape)
        counter = Tensor(np.arange(n, dtype=np.uint32), device=device)
        x = counter ^ key
        for mult in (0x7FEB352D, 0x846CA68B):
            x = (x ^ (x >> 16)) * mult
        x = x ^ (x >> 16)
        return x.reshape(shape)

    @staticmethod
    def rand(*shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform samples in [0, 1)."""
        bits = Tensor._random_bits(_shape_arg(shape), device)
        return ((bits >> 8).cast(dtypes.float32) * (2.0**-24)).cast(dtype or dtypes.default_float)

    @staticmethod
    def randn(*shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Standard normal samples (Box-Muller)."""
        shp = _shape_arg(shape)
        u1, u2 = Tensor.rand(*shp, device=device), Tensor.rand(*shp, device=device)
        r = ((1 - u1).log() * -2).sqrt()
        return (r * (u2 * (2 * math.pi)).cos()).cast(dtype or dtypes.default_float)

    def full_like(self, fill: Scalar, dtype: DType | str | None = None) -> Tensor:
        return Tensor.full(self.shape, fill, dtype or self.dtype, self.device)

    def zeros_like(self, dtype: DType | str | None = None) -> Tensor:
        return self.full_like(0, dtype)

    def ones_like(self, dtype: DType | str | None = None) -> Tensor:
        return self.full_like(1, dtype)

    # ---- elementwise

    def _alu(self, op: Ops, *others: Tensor, dtype: DType | None = None) -> Tensor:
        srcs = (self.uop, *(o.uop for o in others))
        out_dtype = dtype or (dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype)
        return Tensor(UOp(op, out_dtype, srcs))

    def cast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        _check_dtype(self.device, dt)
        return Tensor(UOp(Ops.CAST, dt, (self.uop,)))

    def bitcast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise ValueError(f"bitcast needs dtypes of one size; {self.dtype.name} is {self.dtype.itemsize} bytes "
                             f"and {dt.name} is {dt.itemsize}")
        _check_dtype(self.device, dt)
        return Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def _float_input(self) -> Tensor:
        """Math functions take ints and bools as the default float, like PyTorch."""
        return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def _broadcasted(self, other: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x, y = self, other
        if isinstance(y, Tensor):
            if y.device != x.device:
                raise ValueError(f"tensors are on different devices: {x.device} and {y.device}; use .to()")
            dt = least_upper_dtype(x.dtype, y.dtype)
        elif isinstance(y, (bool, int, float)):
            if isinstance(y, bool):
                dt = x.dtype
            elif isinstance(y, int):
                dt = x.dtype if not x.dtype.is_bool else dtypes.default_int
            else:
                dt = x.dtype if x.dtype.is_float else dtypes.default_float
            y = Tensor(y, device=x.device, dtype=dt)
        else:
            raise TypeError(f"unsupported operand type {type(y).__name__} for a Tensor op")
        x, y = x.cast(dt), y.cast(dt)
        shape = _broadcast_shape(x.shape, y.shape)
        x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        return (y, x) if reverse else (x, y)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        return self.reshape(padded).expand(shape)

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.MUL, b)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            raise TypeError("subtracting bool tensors is not supported; use logical_xor or ^")
        return a._alu(Ops.ADD, -b)

    def div(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """True division; integers divide as floats."""
        a, b = self._broadcasted(x, reverse)
        a, b = a._float_input(), b._float_input()
        return a._alu(Ops.FDIV, b)

    def floordiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            return (a / b).floor()
        q = a._alu(Ops.IDIV, b)
        if a.dtype.is_unsigned:
            return q
        inexact = a._alu(Ops.MOD, b) != 0
        return q - (inexact & ((a < 0) ^ (b < 0))).cast(q.dtype)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor, as Python and torch.remainder."""
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            return a - b * (a / b).floor()
        r = a._alu(Ops.MOD, b)
        if a.dtype.is_unsigned:
            return r
        return ((r != 0) & ((r < 0) ^ (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        if not reverse and isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 8 and not self.dtype.is_bool:
            out = self.ones_like()
            for _ in range(x):
                out = out * self
            return out
        a, b = self._broadcasted(x, reverse)
        if not a.dtype.is_float:
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        mag = (b * a.abs().log2()).exp2()
        b_int = b.trunc() == b
        b_odd = b_int & ((b.abs() % 2) == 1)
        neg = a < 0
        out = neg.where(b_int.where(b_odd.where(-mag, mag), math.nan), mag)
        return (b == 0).where(1.0, out).cast(a.dtype)

    def __neg__(self) -> Tensor:
        if self.dtype.is_bool:
            raise TypeError("negating a bool tensor is not supported; use logical_not or ~")
        return self._alu(Ops.NEG)

    __add__ = add
    __mul__ = mul
    __sub__ = sub
    __truediv__ = div
    __floordiv__ = floordiv
    __mod__ = mod
    __pow__ = pow

    def __radd__(self, x: Scalar) -> Tensor:
        return self.add(x, True)

    def __rmul__(self, x: Scalar) -> Tensor:
        return self.mul(x, True)

    def __rsub__(self, x: Scalar) -> Tensor:
        return self.sub(x, True)

    def __rtruediv__(self, x: Scalar) -> Tensor:
        return self.div(x, True)

    def __rfloordiv__(self, x: Scalar) -> Tensor:
        return self.floordiv(x, True)

    def __rmod__(self, x: Scalar) -> Tensor:
        return self.mod(x, True)

    def __rpow__(self, x: Scalar) -> Tensor:
        return self.pow(x, True)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        return Tensor(x).matmul(self) if not isinstance(x, Tensor) else x.matmul(self)

    # comparisons and logic
    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._alu(Ops.CMPLT, b)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x, True)
        return a._alu(Ops.CMPLT, b)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        return (self < x) | (self == x)

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        return (self > x) | (self == x)

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return (self != x).logical_not()

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        a, b = self._broadcasted(x)
        return a._alu(Ops.CMPNE, b)

    __hash__ = object.__hash__

    def _bitwise(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            raise TypeError(f"bitwise ops take integer or bool tensors, got {a.dtype.name}")
        return a._alu(op, b)

    def __and__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.AND, x)

    def __or__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.OR, x)

    def __xor__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.XOR, x)

    def __rand__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.AND, x, True)

    def __ror__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.OR, x, True)

    def __rxor__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.XOR, x, True)

    def __lshift__(self, x: int) -> Tensor:
        return self._bitwise(Ops.SHL, x)

    def __rshift__(self, x: int) -> Tensor:
        return self._bitwise(Ops.SHR, x)

    def __invert__(self) -> Tensor:
        if self.dtype.is_float:
            raise TypeError(f"~ takes integer or bool tensors, got {self.dtype.name}")
        return self.logical_not() if self.dtype.is_bool else self ^ -1

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, Tensor(True, device=self.device)._broadcast_to(self.shape))

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """x where this (bool) tensor is true, else y."""
        cond = self.cast(dtypes.bool)
        if not isinstance(x, Tensor) and isinstance(y, Tensor):
            y_, x_ = y._broadcasted(x)
        elif isinstance(x, Tensor):
            x_, y_ = x._broadcasted(y)
        else:
            x_, y_ = Tensor(x, device=self.device)._broadcasted(y)
        shape = _broadcast_shape(cond.shape, x_.shape)
        cond, x_, y_ = cond._broadcast_to(shape), x_._broadcast_to(shape), y_._broadcast_to(shape)
        return Tensor(UOp(Ops.WHERE, x_.dtype, (cond.uop, x_.uop, y_.uop)))

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._alu(Ops.MAX, b)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._order_flip()._alu(Ops.MAX, b._order_flip())._order_flip()

    def _order_flip(self) -> Tensor:
        """An order-reversing bijection, so that min(x) = flip(max(flip(x)))."""
        if self.dtype.is_float:
            return -self
        return self.logical_not() if self.dtype.is_bool else self ^ -1

    # math
    def exp(self) -> Tensor:
        return (self._float_input() * (1 / math.log(2))).exp2()

    def exp2(self) -> Tensor:
        return self._float_input()._alu(Ops.EXP2)

    def log(self) -> Tensor:
        return self.log2() * math.log(2)

    def log2(self) -> Tensor:
        return self._float_input()._alu(Ops.LOG2)

    def sqrt(self) -> Tensor:
        return self._float_input()._alu(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._float_input()._alu(Ops.RECIP)

    def sin(self) -> Tensor:
        return self._float_input()._alu(Ops.SIN)

    def cos(self) -> Tensor:
        return (math.pi / 2 - self._float_input()).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t > self).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    def abs(self) -> Tensor:
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return self.maximum(-self) if not self.dtype.is_float else (self < 0).where(-self, self)

    def sign(self) -> Tensor:
        if self.dtype.is_bool:
            return self
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) if not self.dtype.is_unsigned else (
            self != 0).cast(self.dtype)

    def relu(self) -> Tensor:
        return self.maximum(0)

    def sigmoid(self) -> Tensor:
        return (1 + (-self._float_input()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2 * (2 * self._float_input()).sigmoid() - 1

    def gelu(self) -> Tensor:
        x = self._float_input()
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def square(self) -> Tensor:
        return self * self

    def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        out = self
        if min_ is not None:
            out = out.maximum(min_)
        if max_ is not None:
            out = out.minimum(max_)
        return out

    clamp = clip

    def isnan(self) -> Tensor:
        return self != self if self.dtype.is_float else self.full_like(False, dtypes.bool)

    def isinf(self) -> Tensor:
        return (self.abs() == math.inf) if self.dtype.is_float else self.full_like(False, dtypes.bool)

    # ---- reductions

    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool, dtype: DType | None = None) -> Tensor:
        axes = _axes(axis, self.ndim)
        x = self if dtype is None else self.cast(dtype)
        if self.ndim == 0:
            return x
        out = Tensor(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Sum over axes; integers and bools sum as int64, half precision accumulates in float32."""
        if dtype is not None:
            return self.cast(to_dtype(dtype))._reduce(Ops.ADD, axis, keepdim)
        if self.dtype.is_bool or self.dtype.is_int:
            return self._reduce(Ops.ADD, axis, keepdim, dtypes.uint64 if self.dtype == dtypes.uint64 else dtypes.int64)
        if self.dtype.itemsize < 4:
            return self._reduce(Ops.ADD, axis, keepdim, dtypes.float32).cast(self.dtype)
        return self._reduce(Ops.ADD, axis, keepdim)

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        self._nonempty_reduce(axis, "max")
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        self._nonempty_reduce(axis, "min")
        return self._order_flip()._reduce(Ops.MAX, axis, keepdim)._order_flip()

    def _nonempty_reduce(self, axis: int | Sequence[int] | None, name: str) -> None:
        if any(self.shape[a] == 0 for a in _axes(axis, self.ndim)) if self.ndim else False:
            raise ValueError(f"{name}() of an empty dimension has no identity; shape {self.shape}, axis {axis}")

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        if not self.dtype.is_float:
            raise TypeError(f"mean() needs a float tensor, got {self.dtype.name}; cast it first")
        axes = _axes(axis, self.ndim) if self.ndim else ()
        n = _prod(self.shape[a] for a in axes)
        total = self.sum(axis, keepdim)
        return total / n if n else total * math.nan

    def softmax(self, axis: int = -1) -> Tensor:
        x = self._float_input()
        e = (x - x.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        x = self._float_input()
        shifted = x - x.max(axis, keepdim=True)
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    # ---- matmul

    def matmul(self, w: Tensor) -> Tensor:
        """Matrix product with batching and broadcasting, as torch.matmul."""
        if not isinstance(w, Tensor):
            raise TypeError(f"matmul takes a Tensor, got {type(w).__name__}")
        if self.ndim == 0 or w.ndim == 0:
            raise ValueError(f"matmul needs tensors with at least 1 dimension, got shapes {self.shape} and {w.shape}")
        x, y = self, w
        if x.shape[-1] != y.shape[-2 if y.ndim > 1 else -1]:
            raise ValueError(f"matmul shape mismatch: {self.shape} @ {w.shape} "
                             f"(inner sizes {x.shape[-1]} and {y.shape[-2 if y.ndim > 1 else -1]} differ)")
        if y.device != x.device:
            raise ValueError(f"tensors are on different devices: {x.device} and {y.device}; use .to()")
        dt = least_upper_dtype(x.dtype, y.dtype)
        x, y = x.cast(dt), y.cast(dt)
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        y2 = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
        k = x2.shape[-1]
        batch = _broadcast_shape(x2.shape[:-2], y2.shape[:-2])
        n, m = x2.shape[-2], y2.shape[-1]
        a = x2._broadcast_to(batch + (n, k)).reshape(*batch, n, 1, k)
        b = y2._broadcast_to(batch + (k, m)).transpose(-1, -2).reshape(*batch, 1, m, k)
        acc = dtypes.float32 if dt.is_float and dt.itemsize < 4 else dt
        prod = (a * b).cast(acc)
        out = Tensor(UOp(Ops.REDUCE_AXIS, acc, (prod._broadcast_to(batch + (n, m, k)).uop,), (Ops.ADD, (len(batch) + 2,))))
        out = out.reshape(*batch, n, m).cast(dt)
        if self.ndim == 1:
            out = out.reshape(*out.shape[:-2], m) if w.ndim > 1 else out.reshape(*out.shape[:-2])
        elif w.ndim == 1:
            out = out.reshape(*out.shape[:-1])
        return out

    dot = matmul

    # ---- movement

    def _movement(self, op: Ops, arg: Any) -> Tensor:
        return Tensor(UOp(op, self.dtype, (self.uop,), arg))

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """Same elements, new shape; one dimension may be -1."""
        new = list(_shape_arg(shape, allow_neg=True))
        if new.count(-1) > 1:
            raise ValueError(f"reshape takes at most one -1, got {tuple(new)}")
        if -1 in new:
            known = _prod(s for s in new if s != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
            new[new.index(-1)] = self.numel() // known
        if any(s < 0 for s in new) or _prod(new) != self.numel():
            raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
        return self if tuple(new) == self.shape else self._movement(Ops.RESHAPE, tuple(new))

    view = reshape

    def permute(self, *order: int | Sequence[int]) -> Tensor:
        perm = tuple(_normalize_axis(a, self.ndim) for a in _shape_arg(order, allow_neg=True))
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"permute of a {self.ndim}-d tensor needs an order of all its axes, got {order}")
        return self if perm == tuple(range(self.ndim)) else self._movement(Ops.PERMUTE, perm)

    def expand(self, *shape: int | Sequence[int]) -> Tensor:
        new = list(_shape_arg(shape, allow_neg=True))
        if len(new) < self.ndim:
            raise ValueError(f"cannot expand shape {self.shape} to {tuple(new)}: fewer dimensions")
        base = (1,) * (len(new) - self.ndim) + self.shape
        new = [b if n == -1 else n for b, n in zip(base, new)]
        for b, n in zip(base, new):
            if b != n and b != 1:
                raise ValueError(f"cannot expand shape {self.shape} to {tuple(new)}: size {b} is not 1")
        x = self.reshape(base) if base != self.shape else self
        return x if tuple(new) == x.shape else x._movement(Ops.EXPAND, tuple(new))

    def pad(self, padding: Sequence[tuple[int, int]] | Sequence[int], value: Scalar = 0) -> Tensor:
        """Pad with `value`. padding: ((before, after), ...) per dim, or a flat torch-style tuple from the last dim."""
        if padding and isinstance(padding[0], int):
            flat = list(padding)
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ValueError(f"flat padding needs pairs for at most {self.ndim} dims, got {tuple(flat)}")
            pairs = [(0, 0)] * (self.ndim - len(flat) // 2) + [(flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)]
        else:
            pairs = [tuple(p) for p in padding]  # type: ignore[misc]
        if len(pairs) != self.ndim:
            raise ValueError(f"pad needs {self.ndim} (before, after) pairs, got {len(pairs)}")
        if any(b < 0 or a < 0 for b, a in pairs):
            neg = [(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pairs, self.shape)]
            return self.shrink(neg).pad([(max(b, 0), max(a, 0)) for b, a in pairs], value)
        if all(b == 0 and a == 0 for b, a in pairs):
            return self
        out = self._movement(Ops.PAD, tuple(pairs))
        if value == 0:
            return out
        mask = Tensor(True, device=self.device).reshape((1,) * self.ndim).expand(self.shape)
        return mask._movement(Ops.PAD, tuple(pairs)).where(out, value)

    def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        arg = tuple((0, s) if b is None else (int(b[0]), int(b[1])) for b, s in zip(bounds, self.shape))
        if len(bounds) != self.ndim or any(not 0 <= lo <= hi <= s for (lo, hi), s in zip(arg, self.shape)):
            raise ValueError(f"shrink bounds {tuple(bounds)} do not fit shape {self.shape}")
        return self if all(b == (0, s) for b, s in zip(arg, self.shape)) else self._movement(Ops.SHRINK, arg)

    def flip(self, *axis: int | Sequence[int]) -> Tensor:
        axes = tuple(sorted({_normalize_axis(a, self.ndim) for a in _shape_arg(axis, allow_neg=True)}))
        return self._movement(Ops.FLIP, axes) if axes else self

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = _normalize_axis(dim0, self.ndim), _normalize_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _normalize_axis(start_dim, self.ndim), _normalize_axis(end_dim, self.ndim)
        return self.reshape(*self.shape[:s], _prod(self.shape[s : e + 1]), *self.shape[e + 1 :])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = _normalize_axis(dim, self.ndim)
        return self if self.ndim == 0 or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = _normalize_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing: ints, slices (with steps), None and Ellipsis."""
        idx = list(index) if isinstance(index, tuple) else [index]
        for i in idx:
            if not (i is None or i is Ellipsis or isinstance(i, (int, slice))) or isinstance(i, bool):
                raise TypeError(f"this index is not supported yet: {i!r} (ints, slices, None and ... are)")
        if idx.count(Ellipsis) > 1:
            raise IndexError("an index can only have one ellipsis (...)")
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor of {self.ndim} dimension(s)")
        if Ellipsis in idx:
            e = idx.index(Ellipsis)
            idx = idx[:e] + [slice(None)] * (self.ndim - n_real) + idx[e + 1 :]
        else:
            idx = idx + [slice(None)] * (self.ndim - n_real)
        dim, out_shape = 0, []
        bounds, flips, steps = [], [], []
        for i in idx:
            if i is None:
                out_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(i, int):
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                i = slice(i % size, i % size + 1)
            else:
                out_shape.append(len(range(*i.indices(size))))
            start, stop, step = i.indices(size)
            n = len(range(start, stop, step))
            if step < 0:  # walk the flipped dim forwards
                start, step = size - 1 - start, -step
            # take n*step elements where they exist, so that splitting off the step needs no padding
            bounds.append((start, min(start + n * step, size)) if n else (0, 0))
            flips.append(i.step is not None and i.step < 0)
            steps.append(step)
            dim += 1
        x = self.flip([d for d, f in enumerate(flips) if f]) if any(flips) else self
        x = x.shrink(bounds)
        for d, st in enumerate(steps):
            if st > 1 and x.shape[d] > 0:
                x = x._take_every(d, st)
        return x.reshape(out_shape)

    def _take_every(self, dim: int, step: int) -> Tensor:
        """Elements 0, step, 2*step ... along dim, as views: split the dim into (n, step) and keep column 0."""
        size = self.shape[dim]
        n = (size + step - 1) // step

        def along(bounds: tuple[int, int]) -> list[tuple[int, int] | None]:
            return [None] * dim + [bounds] + [None] * (self.ndim - dim - 1)

        def columns(x: Tensor, rows: int) -> Tensor:
            split = x.reshape(*self.shape[:dim], rows, step, *self.shape[dim + 1 :])
            return split.shrink([None] * (dim + 1) + [(0, 1)] + [None] * (self.ndim - dim - 1)).reshape(
                *self.shape[:dim], rows, *self.shape[dim + 1 :])

        if size == n * step:
            return columns(self, n)
        # the last element has no full row after it: take it on its own and join the two with padding
        head = columns(self.shrink(along((0, (n - 1) * step))), n - 1)
        last = self.shrink(along(((n - 1) * step, (n - 1) * step + 1)))
        no_pad = [(0, 0)] * self.ndim
        return head.pad(no_pad[:dim] + [(0, 1)] + no_pad[dim + 1 :]) + last.pad(no_pad[:dim] + [(n - 1, 0)] + no_pad[dim + 1 :])


# ---------------------------------------------------------------- helpers


def _check_dtype(device: str, dtype: DType) -> None:
    if not device_supports(device, dtype):
        raise TypeError(f"device {device} cannot compute in {dtype.name} (its renderer supports "
                        f"{sorted(d.name for d in Device[device].renderer.caps.dtypes)})")


def _const(value: Scalar, dtype: DType, device: str) -> UOp:
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), truncate(dtype, value))


def _upload(arr: np.ndarray, device: str, dtype: DType | None) -> UOp:
    if arr.dtype not in _NP_TO_DTYPE and arr.dtype != np.float64:
        raise TypeError(f"NumPy dtype {arr.dtype} has no tiny dtype")
    src_dt = _NP_TO_DTYPE.get(arr.dtype, dtypes.float64)
    if dtype is None and src_dt == dtypes.float64 and arr.dtype != np.float64:
        dtype = dtypes.default_float
    dt = dtype or src_dt
    _check_dtype(device, dt)
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


def _mix32(x: int) -> int:
    x &= 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _shape_arg(shape: Any, allow_neg: bool = False) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) alike."""
    if isinstance(shape, int):
        shape = (shape,)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = tuple(shape)
    for s in out:
        if not isinstance(s, int) or isinstance(s, bool):
            raise TypeError(f"sizes must be ints, got {out}")
        if s < 0 and not allow_neg:
            raise ValueError(f"sizes must not be negative, got {out}")
    return out


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} cannot broadcast (sizes {x} and {y} differ and neither is 1)")
        out.append(y if x == 1 else x)
    return tuple(out)


def _axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted({_normalize_axis(a, ndim) for a in axes}))
