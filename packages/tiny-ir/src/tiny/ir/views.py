"""Views: how a shape indexes flat memory (strides, offset, a validity mask). Movement ops are View -> View."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tiny.ir.dtypes import DType, dtypes
from tiny.ir.sint import divides, highest, known_le, lowest, maybe_lt, sadd, sint, smax, smin, smul, sprod, ssub
from tiny.ir.uop import UOp

Mask = tuple[tuple[sint, sint], ...]
# (e, d, k, lo, hi): valid where lo <= i_e + k * i_d < hi. A window merged into one view (tiny.codegen.opt) whose
# input is padded along dim e: output position i_e and kernel offset i_d read input row i_e + k * i_d
Band = tuple[int, int, int, int, int]


def strides_for_shape(shape: Sequence[sint]) -> tuple[sint, ...]:
    """Row-major strides; size-1 dims get stride 0 so that views compare equal however they were made."""
    out: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        out.append(0 if s == 1 else acc)
        acc = acc * s if type(s) is int and type(acc) is int else smul(acc, s)
    return tuple(reversed(out))


def prod(xs: Sequence[sint]) -> sint:
    return math.prod(xs) if all(type(x) is int for x in xs) else sprod(xs)


def _sym(xs: Sequence[sint]) -> bool:
    return any(type(x) is not int for x in xs)


@dataclass(frozen=True)
class View:
    """Element (i0, i1, ...) of `shape` lives at offset + sum(i_k * strides_k) of the buffer, and is
    valid (not padding) where mask_lo_k <= i_k < mask_hi_k for every k, and inside each band. Padding reads as 0.
    Only the code generator makes banded views, after every movement: the movement ops refuse them."""

    shape: tuple[sint, ...]
    strides: tuple[sint, ...]
    offset: sint = 0
    mask: Mask | None = None
    bands: tuple[Band, ...] = ()

    @staticmethod
    def create(
        shape: Sequence[sint], strides: Sequence[sint] | None = None, offset: sint = 0, mask: Mask | None = None
    ) -> View:
        shape = tuple(s if type(s) is int or isinstance(s, UOp) else int(s) for s in shape)
        strides = (
            strides_for_shape(shape) if strides is None else tuple(0 if s == 1 else st for s, st in zip(shape, strides))
        )
        if mask is not None:
            if any(known_le(hi, lo) for lo, hi in mask):  # nothing is valid: one canonical empty view
                return View(shape, (0,) * len(shape), 0, tuple((0, 0) for _ in shape))
            if all(lo == 0 and hi == s for (lo, hi), s in zip(mask, shape)):
                mask = None
        return View(shape, strides, offset, mask)

    @property
    def size(self) -> sint:
        return prod(self.shape)

    @property
    def contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and self.strides == strides_for_shape(self.shape)

    @property
    def empty_mask(self) -> bool:
        """True when no element is valid (all padding)."""
        return self.mask is not None and any(known_le(hi, lo) for lo, hi in self.mask)

    def span(self) -> tuple[int, int]:
        """The lowest and highest buffer offset a valid element reads (over every value of its variables)."""
        if self.size == 0 or self.empty_mask:
            return (0, -1)
        ranges = self.mask or tuple((0, s) for s in self.shape)
        if _sym(self.shape) or _sym(self.strides) or type(self.offset) is not int or _sym(sum(ranges, ())):
            lo, hi = lowest(self.offset), highest(self.offset)
            for (a, b), st in zip(ranges, self.strides):
                ends = [i * k for i in (lowest(a), highest(b) - 1) for k in (lowest(st), highest(st))]
                lo, hi = lo + min(ends), hi + max(ends)
            return (lo, hi)
        lo = hi = self.offset
        for (a, b), st in zip(ranges, self.strides):
            ends = (a * st, (b - 1) * st)
            lo, hi = lo + min(ends), hi + max(ends)
        return (lo, hi)

    # ---- the six movement ops

    def reshape(self, new_shape: Sequence[sint]) -> View | None:
        """The same elements in a new shape, or None when one View cannot say it (the caller realizes)."""
        new_shape = tuple(new_shape)
        if new_shape == self.shape:
            return self
        if self.bands:
            return self._merge_banded(new_shape)
        if _sym(new_shape) or _sym(self.shape):
            return self._reshape_symbolic(new_shape)
        if prod(new_shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} ({self.size} elements) to {new_shape}")
        if self.size == 0 or self.contiguous:
            return View.create(new_shape, offset=self.offset if self.size else 0)
        if self.empty_mask:
            return View.create(new_shape, mask=tuple((0, 0) for _ in new_shape))
        old = [
            (s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask or [None] * len(self.shape)) if s != 1
        ]
        new = [(i, s) for i, s in enumerate(new_shape) if s != 1]
        strides = [0] * len(new_shape)
        mask = [(0, s) for s in new_shape]
        oi = ni = 0
        while oi < len(old):
            # the smallest run of old dims and of new dims holding the same number of elements
            og, ng = [old[oi]], [new[ni]]
            oi, ni = oi + 1, ni + 1
            while prod([g[0] for g in og]) != prod([g[1] for g in ng]):
                if prod([g[0] for g in og]) < prod([g[1] for g in ng]):
                    og.append(old[oi])
                    oi += 1
                else:
                    ng.append(new[ni])
                    ni += 1
            if len(og) == 1 and len(ng) == 1:
                strides[ng[0][0]] = og[0][1]
                if og[0][2] is not None:
                    mask[ng[0][0]] = og[0][2]
                continue
            if any(m is not None and m != (0, s) for s, _, m in og):
                return None  # splitting or merging a padded dim is not a single view
            if any(og[k][1] != og[k + 1][1] * og[k + 1][0] for k in range(len(og) - 1)):
                return None  # these dims are not laid out one after the other
            acc = og[-1][1]
            for idx, s in reversed(ng):
                strides[idx] = acc
                acc *= s
        return View.create(new_shape, strides, self.offset, tuple(mask) if self.mask is not None else None)

    def _reshape_symbolic(self, new_shape: tuple[sint, ...]) -> View | None:
        """reshape where a size is symbolic: dims of size 1 come and go, and runs of dims that hold the same product
        (4 x n as 4n, 4n as 4 x n) merge or split where they lie one after the other in memory, unpadded."""
        if prod(new_shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} ({self.size} elements) to {new_shape}")
        if self.contiguous:
            return View.create(new_shape, offset=self.offset)
        old = [
            (s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask or [None] * len(self.shape)) if s != 1
        ]
        new = [(i, s) for i, s in enumerate(new_shape) if s != 1]
        strides: list[sint] = [0] * len(new_shape)
        mask: list[tuple[sint, sint]] = [(0, s) for s in new_shape]
        oi = ni = 0
        while oi < len(old) and ni < len(new):
            og, ng = [old[oi]], [new[ni]]
            oi, ni = oi + 1, ni + 1
            while prod([g[0] for g in og]) != prod([g[1] for g in ng]):
                a, b = prod([g[0] for g in og]), prod([g[1] for g in ng])
                if divides(a, b) and oi < len(old):
                    og.append(old[oi])
                    oi += 1
                elif divides(b, a) and ni < len(new):
                    ng.append(new[ni])
                    ni += 1
                else:
                    return None  # (products that neither divides: not sure they ever meet)
            if len(og) == 1 and len(ng) == 1:
                strides[ng[0][0]] = og[0][1]
                if og[0][2] is not None:
                    mask[ng[0][0]] = og[0][2]
                continue
            if any(m is not None and m != (0, s) for s, _, m in og):
                return None
            if any(og[k][1] != smul(og[k + 1][1], og[k + 1][0]) for k in range(len(og) - 1)):
                return None
            acc = og[-1][1]
            for idx, s in reversed(ng):
                strides[idx] = acc
                acc = smul(acc, s)
        if oi != len(old) or ni != len(new):
            return None
        return View.create(new_shape, strides, self.offset, tuple(mask) if self.mask is not None else None)

    def permute(self, order: Sequence[int]) -> View:
        self._unbanded()
        mask = tuple(self.mask[i] for i in order) if self.mask is not None else None
        return View.create([self.shape[i] for i in order], [self.strides[i] for i in order], self.offset, mask)

    def expand(self, new_shape: Sequence[int]) -> View:
        self._unbanded()
        mask = list(self.mask) if self.mask is not None else None
        strides = list(self.strides)
        for i, (s, n) in enumerate(zip(self.shape, new_shape)):
            if s == n:
                continue
            if s != 1:
                raise ValueError(f"cannot expand {self.shape} to {tuple(new_shape)}")
            strides[i] = 0
            if mask is not None:
                mask[i] = (0, n) if mask[i] == (0, 1) else (0, 0)
        return View.create(new_shape, strides, self.offset, tuple(mask) if mask is not None else None)

    def pad(self, padding: Sequence[tuple[int, int]]) -> View:
        self._unbanded()
        if all(b == 0 and a == 0 for b, a in padding):
            return self
        ranges = self.mask or tuple((0, s) for s in self.shape)
        if _sym(self.shape) or _sym(self.strides) or _sym(sum(padding, ())) or type(self.offset) is not int:
            shape = [sadd(sadd(s, b), a) for s, (b, a) in zip(self.shape, padding)]
            offset = self.offset
            for (b, _), st in zip(padding, self.strides):
                offset = ssub(offset, smul(b, st))
            mask = tuple((sadd(lo, b), sadd(hi, b)) for (lo, hi), (b, _) in zip(ranges, padding))
            return View.create(shape, self.strides, offset, mask)
        shape = [s + b + a for s, (b, a) in zip(self.shape, padding)]
        offset = self.offset - sum(b * st for (b, _), st in zip(padding, self.strides))
        mask = tuple((lo + b, hi + b) for (lo, hi), (b, _) in zip(ranges, padding))
        return View.create(shape, self.strides, offset, mask)

    def shrink(self, bounds: Sequence[tuple[int, int]]) -> View:
        self._unbanded()
        if _sym(self.shape) or _sym(self.strides) or _sym(sum(bounds, ())) or type(self.offset) is not int:
            return self._shrink_symbolic(bounds)
        offset = self.offset + sum(lo * st for (lo, _), st in zip(bounds, self.strides))
        shape = [hi - lo for lo, hi in bounds]
        mask = None
        if self.mask is not None:
            mask = tuple(
                (min(max(0, mlo - lo), hi - lo), max(min(hi - lo, mhi - lo), 0))
                for (mlo, mhi), (lo, hi) in zip(self.mask, bounds)
            )
        return View.create(shape, self.strides, offset, mask)

    def _shrink_symbolic(self, bounds: Sequence[tuple[sint, sint]]) -> View:
        offset = self.offset
        for (lo, _), st in zip(bounds, self.strides):
            offset = sadd(offset, smul(lo, st))
        shape = [ssub(hi, lo) for lo, hi in bounds]
        mask = None
        if self.mask is not None:
            mask = tuple(
                (smin(smax(0, ssub(mlo, lo)), ssub(hi, lo)), smax(smin(ssub(hi, lo), ssub(mhi, lo)), 0))
                for (mlo, mhi), (lo, hi) in zip(self.mask, bounds)
            )
        return View.create(shape, self.strides, offset, mask)

    def flip(self, axes: Sequence[int]) -> View:
        self._unbanded()
        strides, mask = list(self.strides), list(self.mask) if self.mask is not None else None
        offset = self.offset
        for i in axes:
            s = self.shape[i]
            if type(s) is int and type(strides[i]) is int and type(offset) is int:
                offset += (s - 1) * strides[i]
                strides[i] = -strides[i]
            else:
                offset = sadd(offset, smul(ssub(s, 1), strides[i]))
                strides[i] = smul(strides[i], -1)
            if mask is not None:
                mask[i] = (ssub(s, mask[i][1]), ssub(s, mask[i][0]))
        return View.create(self.shape, strides, offset, tuple(mask) if mask is not None else None)

    def _unbanded(self) -> None:
        if self.bands:
            raise ValueError(f"a banded view (a merged window, {self.bands}) is not moved")

    def _merge_banded(self, new_shape: tuple[int, ...]) -> View | None:
        """A reshape that merges two neighbouring dims, neither of them in a band (None for any other)."""
        old = self.shape
        d = next((i for i in range(len(new_shape)) if new_shape[i] != old[i]), len(new_shape))
        banded = {x for e, dd, *_ in self.bands for x in (e, dd)}
        if len(new_shape) != len(old) - 1 or d in banded or d + 1 in banded:
            return None
        if new_shape != old[:d] + (old[d] * old[d + 1],) + old[d + 2 :]:
            return None
        plain = View(self.shape, self.strides, self.offset, self.mask).reshape(new_shape)
        if plain is None:
            return None

        def after(x: int) -> int:  # a dim's number once d and d + 1 are one
            return x - 1 if x > d else x

        moved = tuple((after(e), after(dd), k, lo, hi) for e, dd, k, lo, hi in self.bands)
        return View(plain.shape, plain.strides, plain.offset, plain.mask, moved)

    # ---- index math

    def index_dims(self) -> frozenset[int]:
        """The dims whose index to_index reads: strided ones, masked ones and those of bands."""
        dims = {d for d, (s, st) in enumerate(zip(self.shape, self.strides)) if s != 1 and st != 0}
        dims |= {d for d, (lo, hi) in enumerate(self.mask or ()) if maybe_lt(0, lo) or _below(hi, self.shape[d])}
        for e, d, _, _, _ in self.bands:
            dims |= {e, d}
        return frozenset(dims)

    def to_index(self, idxs: Sequence[UOp]) -> tuple[UOp, UOp | None]:
        """The buffer offset of element idxs, and the condition under which it is valid (None: always)."""
        dtype = idxs[0].dtype if idxs else dtypes.int32
        if self.empty_mask:
            return UOp.const(dtype, 0), UOp.const(dtypes.bool, False)
        idx = _index_uop(self.offset, dtype)
        for i, s, st in zip(idxs, self.shape, self.strides):
            if s != 1 and st != 0:
                idx = idx + i * (st if type(st) is int else _index_uop(st, dtype))
        valid: UOp | None = None
        for i, s, (lo, hi) in zip(idxs, self.shape, self.mask or ()):
            if type(lo) is not int or type(hi) is not int or type(s) is not int:
                conds = ([_index_uop(ssub(lo, 1), dtype).lt(i)] if maybe_lt(0, lo) else []) + (
                    [i.lt(_index_uop(hi, dtype))] if _below(hi, s) else []
                )
            else:
                conds = ([UOp.const(dtype, lo - 1).lt(i)] if lo > 0 else []) + ([i.lt(hi)] if hi < s else [])
            for c in conds:
                valid = c if valid is None else valid & c
        for e, d, k, lo, hi in self.bands:
            pos = idxs[e] + idxs[d] * k if k != 1 else idxs[e] + idxs[d]
            top = self.shape[e] + k * (self.shape[d] - 1)  # (past the highest i_e + k * i_d)
            conds = ([UOp.const(dtype, lo - 1).lt(pos)] if lo > 0 else []) + ([pos.lt(hi)] if hi < top else [])
            for c in conds:
                valid = c if valid is None else valid & c
        return idx, valid


def _below(hi: sint, size: sint) -> bool:
    """Whether a mask's upper end may cut the dim short."""
    return hi is not size and maybe_lt(hi, size)


def _index_uop(x: sint, dtype: DType) -> UOp:
    """A size as index math of `dtype`."""
    if type(x) is int:
        return UOp.const(dtype, x)
    return x if x.dtype == dtype else x.cast(dtype)
