"""Movement ops: reshape, permute, expand, pad, shrink, flip, and what is built from them (transpose, repeat, roll,
padding modes, basic indexing). They change how kernels index memory, never the memory; the few that one View
cannot say (repeat, repeat_interleave) cost a copy when something reads them through further ops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tiny.ir.sint import check_size, known_le, sadd, sdiv_exact, sint, ssub
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import tensors_given
from tiny.tensor.shapes import normalize_axes, normalize_axis, prod, shape_arg

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class MovementOps(TensorBase):
    __slots__ = ()

    def _movement(self, op: Ops, arg: Any) -> Tensor:
        return self._new(UOp(op, self.dtype, (self.uop,), arg))

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """Same elements, new shape; one dimension may be -1.

        >>> Tensor([1, 2, 3, 4]).reshape(2, -1).tolist()
        [[1, 2], [3, 4]]
        """
        new = list(shape_arg(shape, allow_neg=True))
        if new.count(-1) > 1:
            raise ValueError(f"reshape takes at most one -1, got {tuple(new)}")
        if any(type(s) is not int for s in (*new, *self.shape)):
            return self._reshape_symbolic(new)
        if -1 in new:
            known = prod(s for s in new if s != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
            new[new.index(-1)] = self.numel() // known
        if any(s < 0 for s in new) or prod(new) != self.numel():
            raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
        return self if tuple(new) == self.shape else self._movement(Ops.RESHAPE, tuple(new))

    view = reshape

    def _reshape_symbolic(self, new: list[sint]) -> Tensor:
        """reshape where a size is symbolic: -1 is what is left of the elements once the other sizes divide them."""
        numel = self.numel()
        if -1 in new:
            rest = sdiv_exact(numel, prod(s for s in new if s != -1))
            if rest is None:
                raise ValueError(f"cannot reshape {self.shape} to {tuple(new)}: the other sizes do not divide {numel}")
            new[new.index(-1)] = rest
        if any(type(s) is int and s < 0 for s in new) or prod(new) != numel:
            raise ValueError(f"cannot reshape {self.shape} ({numel} elements) to {tuple(new)}")
        return self if tuple(new) == self.shape else self._movement(Ops.RESHAPE, tuple(new))

    def permute(self, *order: int | Sequence[int]) -> Tensor:
        """The dims in a new order: dim i of the result is dim order[i] of this tensor.

        >>> Tensor.zeros(2, 3, 4).permute(2, 0, 1).shape
        (4, 2, 3)
        """
        perm = tuple(normalize_axis(a, self.ndim) for a in shape_arg(order, allow_neg=True))
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"permute of a {self.ndim}-d tensor needs an order of all its axes, got {order}")
        return self if perm == tuple(range(self.ndim)) else self._movement(Ops.PERMUTE, perm)

    def expand(self, *shape: int | Sequence[int]) -> Tensor:
        """Broadcast size-1 dims (and new leading dims) to a larger shape without copying; -1 keeps a size.

        >>> Tensor([[1], [2]]).expand(-1, 3).tolist()
        [[1, 1, 1], [2, 2, 2]]
        """
        new = list(shape_arg(shape, allow_neg=True))
        if len(new) < self.ndim:
            raise ValueError(f"cannot expand shape {self.shape} to {tuple(new)}: fewer dimensions")
        base = (1,) * (len(new) - self.ndim) + self.shape
        new = [b if n == -1 else n for b, n in zip(base, new)]
        for b, n in zip(base, new):
            if b != n and b != 1:
                raise ValueError(f"cannot expand shape {self.shape} to {tuple(new)}: size {b} is not 1")
        x = self.reshape(base) if base != self.shape else self
        return x if tuple(new) == x.shape else x._movement(Ops.EXPAND, tuple(new))

    def pad(
        self, padding: Sequence[tuple[int, int]] | Sequence[int], value: Scalar = 0, mode: str = "constant"
    ) -> Tensor:
        """Pad each dim; negative amounts crop. padding: ((before, after), ...) per dim, or a flat torch-style tuple
        (last dim first, as torch.nn.functional.pad). mode: "constant" (fill with `value`), "reflect" (mirror without
        the edge), "replicate" (repeat the edge) or "circular" (wrap around).

        >>> Tensor([1, 2, 3]).pad((2, 1), mode="reflect").tolist()
        [3, 2, 1, 2, 3, 2]
        """
        pairs = self._pad_pairs(padding)
        if any(isinstance(x, UOp) for pair in pairs for x in pair):
            return self._pad_symbolic(pairs, value, mode)
        if mode != "constant":
            return self._pad_edges(pairs, value, mode)
        if any(b < 0 or a < 0 for b, a in pairs):
            return self._crop(pairs).pad([(max(b, 0), max(a, 0)) for b, a in pairs], value)
        if all(b == 0 and a == 0 for b, a in pairs):
            return self
        out = self._movement(Ops.PAD, tuple(pairs))
        if value == 0:
            return out
        mask = type(self)(True, device=self.device).reshape((1,) * self.ndim).expand(self.shape)
        return mask._movement(Ops.PAD, tuple(pairs)).where(out, value)

    def _pad_symbolic(self, pairs: list[tuple[Any, Any]], value: Scalar, mode: str) -> Tensor:
        """Constant padding by amounts that are sizes of bound Variables (never negative for any of their values)."""
        if mode != "constant":
            raise ValueError(f"padding by a symbolic amount takes mode 'constant', got {mode!r}")
        pairs = [(_bound(b), _bound(a)) for b, a in pairs]
        if not all(known_le(0, x) for pair in pairs for x in pair):
            raise ValueError(f"pad amounts {tuple(pairs)} may be negative for some values of their Variables")
        out = self._movement(Ops.PAD, tuple(pairs))
        if value == 0:
            return out
        mask = type(self)(True, device=self.device).reshape((1,) * self.ndim).expand(self.shape)
        return mask._movement(Ops.PAD, tuple(pairs)).where(out, value)

    def _pad_pairs(self, padding: Sequence[tuple[int, int]] | Sequence[int]) -> list[tuple[int, int]]:
        """(before, after) for every dim, from either form of padding argument."""
        if padding and isinstance(padding[0], int):
            flat = list(padding)
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ValueError(f"flat padding needs pairs for at most {self.ndim} dims, got {tuple(flat)}")
            pairs = [(0, 0)] * (self.ndim - len(flat) // 2) + [
                (flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)
            ]
        else:
            pairs = [tuple(p) for p in padding]  # type: ignore[misc]
        if len(pairs) != self.ndim or any(len(p) != 2 for p in pairs):
            raise ValueError(f"pad needs {self.ndim} (before, after) pairs, got {tuple(padding)}")
        return pairs  # type: ignore[return-value]

    def _crop(self, pairs: Sequence[tuple[int, int]]) -> Tensor:
        """The negative parts of a padding: cut that much off each end."""
        bounds = [(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pairs, self.shape)]
        if any(lo > hi for lo, hi in bounds):
            raise ValueError(f"padding {tuple(pairs)} crops more than shape {self.shape} has")
        return self.shrink(bounds)

    def _pad_edges(self, pairs: list[tuple[int, int]], value: Scalar, mode: str) -> Tensor:
        """reflect / replicate / circular padding: each dim in turn becomes (its edge pieces, itself) joined."""
        if mode not in ("reflect", "replicate", "circular"):
            raise ValueError(f"pad mode must be constant, reflect, replicate or circular, got {mode!r}")
        if value != 0:
            raise ValueError(f"pad mode {mode!r} takes no value (only mode 'constant' fills with one)")
        x = self._crop(pairs) if any(b < 0 or a < 0 for b, a in pairs) else self
        for d, (b, a) in enumerate(pairs):
            b, a, n = max(b, 0), max(a, 0), x.shape[d]
            if not b and not a:
                continue
            if mode == "reflect" and max(b, a) >= n:
                raise ValueError(f"reflect padding ({b}, {a}) of dim {d} must be less than its size {n}")
            if mode == "replicate" and n == 0:
                raise ValueError(f"replicate padding of dim {d} needs a non-empty dim; shape {x.shape}")
            if mode == "circular" and max(b, a) > n:
                raise ValueError(f"circular padding ({b}, {a}) of dim {d} wraps around more than once (size {n})")
            if mode == "reflect":
                left, right = x._slice_dim(d, 1, b + 1).flip(d), x._slice_dim(d, n - 1 - a, n - 1).flip(d)
            elif mode == "replicate":
                edge = list(x.shape)
                left = x._slice_dim(d, 0, 1).expand(edge[:d] + [b] + edge[d + 1 :])
                right = x._slice_dim(d, n - 1, n).expand(edge[:d] + [a] + edge[d + 1 :])
            else:
                left, right = x._slice_dim(d, n - b, n), x._slice_dim(d, 0, a)
            x = left.cat(x, right, dim=d)
        return x

    def _slice_dim(self, dim: int, lo: int, hi: int) -> Tensor:
        """Elements lo..hi-1 of one dim (a shrink of that dim alone)."""
        return self.shrink([None] * dim + [(lo, hi)] + [None] * (self.ndim - dim - 1))

    def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        """The elements lo..hi-1 of each dim, for (lo, hi) (or None: all) per dim.

        >>> Tensor([[1, 2, 3], [4, 5, 6]]).shrink((None, (1, 3))).tolist()
        [[2, 3], [5, 6]]
        """
        arg = tuple((0, s) if b is None else (_bound(b[0]), _bound(b[1])) for b, s in zip(bounds, self.shape))
        if len(bounds) != self.ndim or not all(_fits(lo, hi, s) for (lo, hi), s in zip(arg, self.shape)):
            raise ValueError(f"shrink bounds {tuple(bounds)} do not fit shape {self.shape}")
        return self if all(b == (0, s) for b, s in zip(arg, self.shape)) else self._movement(Ops.SHRINK, arg)

    def flip(self, *axis: int | Sequence[int]) -> Tensor:
        """Reverse the order of elements along the given dims.

        >>> Tensor([[1, 2], [3, 4]]).flip(1).tolist()
        [[2, 1], [4, 3]]
        """
        axes = normalize_axes(shape_arg(axis, allow_neg=True), self.ndim)
        return self._movement(Ops.FLIP, axes) if axes else self

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        """Swap two dims.

        >>> Tensor.zeros(2, 3, 4).transpose(0, -1).shape
        (4, 3, 2)
        """
        order = list(range(self.ndim))
        a, b = normalize_axis(dim0, self.ndim), normalize_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        """All dims reversed (the matrix transpose of a 2-d tensor)."""
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dims start_dim..end_dim into one.

        >>> Tensor.zeros(2, 3, 4).flatten(1).shape
        (2, 12)
        """
        if self.ndim == 0:
            return self.reshape(1)
        s, e = normalize_axis(start_dim, self.ndim), normalize_axis(end_dim, self.ndim)
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
        return self.reshape(*self.shape[:s], prod(self.shape[s : e + 1]), *self.shape[e + 1 :])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Remove size-1 dims: all of them, or those of the dims given that have size 1 (others stay, as in torch).

        >>> Tensor.zeros(1, 3, 1).squeeze().shape, Tensor.zeros(1, 3, 1).squeeze((0, 1)).shape
        ((3,), (3, 1))
        """
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dims = normalize_axes(dim, self.ndim)
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in dims or s != 1))

    def unsqueeze(self, dim: int) -> Tensor:
        """A new size-1 dim at position dim (negative counts from the end of the result).

        >>> Tensor([1, 2]).unsqueeze(-1).tolist()
        [[1], [2]]
        """
        d = normalize_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Split one dim into several; one of `sizes` may be -1.

        >>> Tensor.zeros(2, 6).unflatten(1, (3, -1)).shape
        (2, 3, 2)
        """
        d = normalize_axis(dim, self.ndim)
        sizes = shape_arg(sizes, allow_neg=True)
        known = prod(s for s in sizes if s != -1)
        if -1 in sizes:
            fits = sizes.count(-1) == 1 and known > 0 and self.shape[d] % known == 0
        else:
            fits = known == self.shape[d]
        if not sizes or not fits:
            raise ValueError(f"unflatten: sizes {sizes} do not make dim {dim} of size {self.shape[d]}")
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1 :])

    def repeat(self, *repeats: int | Sequence[int]) -> Tensor:
        """Tile the tensor `repeats[i]` times along dim i, as torch.Tensor.repeat (extra leading repeats add dims).

        >>> Tensor([1, 2]).repeat(2, 2).tolist()
        [[1, 2, 1, 2], [1, 2, 1, 2]]
        """
        reps = shape_arg(repeats)
        if len(reps) < self.ndim:
            raise ValueError(f"repeat needs a count for each of the {self.ndim} dims, got {reps}")
        shape = (1,) * (len(reps) - self.ndim) + self.shape
        split = [n for s in shape for n in (1, s)]
        tiled = [n for r, s in zip(reps, shape) for n in (r, s)]
        return self.reshape(split).expand(tiled).reshape([r * s for r, s in zip(reps, shape)])

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Repeat each element `repeats` times along dim (over the flattened tensor when dim is None).

        >>> Tensor([1, 2]).repeat_interleave(2).tolist()
        [1, 1, 2, 2]
        """
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
            raise TypeError(f"repeat_interleave takes a non-negative int count, got {repeats!r}")
        x, d = (self.flatten(), 0) if dim is None else (self, normalize_axis(dim, self.ndim))
        if x.ndim == 0:
            x = x.reshape(1)
        wide = x.unsqueeze(d + 1)
        return wide.expand(*x.shape[: d + 1], repeats, *x.shape[d + 1 :]).flatten(d, d + 1)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Shift elements along dims, wrapping around (over the flattened tensor when dims is None).

        >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
        [4, 1, 2, 3]
        """
        if dims is None:
            if not isinstance(shifts, int):
                raise TypeError(f"roll without dims takes one int shift, got {shifts!r}")
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        if len(shift_list) != len(dim_list):
            raise ValueError(f"roll needs one shift per dim, got shifts {shifts} and dims {dims}")
        x = self
        for s, dim in zip(shift_list, dim_list):
            d = normalize_axis(dim, self.ndim)
            n = x.shape[d]
            if n and s % n:
                k = s % n
                x = x._slice_dim(d, n - k, n).cat(x._slice_dim(d, 0, n - k), dim=d)
        return x

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of the (dim1, dim2) planes as a view, as torch.diagonal: those two dims go and the
        diagonal becomes the last dim; offset > 0 takes one above the main diagonal, < 0 one below.

        >>> Tensor([[1, 2, 3], [4, 5, 6]]).diagonal().tolist(), Tensor([[1, 2, 3], [4, 5, 6]]).diagonal(1).tolist()
        ([1, 5], [2, 6])
        """
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise TypeError(f"diagonal() takes an int offset, got {offset!r}")
        if self.ndim < 2:
            raise ValueError(f"diagonal() needs a tensor of at least 2 dims, got shape {self.shape}")
        d1, d2 = normalize_axis(dim1, self.ndim), normalize_axis(dim2, self.ndim)
        if d1 == d2:
            raise ValueError(f"diagonal() needs two different dims, got dim1={dim1} and dim2={dim2}")
        rest = [d for d in range(self.ndim) if d not in (d1, d2)]
        x = self.permute(*rest, d1, d2)  # (..., rows, cols)
        rows, cols = x.shape[-2:]
        row0, col0 = max(-offset, 0), max(offset, 0)
        k = max(min(rows - row0, cols - col0), 0)
        lead = x.shape[:-2]
        square = x.shrink(
            [None] * len(lead) + [(min(row0, rows), min(row0, rows) + k), (min(col0, cols), min(col0, cols) + k)]
        )
        # element (i, i) of a k x k block sits at i * (k + 1) of its k * k run: pad the run to k * (k + 1) and
        # take column 0 of it as a (k, k + 1) matrix
        run = square.reshape(*lead, k * k).pad([(0, 0)] * len(lead) + [(0, k)])
        return run.reshape(*lead, k, k + 1).shrink([None] * len(lead) + [None, (0, 1)]).reshape(*lead, k)

    def diag(self, diagonal: int = 0) -> Tensor:
        """As torch.diag: a 1-d tensor becomes a square matrix with it on a diagonal (diagonal > 0 above the
        main one, < 0 below); a 2-d tensor gives its diagonal.

        >>> Tensor([1, 2]).diag().tolist(), Tensor([[1, 2], [3, 4]]).diag().tolist()
        ([[1, 0], [0, 2]], [1, 4])
        """
        if not isinstance(diagonal, int) or isinstance(diagonal, bool):
            raise TypeError(f"diag() takes an int diagonal, got {diagonal!r}")
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ValueError(f"diag() takes a 1-d or 2-d tensor, got shape {self.shape}")
        n = self.shape[0]
        # each value followed by n zeros, as one run: the first n * n of it, as (n, n), has them on the diagonal
        square = self.reshape(n, 1).pad([(0, 0), (0, n)]).reshape(n * (n + 1)).shrink([(0, n * n)]).reshape(n, n)
        k = abs(diagonal)
        return square.pad([(0, k), (k, 0)] if diagonal >= 0 else [(k, 0), (0, k)])

    def unfold(self, dimension: int, size: int, step: int) -> Tensor:
        """Every window of `size` elements along a dim, `step` apart, as torch.Tensor.unfold: the dim becomes the
        number of windows and a new last dim holds each window.

        >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
        [[1, 2], [3, 4]]
        """
        for name, v in (("size", size), ("step", step)):
            if not isinstance(v, int) or isinstance(v, bool) or v < (name == "step"):
                raise ValueError(f"unfold() needs an int {name} >= {int(name == 'step')}, got {v!r}")
        x = self.reshape(1) if self.ndim == 0 else self
        d = normalize_axis(dimension, x.ndim)
        length = x.shape[d]
        if size > length:
            raise ValueError(f"unfold(): size {size} is more than dim {dimension}'s {length} elements")
        windows = (length - size) // step + 1
        span = step * (windows - 1) + 1
        # window element j of every window: elements j, j + step ... along the dim
        parts = [x._slice_dim(d, j, j + span)._take_every(d, step).unsqueeze(-1) for j in range(size)]
        if not parts:
            return x._slice_dim(d, 0, 0).unsqueeze(-1).expand(*x.shape[:d], windows, *x.shape[d + 1 :], 0)
        return parts[0].cat(*parts[1:], dim=-1)  # type: ignore[attr-defined]

    def meshgrid(self, *others: Tensor, indexing: str = "ij") -> list[Tensor]:
        """Coordinate grids from 1-d tensors, as torch.meshgrid: `Tensor.meshgrid(x, y)` or
        `Tensor.meshgrid([x, y])`; indexing="ij" (the default) or "xy" (the first two dims swapped).

        >>> [g.tolist() for g in Tensor.meshgrid(Tensor([1, 2]), Tensor([3, 4, 5]))]
        [[[1, 1, 1], [2, 2, 2]], [[3, 4, 5], [3, 4, 5]]]
        """
        tensors = tensors_given(self, others, "meshgrid", TensorBase)
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid() takes indexing 'ij' or 'xy', got {indexing!r}")
        for i, t in enumerate(tensors):
            if t.ndim > 1:
                raise ValueError(f"meshgrid() takes 0-d or 1-d tensors; tensor {i} has shape {t.shape}")
        sizes = [t.numel() for t in tensors]
        dims = list(range(len(tensors)))
        if indexing == "xy" and len(tensors) > 1:
            dims[0], dims[1] = 1, 0
            sizes[0], sizes[1] = sizes[1], sizes[0]
        return [
            t.reshape(*(t.numel() if i == d else 1 for i in range(len(sizes)))).expand(*sizes)
            for t, d in zip(tensors, dims)
        ]

    def _basic_index(self, idx: list[Any]) -> Tensor:
        """Basic indexing as views: ints, slices (with steps), None and Ellipsis (indexing.py parses the index)."""
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
            if isinstance(i, UOp) or type(size) is not int or (isinstance(i, slice) and _symbolic_slice(i)):
                lo, hi, n = _symbolic_index(i, size, dim)
                out_shape.extend([n] if isinstance(i, slice) else [])
                bounds.append((lo, hi))
                flips.append(False)
                steps.append(1)
                dim += 1
                continue
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
                *self.shape[:dim], rows, *self.shape[dim + 1 :]
            )

        if size == n * step:
            return columns(self, n)
        # the last element has no full row after it: take it on its own and join the two with padding
        head = columns(self.shrink(along((0, (n - 1) * step))), n - 1)
        last = self.shrink(along(((n - 1) * step, (n - 1) * step + 1)))
        return head.cat(last, dim=dim)


def _bound(x: Any) -> sint:
    """A shrink's bound: an int or a size expression of Variables."""
    return x if type(x) is int else check_size(x, "a shrink bound") if isinstance(x, UOp) else int(x)


