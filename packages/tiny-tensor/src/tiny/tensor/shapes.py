"""Shape arithmetic shared by the Tensor's ops: argument forms, broadcasting, axes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from tiny.ir.sint import check_size, sint, sprod
from tiny.ir.uop import UOp


def normalize_axis(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IndexError(f"axis {axis} is out of range for a tensor with {ndim} dimension(s)")
    return axis % max(ndim, 1)


def prod(xs: Iterable[sint]) -> sint:
    xs = tuple(xs)
    return math.prod(xs) if all(type(x) is int for x in xs) else sprod(xs)


def shape_arg(shape: Any, allow_neg: bool = False) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) alike."""
    if isinstance(shape, int):
        shape = (shape,)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = tuple(shape)
    for s in out:
        if type(s) is int:
            if s < 0 and not allow_neg:
                raise ValueError(f"sizes must not be negative, got {out}")
        elif isinstance(s, UOp):  # a symbolic size (a bound Variable, or an expression of them)
            shape_arg(tuple(1 if isinstance(x, UOp) else x for x in out), allow_neg)  # (the ints checked as ints)
            return tuple(check_size(x, "a size") if isinstance(x, UOp) else x for x in out)
        elif not isinstance(s, int) or isinstance(s, bool):
            raise TypeError(f"sizes must be ints, got {out}")
        elif s < 0 and not allow_neg:
            raise ValueError(f"sizes must not be negative, got {out}")
    return out


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} cannot broadcast (sizes {x} and {y} differ and neither is 1)")
        out.append(y if x == 1 else x)
    return tuple(out)


def normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """The dims named (all for None), non-negative and sorted; a dim named twice (as 1 and -1 of a 2-d tensor, say)
    is an error, as in PyTorch, not one use of it."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    dims = [normalize_axis(a, ndim) for a in axes]
    for d in dims:
        if dims.count(d) > 1:
            raise ValueError(f"dim {d} appears more than once in the dims {axes} of a tensor with {ndim} dimension(s)")
    return tuple(sorted(dims))
