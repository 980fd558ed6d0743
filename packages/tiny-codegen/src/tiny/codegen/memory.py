"""Memory through views: the "index memory" pass makes a kernel AST's READs, WRITEs, masked constants and aranges into
loads, stores and gated values, indexed by a variable for each dim of the kernel's shape.

A View says where each point of the kernel's shape lies in its buffer (an offset, strides, a mask of the points that
hold data, bands): at the index (d0, d1 ...) a READ reads the buffer's element at the View's offset expression, where
its mask holds, else 0. That is a rule of one node: a READ becomes a LOAD of an INDEX whose offset and gate are
written in the dims' variables (DEFINE_VARs named dim0, dim1 ...), with 0 as the alternative where there is a gate; a
WRITE a STORE of its value there; a CONST with a view its value where the mask holds, else 0; an ARANGE the offset
itself (the index in its range), where the mask holds, else 0. Dims the plan pads
(tiny.codegen.opt.Kernel.padded) gate memory at their real size too. The lowering walker (tiny.codegen.lower) then
puts, for each lane, the loop counters and lane constants that make each dim in place of its variable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tiny.ir.dtypes import DType, dtypes
from tiny.ir.pattern import PatternMatcher, UPat
from tiny.ir.sint import highest, sint
from tiny.ir.uop import Ops, UOp


def many(size: sint) -> bool:
    """Whether a size is more than one element (a symbolic one may be)."""
    return type(size) is not int or size > 1


@dataclass(frozen=True)
class Dims:
    """The pass's context: the kernel's full shape, a variable for the index along each of its dims (of the kernel's
    index dtype), and the dims the plan pads (dim -> its size after padding)."""

    shape: tuple[sint, ...]
    index: tuple[UOp, ...]
    padded: dict[int, int]
    dtype: DType

    @staticmethod
    def of(shape: tuple[sint, ...], padded: dict[int, int], dtype: DType) -> Dims:
        names = [f"dim{d}" for d in range(len(shape))]
        index = tuple(UOp(Ops.DEFINE_VAR, dtype, (), (n, 0, max(highest(s) - 1, 0))) for n, s in zip(names, shape))
        return Dims(shape, index, padded, dtype)

    def pad_valid(self, shape: tuple[sint, ...], idxs: tuple[UOp, ...], dims: Iterable[int]) -> UOp | None:
        """Where the padded dims among `dims` are inside their real size (None: no padding to mask)."""
        valid = None
        for d in dims:
            if d in self.padded and many(shape[d]):
                c = idxs[d].lt(self.shape[d])
                valid = c if valid is None else valid & c
        return valid


def _address(ctx: Dims, memory: UOp) -> UOp:
    """The INDEX a READ or WRITE reads or writes, gated where its view or a padded dim says."""
    buf, view = memory.buffer, memory.view
    offset, valid = view.to_index(ctx.index)
    pad = ctx.pad_valid(view.shape, ctx.index, range(len(view.shape)))
    if pad is not None:
        valid = pad if valid is None else valid & pad
    return UOp(Ops.INDEX, buf.dtype, (buf, offset) + ((valid,) if valid is not None else ()))


def _load(ctx: Dims, read: UOp) -> UOp:
    addr = _address(ctx, read)
    return UOp(Ops.LOAD, read.dtype, (addr,) if addr.gate is None else (addr, UOp.const(read.dtype, 0)))


def _masked(ctx: Dims, c: UOp) -> UOp:
    """A constant's value (a symbolic one's is its expression: the Variables are kernel arguments) where its view's
    mask holds, else 0."""
    value = UOp.const(c.dtype, c.arg) if not isinstance(c.arg, UOp) else c.arg.cast(c.dtype)
    _, valid = c.view.to_index(ctx.index)
    return value if valid is None else valid.where(value, UOp.const(c.dtype, 0))


def _counted(ctx: Dims, a: UOp) -> UOp:
    """An arange's value: where its view reaches in the range 0 .. n-1 (the offset into it), where the view's mask
    holds, else 0."""
    offset, valid = a.view.to_index(ctx.index)
    value = offset.cast(a.dtype) if offset.dtype != a.dtype else offset
    return value if valid is None else valid.where(value, UOp.const(a.dtype, 0))


index_memory = PatternMatcher(
    [
        (UPat(Ops.READ, name="read"), _load),  # READ -> LOAD(INDEX(buffer, offset[, gate])[, 0])
        (UPat(Ops.WRITE, name="w"), lambda ctx, w: UOp(Ops.STORE, dtypes.void, (_address(ctx, w), w.value))),  # STORE
        (UPat(Ops.CONST, src=(UPat(Ops.VIEW),), name="c"), _masked),  # CONST(VIEW) -> gate.where(value, 0)
        (UPat(Ops.ARANGE, name="a"), _counted),  # ARANGE(VIEW) -> gate.where(offset, 0)
    ],
    name="index memory",
)
