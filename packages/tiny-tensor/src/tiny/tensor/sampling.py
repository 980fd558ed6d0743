"""Random sampling from given weights and random orders: multinomial and randperm (from the same counter-based
random numbers as rand(), so the same on every device)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tiny.ir.device import Device
from tiny.ir.dtypes import DType, dtypes, to_dtype
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


class SamplingOps(TensorBase):
    __slots__ = ()

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Indices drawn from each row of non-negative weights (1-d: one row), as torch.multinomial (int64).
        With replacement each draw is independent; without, a row never repeats an index (Gumbel top-k: the
        indices of the num_samples largest log(w) + Gumbel noise), and indices of weight 0 come only once the
        others are used up.

        >>> Tensor([0.0, 1.0, 0.0]).multinomial(2, replacement=True).tolist()
        [1, 1]
        """
        if self.ndim not in (1, 2):
            raise ValueError(f"multinomial() takes a 1-d or 2-d tensor of weights, got shape {self.shape}")
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"multinomial() needs an int num_samples >= 1, got {num_samples!r}")
        n = self.shape[-1]
        if n == 0:
            raise ValueError("multinomial() needs at least one category, got an empty row of weights")
        if not replacement and num_samples > n:
            raise ValueError(
                f"multinomial() without replacement draws at most the {n} categories, asked for {num_samples}"
            )
        w = self._float_input().detach().reshape(-1, n)  # type: ignore[attr-defined]
        rows = w.shape[0]
        out_dt = default_int(self.device)
        u = type(self).rand(rows, num_samples if replacement else n, device=self.device)
        if replacement:  # the first category whose cumulative share exceeds a uniform draw
            cdf = w.cumsum(1) / w.sum(1, keepdim=True)
            below = cdf.unsqueeze(1) <= u.unsqueeze(2)  # (rows, samples, n)
            picked = below.cast(dtypes.int32).sum(2).minimum(n - 1)
        else:
            gumbel = -(-(u.maximum(2.0**-30)).log()).log()
            keys = (w > 0).where(w.maximum(1e-38).log() + gumbel, -math.inf)
            picked = keys.topk(num_samples, axis=1).indices
        picked = picked.cast(out_dt)
        return picked.reshape(num_samples) if self.ndim == 1 else picked

    @classmethod
    def randperm(
        cls, n: int, dtype: DType | str | None = None, device: str | None = None, requires_grad: bool | None = None
    ) -> Tensor:
        """A random order of 0 .. n-1, as torch.randperm (int64 unless dtype says otherwise). The order is found
        on the host from n random numbers drawn on the device (sorting them there would cost n^2).

        >>> sorted(Tensor.randperm(5).tolist())
        [0, 1, 2, 3, 4]
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"randperm() needs an int n >= 0, got {n!r}")
        dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
        dt = to_dtype(dtype) if dtype is not None else default_int(dev)
        keys = cls._random_bits((n,), dev).numpy()  # type: ignore[attr-defined]
        order = np.argsort(keys, kind="stable")
        return cls(order, device=dev, dtype=dt, requires_grad=requires_grad)  # type: ignore[call-arg]
