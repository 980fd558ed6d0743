"""tinygrad's names for Tensor methods where they differ from PyTorch's, so that code written for tinygrad mostly
runs. Each is a thin alias onto the PyTorch-named method that does the work, with tinygrad's argument names and
defaults; the PyTorch names stay the documented ones. (nn.BatchNorm is in tiny.nn.tinygrad_names.)

    sparse_categorical_crossentropy  -> cross_entropy, classes on the last axis, ignore_index=-1
    binary_crossentropy              -> binary_cross_entropy
    binary_crossentropy_logits       -> binary_cross_entropy_with_logits
    layernorm(axis, eps)             -> layer_norm without weight and bias, over any axes
    batchnorm(weight, bias, mean, invstd, axis)  -> batch norm with given statistics (invstd = 1/sqrt(var + eps))
    sequential(layers)               -> the layers applied in turn
    lshift / rshift / xor            -> bitwise_left_shift / bitwise_right_shift / bitwise_xor
    idiv                             -> div(rounding_mode="trunc")
    leakyrelu                        -> leaky_relu
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import normalize_axes, prod

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class TinygradNameOps(TensorBase):
    __slots__ = ()

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Tensor:
        """tinygrad's name: cross_entropy of logits self (..., C), the classes on the LAST axis, with integer class
        indices Y (...); targets equal to ignore_index are left out ('mean' divides by the others' count).

        >>> round(Tensor([[0.0, 0.0]]).sparse_categorical_crossentropy(Tensor([1])).item(), 4)
        0.6931
        """
        if self.ndim == 0:
            raise ValueError("sparse_categorical_crossentropy() needs logits (..., C), got a 0-d tensor")
        if Y.shape != self.shape[:-1]:
            raise ValueError(
                f"sparse_categorical_crossentropy(): logits {self.shape} need Y of shape {self.shape[:-1]} "
                f"(one class index per row; the classes are the last axis), got {Y.shape}"
            )
        targets = Y if not (Y.dtype.is_float or Y.dtype.is_bool) else Y.cast("int32")
        c = self.shape[-1]
        loss = self.reshape(-1, c).cross_entropy(
            targets.reshape(-1), ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
        )
        return loss.reshape(Y.shape) if reduction == "none" else loss

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """tinygrad's name for binary_cross_entropy of probabilities self and targets Y.

        >>> round(Tensor([0.5]).binary_crossentropy(Tensor([1.0])).item(), 4)
        0.6931
        """
        return self.binary_cross_entropy(Y, reduction=reduction)

    def binary_crossentropy_logits(
        self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        """tinygrad's name for binary_cross_entropy_with_logits of logits self and targets Y.

        >>> round(Tensor([0.0]).binary_crossentropy_logits(Tensor([1.0])).item(), 4)
        0.6931
        """
        return self.binary_cross_entropy_with_logits(Y, reduction=reduction, pos_weight=pos_weight)

    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """tinygrad's layer norm: (x - mean) / sqrt(var + eps) over the given axes (any of them, not only the last),
        with no weight or bias; layer_norm(normalized_shape, weight, bias) is PyTorch's.

        >>> Tensor([[1.0, 3.0]]).layernorm(eps=0.0).tolist()
        [[-1.0, 1.0]]
        """
        axes = normalize_axes(axis, self.ndim)
        centered = self - self.mean(axis=axes, keepdim=True)
        return centered * (centered.square().mean(axis=axes, keepdim=True) + eps).rsqrt()

    def batchnorm(
        self,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        axis: int | Sequence[int] = 1,
    ) -> Tensor:
        """tinygrad's batch norm with the statistics given: (x - mean) * invstd * weight + bias, where mean, invstd,
        weight and bias run along `axis` (the channels, 1 by default) and invstd is 1 / sqrt(var + eps).
        batch_norm(running_mean, running_var, ...) is PyTorch's.

        >>> Tensor([[1.0], [3.0]]).batchnorm(None, None, Tensor([2.0]), Tensor([1.0])).reshape(2).tolist()
        [-1.0, 1.0]
        """
        axes = normalize_axes(axis, self.ndim)
        along = tuple(self.shape[a] for a in axes)
        shape = tuple(s if a in axes else 1 for a, s in enumerate(self.shape))
        for what, t in (("weight", weight), ("bias", bias), ("mean", mean), ("invstd", invstd)):
            if t is not None and t.numel() != (n := prod(along)):
                raise ValueError(
                    f"batchnorm(): {what} must hold {n} values for the sizes {along} of axis {axis} of an input "
                    f"of shape {self.shape}, got shape {t.shape}"
                )
        y = (self - mean.reshape(shape)) * invstd.reshape(shape)
        if weight is not None:
            y = y * weight.reshape(shape)
        return y if bias is None else y + bias.reshape(shape)

    def sequential(self, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """tinygrad's name: each callable (a layer, a function, a bound method) applied in turn, starting with self.

        >>> Tensor([-1.0, 2.0]).sequential([Tensor.relu, lambda x: x * 3]).tolist()
        [0.0, 6.0]
        """
        x: Tensor = self  # type: ignore[assignment]
        for f in ll:
            x = f(x)
        return x

    def lshift(self, x: Tensor | int) -> Tensor:
        """tinygrad's name for bitwise_left_shift (`<<`).

        >>> Tensor([1, 3]).lshift(2).tolist()
        [4, 12]
        """
        return self.bitwise_left_shift(x)

    def rshift(self, x: Tensor | int) -> Tensor:
        """tinygrad's name for bitwise_right_shift (`>>`).

        >>> Tensor([16, 7]).rshift(2).tolist()
        [4, 1]
        """
        return self.bitwise_right_shift(x)

    def xor(self, x: Tensor | Scalar) -> Tensor:
        """tinygrad's name for bitwise_xor (`^`), for integers and bools.

        >>> Tensor([12, 10]).xor(6).tolist()
        [10, 12]
        """
        return self.bitwise_xor(x)

    def idiv(self, x: Tensor | Scalar) -> Tensor:
        """tinygrad's integer division, rounding toward zero: div(x, rounding_mode="trunc").

        >>> Tensor([7, -7]).idiv(2).tolist()
        [3, -3]
        """
        return self.div(x, rounding_mode="trunc")

    def leakyrelu(self, neg_slope: float = 0.01) -> Tensor:
        """tinygrad's older name for leaky_relu.

        >>> Tensor([-2.0, 3.0]).leakyrelu(0.5).tolist()
        [-1.0, 3.0]
        """
        return self.leaky_relu(neg_slope)
