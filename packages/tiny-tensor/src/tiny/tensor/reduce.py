"""Reductions (sum, prod, max, argmax, var, logsumexp, softmax ...), scans (cumsum ...), sorting, and matmul.

Every op here is built from REDUCE_AXIS (with ADD, MUL or MAX), elementwise ops and movement ops, so autograd
needs no rule beyond those primitives' own. Scans and sorts along an axis of n elements compare every pair
(i, j) inside one fused kernel: O(n^2) work but only O(n) memory, because the (n, n) grid is an expand, never
a buffer. Long scans are split into blocks of about sqrt(n), which brings the work down to O(n sqrt(n)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from tiny.ir.dtypes import DType, dtypes, least_upper_dtype, to_dtype
from tiny.ir.schedule import layout
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int
from tiny.tensor.shapes import broadcast_shape, normalize_axes, normalize_axis, prod

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool
Axis = int | Sequence[int] | None

# a scan along an axis longer than this runs in blocks (see _scan); shorter ones compare all pairs at once
SCAN_DIRECT_MAX = 64


class ValuesIndices(NamedTuple):
    """What cummax, cummin, sort and topk return, as PyTorch's named tuples: (values, indices)."""

    values: Tensor
    indices: Tensor


class ReduceOps(TensorBase):
    __slots__ = ()

    def _reduce(self, op: Ops, axis: Axis, keepdim: bool, dtype: DType | None = None) -> Tensor:
        axes = normalize_axes(axis, self.ndim)
        x = self if dtype is None else self.cast(dtype)
        if self.ndim == 0:
            return x
        out = self._new(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _accumulated(self, op: Ops, axis: Axis, keepdim: bool, dtype: DType | str | None) -> Tensor:
        """A sum or product with PyTorch's result dtype: ints and bools give the default int
        (int64; int32 on a device without it), half precision accumulates in float32 and comes back in its own dtype."""
        if dtype is not None:
            return self.cast(to_dtype(dtype))._reduce(op, axis, keepdim)
        if self.dtype.is_bool or self.dtype.is_int:
            return self._reduce(op, axis, keepdim, self._wide_int())
        if self.dtype.itemsize < 4:
            return self._reduce(op, axis, keepdim, dtypes.float32).cast(self.dtype)
        return self._reduce(op, axis, keepdim)

    def _wide_int(self) -> DType:
        """The dtype integer sums and scans accumulate in: uint64 for uint64, else the device's default int."""
        return dtypes.uint64 if self.dtype == dtypes.uint64 else default_int(self.device)

    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Sum over axes (all of them by default); integers and bools sum as int64 (int32 on a
        device without it), half precision accumulates in float32. An empty sum is 0.

        >>> Tensor([[1, 2], [3, 4]]).sum(axis=-1).tolist()
        [3, 7]
        """
        return self._accumulated(Ops.ADD, axis, keepdim, dtype)

    def prod(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Product over axes (all of them by default), with sum()'s result dtypes. An empty product is 1.

        >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).prod(0).tolist()
        [3.0, 8.0]
        """
        return self._accumulated(Ops.MUL, axis, keepdim, dtype)

    def max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The largest value over axes, as torch.amax: NaN wins, and ties share the gradient equally.

        Unlike torch.max(dim), this returns only the values; argmax() gives the indices.

        >>> Tensor([[1.0, 5.0], [7.0, 2.0]]).max(axis=1).tolist()
        [5.0, 7.0]
        """
        self._nonempty_reduce(axis, "max")
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The smallest value over axes, as torch.amin (values only; argmin() gives the indices).

        >>> Tensor([[1.0, 5.0], [7.0, 2.0]]).min(axis=0).tolist()
        [1.0, 2.0]
        """
        self._nonempty_reduce(axis, "min")
        return self._order_flip()._reduce(Ops.MAX, axis, keepdim)._order_flip()

    def amax(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The same as max(): torch.amax's name for it.

        >>> Tensor([3, 9, 4]).amax().item()
        9
        """
        return self.max(axis, keepdim)

    def amin(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The same as min(): torch.amin's name for it.

        >>> Tensor([3, 9, 4]).amin().item()
        3
        """
        return self.min(axis, keepdim)

    def _nonempty_reduce(self, axis: Axis, name: str) -> None:
        if any(self.shape[a] == 0 for a in normalize_axes(axis, self.ndim)) if self.ndim else False:
            raise ValueError(f"{name}() of an empty dimension has no identity; shape {self.shape}, axis {axis}")

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int64; int32 on a device without it) of the largest value along an axis, or in the
        flattened tensor when axis is None.
        Of equal largest values the first wins; a NaN counts as the largest, as in PyTorch.

        >>> Tensor([[1.0, 5.0, 5.0], [7.0, 2.0, 7.0]]).argmax(axis=1).tolist()
        [1, 0]
        """
        if axis is None:
            flat = self.reshape(-1).argmax(0)
            return flat.reshape((1,) * self.ndim) if keepdim else flat
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"argmax()/argmin() take one int axis or None, got {axis!r}")
        ax = normalize_axis(axis, self.ndim)
        if self.ndim == 0:
            return self.full_like(0, default_int(self.device))
        n = self.shape[ax]
        if n == 0:
            raise ValueError(f"argmax()/argmin() of an empty dimension; shape {self.shape}, axis {axis}")
        top = self.max(ax, keepdim=True).detach()
        hit = self == top
        if self.dtype.is_float:  # the max is NaN exactly where a NaN is in the row: that one wins
            hit = hit | self.isnan()
        # n - j for position j, so the max over the hits is the first of them
        countdown = self.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape(_along(n, ax, self.ndim))
        first = n - hit.where(countdown, 0)._reduce(Ops.MAX, ax, keepdim)
        return first.cast(default_int(self.device))

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (default int) of the smallest value; of equal ones the first wins, and a NaN counts as the
        smallest.

        >>> Tensor([[4, 2, 2], [0, 9, 0]]).argmin(axis=-1).tolist()
        [1, 0]
        """
        return self._order_flip().argmax(axis, keepdim)

    def any(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Whether any element along the axes is nonzero (bool). any() of nothing is False.

        >>> Tensor([[0, 0], [0, 3]]).any(axis=1).tolist()
        [False, True]
        """
        return self.cast(dtypes.bool)._reduce(Ops.MAX, axis, keepdim)

    def all(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Whether every element along the axes is nonzero (bool). all() of nothing is True.

        >>> Tensor([[1, 0], [2, 3]]).all(axis=1).tolist()
        [False, True]
        """
        return self.logical_not().any(axis, keepdim).logical_not()

    def mean(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The mean over axes; half precision sums in float32. The mean of nothing is NaN.

        >>> Tensor([[1.0, 2.0], [3.0, 5.0]]).mean(axis=0).tolist()
        [2.0, 3.5]
        """
        if not self.dtype.is_float:
            raise TypeError(f"mean() needs a float tensor, got {self.dtype.name}; cast it first")
        axes = normalize_axes(axis, self.ndim) if self.ndim else ()
        n = prod(self.shape[a] for a in axes)
        wide = self.cast(dtypes.float32) if self.dtype.itemsize < 4 else self  # half sums can overflow before / n
        total = wide.sum(axis, keepdim)
        if type(n) is not int:  # a symbolic count: divide by its value, computed in the kernel
            return (total / type(self)(n, device=self.device).cast(total.dtype)).cast(self.dtype)
        return (total / n if n else total * math.nan).cast(self.dtype)

    def var(
        self,
        axis: Axis | bool = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> Tensor:
        """The variance over axes: sum((x - mean)^2) / max(0, N - correction), with correction 1 by default.
        unbiased=False is PyTorch's older spelling of correction=0.

        >>> Tensor([[1.0, 3.0], [2.0, 2.0]]).var(axis=1).tolist()
        [2.0, 0.0]
        """
        if isinstance(axis, bool):  # torch's var(unbiased) overload
            axis, unbiased = None, axis if unbiased is None else unbiased
        if unbiased is not None and correction is not None:
            raise ValueError("var()/std(): give either unbiased or correction, not both")
        if not self.dtype.is_float:
            raise TypeError(f"var()/std() need a float tensor, got {self.dtype.name}; cast it first")
        corr = correction if correction is not None else 0 if unbiased is False else 1
        axes = normalize_axes(axis, self.ndim) if self.ndim else ()
        n = prod(self.shape[a] for a in axes)
        x = self.cast(dtypes.float32) if self.dtype.itemsize < 4 else self
        centered = x - x.mean(axis, keepdim=True)
        squares = (centered * centered).sum(axis, keepdim)
        divisor = max(0, n - corr)
        return (squares / divisor if divisor else squares * math.inf).cast(self.dtype)

    def std(
        self,
        axis: Axis | bool = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> Tensor:
        """The standard deviation over axes: the square root of var() (same arguments).

        >>> Tensor([[1.0, 3.0], [2.0, 2.0]]).std(axis=1, correction=0).tolist()
        [1.0, 0.0]
        """
        return _std_of(self.var(axis, unbiased, keepdim, correction=correction))

    def var_mean(
        self,
        axis: Axis | bool = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(var, mean) over axes, as torch.var_mean.

        >>> [t.tolist() for t in Tensor([1.0, 3.0]).var_mean()]
        [2.0, 2.0]
        """
        if isinstance(axis, bool):
            axis, unbiased = None, axis if unbiased is None else unbiased
        return self.var(axis, unbiased, keepdim, correction=correction), self.mean(axis, keepdim)

    def std_mean(
        self,
        axis: Axis | bool = None,
        unbiased: bool | None = None,
        keepdim: bool = False,
        *,
        correction: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(std, mean) over axes, as torch.std_mean.

        >>> [t.tolist() for t in Tensor([1.0, 3.0]).std_mean(correction=0)]
        [1.0, 2.0]
        """
        var, mean = self.var_mean(axis, unbiased, keepdim, correction=correction)
        return _std_of(var), mean

    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) over axes, computed stably around the max; over nothing it is -inf.

        >>> round(Tensor([1000.0, 1000.0]).logsumexp(0).item(), 3)
        1000.693
        """
        x = self._float_input()
        axes = normalize_axes(axis, x.ndim) if x.ndim else ()
        if any(x.shape[a] == 0 for a in axes):
            return x.exp().sum(axis, keepdim).log()
        # the max only shifts the exponents: its own derivative cancels, so no gradient flows through it
        top = x.max(axis, keepdim=True).detach()
        top = top.isinf().where(0.0, top)  # a row of infinities: no shift, exp() gives the right 0 or inf
        out = (x - top).exp().sum(axis, keepdim=True).log() + top
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in axes))

    def softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) along an axis, shifted by the max for stability (three kernels at most).

        >>> [round(v, 4) for v in Tensor([1.0, 1.0, 2.0]).softmax().tolist()]
        [0.2119, 0.2119, 0.5761]
        """
        x = self._float_input() if dtype is None else self.cast(dtype)
        if x.ndim and x.shape[normalize_axis(axis, x.ndim)] == 0:
            return x
        e = (x - x.max(axis, keepdim=True).detach()).exp()
        # times the sum's reciprocal, as PyTorch's CPU kernels do: one division a row, not one a value
        return e * e.sum(axis, keepdim=True).reciprocal()

    def log_softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """log(softmax(x)) along an axis, computed as x - logsumexp(x) (three kernels at most).

        >>> [round(v, 4) for v in Tensor([0.0, 0.0]).log_softmax().tolist()]
        [-0.6931, -0.6931]
        """
        x = self._float_input() if dtype is None else self.cast(dtype)
        if x.ndim and x.shape[normalize_axis(axis, x.ndim)] == 0:
            return x
        shifted = x - x.max(axis, keepdim=True).detach()
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    def softmin(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """softmax(-x) along an axis, as torch.nn.functional.softmin: the smallest values weigh most.

        >>> [round(v, 4) for v in Tensor([1.0, 1.0, 2.0]).softmin().tolist()]
        [0.4223, 0.4223, 0.1554]
        """
        x = self._float_input() if dtype is None else self.cast(dtype)
        return (-x).softmax(axis)

    # ---- scans

    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sums along an axis, with sum()'s result dtypes.

        >>> Tensor([[1, 2, 3], [4, 5, 6]]).cumsum(axis=1).tolist()
        [[1, 3, 6], [4, 9, 15]]
        """
        return self._accumulated_scan(Ops.ADD, axis)

    def cumprod(self, axis: int = 0) -> Tensor:
        """Running products along an axis, with prod()'s result dtypes; zeros get PyTorch's gradients.

        >>> Tensor([1.0, 2.0, 3.0, 4.0]).cumprod(0).tolist()
        [1.0, 2.0, 6.0, 24.0]
        """
        return self._accumulated_scan(Ops.MUL, axis)

    def cummax(self, axis: int = 0) -> ValuesIndices:
        """Running maxima along an axis, and their indices, as torch.cummax: the index of the last element equal
        to the running max (of the last NaN once one was seen). The gradient of each value flows to that element.

        >>> [t.tolist() for t in Tensor([1, 3, 2, 5]).cummax(0)]
        [[1, 3, 3, 5], [0, 1, 1, 3]]
        """
        ax = self._scan_axis(axis)
        if self.ndim == 0 or self.shape[ax] == 0:
            return ValuesIndices(self, self.zeros_like(default_int(self.device)))
        n = self.shape[ax]
        running = self.detach()._scan(Ops.MAX, ax)
        new_top = self == running  # where the running max was (re)reached: the last such j <= i is its index
        if self.dtype.is_float:
            new_top = new_top | self.isnan()
        index = new_top.where(self._positions(n, ax, self.ndim), -1)._scan(Ops.MAX, ax)
        values = running
        if self.dtype.is_float:  # values as x[index], a one-hot pick: each value's gradient goes where it came from
            picked = index.unsqueeze(ax + 1) == self._positions(n, ax + 1, self.ndim + 1)  # [..., i, j, ...]
            values = picked.where(self.unsqueeze(ax), 0.0)._reduce(Ops.ADD, ax + 1, False)
        return ValuesIndices(values, index.cast(default_int(self.device)))

    def cummin(self, axis: int = 0) -> ValuesIndices:
        """Running minima along an axis, and their indices, as torch.cummin.

        >>> [t.tolist() for t in Tensor([4, 3, 5, 1]).cummin(0)]
        [[4, 3, 3, 1], [0, 1, 1, 3]]
        """
        values, indices = self._order_flip().cummax(axis)
        return ValuesIndices(values._order_flip(), indices)

    def logcumsumexp(self, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along an axis, computed stably: output i is the logsumexp of elements 0..i, each
        around its own max. It compares every pair (i, j) of the axis: O(n^2) work, O(n) memory.

        >>> [round(v, 3) for v in Tensor([1000.0, 1000.0, 0.0]).logcumsumexp(0).tolist()]
        [1000.0, 1000.693, 1000.693]
        """
        ax = self._scan_axis(axis)
        x = self._float_input()
        if x.ndim == 0 or x.shape[ax] == 0:
            return x
        n = x.shape[ax]
        upto = self._positions(n, ax + 1, x.ndim + 1) <= self._positions(n, ax, x.ndim + 1)  # [..., i, j, ...]: j <= i
        return upto.where(x.unsqueeze(ax), -math.inf).logsumexp(ax + 1)

    def _scan_axis(self, axis: int) -> int:
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"scans and sorts take one int axis, got {axis!r}")
        return normalize_axis(axis, self.ndim)

    def _positions(self, n: int, axis: int, ndim: int) -> Tensor:
        """0 .. n-1 (int32) on `axis` of an ndim-d shape, broadcasting along the other axes."""
        return self.arange(n, dtype=dtypes.int32, device=self.device).reshape(_along(n, axis, ndim))

    def _accumulated_scan(self, op: Ops, axis: int) -> Tensor:
        ax = self._scan_axis(axis)
        if self.dtype.is_bool or self.dtype.is_int:
            x = self.cast(self._wide_int())
        else:
            x = self.cast(dtypes.float32) if self.dtype.itemsize < 4 else self
        out = x if x.ndim == 0 or x.shape[ax] == 0 else x._scan(op, ax)
        return out.cast(self.dtype if self.dtype.is_float else x.dtype)

    def _scan(self, op: Ops, ax: int) -> Tensor:
        """The inclusive scan of `op` (ADD, MUL or MAX) along axis ax."""
        n = self.shape[ax]
        if n <= SCAN_DIRECT_MAX:
            return self._scan_direct(op, ax)
        # blocks of b: scan inside each block, scan the block totals, and combine each block with the totals
        # of all blocks before it
        b = _block_size(n)
        c = -(-n // b)
        lead, rest = self.shape[:ax], self.shape[ax + 1 :]
        identity = _identity(op, self.dtype)
        blocks = self.pad(_on(ax, self.ndim, (0, c * b - n), (0, 0)), value=identity).reshape(*lead, c, b, *rest)
        inner = blocks._scan_direct(op, ax + 1)
        totals = inner.shrink(_on(ax + 1, inner.ndim, (b - 1, b), None)).reshape(*lead, c, *rest)
        before = totals._scan(op, ax).pad(_on(ax, self.ndim, (1, 0), (0, 0)), value=identity)
        carry = before.shrink(_on(ax, self.ndim, (0, c), None)).unsqueeze(ax + 1)
        out = _combine(op, inner, carry).reshape(*lead, c * b, *rest)
        return out.shrink(_on(ax, self.ndim, (0, n), None))

    def _scan_direct(self, op: Ops, ax: int) -> Tensor:
        """The inclusive scan along axis ax as one reduction over an (n, n) grid: out[i] = op(x[j] for j <= i)."""
        n, nd = self.shape[ax], self.ndim + 1
        j = self._positions(n, ax + 1, nd)
        i_plus_1 = self.arange(1, n + 1, dtype=dtypes.int32, device=self.device).reshape(_along(n, ax, nd))
        grid = (j < i_plus_1).where(self.unsqueeze(ax), _identity(op, self.dtype))  # [..., i, j, ...]
        return grid._reduce(op, ax + 1, False)

    # ---- sorting

    def sort(self, axis: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
        """(values, indices) sorted along an axis, as torch.sort(stable=True): equal values keep their
        order, and NaN sorts as the largest value. The gradient of each value flows to the element it came from.
        The sort is always stable; `stable` is accepted for PyTorch's signature.

        >>> [t.tolist() for t in Tensor([3.0, 1.0, 2.0]).sort()]
        [[1.0, 2.0, 3.0], [1, 2, 0]]
        """
        ax = self._scan_axis(axis)
        return self._ranked(ax, self.shape[ax] if self.ndim else 1, descending)

    def argsort(self, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
        """The indices (int64) that sort the tensor along an axis; stable, as sort().

        >>> Tensor([3.0, 1.0, 2.0]).argsort(descending=True).tolist()
        [0, 2, 1]
        """
        return self.sort(axis, descending)[1]

    def topk(self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """(values, indices) of the k largest (or smallest) elements along an axis, as torch.topk.
        They always come sorted (largest first, or smallest first); of equal values the first wins.

        >>> [t.tolist() for t in Tensor([1.0, 9.0, 3.0, 7.0]).topk(2)]
        [[9.0, 7.0], [1, 3]]
        """
        ax = self._scan_axis(axis)
        n = self.shape[ax] if self.ndim else 1
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n:
            raise ValueError(f"topk(): k must be an int in [0, {n}] for an axis of size {n}, got {k!r}")
        return self._ranked(ax, k, largest)

    def _ranked(self, ax: int, k: int, descending: bool) -> ValuesIndices:
        """The first k elements along axis ax in sorted order, and their indices: each element's rank is the
        number of elements that sort before it, and output slot r picks the element of rank r."""
        if self.ndim == 0:
            return ValuesIndices(self, self.zeros_like(default_int(self.device)))
        n, nd = self.shape[ax], self.ndim + 1
        if n == 0 or k == 0:
            values = self.shrink(_on(ax, self.ndim, (0, k), None))
            return ValuesIndices(values, values.zeros_like(default_int(self.device)))
        mine, other = self.unsqueeze(ax + 1), self.unsqueeze(ax)  # [..., i, j, ...]: element i against element j
        ahead = _sorts_before(mine, other) if descending else _sorts_before(other, mine)
        j = self._positions(n, ax + 1, nd)
        ties_ahead = (j < self._positions(n, ax, nd)) & _same(mine, other)  # equal, and earlier
        rank = (ahead | ties_ahead).cast(dtypes.int32)._reduce(Ops.ADD, ax + 1, False)
        picked = rank.unsqueeze(ax) == self._positions(k, ax, nd)  # [..., r, i, ...]: element i goes to slot r
        if self.dtype.is_float:  # a sum of one value and zeros: the gradient of slot r flows to its element
            values = picked.where(self.unsqueeze(ax), 0.0)._reduce(Ops.ADD, ax + 1, False)
        else:
            values = picked.where(self.unsqueeze(ax), self.dtype.min)._reduce(Ops.MAX, ax + 1, False)
        indices = picked.where(j, 0)._reduce(Ops.ADD, ax + 1, False).cast(default_int(self.device))
        return ValuesIndices(values, indices)

    # ---- matmul

    def matmul(self, w: Tensor) -> Tensor:
        """Matrix product with batching and broadcasting, as torch.matmul.

        >>> (Tensor([[1.0, 2.0], [3.0, 4.0]]) @ Tensor([1.0, 1.0])).tolist()
        [3.0, 7.0]
        """
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
        stored = y  # (B's panels are copied in its own dtype: float16 ones half the bytes, widened as they are read)
        x, y = x.cast(dt), y.cast(dt)
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        y2 = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
        k = x2.shape[-1]
        batch = broadcast_shape(x2.shape[:-2], y2.shape[:-2])
        n, m = x2.shape[-2], y2.shape[-1]
        width = layout.panel_width(x.device, dt, prod(x2.shape[:-1]), m, k)  # (the scheduler's choice)
        cols = -(-m // width) * width if width else m  # (B's columns padded with zeros to whole panels)
        if width:  # B copied into panels of `width` columns, each contiguous: C's columns in panels too
            b2 = stored.reshape(y2.shape)
            padded = b2 if cols == m else b2.pad([(0, 0)] * (b2.ndim - 1) + [(0, cols - m)])
            out = _panel_product(x2, padded._panels(width), batch, dt)
        else:
            a = x2._broadcast_to(batch + (n, k)).reshape(*batch, n, 1, k)
            b = y2._broadcast_to(batch + (k, m)).transpose(-1, -2).reshape(*batch, 1, m, k)
            out = _summed_products(a, b, batch + (n, m, k), _accumulator(dt)).reshape(*batch, n, m).cast(dt)
        if cols != m:
            out = out.shrink([None] * (out.ndim - 1) + [(0, m)])
        if self.ndim == 1:
            out = out.reshape(*out.shape[:-2], m) if w.ndim > 1 else out.reshape(*out.shape[:-2])
        elif w.ndim == 1:
            out = out.reshape(*out.shape[:-1])
        return out

    dot = matmul

    def _over_panels(self, panels: Tensor) -> Tensor:
        """self (..., k) @ B where B (k, cols) is kept in panels, (cols / width, k, width) of any float dtype, widened
        as they are read (tiny.tensor.weight_forms.Panels): (..., cols)."""
        *lead, k = self.shape
        dt = least_upper_dtype(self.dtype, panels.dtype)
        out = _panel_product(self.cast(dt).reshape(prod(lead), k), panels, (), dt)
        return out.reshape(*lead, out.shape[-1])

    def _panels(self, width: int) -> Tensor:
        """A (..., k, m) matrix copied into m / width panels of `width` columns, each row of a panel next to the
        last: (..., m / width, k, width), contiguous."""
        *lead, k, m = self.shape
        split = self.reshape(*lead, k, m // width, width)
        nb = len(lead)
        return split.permute(*range(nb), nb + 1, nb, nb + 2).contiguous()


# ---------------------------------------------------------------- helpers


def _panel_product(x2: Tensor, panels: Tensor, batch: tuple[int, ...], dt: DType) -> Tensor:
    """x2 (*batch, n, k) @ B, B's columns in panels (..., cols / width, k, width), widened to dt as they are read:
    (*batch, n, cols) in dt, each row of C's a panel's width at a time."""
    n, k = x2.shape[-2:]
    b = panels.cast(dt).transpose(-1, -2)  # (..., cols / width, width, k)
    a = x2._broadcast_to(batch + (n, k)).reshape(*batch, n, 1, 1, k)
    b = b._broadcast_to(batch + b.shape[-3:]).reshape(*batch, 1, *b.shape[-3:])
    groups, width = b.shape[-3:-1]
    out = _summed_products(a, b, batch + (n, groups, width, k), _accumulator(dt))
    return out.reshape(*batch, n, groups * width).cast(dt)


def _summed_products(a: Tensor, b: Tensor, full: tuple[int, ...], acc: DType) -> Tensor:
    """The sum over the last dim of a * b broadcast to `full`, in acc."""
    product = (a * b).cast(acc)
    return a._new(UOp(Ops.REDUCE_AXIS, acc, (product._broadcast_to(full).uop,), (Ops.ADD, (len(full) - 1,))))


def _accumulator(dt: DType) -> DType:
    """The dtype a product of dt sums in: float32 for narrower floats."""
    return dtypes.float32 if dt.is_float and dt.itemsize < 4 else dt


def _std_of(var: Tensor) -> Tensor:
    """sqrt(var), whose gradient is 0 where var is 0, as PyTorch's std: sqrt's own there (grad / 0) times the
    variance's (x - mean = 0) would be nan. The same values: the square root of a variance of 0 is 0."""
    zero = var == 0  # (a nan or inf variance keeps its square root)
    return zero.where(0, zero.where(1, var).sqrt())


def _along(n: int, axis: int, ndim: int) -> tuple[int, ...]:
    """The shape that puts n elements on `axis` of an ndim-d tensor, broadcasting along the others."""
    return tuple(n if d == axis else 1 for d in range(ndim))


def _on(axis: int, ndim: int, value: object, other: object) -> list:
    """A per-axis argument (padding, shrink bounds) that is `value` on `axis` and `other` on the rest."""
    return [value if d == axis else other for d in range(ndim)]


def _block_size(n: int) -> int:
    """A block length near sqrt(n) for a blocked scan: one that divides n where there is one (a padded axis
    cannot be split by a view, so padding costs a copy), else ceil(sqrt(n))."""
    root = math.isqrt(n)
    for d in range(root, max(root // 2, 1), -1):
        if n % d == 0:
            return d
    return root if root * root == n else root + 1


def _identity(op: Ops, dtype: DType) -> Scalar:
    """The value that op leaves unchanged: what padding and masked-out grid cells of a scan hold."""
    if op is Ops.ADD:
        return _zero(dtype)
    if op is Ops.MUL:
        return True if dtype.is_bool else 1.0 if dtype.is_float else 1
    assert op is Ops.MAX, op
    return dtype.min


def _zero(dtype: DType) -> Scalar:
    return False if dtype.is_bool else 0.0 if dtype.is_float else 0


def _combine(op: Ops, a: Tensor, b: Tensor) -> Tensor:
    if op is Ops.ADD:
        return a + b
    if op is Ops.MUL:
        return a * b
    assert op is Ops.MAX, op
    return a.maximum(b)


def _sorts_before(a: Tensor, b: Tensor) -> Tensor:
    """a < b in sort order: NaN is larger than every number."""
    if not a.dtype.is_float:
        return a < b
    return (a < b) | (b.isnan() & a.isnan().logical_not())


def _same(a: Tensor, b: Tensor) -> Tensor:
    """a == b in sort order: NaNs equal one another."""
    if not a.dtype.is_float:
        return a == b
    return (a == b) | (a.isnan() & b.isnan())
