"""Layers with torch.nn's constructor arguments, parameter names and default initialization.

Each layer is a plain class that owns its parameters (Tensors with requires_grad=True) and buffers (Tensors
without grad, such as batch norm's running statistics) as attributes named as torch names them, and applies
the matching functional Tensor op in __call__. Training behaviour (dropout, batch statistics) follows
Tensor.train() / Tensor.eval().
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tiny.ir.dtypes import DType
from tiny.tensor import Tensor

IntOrSeq = int | Sequence[int]
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


_SKIPPING: list[bool] = []  # inside skip_init()


@contextmanager
def skip_init() -> Iterator[None]:
    """Layers made inside leave their initial values uncomputed, as torch.nn.utils.skip_init does: each parameter is
    the lazy graph of its random draw, which takes no memory and is computed only if it is used, and requires no
    gradient (requires_grad_() makes it a leaf). For models whose weights are loaded right after (tiny.llm.load): a
    1B model's random draw would take 3.4 GB first.

    >>> with skip_init(): layer = Linear(4096, 4096)  # no 64 MB of random weights made
    >>> layer.weight.shape
    (4096, 4096)
    """
    _SKIPPING.append(True)
    try:
        yield
    finally:
        _SKIPPING.pop()


def parameter(t: Tensor) -> Tensor:
    """A realized leaf that gradients accumulate into (inside skip_init: uncomputed, and no leaf until given a
    value, which a leaf's memory would take)."""
    if _SKIPPING:
        return t
    t = t.realize()
    t.requires_grad = True
    return t


def _buffer(t: Tensor) -> Tensor:
    return t if _SKIPPING else t.realize()


def _uniform(shape: tuple[int, ...], bound: float, dtype: DType | str | None, device: str | None) -> Tensor:
    return parameter(Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device))


def _tuple(v: IntOrSeq, n: int, name: str) -> tuple[int, ...]:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n:
        raise ValueError(f"{name} must be an int or {n} ints, got {v!r}")
    return t


# ---------------------------------------------------------------- linear


