"""The state every Tensor has, for the op mixins to build on: its UOp and how to make a new Tensor."""

from __future__ import annotations

import math

from tiny.ir.dtypes import DType
from tiny.ir.sint import sint, sprod
from tiny.ir.uop import UOp


class TensorBase:
    __slots__ = ("uop", "_requires_grad", "grad", "__weakref__")
    uop: UOp
    _requires_grad: bool | None
    grad: TensorBase | None

    def _new(self, uop: UOp):  # noqa: ANN202  (returns the concrete Tensor class)
        return type(self)(uop)

    def _operand(self, uop: UOp):  # noqa: ANN202
        """A tensor of a node that an op makes for its own use and never hands out (a scalar operand)."""
        return self._new(uop)

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

    def numel(self) -> sint:
        shape = self.shape
        return math.prod(shape) if all(type(s) is int for s in shape) else sprod(shape)
