"""Movement ops: reshape, permute, expand, pad, shrink, flip, and what is built from them (indexing).
They change how kernels index memory, never the memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import normalize_axis, prod, shape_arg

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class MovementOps(TensorBase):
    __slots__ = ()

    def _movement(self, op: Ops, arg: Any) -> Tensor:
        return self._new(UOp(op, self.dtype, (self.uop,), arg))

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """Same elements, new shape; one dimension may be -1."""
        new = list(shape_arg(shape, allow_neg=True))
        if new.count(-1) > 1:
            raise ValueError(f"reshape takes at most one -1, got {tuple(new)}")
        if -1 in new:
            known = prod(s for s in new if s != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
            new[new.index(-1)] = self.numel() // known
        if any(s < 0 for s in new) or prod(new) != self.numel():
            raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new)}")
        return self if tuple(new) == self.shape else self._movement(Ops.RESHAPE, tuple(new))

    view = reshape

    def permute(self, *order: int | Sequence[int]) -> Tensor:
        perm = tuple(normalize_axis(a, self.ndim) for a in shape_arg(order, allow_neg=True))
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"permute of a {self.ndim}-d tensor needs an order of all its axes, got {order}")
        return self if perm == tuple(range(self.ndim)) else self._movement(Ops.PERMUTE, perm)

    def expand(self, *shape: int | Sequence[int]) -> Tensor:
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

    def pad(self, padding: Sequence[tuple[int, int]] | Sequence[int], value: Scalar = 0) -> Tensor:
        """Pad with `value`. padding: ((before, after), ...) per dim, or a flat torch-style tuple from the last dim."""
        if padding and isinstance(padding[0], int):
            flat = list(padding)
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ValueError(f"flat padding needs pairs for at most {self.ndim} dims, got {tuple(flat)}")
            pairs = [(0, 0)] * (self.ndim - len(flat) // 2) + [
                (flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)
            ]
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
        mask = type(self)(True, device=self.device).reshape((1,) * self.ndim).expand(self.shape)
        return mask._movement(Ops.PAD, tuple(pairs)).where(out, value)

    def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        arg = tuple((0, s) if b is None else (int(b[0]), int(b[1])) for b, s in zip(bounds, self.shape))
        if len(bounds) != self.ndim or any(not 0 <= lo <= hi <= s for (lo, hi), s in zip(arg, self.shape)):
            raise ValueError(f"shrink bounds {tuple(bounds)} do not fit shape {self.shape}")
        return self if all(b == (0, s) for b, s in zip(arg, self.shape)) else self._movement(Ops.SHRINK, arg)

    def flip(self, *axis: int | Sequence[int]) -> Tensor:
        axes = tuple(sorted({normalize_axis(a, self.ndim) for a in shape_arg(axis, allow_neg=True)}))
        return self._movement(Ops.FLIP, axes) if axes else self

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = normalize_axis(dim0, self.ndim), normalize_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = normalize_axis(start_dim, self.ndim), normalize_axis(end_dim, self.ndim)
        return self.reshape(*self.shape[:s], prod(self.shape[s : e + 1]), *self.shape[e + 1 :])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = normalize_axis(dim, self.ndim)
        return self if self.ndim == 0 or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def unsqueeze(self, dim: int) -> Tensor:
        d = normalize_axis(dim, self.ndim + 1)
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
                *self.shape[:dim], rows, *self.shape[dim + 1 :]
            )

        if size == n * step:
            return columns(self, n)
        # the last element has no full row after it: take it on its own and join the two with padding
        head = columns(self.shrink(along((0, (n - 1) * step))), n - 1)
        last = self.shrink(along(((n - 1) * step, (n - 1) * step + 1)))
        no_pad = [(0, 0)] * self.ndim
        return head.pad(no_pad[:dim] + [(0, 1)] + no_pad[dim + 1 :]) + last.pad(
            no_pad[:dim] + [(n - 1, 0)] + no_pad[dim + 1 :]
        )