class Linear:
    """y = x @ weight.T + bias; weight (out_features, in_features) and bias drawn from U(-1/sqrt(in), 1/sqrt(in)).

    >>> Linear(3, 2)(Tensor.ones(4, 3)).shape
    (4, 2)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0  # kaiming_uniform(a=sqrt(5)) is this bound
        self.weight = _uniform((out_features, in_features), bound, dtype, device)
        self.bias = _uniform((out_features,), bound, dtype, device) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight, self.bias)


# ---------------------------------------------------------------- convolutions


class _ConvNd:
    nd = 0
    transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrSeq,
        stride: IntOrSeq = 1,
        padding: IntOrSeq | str = 0,
        dilation: IntOrSeq = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: str | None = None,
        dtype: DType | str | None = None,
        output_padding: IntOrSeq = 0,
    ) -> None:
        name = type(self).__name__
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{name}: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        if self.transposed and (padding_mode != "zeros" or isinstance(padding, str)):
            raise ValueError(f"{name} supports only padding_mode='zeros' and int padding")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, self.nd, "kernel_size")
        self.stride, self.dilation = _tuple(stride, self.nd, "stride"), _tuple(dilation, self.nd, "dilation")
        self.padding = padding if isinstance(padding, str) else _tuple(padding, self.nd, "padding")
        self.output_padding = _tuple(output_padding, self.nd, "output_padding")
        self.padding_mode = padding_mode
        if self.transposed:
            shape = (in_channels, out_channels // groups, *self.kernel_size)
        else:
            shape = (out_channels, in_channels // groups, *self.kernel_size)
        # torch's fan_in is weight.shape[1] * kernel for both kinds, and kaiming_uniform(a=sqrt(5)) gives 1/sqrt(fan)
        fan_in = shape[1] * math.prod(self.kernel_size)
        bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = _uniform(shape, bound, dtype, device)
        self.bias = _uniform((out_channels,), bound, dtype, device) if bias else None

    def _edge_padding(self) -> list[int]:
        """Flat torch-style padding (last dim first) for a padding_mode other than zeros."""
        flat: list[int] = []
        for i in reversed(range(self.nd)):
            if self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                flat += [total // 2, total - total // 2]
            elif self.padding == "valid":
                flat += [0, 0]
            else:
                flat += [self.padding[i], self.padding[i]]  # type: ignore[index]
        return flat

    def _padded(self, x: Tensor) -> tuple[Tensor, IntOrSeq | str]:
        """The input and the padding left for the convolution: edges are padded here unless the mode is zeros."""
        if self.padding_mode == "zeros":
            return x, self.padding
        return x.pad(self._edge_padding(), mode=self.padding_mode), 0


class Conv1d(_ConvNd):
    """1-d convolution over (N, C_in, L) with weight (out_channels, in_channels/groups, kernel_size).

    >>> Conv1d(2, 3, 3)(Tensor.ones(1, 2, 5)).shape
    (1, 3, 3)
    """

    nd = 1

    def __call__(self, x: Tensor) -> Tensor:
        x, padding = self._padded(x)
        return x.conv1d(self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    """2-d convolution over (N, C_in, H, W) with weight (out_channels, in_channels/groups, kH, kW).

    >>> Conv2d(2, 3, 3, padding=1)(Tensor.ones(1, 2, 4, 4)).shape
    (1, 3, 4, 4)
    """

    nd = 2

    def __call__(self, x: Tensor) -> Tensor:
        x, padding = self._padded(x)
        return x.conv2d(self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class _ConvTransposeNd(_ConvNd):
    transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrSeq,
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: IntOrSeq = 1,
        padding_mode: str = "zeros",
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
            output_padding,
        )

    def _args(self) -> tuple:
        return (self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution with weight (in_channels, out_channels/groups, kernel_size).

    >>> ConvTranspose1d(2, 3, 2, stride=2)(Tensor.ones(1, 2, 4)).shape
    (1, 3, 8)
    """

    nd = 1

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose1d(*self._args())


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution with weight (in_channels, out_channels/groups, kH, kW).

    >>> ConvTranspose2d(2, 3, 2, stride=2)(Tensor.ones(1, 2, 3, 3)).shape
    (1, 3, 6, 6)
    """

    nd = 2

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(*self._args())


# ---------------------------------------------------------------- batch and instance norm


class _NormBase:
    """Per-channel affine weight/bias and, when tracked, running_mean / running_var / num_batches_tracked."""

    def __init__(
        self,
        num_features: int,
        eps: float,
        momentum: float | None,
        affine: bool,
        track_running_stats: bool,
        device: str | None,
        dtype: DType | str | None,
    ) -> None:
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = parameter(Tensor.ones(num_features, dtype=dtype, device=device)) if affine else None
        self.bias = parameter(Tensor.zeros(num_features, dtype=dtype, device=device)) if affine else None
        if track_running_stats:
            self.running_mean: Tensor | None = _buffer(Tensor.zeros(num_features, dtype=dtype, device=device))
            self.running_var: Tensor | None = _buffer(Tensor.ones(num_features, dtype=dtype, device=device))
            self.num_batches_tracked: Tensor | None = _buffer(Tensor.full((), 0, device=device))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def _check_input(self, x: Tensor, ndims: tuple[int, ...]) -> None:
        if x.ndim not in ndims:
            raise ValueError(
                f"{type(self).__name__} expects an input with {' or '.join(map(str, ndims))} dims, got {x.shape}"
            )

    def _update_factor(self) -> float:
        """Count this batch and return the running-average weight of its statistics (torch's momentum rule)."""
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        if self.momentum is None:  # a cumulative moving average
            return 1.0 / float(self.num_batches_tracked.item())
        return self.momentum


class _BatchNorm(_NormBase):
    ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def __call__(self, x: Tensor) -> Tensor:
        self._check_input(x, self.ndims)
        if x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got {x.shape[1]} channels in {x.shape}")
        if not Tensor.is_training() and self.running_mean is not None:  # eval: the running statistics
            return x.batch_norm(self.running_mean, self.running_var, self.weight, self.bias, False, eps=self.eps)
        return self._by_batch(x)

    def _by_batch(self, x: Tensor) -> Tensor:
        """x normalized by the batch's statistics (training, or nothing tracked), blended into the running ones when
        tracked."""
        factor = self._update_factor() if Tensor.is_training() and self.track_running_stats else 0.0
        return x.batch_norm(
            self.running_mean, self.running_var, self.weight, self.bias, True, momentum=factor, eps=self.eps
        )


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L), per channel.

    >>> BatchNorm1d(3)(Tensor.ones(2, 3)).shape
    (2, 3)
    """

    ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W), per channel.

    >>> BatchNorm2d(3).running_var.tolist()
    [1.0, 1.0, 1.0]
    """

    ndims = (4,)


