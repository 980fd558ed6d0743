"""Weights kept in a layout of their own for the products that read them.

A weight loaded from a file (tiny.nn.gguf) may be kept on the device in the layout its products read fastest rather
than as the file has it: Q8_0 and Q4_0 blocks as words of bytes with rows side by side (tiny.tensor.byte_blocks), a
float matrix in panels of rows (`Panels`). The weight itself stays the float32 graph over that form, which every
other reader (a row lookup, `.numpy()`, a gradient) computes; `register` records the form for it, and `linear` asks
`form_of` for one and calls its `product`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tiny.ir.uop import UOp

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


class Form(Protocol):
    def product(self, x: Tensor) -> Tensor:
        """x @ weight.T, x float32 (..., k)."""
        ...


_FORMS: weakref.WeakKeyDictionary[UOp, Form] = weakref.WeakKeyDictionary()


def register(weight: Tensor, form: Form) -> Tensor:
    """Record `form` as the stored form of `weight` (its float32 graph over it); returns weight."""
    _FORMS[weight.uop] = form
    return weight


def form_of(weight: Tensor) -> Form | None:
    """The form registered for this weight, or None (any other tensor, or the weight computed into memory)."""
    return _FORMS.get(weight.uop)


@dataclass(frozen=True, eq=False)
class Panels:
    """A matrix (rows, k) kept as panels of `width` rows, (rows / width, k, width): the rows of a panel side by side,
    one k after the next. A CPU product reads its B so (tiny.ir.schedule.layout.panel_width: a register tile's
    vectors of output columns, one contiguous block down all of k), and copies B into panels where enough rows of A
    share the copy; a weight kept in panels is read so by every product, a prompt's few rows and a decode step's one
    included, with no copy."""

    # (rows / width, k, width) float32: the stored panels (float32, float16, bfloat16's bits) widened. A graph, not a
    # tensor: a live tensor with work pending is looked over by every realize
    values: UOp

    def product(self, x: Tensor) -> Tensor:
        return x._over_panels(x._new(self.values))

    @staticmethod
    def weight(values: Tensor) -> Tensor:
        """The matrix (rows, k) that panels of float32 `values` hold (a view of them), registered as their form."""
        n, k, width = values.shape
        return register(values.permute(0, 2, 1).reshape(n * width, k), Panels(values.uop))

    @staticmethod
    def of(stored: np.ndarray, dtype: str, width: int, device: str | None) -> Tensor:
        """The matrix (rows, k) a file holds as `stored` (its bytes on the host, as STORED[dtype] reads them), put in
        panels of `width` rows on the host as it is read: the device holds the file's bytes once, in panels, and the
        weight is the float32 graph over them (Panels.weight)."""
        from tiny.tensor.tensor import Tensor

        rows, k = stored.shape
        panels = np.ascontiguousarray(stored.reshape(rows // width, width, k).transpose(0, 2, 1))
        return Panels.weight(STORED[dtype][1](Tensor(panels, device=device)))


def _widen_bf16(bits: Tensor) -> Tensor:
    """bfloat16 values held as their uint16 bits, as float32: the top half of each one's bits."""
    return (bits.cast("uint32") << 16).bitcast("float32")


# the float dtypes a matrix kept in panels may be stored in: the NumPy dtype its bytes are read as on the host, and
# how the device widens them to float32 (bfloat16 as its bits: NumPy has no bfloat16)
STORED: dict[str, tuple[str, Callable[[Tensor], Tensor]]] = {
    "float32": ("<f4", lambda t: t),
    "float16": ("<f2", lambda t: t.cast("float32")),
    "bfloat16": ("<u2", _widen_bf16),
}
