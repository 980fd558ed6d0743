"""Activation functions; their gradients at the corners are PyTorch's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tiny.tensor.base import TensorBase
from tiny.tensor.elementwise import float32_math
from tiny.tensor.mathfns import SELU_ALPHA, SELU_SCALE, softplus1

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class ActivationOps(TensorBase):
    __slots__ = ()

    # ---- activations (their gradients at the corners are PyTorch's)

    def relu(self) -> Tensor:
        """max(x, 0); NaN stays NaN, and the gradient at 0 is 0, as in PyTorch.

        >>> Tensor([-1.0, 0.0, 2.0]).relu().tolist()
        [0.0, 0.0, 2.0]
        """
        return (self <= 0).where(0, self)

    def relu6(self) -> Tensor:
        """min(max(x, 0), 6); the gradient at 0 and at 6 is 0.

        >>> Tensor([-1.0, 3.0, 7.0]).relu6().tolist()
        [0.0, 3.0, 6.0]
        """
        return self.hardtanh(0.0, 6.0)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x clipped to [min_val, max_val]; unlike clip, the gradient at the bounds is 0.

        >>> Tensor([-2.0, 0.5, 2.0]).hardtanh().tolist()
        [-1.0, 0.5, 1.0]
        """
        if min_val > max_val:
            raise ValueError(f"hardtanh() needs min_val <= max_val, got {min_val} and {max_val}")
        return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        """x where x > 0, else negative_slope * x (also the gradient at 0).

        >>> Tensor([-2.0, 3.0]).leaky_relu(0.5).tolist()
        [-1.0, 3.0]
        """
        x = self._float_input()
        return (x > 0).where(x, x * negative_slope)

    def elu(self, alpha: float = 1.0) -> Tensor:
        """x where x > 0, else alpha * (e**x - 1).

        >>> Tensor([0.0, 2.0]).elu().tolist()
        [0.0, 2.0]
        """
        x = self._float_input()
        pos = x > 0
        return pos.where(x, alpha * pos.where(0.0, x).expm1())

    def selu(self) -> Tensor:
        """scale * elu(x, alpha) with the self-normalizing constants.

        >>> round(Tensor(1.0).selu().item(), 4)
        1.0507
        """
        return SELU_SCALE * self.elu(SELU_ALPHA)

    def celu(self, alpha: float = 1.0) -> Tensor:
        """x where x > 0, else alpha * (e**(x/alpha) - 1).

        >>> Tensor([0.0, 2.0]).celu(2.0).tolist()
        [0.0, 2.0]
        """
        if alpha == 0:
            raise ValueError("celu() needs a nonzero alpha, got 0")
        x = self._float_input()
        pos = x > 0
        return pos.where(x, alpha * (pos.where(0.0, x) / alpha).expm1())

    @float32_math
    def sigmoid(self) -> Tensor:
        """1 / (1 + e**-x), without overflow for large |x|.

        >>> Tensor([0.0]).sigmoid().tolist()
        [0.5]
        """
        neg, a = self._sign_split()
        s = (-a).exp()
        return neg.where(s, 1.0) / (1 + s)

    def hardsigmoid(self) -> Tensor:
        """0 below -3, 1 above 3, x/6 + 1/2 between (gradient 0 at +-3).

        >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
        [0.0, 0.5, 1.0]
        """
        x = self._float_input()
        return (x <= -3).where(0.0, (x >= 3).where(1.0, x / 6 + 0.5))

    @float32_math
    def logsigmoid(self) -> Tensor:
        """log(sigmoid(x)), without overflow.

        >>> round(Tensor(0.0).logsigmoid().item(), 4)
        -0.6931
        """
        return -softplus1(-self)

    @float32_math
    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + e**(beta*x)) / beta, and x itself where beta*x > threshold.

        >>> round(Tensor(0.0).softplus().item(), 4)
        0.6931
        """
        bx = self * beta
        return (bx > threshold).where(self, softplus1(bx) / beta)

    def softsign(self) -> Tensor:
        """x / (1 + |x|).

        >>> Tensor([-3.0, 1.0]).softsign().tolist()
        [-0.75, 0.5]
        """
        x = self._float_input()
        return x / (1 + x.abs())

    @float32_math
    def gelu(self, approximate: str = "none") -> Tensor:
        """x * Phi(x) with Phi the standard normal CDF (exact, via erf); approximate="tanh" uses tanh.

        >>> Tensor([0.0]).gelu().tolist()
        [0.0]
        """
        if approximate == "tanh":  # 0.5 * (1 + tanh(y)) = sigmoid(2y)
            return self * (2 * math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).sigmoid()
        if approximate != "none":
            raise ValueError(f"gelu() takes approximate='none' or 'tanh', got {approximate!r}")
        return self * (0.5 * (self * -math.sqrt(0.5)).erfc())

    @float32_math
    def quick_gelu(self) -> Tensor:
        """x * sigmoid(1.702 x), a cheaper gelu.

        >>> Tensor([0.0]).quick_gelu().tolist()
        [0.0]
        """
        return self * (1.702 * self).sigmoid()

    @float32_math
    def silu(self) -> Tensor:
        """x * sigmoid(x), also called swish.

        >>> Tensor([0.0]).silu().tolist()
        [0.0]
        """
        return self * self.sigmoid()

    swish = silu

    @float32_math
    def mish(self) -> Tensor:
        """x * tanh(softplus(x)).

        >>> round(Tensor(1.0).mish().item(), 4)
        0.8651
        """
        return self * softplus1(self).tanh()

    def hardswish(self) -> Tensor:
        """x * relu6(x + 3) / 6 (gradient 0 at -3 and 1 at 3, NaN at -inf, as in PyTorch).

        >>> Tensor([-4.0, 0.0, 4.0]).hardswish().tolist()
        [-0.0, 0.0, 4.0]
        """
        x = self._float_input()
        return (x <= -3).where(x * 0, (x < 3).where(x * (x + 3) / 6, x))
