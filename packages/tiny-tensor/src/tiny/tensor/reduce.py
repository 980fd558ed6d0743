"""Reductions (sum, max, min, mean, softmax) and matmul."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tiny.ir.dtypes import DType, dtypes, least_upper_dtype, to_dtype
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import broadcast_shape, normalize_axes, prod

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class ReduceOps(TensorBase):
    __slots__ = ()

    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool, dtype: DType | None = None) -> Tensor:
        axes = normalize_axes(axis, self.ndim)
        x = self if dtype is None else self.cast(dtype)
        if self.ndim == 0:
            return x
        out = self._new(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(
        self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | str | None = None
    ) -> Tensor:
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
        if any(self.shape[a] == 0 for a in normalize_axes(axis, self.ndim)) if self.ndim else False:
            raise ValueError(f"{name}() of an empty dimension has no identity; shape {self.shape}, axis {axis}")

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        if not self.dtype.is_float:
            raise TypeError(f"mean() needs a float tensor, got {self.dtype.name}; cast it first")
        axes = normalize_axes(axis, self.ndim) if self.ndim else ()
        n = prod(self.shape[a] for a in axes)
        wide = self.cast(dtypes.float32) if self.dtype.itemsize < 4 else self  # half sums can overflow before / n
        total = wide.sum(axis, keepdim)
        return (total / n if n else total * math.nan).cast(self.dtype)

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
        if not isinstance(w, TensorBase):
            raise TypeError(f"matmul takes a Tensor, got {type(w).__name__}")
        if self.ndim == 0 or w.ndim == 0:
            raise ValueError(f"matmul needs tensors with at least 1 dimension, got shapes {self.shape} and {w.shape}")
        x, y = self, w
        if x.shape[-1] != y.shape[-2 if y.ndim > 1 else -1]:
            raise ValueError(
                f"matmul shape mismatch: {self.shape} @ {w.shape} "
                f"(inner sizes {x.shape[-1]} and {y.shape[-2 if y.ndim > 1 else -1]} differ)"
            )
        if y.device != x.device:
            raise ValueError(f"tensors are on different devices: {x.device} and {y.device}; use .to()")
        dt = least_upper_dtype(x.dtype, y.dtype)
        x, y = x.cast(dt), y.cast(dt)
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        y2 = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
        k = x2.shape[-1]
        batch = broadcast_shape(x2.shape[:-2], y2.shape[:-2])
        n, m = x2.shape[-2], y2.shape[-1]
        a = x2._broadcast_to(batch + (n, k)).reshape(*batch, n, 1, k)
        b = y2._broadcast_to(batch + (k, m)).transpose(-1, -2).reshape(*batch, 1, m, k)
        acc = dtypes.float32 if dt.is_float and dt.itemsize < 4 else dt
        prod = (a * b).cast(acc)
        out = self._new(
            UOp(Ops.REDUCE_AXIS, acc, (prod._broadcast_to(batch + (n, m, k)).uop,), (Ops.ADD, (len(batch) + 2,)))
        )
        out = out.reshape(*batch, n, m).cast(dt)
        if self.ndim == 1:
            out = out.reshape(*out.shape[:-2], m) if w.ndim > 1 else out.reshape(*out.shape[:-2])
        elif w.ndim == 1:
            out = out.reshape(*out.shape[:-1])
        return out

    dot = matmul
