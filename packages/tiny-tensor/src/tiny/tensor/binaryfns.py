"""Math functions of two tensors, broadcast and promoted as arithmetic is: copysign, logaddexp, fmod, isclose,
allclose, and division with a rounding mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiny.ir.dtypes import dtypes, least_upper_dtype
from tiny.ir.uop import Ops
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool
ROUNDING_MODES = (None, "trunc", "floor")
_SIGNED_OF_SIZE = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


class BinaryFnOps(TensorBase):
    __slots__ = ()

    def copysign(self, other: Tensor | Scalar) -> Tensor:
        """|self| with the sign of other (its sign bit: -0.0 counts as negative); ints become floats.
        The gradient flows to self (0 where self is 0), none to other, as in PyTorch.

        >>> Tensor([1.0, -2.0, 3.0]).copysign(Tensor([-1.0, 1.0, -0.0])).tolist()
        [-1.0, 2.0, -3.0]
        """
        a, b = self._broadcasted(other)  # type: ignore[attr-defined]
        a, b = a._float_input(), b._float_input()
        magnitude = a.abs()
        return _sign_bit(b).where(-magnitude, magnitude)

    def logaddexp(self, other: Tensor | Scalar) -> Tensor:
        """log(exp(self) + exp(other)), computed around the larger of the two so that it does not overflow.

        >>> round(Tensor([1000.0]).logaddexp(Tensor([1000.0])).item(), 3)
        1000.693
        """
        a, b = self._broadcasted(other)  # type: ignore[attr-defined]
        a, b = a._float_input(), b._float_input()
        top = a.maximum(b).detach()  # only shifts the exponents: its derivative cancels
        top = top.isinf().where(0.0, top)  # both -inf, or one +inf: no shift, exp() gives the right 0 or inf
        return ((a - top).exp() + (b - top).exp()).log() + top

    def fmod(self, other: Tensor | Scalar) -> Tensor:
        """The remainder of self / other with the sign of self, as C's fmod and torch.fmod (mod() takes the sign
        of the divisor instead). An integer division by zero gives 0 (PyTorch raises).

        >>> Tensor([-7, 7]).fmod(3).tolist()
        [-1, 1]
        """
        a, b = self._broadcasted(other)  # type: ignore[attr-defined]
        if a.dtype.is_bool:
            raise TypeError("fmod() of bool tensors is not supported; cast them to an int dtype first")
        return a._alu(Ops.MOD, b)

    def _rounded_div(self, other: Tensor | Scalar, reverse: bool, rounding_mode: str | None) -> Tensor:
        """div() with rounding_mode "trunc" (toward zero) or "floor" (down, as //); the result keeps the
        promoted dtype (integers stay integers) and no gradient flows through the rounding, as in PyTorch."""
        if rounding_mode not in ROUNDING_MODES:
            raise ValueError(f"div() takes rounding_mode None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = self._broadcasted(other, reverse)  # type: ignore[attr-defined]
        if a.dtype.is_bool:
            a, b = a.cast(default_int(a.device)), b.cast(default_int(a.device))
        if rounding_mode == "floor":
            q = a.floordiv(b)
        elif a.dtype.is_float:
            q = a._alu(Ops.FDIV, b).trunc()
        else:
            q = a._alu(Ops.IDIV, b)  # C's integer division rounds toward zero
        return q

    def isclose(
        self, other: Tensor | Scalar, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
    ) -> Tensor:
        """|self - other| <= atol + rtol * |other|, elementwise (bool), as torch.isclose: equal values (infinities
        too) are close, NaN is close to NaN only with equal_nan.

        >>> Tensor([1.0, 1.1, float("inf")]).isclose(Tensor([1.0 + 1e-6, 1.0, float("inf")])).tolist()
        [True, False, True]
        """
        for name, v in (("rtol", rtol), ("atol", atol)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"isclose() needs a number >= 0 as {name}, got {v!r}")
        a, b = self._broadcasted(other)  # type: ignore[attr-defined]
        same = a == b
        if not a.dtype.is_float and not (rtol or atol):
            return same
        work = least_upper_dtype(a.dtype, dtypes.default_float)
        a, b = a.cast(work), b.cast(work)
        near = a.isfinite() & b.isfinite() & ((a - b).abs() <= atol + rtol * b.abs())
        close = same | near
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(self, other: Tensor | Scalar, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        """Whether every element is close to other's, as isclose() says (a Python bool: this reads the device).

        >>> Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7]))
        True
        """
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())  # type: ignore[attr-defined]


def _sign_bit(x: TensorBase) -> Tensor:
    """Whether x's sign bit is set: x < 0, and for floats also -0.0 and NaNs with the bit set."""
    if not x.dtype.is_float:
        return x < 0  # type: ignore[operator,return-value]
    return x.bitcast(_SIGNED_OF_SIZE[x.dtype.itemsize]) < 0  # type: ignore[attr-defined]