class _InstanceNorm(_NormBase):
    ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def __call__(self, x: Tensor) -> Tensor:
        self._check_input(x, self.ndims)
        batched = x.ndim == self.ndims[-1]
        if not batched:
            x = x.reshape(1, *x.shape)
        if x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got {x.shape[1]} channels in {x.shape}")
        n, c = x.shape[:2]
        if Tensor.is_training() or self.running_mean is None:
            y = x.group_norm(c, self.weight, self.bias, self.eps)
            if Tensor.is_training() and self.running_mean is not None and self.running_var is not None:
                self._update_running(x.detach())
        else:
            assert self.running_var is not None
            y = x.batch_norm(self.running_mean, self.running_var, self.weight, self.bias, training=False, eps=self.eps)
        return y if batched else y.reshape(y.shape[1:])

    def _update_running(self, x: Tensor) -> None:
        """Each instance's statistics, averaged over the batch, blended into the running ones (as torch does)."""
        assert self.running_mean is not None and self.running_var is not None
        axes = tuple(range(2, x.ndim))
        count = math.prod(x.shape[2:])
        factor = self.momentum if self.momentum is not None else 0.0  # torch counts no batches here
        mean = x.mean(axis=axes)
        var = (x - mean.reshape(*mean.shape, *([1] * len(axes)))).square().sum(axis=axes) / max(count - 1, 1)
        self.running_mean.assign((1 - factor) * self.running_mean + factor * mean.mean(axis=0))
        self.running_var.assign((1 - factor) * self.running_var + factor * var.mean(axis=0))


class InstanceNorm1d(_InstanceNorm):
    """Normalize each channel of each sample of (N, C, L) or (C, L) over L.

    >>> [round(v, 3) for v in InstanceNorm1d(2)(Tensor([[[1.0, 3.0], [2.0, 2.0]]])).tolist()[0][0]]
    [-1.0, 1.0]
    """

    ndims = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """Normalize each channel of each sample of (N, C, H, W) or (C, H, W) over H and W.

    >>> InstanceNorm2d(2)(Tensor.ones(1, 2, 3, 3)).shape
    (1, 2, 3, 3)
    """

    ndims = (3, 4)


# ---------------------------------------------------------------- layer, group and rms norm


