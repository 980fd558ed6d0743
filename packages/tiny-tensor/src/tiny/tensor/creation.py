"""Creating tensors: constants, ranges, identity matrices and random numbers (the same on every device)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tiny.ir.dtypes import DType, dtypes, to_dtype
from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import prod, shape_arg

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class _Rng:
    """The counter-based generator's state: a seed and how many draws have been made."""

    seed: int = 0
    counter: int = 0


RNG = _Rng()


class CreationOps(TensorBase):
    __slots__ = ()

    @classmethod
    def full(
        cls, shape: Sequence[int] | int, fill: Scalar, dtype: DType | str | None = None, device: str | None = None
    ) -> Tensor:
        shape = shape_arg(shape)
        return cls(fill, device=device, dtype=dtype).reshape((1,) * len(shape)).expand(shape)

    @classmethod
    def zeros(cls, *shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return cls.full(shape_arg(shape), 0, dtype or dtypes.default_float, device)

    @classmethod
    def ones(cls, *shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return cls.full(shape_arg(shape), 1, dtype or dtypes.default_float, device)

    @classmethod
    def arange(
        cls,
        start: Scalar,
        stop: Scalar | None = None,
        step: Scalar = 1,
        dtype: DType | str | None = None,
        device: str | None = None,
    ) -> Tensor:
        """Evenly spaced values in [start, stop), like torch.arange."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange() step must not be zero")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        return cls(
            np.arange(n, dtype=np.float64) * step + start
            if dt.is_float
            else np.arange(start, stop, step, dtype=np.int64),
            device=device,
            dtype=dt,
        )

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        m = n if m is None else m
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, m)
        return (rows == cols).cast(dtype or dtypes.default_float)

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        RNG.seed, RNG.counter = seed, 0

    @classmethod
    def _random_bits(cls, shape: tuple[int, ...], device: str | None) -> Tensor:
        """Uniform uint32 bits from a counter-based hash: the same numbers on every device."""
        RNG.counter += 1
        key = _mix32(_mix32(RNG.seed & 0xFFFFFFFF) ^ RNG.counter)
        n = prod(shape)
        counter = cls(np.arange(n, dtype=np.uint32), device=device)
        x = counter ^ key
        for mult in (0x7FEB352D, 0x846CA68B):
            x = (x ^ (x >> 16)) * mult
        x = x ^ (x >> 16)
        return x.reshape(shape)

    @classmethod
    def rand(cls, *shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform samples in [0, 1)."""
        bits = cls._random_bits(shape_arg(shape), device)
        return ((bits >> 8).cast(dtypes.float32) * (2.0**-24)).cast(dtype or dtypes.default_float)

    @classmethod
    def randn(cls, *shape: int | Sequence[int], dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Standard normal samples (Box-Muller)."""
        shp = shape_arg(shape)
        u1, u2 = cls.rand(*shp, device=device), cls.rand(*shp, device=device)
        r = ((1 - u1).log() * -2).sqrt()
        return (r * (u2 * (2 * math.pi)).cos()).cast(dtype or dtypes.default_float)

    def full_like(self, fill: Scalar, dtype: DType | str | None = None) -> Tensor:
        return type(self).full(self.shape, fill, dtype or self.dtype, self.device)

    def zeros_like(self, dtype: DType | str | None = None) -> Tensor:
        return self.full_like(0, dtype)

    def ones_like(self, dtype: DType | str | None = None) -> Tensor:
        return self.full_like(1, dtype)


def _mix32(x: int) -> int:
    x &= 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)
