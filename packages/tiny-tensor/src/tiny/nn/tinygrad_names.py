"""tinygrad's names for layers where they differ from torch.nn's, so that models written for tinygrad mostly run:
thin subclasses of the torch-named layers with tinygrad's constructor arguments (the Tensor methods with tinygrad's
names are in tiny.tensor.tinygrad_names).

    BatchNorm(sz, eps, affine, track_running_stats, momentum)  -> BatchNorm1d/2d, for an input of any rank >= 2
    InstanceNorm(num_features, eps, affine=True)               -> InstanceNorm1d/2d, any rank >= 3, always batched
    LayerNorm2d(channels, eps, elementwise_affine)             -> LayerNorm over the channels of (N, C, H, W)
"""

from __future__ import annotations

from tiny.nn.layers import LayerNorm, _BatchNorm, _InstanceNorm
from tiny.tensor import Tensor

_ANY_RANK = tuple(range(2, 9))


class BatchNorm(_BatchNorm):
    """tinygrad's batch norm: BatchNorm2d's statistics and parameters (weight, bias, running_mean, running_var,
    num_batches_tracked), for (N, C, ...) of any rank >= 2; the arguments in tinygrad's order.

    >>> BatchNorm(3)(Tensor.ones(2, 3, 4, 4, 4)).shape
    (2, 3, 4, 4, 4)
    """

    ndims = _ANY_RANK

    def __init__(
        self,
        sz: int,
        eps: float = 1e-5,
        affine: bool = True,
        track_running_stats: bool = True,
        momentum: float | None = 0.1,
    ) -> None:
        super().__init__(sz, eps, momentum, affine, track_running_stats)


class InstanceNorm(_InstanceNorm):
    """tinygrad's instance norm: each channel of each sample of (N, C, ...) normalized over the rest, with a weight
    and bias per channel by default (affine=True, unlike torch's InstanceNorm2d) and no running statistics.

    >>> [round(v, 3) for v in InstanceNorm(1)(Tensor([[[1.0, 3.0]]])).tolist()[0][0]]
    [-1.0, 1.0]
    """

    ndims = (3, 4, 5, 6, 7, 8)

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__(num_features, eps, affine=affine, track_running_stats=False)

    def __call__(self, x: Tensor) -> Tensor:
        self._check_input(x, self.ndims)
        if x.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm({self.num_features}) got {x.shape[1]} channels in {x.shape}")
        return x.group_norm(x.shape[1], self.weight, self.bias, self.eps)


class LayerNorm2d(LayerNorm):
    """tinygrad's layer norm over the channels of (N, C, H, W): LayerNorm(channels) at each pixel.

    >>> LayerNorm2d(3)(Tensor.ones(2, 3, 4, 4)).shape
    (2, 3, 4, 4)
    """

    def __init__(self, channels: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__(channels, eps=eps, elementwise_affine=elementwise_affine)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ValueError(f"LayerNorm2d expects an input (N, C, H, W), got {x.shape}")
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