class LayerNorm:
    """Normalize over the last dims (normalized_shape), then scale by weight and shift by bias (ones and zeros).

    >>> LayerNorm(2)(Tensor([[1.0, 3.0]])).shape
    (1, 2)
    """

    def __init__(
        self,
        normalized_shape: IntOrSeq,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        shape = self.normalized_shape
        self.weight = parameter(Tensor.ones(*shape, dtype=dtype, device=device)) if elementwise_affine else None
        has_bias = elementwise_affine and bias
        self.bias = parameter(Tensor.zeros(*shape, dtype=dtype, device=device)) if has_bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm:
    """Normalize (N, C, ...) over groups of C/num_groups channels, then scale and shift per channel.

    >>> GroupNorm(2, 4)(Tensor.ones(1, 4, 3)).shape
    (1, 4, 3)
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = parameter(Tensor.ones(num_channels, dtype=dtype, device=device)) if affine else None
        self.bias = parameter(Tensor.zeros(num_channels, dtype=dtype, device=device)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.group_norm(self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) over the last dims, times weight (ones); eps=None is the dtype's epsilon.

    >>> RMSNorm(2)(Tensor([[3.0, 4.0]])).shape
    (1, 2)
    """

    def __init__(
        self,
        normalized_shape: IntOrSeq,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        shape = self.normalized_shape
        self.weight = parameter(Tensor.ones(*shape, dtype=dtype, device=device)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.rms_norm(self.normalized_shape, self.weight, self.eps)


# ---------------------------------------------------------------- embedding, recurrent cell, dropout


class Embedding:
    """A lookup table: row i of weight (num_embeddings, embedding_dim), drawn from N(0, 1), for each index i.
    The row at padding_idx starts as zeros and gets no gradient.

    >>> Embedding(10, 3)(Tensor([[1, 2], [4, 5]])).shape
    (2, 2, 3)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx={padding_idx} is outside [0, {num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        weight = Tensor.normal(num_embeddings, embedding_dim, dtype=dtype, device=device)
        if padding_idx is not None:
            weight = (Tensor.arange(num_embeddings, device=device) == padding_idx).reshape(-1, 1).where(0, weight)
        self.weight = parameter(weight)

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype.is_float or x.dtype.is_bool:
            raise TypeError(f"Embedding takes integer indices, got dtype {x.dtype.name}")
        weight = self.weight
        if self.padding_idx is not None:  # the same values, with no path for gradients into the padding row
            pad_row = (Tensor.arange(self.num_embeddings, device=weight.device) == self.padding_idx).reshape(-1, 1)
            weight = pad_row.where(weight.detach(), weight)
        return weight[x]


class LSTMCell:
    """One LSTM step: (h', c') from input x (N, input_size) and state (h, c), gates in torch's order i, f, g, o.
    Every parameter is drawn from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)).

    >>> h, c = LSTMCell(3, 4)(Tensor.ones(2, 3)); h.shape, c.shape
    ((2, 4), (2, 4))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        self.input_size, self.hidden_size = input_size, hidden_size
        bound = 1 / math.sqrt(hidden_size) if hidden_size else 0.0
        self.weight_ih = _uniform((4 * hidden_size, input_size), bound, dtype, device)
        self.weight_hh = _uniform((4 * hidden_size, hidden_size), bound, dtype, device)
        self.bias_ih = _uniform((4 * hidden_size,), bound, dtype, device) if bias else None
        self.bias_hh = _uniform((4 * hidden_size,), bound, dtype, device) if bias else None

    def __call__(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        batched = x.ndim == 2
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"LSTMCell expects (N, {self.input_size}) or ({self.input_size},), got {x.shape}")
        if not batched:
            x = x.reshape(1, -1)
            hx = None if hx is None else (hx[0].reshape(1, -1), hx[1].reshape(1, -1))
        if hx is None:
            zeros = Tensor.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hx = (zeros, zeros)
        h, c = hx
        gates = x.linear(self.weight_ih, self.bias_ih) + h.linear(self.weight_hh, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c_next = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h_next = o.sigmoid() * c_next.tanh()
        if not batched:
            return h_next.reshape(-1), c_next.reshape(-1)
        return h_next, c_next


class Dropout:
    """Zero each element with probability p and scale the others by 1/(1-p) while training; identity otherwise.

    >>> Dropout(0.5)(Tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout probability must be between 0 and 1, got {p}")
        self.p, self.inplace = p, inplace

    def __call__(self, x: Tensor) -> Tensor:
        return x.dropout(self.p)
