"""Indexing and joining: advanced indexing, gather/scatter, cat/stack/split, masks.

Everything here is built from movement ops, comparisons, `where` and sums. Picking elements by an index tensor
never leaves the device: an index is compared with an arange along the dim it indexes (a one-hot mask), and the
mask selects and sums, so a gather is one fused reduction kernel. The price is work proportional to the size of the
indexed dim for every element picked. The same one-hot form means an index outside the dim matches nothing: lazily
it cannot be checked, so a gather gives 0 there and a scatter writes nothing (indices given as Python lists or NumPy
arrays are on the host already and are checked).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tiny.ir.dtypes import dtypes, least_upper_dtype
from tiny.ir.sint import check_size
from tiny.ir.uop import UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int, tensors_given
from tiny.tensor.shapes import broadcast_shape, normalize_axis

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool
REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
SCATTER_REDUCTIONS = {"add": "sum", "multiply": "prod"}  # scatter(reduce=...) -> the scatter_reduce it is


@dataclass(frozen=True)
class _Mask:
    """A bool index over as many dims as it has, with its values on the host."""

    values: np.ndarray


@dataclass(frozen=True)
class _Take:
    """An integer index tensor (advanced indexing) for one dim: a Tensor, or host values still to be checked."""

    index: Any  # Tensor | np.ndarray


class IndexingOps(TensorBase):
    __slots__ = ()

    # ---------------------------------------------------------------- __getitem__

    def __getitem__(self, index: Any) -> Tensor:
        """NumPy/PyTorch indexing. Basic indices (ints, slices with steps, None, ...) are views. Advanced indices
        (integer tensors, lists or arrays; negative values count from the end) are broadcast together; their result
        dims replace the indexed dims when those are adjacent, else they come first (as in PyTorch, ints and 0-d
        index tensors are applied first and do not separate advanced indices). A bool mask (a list, a NumPy array or a
        tensor) picks the elements where it is true: the result's size depends on its values, so a mask tensor is
        realized and read here. Integer index tensors are not read: a value outside the dim picks 0.

        >>> x = Tensor([[1, 2, 3], [4, 5, 6]])
        >>> x[:, Tensor([2, 0])].tolist(), x[x.numpy() > 2].tolist()
        ([[3, 1], [6, 4]], [3, 4, 5, 6])
        """
        items = [self._index_item(i) for i in (index if isinstance(index, tuple) else (index,))]
        if items.count(Ellipsis) > 1:
            raise IndexError("an index can only have one ellipsis (...)")
        used = sum(_dims_used(i) for i in items)
        if used > self.ndim:
            raise IndexError(f"too many indices ({used}) for a tensor of {self.ndim} dimension(s)")
        if Ellipsis in items:
            e = items.index(Ellipsis)
            items = items[:e] + [slice(None)] * (self.ndim - used) + items[e + 1 :]
        basic: list[Any] = []
        picks: list[tuple[int, Tensor]] = []  # (dim of the basic result, index tensor)
        dim = out_dim = 0
        for item in items:
            if isinstance(item, _Mask):
                item_list: list[Any] = [_Take(nz) for nz in self._mask_indices(item.values, dim)]
            else:
                item_list = [item]
            for i in item_list:
                if isinstance(i, _Take):
                    picks.append((out_dim, self._index_tensor_for(i.index, dim)))
                    basic.append(slice(None))
                else:
                    basic.append(i)
                dim += i is not None
                out_dim += not isinstance(i, int)
        out = self._basic_index(basic)
        return out._take(picks) if picks else out

    def _index_item(self, i: Any) -> Any:
        """One entry of an index, checked: None, Ellipsis, int, slice, _Mask or _Take."""
        if isinstance(i, (bool, np.bool_)):
            raise TypeError(f"a Python bool is not an index (got {i!r}); use None to add a dim")
        if i is None or i is Ellipsis or isinstance(i, slice):
            return i
        if isinstance(i, (int, np.integer)):
            return operator.index(i)
        if isinstance(i, UOp):  # a bound Variable (or a size expression of them): an index into a dim
            return check_size(i, "an index")
        if isinstance(i, TensorBase):
            if i.device != self.device:
                raise ValueError(f"index tensor is on {i.device} but the tensor is on {self.device}; use .to()")
            if i.dtype.is_bool:
                return _Mask(i.numpy())
            if not i.dtype.is_int:
                raise TypeError(f"index tensors must have an integer or bool dtype, got {i.dtype.name}")
            return _Take(i)
        if isinstance(i, (list, tuple, np.ndarray)):  # (a tuple inside the index is a sequence of indices)
            try:
                arr = np.asarray(i)
            except ValueError as e:
                raise TypeError(f"an index list must be rectangular: {e}") from None
            if arr.dtype == np.bool_:
                return _Mask(arr)
            if arr.size == 0:
                arr = arr.astype(np.int64)
            if arr.dtype.kind not in "iu":
                raise TypeError(f"index lists and arrays must hold ints or bools, got {arr.dtype} ({i!r})")
            return _Take(arr)
        raise TypeError(
            f"this index is not supported: {i!r} (ints, slices, None, ..., integer or bool tensors/lists/arrays are)"
        )

    def _mask_indices(self, mask: np.ndarray, dim: int) -> tuple[np.ndarray, ...]:
        """The integer indices of a bool mask that covers dims dim, dim+1, ... (NumPy's nonzero)."""
        if mask.ndim == 0:
            raise IndexError("a 0-d bool index is not supported; use None to add a dim")
        covered = self.shape[dim : dim + mask.ndim]
        if mask.shape != covered:
            raise IndexError(
                f"bool mask of shape {mask.shape} does not match dims {dim}..{dim + mask.ndim - 1} "
                f"of the indexed tensor, of sizes {covered} (shape {self.shape})"
            )
        return np.nonzero(mask)

    def _index_tensor_for(self, index: Any, dim: int) -> Tensor:
        """An integer index for dim as a tensor on this device; values from the host are checked here."""
        if isinstance(index, np.ndarray):
            size = self.shape[dim]
            bad = index[(index < -size) | (index >= size)]
            if bad.size:
                raise IndexError(f"index {bad.flat[0]} is out of bounds for dimension {dim} with size {size}")
            return type(self)(index.astype(np.int32), device=self.device)
        return index

    def _take(self, picks: list[tuple[int, Tensor]]) -> Tensor:
        """Advanced indexing of dims by index tensors: one-hot masks of all of them select, a sum over the indexed
        dims gathers. The result's dims are laid out in their final order before the sum, so nothing moves after it."""
        dims = [d for d, _ in picks]
        rest = [d for d in range(self.ndim) if d not in dims]
        vector = [d for d, t in picks if t.ndim]  # 0-d indices act as ints: they place nothing
        kept = [d for d in range(self.ndim) if d in vector or d not in dims]
        adjacent = bool(vector) and [kept.index(d) for d in vector] == list(
            range(kept.index(vector[0]), kept.index(vector[0]) + len(vector))
        )
        q = sum(1 for d in rest if d < vector[0]) if adjacent else 0  # rest dims before the index dims
        b_shape: tuple[int, ...] = ()
        for _, t in picks:
            try:
                b_shape = broadcast_shape(b_shape, t.shape)
            except ValueError:
                shapes = [t.shape for _, t in picks]
                raise IndexError(f"index tensors of shapes {shapes} cannot be broadcast together") from None
        r_shape = tuple(self.shape[d] for d in rest)
        sizes = tuple(self.shape[d] for d in dims)
        nb, m = len(b_shape), len(dims)
        values = self.permute(rest + dims).reshape(r_shape[:q] + (1,) * nb + r_shape[q:] + sizes)
        values = values.expand(r_shape[:q] + b_shape + r_shape[q:] + sizes)
        mask = None
        for k, ((_, t), n) in enumerate(zip(picks, sizes)):
            t = (t < 0).where(t + n, t) if not t.dtype.is_unsigned else t
            t = t._broadcast_to(b_shape).reshape((1,) * q + b_shape + (1,) * (len(rest) - q) + (1,) * m)
            hot = t == self._arange_along(n, len(rest) + nb + k, len(rest) + nb + m)
            mask = hot if mask is None else mask & hot
        return values._select_sum(mask, tuple(range(-m, 0)))

    def _arange_along(self, n: int, axis: int, ndim: int) -> Tensor:
        """0, 1 ... n-1 along `axis` of an ndim-dim shape of ones (int32, for comparing with indices)."""
        out = type(self).arange(n, dtype=dtypes.int32, device=self.device)
        return out.reshape((1,) * axis + (n,) + (1,) * (ndim - axis - 1))

    def _select_sum(self, mask: Tensor, axes: tuple[int, ...]) -> Tensor:
        """Sum over axes of self where mask (broadcast) is true, in self's dtype: where one element is selected,
        that element exactly."""
        wide = self.cast(dtypes.int32) if self.dtype.is_bool else self
        picked = mask.where(wide, wide.zeros_like())
        return picked.sum(axes, dtype=wide.dtype).cast(self.dtype)

    # ---------------------------------------------------------------- joining and splitting

    def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
        """Join tensors along an existing dim (dtypes promote as in torch.cat): `a.cat(b, c, dim=1)`,
        `Tensor.cat(a, b, c, dim=1)` or `Tensor.cat([a, b, c], dim=1)`. Each piece is padded to the result's shape
        and a where picks it: one kernel.

        >>> Tensor([1, 2]).cat(Tensor([3])).tolist()
        [1, 2, 3]
        """
        tensors = tensors_given(self, others, "cat", TensorBase)
        if tensors[0] is not self:  # Tensor.cat([a, b, c])
            return tensors[0].cat(*tensors[1:], dim=dim)
        for t in tensors:
            if t.device != self.device:
                raise ValueError(f"cat got tensors on {self.device} and {t.device}; use .to()")
        if self.ndim == 0:
            raise ValueError("cat cannot join 0-d tensors; use stack")
        d = normalize_axis(dim, self.ndim)
        for t in tensors:
            if t.ndim != self.ndim or any(a != b for e, (a, b) in enumerate(zip(t.shape, self.shape)) if e != d):
                raise ValueError(
                    f"cat along dim {dim} needs shapes equal but in that dim, got {self.shape} and {t.shape}"
                )
        dt = least_upper_dtype(*(t.dtype for t in tensors))
        total = sum(t.shape[d] for t in tensors)
        pieces: list[tuple[int, Tensor]] = []
        for t in tensors:
            start = pieces[-1][0] + pieces[-1][1].shape[d] if pieces else 0
            pieces.append((start, t.cast(dt)))
        pieces = [(s, t) for s, t in pieces if t.shape[d]]
        if len(pieces) <= 1:
            return pieces[0][1] if pieces else self.cast(dt)
        no_pad = [(0, 0)] * self.ndim

        def placed(start: int, t: Tensor) -> list[tuple[int, int]]:
            return no_pad[:d] + [(start, total - start - t.shape[d])] + no_pad[d + 1 :]

        out = pieces[-1][1].pad(placed(*pieces[-1]))
        for start, t in reversed(pieces[:-1]):
            inside = type(self).full(t.shape, True, dtypes.bool, self.device).pad(placed(start, t))
            out = inside.where(t.pad(placed(start, t)), out)
        return out

    def stack(self, *others: Tensor, dim: int = 0) -> Tensor:
        """Join tensors of one shape along a new dim: `a.stack(b, dim=1)`, `Tensor.stack(a, b, dim=1)` or
        `Tensor.stack([a, b], dim=1)`.

        >>> Tensor([1, 2]).stack(Tensor([3, 4])).tolist(), Tensor.stack([Tensor([1]), Tensor([2])], dim=1).tolist()
        ([[1, 2], [3, 4]], [[1, 2]])
        """
        first, *rest = tensors_given(self, others, "stack", TensorBase)
        for t in rest:
            if t.shape != first.shape:
                raise ValueError(f"stack needs tensors of one shape, got {first.shape} and {t.shape}")
        d = normalize_axis(dim, first.ndim + 1)
        return first.unsqueeze(d).cat(*(t.unsqueeze(d) for t in rest), dim=d)

    def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Views of consecutive pieces along dim: of one size (the last may be smaller), or of the sizes listed.

        >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).split(2)]
        [[1, 2], [3, 4], [5]]
        """
        d = normalize_axis(dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            size = split_size_or_sections
            if size < 0 or (size == 0 and n):
                raise ValueError(f"split size must be positive (0 only for an empty dim), got {size}")
            sizes = [size] * (n // size) + ([n % size] if n % size else []) if n else [0]
        else:
            sizes = list(split_size_or_sections)
            if any(not isinstance(s, int) or s < 0 for s in sizes) or sum(sizes) != n:
                raise ValueError(f"split sizes {tuple(sizes)} must be non-negative ints adding up to dim {dim}'s {n}")
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return tuple(self._slice_dim(d, s, s + size) for s, size in zip(starts, sizes))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """Split into `chunks` pieces of ceil(size / chunks) along dim, as torch.chunk (there may be fewer).

        >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).chunk(3)]
        [[1, 2], [3, 4], [5]]
        """
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunk needs a positive number of chunks, got {chunks!r}")
        n = self.shape[normalize_axis(dim, self.ndim)]
        return self.split(math.ceil(n / chunks), dim) if n else self.split([0] * chunks, dim)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along dim, each without that dim.

        >>> [t.tolist() for t in Tensor([[1, 2], [3, 4]]).unbind(1)]
        [[1, 3], [2, 4]]
        """
        d = normalize_axis(dim, self.ndim)
        return tuple(self._slice_dim(d, i, i + 1).squeeze(d) for i in range(self.shape[d]))

    # ---------------------------------------------------------------- masks

    def masked_select(self, mask: Tensor) -> Tensor:
        """The elements where a bool mask (broadcast with self) is True, as a 1-d tensor, as torch.masked_select.
        Its length depends on the mask's values: the mask is computed and read here. Gradients flow to self.

        >>> Tensor([[1, 2], [3, 4]]).masked_select(Tensor([True, False])).tolist()
        [1, 3]
        """
        if not isinstance(mask, TensorBase) or not mask.dtype.is_bool:
            got = mask.dtype.name if isinstance(mask, TensorBase) else type(mask).__name__
            raise TypeError(f"masked_select() takes a bool Tensor as mask, got {got}")
        shape = broadcast_shape(self.shape, mask.shape)
        x, m = self._broadcast_to(shape), mask._broadcast_to(shape)  # type: ignore[attr-defined]
        return x.reshape(-1)[m.reshape(-1)]

    def nonzero(self, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
        """The indices of the nonzero elements, as torch.nonzero: one row (of ndim ints) per element, in order;
        with as_tuple, one 1-d tensor of indices per dim (NumPy's nonzero). The tensor is computed and read here.

        >>> Tensor([[0, 1], [2, 0]]).nonzero().tolist(), [t.tolist() for t in Tensor([0, 3, 4]).nonzero(as_tuple=True)]
        ([[0, 1], [1, 0]], [[1, 2]])
        """
        found = np.nonzero(self.numpy().reshape(self.shape or (1,)) != 0)  # type: ignore[attr-defined]
        dt = default_int(self.device)
        if as_tuple:
            return tuple(type(self)(i, device=self.device, dtype=dt) for i in found)
        rows = np.stack(found, axis=1) if self.ndim else np.zeros((len(found[0]), 0), np.int64)
        return type(self)(rows, device=self.device, dtype=dt)

    def masked_fill(self, mask: Tensor, value: Scalar | Tensor) -> Tensor:
        """`value` where the bool mask (broadcast to this shape) is true; the dtype stays this tensor's.

        >>> Tensor([1.0, 2.0]).masked_fill(Tensor([True, False]), 0.0).tolist()
        [0.0, 2.0]
        """
        if not isinstance(mask, TensorBase) or not mask.dtype.is_bool:
            raise TypeError(f"masked_fill takes a bool mask tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        if mask.device != self.device:
            raise ValueError(f"mask is on {mask.device} but the tensor is on {self.device}; use .to()")
        if mask.ndim > self.ndim or any(m not in (1, s) for m, s in zip(reversed(mask.shape), reversed(self.shape))):
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to the tensor's shape {self.shape}")
        if isinstance(value, TensorBase):
            if value.ndim:
                raise ValueError(f"masked_fill takes a scalar or a 0-d tensor value, got shape {value.shape}")
            fill = value.to(self.device).cast(self.dtype)
        else:
            fill = type(self)(value, device=self.device, dtype=self.dtype)
        return mask.where(fill, self)

    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two dims (j - i <= diagonal kept), zeros above it.

        >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
        [[1, 0], [3, 4]]
        """
        return self._triangle(lambda rows, cols: cols <= rows + diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two dims (j - i >= diagonal kept), zeros below it.

        >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
        [[1, 2], [0, 4]]
        """
        return self._triangle(lambda rows, cols: cols >= rows + diagonal)

    def _triangle(self, keep: Any) -> Tensor:
        if self.ndim < 2:
            raise ValueError(f"tril/triu need a tensor of at least 2 dims, got shape {self.shape}")
        h, w = self.shape[-2:]
        rows, cols = self._arange_along(h, 0, 2), self._arange_along(w, 1, 2)
        return keep(rows, cols).where(self, self.zeros_like())

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """One-hot vectors along a new last dim, as torch.nn.functional.one_hot, in the default int (int64; int32
        on a device without it). num_classes=-1 uses max + 1, which realizes this tensor and reads its maximum.
        Values outside [0, num_classes) give all zeros.

        >>> Tensor([0, 2]).one_hot(3).tolist()
        [[1, 0, 0], [0, 0, 1]]
        """
        if not self.dtype.is_int:
            raise TypeError(f"one_hot takes an integer tensor, got {self.dtype.name}")
        if num_classes == -1:
            if self.numel() == 0:
                raise ValueError("one_hot cannot infer num_classes from an empty tensor; pass it")
            num_classes = int(self.max().item()) + 1
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"one_hot needs num_classes >= 0 (or -1), got {num_classes!r}")
        hot = self.unsqueeze(-1) == self._arange_along(num_classes, self.ndim, self.ndim + 1)
        return hot.cast(default_int(self.device))

    # ---------------------------------------------------------------- gather and scatter

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[i][j][k] = self[index[i][j][k]][j][k] for dim 0 (and so on), as torch.gather: index has this tensor's
        number of dims, and no larger sizes except along dim. One fused kernel.

        >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[1], [0]])).tolist()
        [[2], [3]]
        """
        self._check_index(index, "gather")
        if self.ndim == 0:
            return self.reshape(1).gather(0, index.reshape(1)).reshape(())
        d = normalize_axis(dim, self.ndim)
        self._check_index_shape(index, d, "gather", self.shape, "input")
        n, s = self.shape[d], index.shape
        region = self.shrink([None if e == d else (0, s[e]) for e in range(self.ndim)])
        values = region.permute([e for e in range(self.ndim) if e != d] + [d]).unsqueeze(d).expand(*s, n)
        hot = index.unsqueeze(-1) == self._arange_along(n, self.ndim, self.ndim + 1)
        return values._select_sum(hot, (-1,))

    def scatter(self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
        """A copy with self[index[i][j]][j] = src[i][j] for dim 0 (and so on), as torch.scatter; src may be a scalar.
        Where several indices along dim name one place, the last of them in index order writes it (what PyTorch's
        CPU kernel keeps; its GPU kernels keep any one): the others write nothing, and their src elements take no
        gradient (PyTorch hands each of them the place's gradient). reduce="add" or "multiply" combines the values
        sent to a place with the one there instead, as scatter_reduce's "sum" and "prod" with include_self.

        >>> Tensor([0, 0, 0]).scatter(0, Tensor([2, 0, 2]), Tensor([5, 7, 9])).tolist()
        [7, 0, 9]
        >>> Tensor([1, 1, 1]).scatter(0, Tensor([2, 0, 2]), Tensor([5, 7, 9]), reduce="add").tolist()
        [8, 1, 15]
        """
        if reduce is not None:
            if reduce not in SCATTER_REDUCTIONS:
                raise ValueError(f"scatter's reduce must be None, 'add' or 'multiply', got {reduce!r}")
            self._check_index(index, "scatter")
            if not isinstance(src, TensorBase):
                src = type(self).full(index.shape, src, self.dtype, self.device)
            return self.scatter_reduce(dim, index, src, SCATTER_REDUCTIONS[reduce], include_self=True)
        hot, values = self._scatter_parts(dim, index, src, "scatter", last_only=True)
        if index.numel() == 0:  # an empty index sends nothing anywhere
            return self
        hits = hot.sum(-1, dtype=dtypes.int32) > 0
        return hits.where(values._select_sum(hot, (-1,)), self)

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """A copy with src[i][j] added to self[index[i][j]][j] for dim 0 (and so on): every value sent to a place
        adds up, as torch.scatter_add.

        >>> Tensor([1, 1, 1]).scatter_add(0, Tensor([2, 0, 2]), Tensor([5, 7, 9])).tolist()
        [8, 1, 15]
        """
        return self.scatter_reduce(dim, index, src, "sum", include_self=True)

    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
        """Reduce the src values that index sends to each place ("sum", "prod", "mean", "amax" or "amin"), together
        with the value already there when include_self; places nothing is sent to keep their value. As
        torch.scatter_reduce, gradients included ("mean" of integers rounds down, as torch does).

        >>> Tensor([1, 1]).scatter_reduce(0, Tensor([0, 0, 1]), Tensor([2, 3, 4]), "sum").tolist()
        [6, 5]
        """
        if reduce not in REDUCTIONS:
            raise ValueError(f"scatter_reduce's reduce must be one of {REDUCTIONS}, got {reduce!r}")
        if not isinstance(src, TensorBase):
            raise TypeError(f"scatter_reduce takes a src tensor, got {type(src).__name__}")
        hot, values = self._scatter_parts(dim, index, src, "scatter_reduce")
        if index.numel() == 0:  # an empty index sends nothing anywhere
            return self
        count = hot.sum(-1, dtype=dtypes.int32)
        own = self.unsqueeze(-1)
        if reduce in ("sum", "mean"):
            total = values._select_sum(hot, (-1,))
            if reduce == "sum":
                return self + total if include_self else (count > 0).where(total, self)
            if include_self:
                total, count = total + self, count + 1
            div = count.maximum(1).cast(self.dtype)
            return (count > 0).where(total / div if self.dtype.is_float else total // div, self)
        if reduce == "prod":
            picked = hot.where(values, values.ones_like())
            if include_self:
                picked = picked.cat(own, dim=-1)
            return (count > 0).where(picked._prod_last(), self)
        flip = reduce == "amin"  # min(x) = flip(max(flip(x))) for an order-reversing flip
        values, own = (values._order_flip(), own._order_flip()) if flip else (values, own)
        lowest = -math.inf if self.dtype.is_float else self.dtype.min
        picked = hot.where(values, values.full_like(lowest))
        if include_self:
            picked = picked.cat(own, dim=-1)
        best = picked.max(-1)
        best = best._order_flip() if flip else best
        return (count > 0).where(best, self)

    def _scatter_parts(
        self, dim: int, index: Tensor, src: Tensor | Scalar, name: str, last_only: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The one-hot mask and the src values of a scatter, both of shape self.shape + (index.shape[dim],): along the
        last dim, which src elements land on each place of self (masked out beyond the index's extent). last_only:
        of the elements that name one place, only the last along dim lands."""
        self._check_index(index, name)
        if self.ndim == 0:
            raise ValueError(f"{name} needs a tensor of at least 1 dim")
        d = normalize_axis(dim, self.ndim)
        self._check_index_shape(index, d, name, self.shape, "self")
        if isinstance(src, TensorBase):
            if src.device != self.device:
                raise ValueError(f"{name}: src is on {src.device} but the tensor is on {self.device}; use .to()")
            if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
                raise ValueError(f"{name}: index of shape {index.shape} does not fit src of shape {src.shape}")
            src = src.shrink([(0, s) for s in index.shape]).cast(self.dtype)
        else:
            src = type(self).full(index.shape, src, self.dtype, self.device)
        k, s, n = self.ndim, index.shape, self.shape[d]
        order = list(range(k)) + [d]  # index dims, with the new last dim (which place of dim d) moved to d
        order[d] = k
        grow = [(0, 0) if e == d else (0, self.shape[e] - s[e]) for e in range(k)] + [(0, 0)]
        hot = index.unsqueeze(-1) == self._arange_along(n, k, k + 1)
        if last_only:
            hot = hot & _repeated_later(index, d).logical_not().unsqueeze(-1)
        hot = hot.permute(order).pad(grow)
        values = src.unsqueeze(-1).expand(*s, n).permute(order).pad(grow)
        return hot, values

    def _prod_last(self) -> Tensor:
        """The product over the last dim, as a tree of elementwise products (no reduction op needed)."""
        x = self
        while x.shape[-1] > 1:
            n = x.shape[-1]
            if n % 2:
                x = x.pad([(0, 0)] * (x.ndim - 1) + [(0, 1)], value=1)
            half = (n + 1) // 2
            x = x._slice_dim(x.ndim - 1, 0, half) * x._slice_dim(x.ndim - 1, half, 2 * half)
        return x.squeeze(-1) if x.shape[-1] == 1 else type(self).full(x.shape[:-1], 1, x.dtype, x.device)

    def _check_index(self, index: Any, name: str) -> None:
        if not isinstance(index, TensorBase):
            raise TypeError(f"{name} takes an index Tensor, got {type(index).__name__}")
        if not index.dtype.is_int:
            raise TypeError(f"{name} needs an integer index tensor, got {index.dtype.name}")
        if index.device != self.device:
            raise ValueError(f"{name}: index is on {index.device} but the tensor is on {self.device}; use .to()")
        if index.ndim != self.ndim:
            raise ValueError(
                f"{name} needs an index with as many dims as the tensor ({self.ndim}), got shape {index.shape}"
            )

    def _check_index_shape(self, index: Tensor, d: int, name: str, shape: tuple[int, ...], what: str) -> None:
        for e, (i, s) in enumerate(zip(index.shape, shape)):
            if e != d and i > s:
                raise ValueError(
                    f"{name}: index of shape {index.shape} is larger than {what} of shape {shape} in dim {e} "
                    f"(only dim {d} may be)"
                )


def _repeated_later(index: Tensor, d: int) -> Tensor:
    """Whether a later element along dim d (the same other coordinates) holds the same index: a bool of index's
    shape. An element that is repeated later is overwritten by it in a scatter."""
    m, k = index.shape[d], index.ndim
    later = index.unsqueeze(k).transpose(d, k)  # later[..., 1 at d, ..., j] = index[..., j at d, ...]
    same = index.unsqueeze(-1) == later
    after = index._arange_along(m, k, k + 1) > index._arange_along(m, d, k + 1)  # j > i
    return (same & after).any(-1)


def _dims_used(item: Any) -> int:
    """How many dims of the indexed tensor an index entry consumes."""
    if item is None or item is Ellipsis:
        return 0
    return item.values.ndim if isinstance(item, _Mask) else 1
