"""The series and polynomial fits behind the special functions (expm1, log1p, atan, erf ...), one set per float
precision: float32's for float32 and the half types (computed in float32), float64's for float64.

float64's fits are the polynomials through the kernel at the Chebyshev nodes of its interval (near-minimax),
solved in mpmath at 50 digits and rounded to float64, each of the lowest degree that is exact to about 1 ulp there
(checked in float64 against mpmath): their values and gradients are float64-accurate, not float32-accurate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiny.ir.dtypes import DType, dtypes

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor


@dataclass(frozen=True)
class Fits:
    """The coefficients (lowest power first) and cut-offs of one precision."""

    expm1: tuple[float, ...]  # expm1(x) = x * P(x) for |x| < 0.35
    log1p: tuple[float, ...]  # log1p(x) = 2s * P(s*s), s = x / (2 + x), for |x| < 0.25
    atan: tuple[float, ...]  # atan(u) = u + u**3 * P(u*u) for |u| <= tan(pi/8)
    erf: tuple[float, ...]  # erf(x) = x * P(x*x) for |x| < 1
    erfc: tuple[float, ...]  # erfc(x) for x >= 1 from P(t), t = 1 / (1 + x/2): see erfc_in_exponent
    erfc_in_exponent: bool  # erfc(x) = t * exp(P(t) - x*x), else exp(-x*x) * P(t)
    erfc_zero: float  # from here on erfc is 0 (below the smallest number) and erf is 1
    tanh_one: float  # from here on tanh is 1


def fits(dtype: DType) -> Fits:
    """The fits for a float dtype (half types compute in float32)."""
    return FLOAT64 if dtype == dtypes.float64 else FLOAT32


def poly(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    """coeffs[0] + coeffs[1]*x + coeffs[2]*x**2 + ..., by Horner's rule."""
    out = x * coeffs[-1] + coeffs[-2]
    for c in reversed(coeffs[:-2]):
        out = out * x + c
    return out


FLOAT32 = Fits(
    # Taylor series: truncated where the next term is below float32's resolution
    expm1=tuple(1 / math.factorial(k + 1) for k in range(7)),
    log1p=tuple(1 / (2 * k + 1) for k in range(5)),
    # least-squares fits on Chebyshev nodes, checked in float32 against mpmath: relative error 7e-8
    atan=(-0.333333326, 0.199996387, -0.142663592, 0.107641261, -0.0650788598),
    # relative error 2e-7 (its derivative 6e-7)
    erf=(1.12837917, -0.376126299, 0.112836257, -0.0268553992, 0.00519121803, -0.000803484398, 7.93348599e-05),
    # for 1 <= x <= 10, relative error 3e-7 (its derivative 2e-7)
    erfc=(
        -3.14414128e-06,
        0.282175428,
        0.281243954,
        0.251492607,
        0.163227652,
        0.0940542984,
        0.039934133,
        -0.19590767,
        0.084268388,
    ),
    erfc_in_exponent=False,
    erfc_zero=10.5,
    tanh_one=10.0,
)

FLOAT64 = Fits(
    # Taylor series: the first term left out is below 2**-60 of the sum
    expm1=tuple(1 / math.factorial(k + 1) for k in range(14)),
    log1p=tuple(1 / (2 * k + 1) for k in range(10)),
    # Chebyshev interpolants (module docstring) of (atan(u) - u) / u**3 in u*u on [0, tan(pi/8)**2]: degree 9
    atan=(
        -0.3333333333333325,
        0.19999999999898407,
        -0.1428571426609662,
        0.11111109636534361,
        -0.09090852557176049,
        0.0769105515839315,
        -0.06649613695291669,
        0.05736332165907643,
        -0.04483334622272886,
        0.02275052699336167,
    ),
    # of erf(x) / x in x*x on [0, 1]: degree 11
    erf=(
        1.1283791670955126,
        -0.37612638903183543,
        0.11283791670945006,
        -0.02686617064323777,
        0.0052239776071164225,
        -0.0008548325975389692,
        0.00012055294904839707,
        -1.492473690741966e-05,
        1.6447424703317362e-06,
        -1.6208483801871705e-07,
        1.3720064546777686e-08,
        -7.795898827002142e-10,
    ),
    # of log(erfc(x) * exp(x*x) / t) in t = 1 / (1 + x/2) on [0, 2/3], all of x >= 1: degree 20
    erfc=(
        -1.2655121234846454,
        0.9999999999998169,
        0.3750000000400511,
        0.0833333298674579,
        -0.08593734196760523,
        -0.1437543848414361,
        -0.0917162648199664,
        0.028539063539473285,
        0.14254517477382758,
        0.05506135688590475,
        0.32021553820586596,
        -1.5717334728696069,
        3.7970780280056755,
        -8.360383619837673,
        12.386551524489473,
        -7.957577739316067,
        -4.860717501562028,
        14.017836774337583,
        -12.04789044975256,
        5.059083530908647,
        -0.8800805785508374,
    ),
    erfc_in_exponent=True,
    erfc_zero=27.5,  # erfc(27.5) is below float64's smallest subnormal
    tanh_one=20.0,
)
