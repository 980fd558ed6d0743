"""Neural-network functions: linear, convolutions, pooling, normalization, attention, losses."""

from __future__ import annotations

from tiny.tensor.base import TensorBase


class FunctionalOps(TensorBase):
    __slots__ = ()