def _fits(lo: sint, hi: sint, size: sint) -> bool:
    """0 <= lo <= hi <= size, for every value of the Variables (a bound that may fall outside does not fit)."""
    if type(lo) is int and type(hi) is int and type(size) is int:
        return 0 <= lo <= hi <= size
    return known_le(0, lo) and (lo is hi or known_le(lo, hi)) and (hi is size or known_le(hi, size))


def _symbolic_slice(i: slice) -> bool:
    return isinstance(i.start, UOp) or isinstance(i.stop, UOp) or isinstance(i.step, UOp)


def _symbolic_index(i: Any, size: sint, dim: int) -> tuple[sint, sint, sint]:
    """(lo, hi, length) of an index into a dim where the index or the dim's size is symbolic: an int or a size
    expression, or a slice of them with step 1. Negative ints count from the end; nothing is clamped (the bounds
    must lie in the dim for every value of the Variables, which shrink checks)."""
    if isinstance(i, slice):
        if i.step not in (None, 1):
            raise IndexError(f"a slice with a symbolic bound or of a symbolic dim takes step 1, got step {i.step!r}")
        lo = _from_end(0 if i.start is None else i.start, size)
        hi = size if i.stop is None else _from_end(i.stop, size)
        return lo, hi, ssub(hi, lo)
    at = _from_end(i, size)
    if type(at) is int and type(size) is int and not 0 <= at < size:
        raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
    return at, sadd(at, 1), 1


def _from_end(x: Any, size: sint) -> sint:
    x = _bound(x)
    return sadd(size, x) if type(x) is int and x < 0 else x
