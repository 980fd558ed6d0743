"""Conversions a PyTorch user reaches for: dtype shortcuts (half(), long() ...), clone(), size(), .data, and
NumPy's __array__ protocol (np.asarray(t))."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiny.ir.dtypes import DType, dtypes
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import normalize_axis

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


class ConversionOps(TensorBase):
    __slots__ = ()

    def _to(self, dtype: DType) -> Tensor:
        return self.cast(dtype)  # type: ignore[attr-defined]

    def float(self) -> Tensor:
        """Cast to float32.

        >>> Tensor([1, 2]).float().tolist()
        [1.0, 2.0]
        """
        return self._to(dtypes.float32)

    def half(self) -> Tensor:
        """Cast to float16.

        >>> Tensor([1.0, 2.5]).half().dtype.name
        'float16'
        """
        return self._to(dtypes.float16)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16.

        >>> Tensor([1.0, 2.5]).bfloat16().tolist()
        [1.0, 2.5]
        """
        return self._to(dtypes.bfloat16)

    def double(self) -> Tensor:
        """Cast to float64.

        >>> Tensor([1, 2]).double().tolist()
        [1.0, 2.0]
        """
        return self._to(dtypes.float64)

    def int(self) -> Tensor:
        """Cast to int32 (floats round toward zero).

        >>> Tensor([1.5, -2.5]).int().tolist()
        [1, -2]
        """
        return self._to(dtypes.int32)

    def long(self) -> Tensor:
        """Cast to int64 (floats round toward zero).

        >>> Tensor([1.5, -2.5]).long().tolist()
        [1, -2]
        """
        return self._to(dtypes.int64)

    def short(self) -> Tensor:
        """Cast to int16 (floats round toward zero).

        >>> Tensor([300.7, -2.5]).short().tolist()
        [300, -2]
        """
        return self._to(dtypes.int16)

    def bool(self) -> Tensor:
        """Cast to bool: nonzero values are True.

        >>> Tensor([0.0, 0.5, -1.0]).bool().tolist()
        [False, True, True]
        """
        return self._to(dtypes.bool)

    def clone(self) -> Tensor:
        """A copy in memory of its own: writing into it leaves this tensor alone. Gradients flow through it.

        >>> a = Tensor([1.0, 2.0]).realize(); b = a.clone(); b += 1; a.tolist(), b.tolist()
        ([1.0, 2.0], [2.0, 3.0])
        """
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def size(self, dim: int | None = None) -> Any:
        """The shape as a tuple, or the size of one dim, as torch.Tensor.size.

        >>> Tensor.zeros(2, 3).size(), Tensor.zeros(2, 3).size(-1)
        ((2, 3), 3)
        """
        if dim is None:
            return self.shape
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"size() takes an int dim or nothing, got {dim!r}")
        if self.ndim == 0:
            raise IndexError(f"size({dim}) of a 0-d tensor: it has no dims")
        return self.shape[normalize_axis(dim, self.ndim)]

    @property
    def data(self) -> Tensor:
        """The same values without the gradient path (as .detach()): what PyTorch's .data gives.

        >>> w = Tensor([1.0], requires_grad=True); w.data.requires_grad is None
        True
        """
        return self.detach()  # type: ignore[attr-defined]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """np.asarray(t) and np.array(t): the values as a NumPy array (a copy; bfloat16 comes back as float32).

        >>> import numpy as np; np.asarray(Tensor([[1, 2]])).tolist()
        [[1, 2]]
        """
        if copy is False:
            raise ValueError("np.asarray(t, copy=False): a tensor's values live on its device and are always copied")
        out = self.numpy()  # type: ignore[attr-defined]
        return out if dtype is None else out.astype(dtype, copy=False)
