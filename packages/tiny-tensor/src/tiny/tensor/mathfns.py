"""Math functions: exponentials and logarithms, trigonometric and hyperbolic functions, erf, rounding, signs,
bounds and predicates. Built from primitives (gradients by composition); special functions are series and fits
of the input's precision (fits.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int
from tiny.tensor.elementwise import float32_math
from tiny.tensor.fits import fits, poly
from tiny.tensor.shapes import broadcast_shape

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class MathOps(TensorBase):
    __slots__ = ()

    # ---- exponentials and logarithms

    def neg(self) -> Tensor:
        """-x.

        >>> Tensor([1.0, -2.0]).neg().tolist()
        [-1.0, 2.0]
        """
        return -self

    def exp(self) -> Tensor:
        """e**x.

        >>> Tensor([0.0]).exp().tolist()
        [1.0]
        """
        return (self._float_input() * (1 / math.log(2))).exp2()

    def exp2(self) -> Tensor:
        """2**x.

        >>> Tensor([3.0, -1.0]).exp2().tolist()
        [8.0, 0.5]
        """
        return self._float_input()._alu(Ops.EXP2)

    @float32_math
    def expm1(self) -> Tensor:
        """e**x - 1, accurate also where x is tiny.

        >>> Tensor([0.0]).expm1().tolist()
        [0.0]
        """
        small = (self > -0.35) & (self < 0.35)
        xs = small.where(self, 0.0)  # the series sees only small values (no overflow in the branch not taken)
        return small.where(xs * poly(xs, fits(self.dtype).expm1), self.exp() - 1)

    def log(self) -> Tensor:
        """The natural logarithm.

        >>> Tensor([1.0]).log().tolist()
        [0.0]
        """
        return self.log2() * math.log(2)

    def log2(self) -> Tensor:
        """The base-2 logarithm.

        >>> Tensor([8.0, 0.5]).log2().tolist()
        [3.0, -1.0]
        """
        return self._float_input()._alu(Ops.LOG2)

    def log10(self) -> Tensor:
        """The base-10 logarithm.

        >>> round(Tensor(1000.0).log10().item(), 4)
        3.0
        """
        return self.log2() * (math.log(2) / math.log(10))

    @float32_math
    def log1p(self) -> Tensor:
        """log(1 + x), accurate also where x is tiny.

        >>> Tensor([0.0]).log1p().tolist()
        [0.0]
        """
        small = (self > -0.25) & (self < 0.25)
        xs = small.where(self, 0.0)
        s = xs / (xs + 2)  # log(1 + x) = 2 atanh(x / (2 + x)), an odd series in s
        return small.where(2 * s * poly(s * s, fits(self.dtype).log1p), (self + 1).log())

    def sqrt(self) -> Tensor:
        """The square root; NaN below zero.

        >>> Tensor([4.0, 0.25]).sqrt().tolist()
        [2.0, 0.5]
        """
        return self._float_input()._alu(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        """1 / sqrt(x).

        >>> Tensor([4.0, 0.25]).rsqrt().tolist()
        [0.5, 2.0]
        """
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        """1 / x.

        >>> Tensor([4.0, -0.5]).reciprocal().tolist()
        [0.25, -2.0]
        """
        return self._float_input()._alu(Ops.RECIP)

    def square(self) -> Tensor:
        """x * x; bools square as integers, as in PyTorch.

        >>> Tensor([-3, 2]).square().tolist()
        [9, 4]
        """
        x = self.cast(default_int(self.device)) if self.dtype.is_bool else self
        return x * x

    # ---- trigonometry

    def sin(self) -> Tensor:
        """The sine (radians).

        >>> Tensor([0.0]).sin().tolist()
        [0.0]
        """
        return self._float_input()._alu(Ops.SIN)

    def cos(self) -> Tensor:
        """The cosine (radians).

        >>> round(Tensor(math.pi).cos().item(), 4)
        -1.0
        """
        return (math.pi / 2 - self._float_input()).sin()

    def tan(self) -> Tensor:
        """The tangent (radians).

        >>> round(Tensor(math.pi / 4).tan().item(), 4)
        1.0
        """
        return self.sin() / self.cos()

    @float32_math
    def atan(self) -> Tensor:
        """The arctangent, in (-pi/2, pi/2).

        >>> round(Tensor(1.0).atan().item(), 4)
        0.7854
        """
        neg, a = self._sign_split()
        big = a > 1  # atan(a) = pi/2 - atan(1/a)
        t = big.where(big.where(a, 1.0).reciprocal(), a)
        mid = t > _TAN_PI_8  # atan(t) = pi/4 + atan((t-1)/(t+1))
        u = mid.where((t - 1) / (t + 1), t)
        z = u * u
        r = u + u * z * poly(z, fits(self.dtype).atan)
        r = mid.where(r + math.pi / 4, r)
        r = big.where(math.pi / 2 - r, r)
        return neg.where(-r, r)

    @float32_math
    def asin(self) -> Tensor:
        """The arcsine, in [-pi/2, pi/2]; NaN outside [-1, 1].

        >>> round(Tensor(1.0).asin().item(), 4)
        1.5708
        """
        return (self / ((1 - self) * (1 + self)).sqrt()).atan()

    @float32_math
    def acos(self) -> Tensor:
        """The arccosine, in [0, pi]; NaN outside [-1, 1].

        >>> round(Tensor(-1.0).acos().item(), 4)
        3.1416
        """
        return 2 * ((1 - self) / (1 + self)).sqrt().atan()

    # ---- hyperbolic functions

    @float32_math
    def sinh(self) -> Tensor:
        """The hyperbolic sine.

        >>> round(Tensor(1.0).sinh().item(), 4)
        1.1752
        """
        neg, a = self._sign_split()
        big = a > 20  # there e**-a is below float32's resolution of e**a
        u = big.where(20.0, a).expm1()
        r = big.where((a - _LN2).exp(), 0.5 * (u + u / (u + 1)))
        return neg.where(-r, r)

    @float32_math
    def cosh(self) -> Tensor:
        """The hyperbolic cosine.

        >>> round(Tensor(1.0).cosh().item(), 4)
        1.5431
        """
        _, a = self._sign_split()
        big = a > 20
        u = big.where(20.0, a).expm1()  # cosh(a) = 1 + u*u / (2(u + 1)): its gradient is exact near 0 too
        return big.where((a - _LN2).exp(), 1 + 0.5 * u * u / (u + 1))

    @float32_math
    def tanh(self) -> Tensor:
        """The hyperbolic tangent.

        >>> round(Tensor(1.0).tanh().item(), 4)
        0.7616
        """
        neg, a = self._sign_split()
        one = fits(self.dtype).tanh_one  # from here on tanh is 1
        u = (2 * (a > one).where(one, a)).expm1()
        # u / (u + 2) near 0, 1 - 2 / (u + 2) near 1: each form keeps the value and its gradient exact there
        r = (a < 0.5).where(u / (u + 2), 1 - 2 / (u + 2))
        return neg.where(-r, r)

    @float32_math
    def asinh(self) -> Tensor:
        """The inverse hyperbolic sine.

        >>> round(Tensor(1.0).asinh().item(), 4)
        0.8814
        """
        neg, a = self._sign_split()
        big = a > 2.0**28  # there sqrt(a*a + 1) is a, and a*a might overflow
        s = big.where(1.0, a)
        r = big.where(big.where(a, 1.0).log() + _LN2, (s + s * s / (1 + (s * s + 1).sqrt())).log1p())
        return neg.where(-r, r)

    @float32_math
    def acosh(self) -> Tensor:
        """The inverse hyperbolic cosine; NaN below 1.

        >>> round(Tensor(2.0).acosh().item(), 4)
        1.317
        """
        big = self > 2.0**28
        t = big.where(1.0, self) - 1
        return big.where(big.where(self, 1.0).log() + _LN2, (t + (t * (t + 2)).sqrt()).log1p())

    @float32_math
    def atanh(self) -> Tensor:
        """The inverse hyperbolic tangent; +-inf at +-1, NaN outside [-1, 1].

        >>> round(Tensor(0.5).atanh().item(), 4)
        0.5493
        """
        neg, a = self._sign_split()
        r = 0.5 * (2 * a / (1 - a)).log1p()
        return neg.where(-r, r)

    # ---- the error function

    @float32_math
    def erf(self) -> Tensor:
        """The error function.

        >>> round(Tensor(1.0).erf().item(), 4)
        0.8427
        """
        small, inner, neg, tail = self._erf_parts()
        return small.where(inner, neg.where(tail - 1, 1 - tail))

    @float32_math
    def erfc(self) -> Tensor:
        """1 - erf(x), accurate also where it is tiny (large x).

        >>> round(Tensor(1.0).erfc().item(), 4)
        0.1573
        """
        small, inner, neg, tail = self._erf_parts()
        return small.where(1 - inner, neg.where(2 - tail, tail))

    def _erf_parts(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(|x| < 1, erf(x) there, x < 0, erfc(|x|) for |x| >= 1): erf is an odd polynomial near 0, erfc beyond is
        exp(-x*x) times a fit (float32) or exp of a fit minus x*x (float64)."""
        fit = fits(self.dtype)
        small = (self > -1) & (self < 1)
        xs = small.where(self, 0.0)
        neg, a = self._sign_split()
        a = a.clip(1.0, fit.erfc_zero)  # beyond erfc_zero erfc is below the smallest number: erf is 1 and erfc 0
        t = (1 + 0.5 * a).reciprocal()
        if fit.erfc_in_exponent:  # the fit's error is then relative, from x = 1 to where erfc underflows
            tail = t * (poly(t, fit.erfc) - a * a).exp()
        else:
            tail = (-(a * a)).exp() * poly(t, fit.erfc)
        return small, xs * poly(xs * xs, fit.erf), neg, tail

    # ---- rounding

    def trunc(self) -> Tensor:
        """Rounded toward zero.

        >>> Tensor([-1.5, 1.5]).trunc().tolist()
        [-1.0, 1.0]
        """
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        """Rounded down.

        >>> Tensor([-1.5, 1.5]).floor().tolist()
        [-2.0, 1.0]
        """
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t > self).where(t - 1, t)

    def ceil(self) -> Tensor:
        """Rounded up.

        >>> Tensor([-1.5, 1.5]).ceil().tolist()
        [-1.0, 2.0]
        """
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    def round(self, decimals: int = 0) -> Tensor:
        """Rounded to the nearest integer, halves to even (as torch.round); `decimals` rounds to 10**-decimals.

        >>> Tensor([0.5, 1.5, 2.5, -2.5, 2.7]).round().tolist()
        [0.0, 2.0, 2.0, -2.0, 3.0]
        """
        if not isinstance(decimals, int) or isinstance(decimals, bool):
            raise TypeError(f"round() takes an int number of decimals, got {decimals!r}")
        if not self.dtype.is_float:
            return self
        if decimals > 0:
            return (self * 10.0**decimals).round() / 10.0**decimals
        if decimals < 0:
            return (self / 10.0**-decimals).round() * 10.0**-decimals
        t = self.trunc()
        frac = (self - t).abs()  # exact; NaN for +-inf, which stay as they are
        odd = (t * 0.5).trunc() != t * 0.5
        away = (frac > 0.5) | ((frac == 0.5) & odd)
        return away.where(t + self.sign(), t)

    def frac(self) -> Tensor:
        """The fractional part, x - trunc(x), with the sign of x.

        >>> Tensor([2.5, -1.25]).frac().tolist()
        [0.5, -0.25]
        """
        return self - self.trunc()

    # ---- signs and magnitudes

    def abs(self) -> Tensor:
        """|x|; the gradient at 0 is 0, as in PyTorch.

        >>> Tensor([-2.0, 0.0, 3.0]).abs().tolist()
        [2.0, 0.0, 3.0]
        """
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        if not self.dtype.is_float:
            return self.maximum(-self)
        # 0 where x is 0 (also -0.0, and the gradient there is 0, as PyTorch's); NaN stays NaN
        return (self < 0).where(-self, (self == 0).where(0.0, self))

    def sign(self) -> Tensor:
        """-1, 0 or 1 by the sign of x (0 for NaN, as in PyTorch).

        >>> Tensor([-2.0, 0.0, 3.0]).sign().tolist()
        [-1.0, 0.0, 1.0]
        """
        if self.dtype.is_bool:
            return self
        return (
            (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
            if not self.dtype.is_unsigned
            else (self != 0).cast(self.dtype)
        )

    def _sign_split(self) -> tuple[Tensor, Tensor]:
        """(x < 0, |x|), |x| made by a where: its gradient is +-1 also at 0, so odd functions keep f'(0)."""
        neg = self < 0
        return neg, neg.where(-self, self)

    # ---- bounds and predicates

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        """The larger of the two, elementwise (NaN if either is NaN); ties share the gradient.

        >>> Tensor([1.0, 5.0]).maximum(Tensor([3.0, 2.0])).tolist()
        [3.0, 5.0]
        """
        a, b = self._broadcasted(x)
        return a._alu(Ops.MAX, b)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        """The smaller of the two, elementwise.

        >>> Tensor([1.0, 5.0]).minimum(2.0).tolist()
        [1.0, 2.0]
        """
        a, b = self._broadcasted(x)
        return a._order_flip()._alu(Ops.MAX, b._order_flip())._order_flip()

    def clip(
        self,
        min: Tensor | Scalar | None = None,  # PyTorch's names, though they hide the builtins here
        max: Tensor | Scalar | None = None,
        *,
        min_: Tensor | Scalar | None = None,
        max_: Tensor | Scalar | None = None,
    ) -> Tensor:
        """Values below `min` become `min`, above `max` become `max` (scalars or tensors; `min_`/`max_` also work).

        The gradient passes at the bounds, a NaN in x or in a bound gives NaN, and where min > max all is max,
        as in torch.clamp.

        >>> Tensor([-2.0, 0.5, 3.0]).clip(-1, 1).tolist()
        [-1.0, 0.5, 1.0]
        """
        lo, hi = _one_of(min, min_, "min"), _one_of(max, max_, "max")
        if lo is None and hi is None:
            raise ValueError("clip()/clamp() needs min, max or both; got neither")
        out = self if lo is None else self._past_bound(lo, below=True)
        return out if hi is None else out._past_bound(hi, below=False)

    def _past_bound(self, bound: Tensor | Scalar, below: bool) -> Tensor:
        """The bound where x is past it (below or above) or the bound is NaN, else x."""
        if isinstance(bound, float) and math.isnan(bound):
            bound = type(self)(bound, device=self.device)
        past = self < bound if below else self > bound
        if isinstance(bound, TensorBase):
            past = past | bound.isnan()
        return past.where(bound, self)

    clamp = clip

    def lerp(self, end: Tensor, weight: Tensor | float) -> Tensor:
        """self + weight * (end - self), as torch.lerp (exact at weight 0 and 1).

        >>> Tensor([1.0, 2.0]).lerp(Tensor([3.0, 6.0]), 0.25).tolist()
        [1.5, 3.0]
        """
        if not isinstance(end, TensorBase):
            raise TypeError(f"lerp() takes the end as a Tensor, got {type(end).__name__}")
        a, b = self._broadcasted(end)
        if not a.dtype.is_float:
            raise TypeError(f"lerp() takes float tensors, got {self.dtype.name} and {end.dtype.name}")
        if isinstance(weight, TensorBase):
            if weight.device != a.device:
                raise ValueError(f"lerp() weight is on {weight.device}, the tensors on {a.device}; use .to()")
            shape = broadcast_shape(a.shape, weight.shape)
            a, b, w = a._broadcast_to(shape), b._broadcast_to(shape), weight.cast(a.dtype)._broadcast_to(shape)
            near_start: Tensor | bool = w.abs() < 0.5
        elif isinstance(weight, (int, float)) and not isinstance(weight, bool):
            w, near_start = weight, abs(weight) < 0.5
        else:
            raise TypeError(f"lerp() takes a float or a Tensor as the weight, got {type(weight).__name__}")
        d = b - a
        if isinstance(near_start, bool):
            return a + w * d if near_start else b - d * (1 - w)
        return near_start.where(a + w * d, b - d * (1 - w))

    def isnan(self) -> Tensor:
        """True where NaN.

        >>> Tensor([1.0, math.nan]).isnan().tolist()
        [False, True]
        """
        return self != self if self.dtype.is_float else self.full_like(False, dtypes.bool)

    def isinf(self) -> Tensor:
        """True where +inf or -inf.

        >>> Tensor([1.0, -math.inf]).isinf().tolist()
        [False, True]
        """
        return (self.abs() == math.inf) if self.dtype.is_float else self.full_like(False, dtypes.bool)

    def isfinite(self) -> Tensor:
        """True where neither infinite nor NaN.

        >>> Tensor([1.0, math.inf, math.nan]).isfinite().tolist()
        [True, False, False]
        """
        if not self.dtype.is_float:
            return self.full_like(True, dtypes.bool)
        return (self < math.inf) & (self > -math.inf)


# ---------------------------------------------------------------- helpers


def softplus1(x: Tensor) -> Tensor:
    """log(1 + e**x) as max(x, 0) + log1p(e**-|x|): no overflow, and the gradient 1/2 at 0."""
    neg, a = x._sign_split()
    return neg.where(0.0, x) + (-a).exp().log1p()


def _one_of(torch_name: Tensor | Scalar | None, alias: Tensor | Scalar | None, name: str) -> Tensor | Scalar | None:
    if torch_name is not None and alias is not None:
        raise ValueError(f"clip() got both {name} and {name}_; pass one")
    return alias if torch_name is None else torch_name


_LN2 = math.log(2)
_TAN_PI_8 = math.tan(math.pi / 8)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
