"""ONNX's neural-network operators as tiny tensor ops: products, convolutions, pooling, normalizations,
activations and softmax."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, normalize_axis, onnx_dtype, register
from tiny.tensor import Tensor

# ---------------------------------------------------------------- products


@register("MatMul")
def matmul(c: NodeCall) -> Tensor:
    return c.tensor(0) @ c.tensor(1)


@register("Gemm")
def gemm(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    a = a.T if c.attr("transA", 0) else a
    b = b.T if c.attr("transB", 0) else b
    y = a @ b
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    y = y * alpha if alpha != 1.0 else y
    if c.has(2):
        bias = c.tensor(2)
        y = y + (bias * beta if beta != 1.0 else bias)
    return y


# ---------------------------------------------------------------- convolution and pooling


def _spatial_args(c: NodeCall, x: Tensor, kernel: list[int]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(strides, dilations, (begin, end) padding per spatial dim) with auto_pad worked out."""
    nd = len(kernel)
    strides = c.attr("strides", [1] * nd)
    dils = c.attr("dilations", [1] * nd)
    auto = c.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dils):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return strides, dils, pads
    if auto == "VALID":
        return strides, dils, [(0, 0)] * nd
    if auto != "NOTSET":
        raise ValueError(f"{c.where}: auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto!r}")
    flat = c.attr("pads", [0] * (2 * nd))
    return strides, dils, [(flat[i], flat[i + nd]) for i in range(nd)]


_CONVS = {1: Tensor.conv1d, 2: Tensor.conv2d, 3: Tensor.conv3d}


@register("Conv")
def conv(c: NodeCall) -> Tensor:
    x, w, b = c.tensor(0), c.tensor(1), c.opt(2)
    nd = w.ndim - 2
    if nd not in _CONVS:
        raise NotImplementedError(f"{c.where}: a convolution over {nd} spatial dims (tiny has 1, 2 and 3)")
    strides, dils, pads = _spatial_args(c, x, list(w.shape[2:]))
    if all(lo == hi for lo, hi in pads):
        return _CONVS[nd](x, w, b, strides, [lo for lo, _ in pads], dils, c.attr("group", 1))
    x = x.pad([(0, 0), (0, 0), *pads])  # uneven padding: the zeros first, then a convolution without any
    return _CONVS[nd](x, w, b, strides, 0, dils, c.attr("group", 1))


_CONV_TRANSPOSES = {1: Tensor.conv_transpose1d, 2: Tensor.conv_transpose2d}


@register("ConvTranspose")
def conv_transpose(c: NodeCall) -> Tensor:
    x, w, b = c.tensor(0), c.tensor(1), c.opt(2)
    nd = w.ndim - 2
    if nd not in _CONVS:
        raise NotImplementedError(f"{c.where}: a transposed convolution over {nd} spatial dims (tiny has 1 to 3)")
    kernel = list(w.shape[2:])
    strides = c.attr("strides", [1] * nd)
    dils = c.attr("dilations", [1] * nd)
    out_pad = c.attr("output_padding", [0] * nd)
    # the full output (no padding taken off), then cropped: begin/end per dim from pads, auto_pad or output_shape
    full = [(s - 1) * st + (k - 1) * d + 1 for s, st, k, d in zip(x.shape[2:], strides, kernel, dils)]
    auto = c.attr("auto_pad", "NOTSET")
    out_shape = c.attr("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-nd:] if out_shape is not None else [s * st for s, st in zip(x.shape[2:], strides)]
        pads = []
        for f, op, t in zip(full, out_pad, target):
            total = f + op - t
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    elif auto == "VALID" or c.attr("pads") is None:
        pads = [(0, 0)] * nd
    else:
        flat = c.attr("pads")
        pads = [(flat[i], flat[i + nd]) for i in range(nd)]
    groups = c.attr("group", 1)
    if nd in _CONV_TRANSPOSES:
        y = _CONV_TRANSPOSES[nd](x, w, None, strides, 0, 0, groups, dils)
    else:
        y = _conv_transpose_as_conv(x, w, strides, dils, groups)
    # output_padding adds rows at the end (zeros from the transposed convolution's view), then the crop
    y = y.pad([(0, 0), (0, 0), *((-lo, op - hi) for (lo, hi), op in zip(pads, out_pad))])
    return y + b.reshape(1, -1, *([1] * nd)) if b is not None else y


def _spread(x: Tensor, dim: int, stride: int) -> Tensor:
    """x with stride - 1 zeros between neighbours along dim (a length n becomes (n - 1) * stride + 1)."""
    if stride == 1:
        return x
    n = x.shape[dim]
    x = x.unsqueeze(dim + 1).pad([(0, 0)] * (dim + 1) + [(0, stride - 1)] + [(0, 0)] * (x.ndim - dim - 1))
    x = x.reshape(*x.shape[:dim], n * stride, *x.shape[dim + 2 :])
    return x[(slice(None),) * dim + (slice(0, (n - 1) * stride + 1),)]


def _conv_transpose_as_conv(x: Tensor, w: Tensor, strides: list[int], dils: list[int], groups: int) -> Tensor:
    """The full transposed convolution as a convolution: the input spread out by the strides (zeros between) and
    padded by the dilated kernel's reach, the weight with its channels swapped per group and its kernel flipped."""
    cin = x.shape[1]
    kernel = w.shape[2:]
    nd = len(kernel)
    for i, st in enumerate(strides):
        x = _spread(x, 2 + i, st)
    reach = [(k - 1) * d for k, d in zip(kernel, dils)]
    x = x.pad([(0, 0), (0, 0), *((r, r) for r in reach)])
    cout_g = w.shape[1]
    wt = (
        w.reshape(groups, cin // groups, cout_g, *kernel)
        .transpose(1, 2)
        .reshape(groups * cout_g, cin // groups, *kernel)
    )
    return _CONVS[nd](x, wt.flip(*range(2, 2 + nd)), None, 1, 0, dils, groups)


@dataclass(frozen=True)
class _Pool:
    """A pooling node's windows: kernel, strides, dilations and pads per spatial dim, the output's spatial sizes
    (ceil_mode rounding up), and the axes of the window elements in _windows' result."""

    kernel: list[int]
    strides: list[int]
    dils: list[int]
    pads: list[tuple[int, int]]
    out: list[int]
    axes: tuple[int, ...]

    @staticmethod
    def of(c: NodeCall, x: Tensor) -> _Pool:
        kernel = c.attr("kernel_shape")
        if kernel is None:
            raise ValueError(f"{c.where}: kernel_shape is required")
        strides, dils, pads = _spatial_args(c, x, kernel)
        ceil, nd = bool(c.attr("ceil_mode", 0)), len(kernel)
        dims = zip(x.shape[2:], kernel, strides, dils, pads)
        out = [_pool_out(s, k, st, d, lo, hi, ceil) for s, k, st, d, (lo, hi) in dims]
        return _Pool(kernel, strides, dils, pads, out, tuple(range(2 + nd, 2 + 2 * nd)))

    def windows(self, t: Tensor, fill: float, pads: list[tuple[int, int]] | None = None) -> Tensor:
        return _windows(t, self.kernel, self.strides, self.dils, self.pads if pads is None else pads, self.out, fill)


def _pool_out(size: int, k: int, s: int, d: int, lo: int, hi: int, ceil: bool) -> int:
    span = size + lo + hi - (k - 1) * d - 1
    n = (-(-span // s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + lo:  # the last window must start inside the input or its begin padding
        n -= 1
    return n


def _windows(x: Tensor, kernel, strides, dils, pads, out, fill: float) -> Tensor:
    """(N, C, *out, *kernel): each output position's window, `fill` where it reads padding."""
    nd = len(kernel)
    ends = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out, strides, kernel, dils)]
    pairs = [(lo, e - size - lo) for (lo, _), e, size in zip(pads, ends, x.shape[2:])]
    x = x.pad([(0, 0), (0, 0), *pairs], value=fill)
    parts = []
    for offsets in _product([range(k) for k in kernel]):
        index = tuple(slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(offsets, dils, out, strides))
        parts.append(x[(slice(None), slice(None), *index)])
    stacked = parts[0].stack(*parts[1:], dim=-1) if len(parts) > 1 else parts[0].unsqueeze(-1)
    return stacked.reshape(*x.shape[:2], *out, *kernel) if nd else stacked


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [(*o, i) for o in out for i in r]
    return out


@register("MaxPool")
def max_pool(c: NodeCall) -> Tensor | tuple[Tensor, Tensor]:
    x = c.tensor(0)
    pool = _Pool.of(c, x)
    nd, axes = len(pool.kernel), pool.axes
    win = pool.windows(x, -math.inf if x.dtype.is_float else x.dtype.min)
    y = win.max(axis=axes)
    if c.n_outputs < 2:
        return y
    # each window element's flat index into the whole input (N, C, *spatial), as ONNX's Indices output counts;
    # with storage_order=1 the spatial dims count in column-major order (the first one fastest)
    if c.attr("storage_order", 0):
        spatial_rev = x.shape[2:][::-1]
        flat = Tensor.arange(math.prod(x.shape), device=c.device).reshape(*x.shape[:2], *spatial_rev)
        flat = flat.permute(0, 1, *range(x.ndim - 1, 1, -1))
    else:
        flat = Tensor.arange(math.prod(x.shape), device=c.device).reshape(x.shape)
    where = pool.windows(flat, -1)
    big = math.prod(x.shape)
    at_max = win == y.reshape(*y.shape, *([1] * nd))
    idx = (at_max & (where >= 0)).where(where, big).min(axis=axes)
    return y, idx


@register("AveragePool")
def average_pool(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    pool = _Pool.of(c, x)
    total = pool.windows(x, 0.0).sum(axis=pool.axes)
    # what each window divides by: the elements inside the input (count_include_pad=0) or inside input and
    # explicit padding (count_include_pad=1); never the positions past the padding that ceil_mode adds
    inside = Tensor.ones(1, 1, *x.shape[2:], device=c.device, dtype=x.dtype)
    if c.attr("count_include_pad", 0):
        inside = inside.pad([(0, 0), (0, 0), *pool.pads], value=1.0)
        counted = pool.windows(inside, 0.0, [(0, 0)] * len(pool.kernel))
    else:
        counted = pool.windows(inside, 0.0)
    return total / counted.sum(axis=pool.axes)


@register("GlobalAveragePool")
def global_average_pool(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    return x.mean(axis=tuple(range(2, x.ndim)), keepdim=True)


@register("GlobalMaxPool")
def global_max_pool(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    return x.max(axis=tuple(range(2, x.ndim)), keepdim=True)


@register("LpPool")
def lp_pool(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    pool, p = _Pool.of(c, x), c.attr("p", 2)
    return (pool.windows(x.abs(), 0.0) ** p).sum(axis=pool.axes) ** (1.0 / p)


# ---------------------------------------------------------------- normalizations


def _channel(t: Tensor, ndim: int) -> Tensor:
    return t.reshape(1, -1, *([1] * (ndim - 2)))


@register("BatchNormalization")
def batch_norm(c: NodeCall) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    x, scale, bias, mean, var = (c.tensor(i) for i in range(5))
    eps = c.attr("epsilon", 1e-5)
    training = c.attr("training_mode", 0) if c.opset >= 14 else c.n_outputs > 1
    if training and c.opset < 14:
        raise NotImplementedError(f"{c.where}: training mode before opset 14 (saved mean and variance outputs)")
    if training:  # the batch's statistics (the variance without Bessel's correction), and the running ones updated
        axes = (0, *range(2, x.ndim))
        batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes, correction=0)
        momentum = c.attr("momentum", 0.9)
        mean_out = mean * momentum + batch_mean * (1 - momentum)
        var_out = var * momentum + batch_var * (1 - momentum)
        mean, var = batch_mean, batch_var
    inv = (_channel(var, x.ndim) + eps).rsqrt()
    y = (x - _channel(mean, x.ndim)) * inv * _channel(scale, x.ndim) + _channel(bias, x.ndim)
    return (y, mean_out, var_out) if training else y


def _normalized(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    mean = x.mean(axis=axes, keepdim=True)
    centered = x - mean
    inv = ((centered * centered).mean(axis=axes, keepdim=True) + eps).rsqrt()
    return centered * inv, mean, inv


def _stash(c: NodeCall, x: Tensor) -> Tensor:
    """The input in the precision the statistics are computed in (stash_type 1: float32)."""
    return x.cast(dtypes.float32) if c.attr("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x


@register("LayerNormalization")
def layer_norm(c: NodeCall) -> tuple[Tensor, ...]:
    x = c.tensor(0)
    axis = normalize_axis(c.attr("axis", -1), x.ndim, c)
    axes = tuple(range(axis, x.ndim))
    normed, mean, inv = _normalized(_stash(c, x), axes, c.attr("epsilon", 1e-5))
    y = normed.cast(x.dtype) * c.tensor(1)
    if c.has(2):
        y = y + c.tensor(2)
    return y, mean, inv


@register("RMSNormalization")
def rms_norm(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    axis = normalize_axis(c.attr("axis", -1), x.ndim, c)
    xs = _stash(c, x)
    inv = ((xs * xs).mean(axis=tuple(range(axis, x.ndim)), keepdim=True) + c.attr("epsilon", 1e-5)).rsqrt()
    return (xs * inv).cast(x.dtype) * c.tensor(1)


@register("InstanceNormalization")
def instance_norm(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    normed, _, _ = _normalized(x, tuple(range(2, x.ndim)), c.attr("epsilon", 1e-5))
    return normed * _channel(c.tensor(1), x.ndim) + _channel(c.tensor(2), x.ndim)


@register("GroupNormalization")
def group_norm(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    groups = c.attr("num_groups")
    n, ch, *spatial = x.shape
    grouped = _stash(c, x).reshape(n, groups, -1)
    normed, _, _ = _normalized(grouped, (2,), c.attr("epsilon", 1e-5))
    scale, bias = c.tensor(1), c.tensor(2)
    if c.opset < 21:  # scale and bias per group, before opset 21 (per channel from then on)
        scale, bias = scale.repeat_interleave(ch // groups), bias.repeat_interleave(ch // groups)
    y = normed.reshape(x.shape).cast(x.dtype)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


@register("LpNormalization")
def lp_norm(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    axis = normalize_axis(c.attr("axis", -1), x.ndim, c)
    p = c.attr("p", 2)
    if p not in (1, 2):
        raise ValueError(f"{c.where}: p must be 1 or 2, got {p}")
    norm = x.abs().sum(axis=axis, keepdim=True) if p == 1 else (x * x).sum(axis=axis, keepdim=True).sqrt()
    return (norm == 0).where(0.0, x / norm).cast(x.dtype)  # a zero vector stays zero


@register("MeanVarianceNormalization")
def mean_variance_norm(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    axes = tuple(normalize_axis(a, x.ndim, c) for a in c.attr("axes", [0, 2, 3]))
    mean = x.mean(axis=axes, keepdim=True)
    var = (x * x).mean(axis=axes, keepdim=True) - mean * mean
    return (x - mean) / (var.sqrt() + 1e-9)


@register("LRN")
def lrn(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    size = c.attr("size")
    alpha, beta, bias = c.attr("alpha", 1e-4), c.attr("beta", 0.75), c.attr("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).pad([(0, 0), (lo, hi), *([(0, 0)] * (x.ndim - 2))])
    ch = x.shape[1]
    total = sq[:, 0:ch]
    for i in range(1, size):
        total = total + sq[:, i : i + ch]
    return x / (bias + alpha / size * total) ** beta


# ---------------------------------------------------------------- activations


def _activation(fn):
    return lambda c: fn(c.tensor(0), c)


for _name, _fn in {
    "Relu": lambda x, c: x.relu(),
    "Sigmoid": lambda x, c: x.sigmoid(),
    "Tanh": lambda x, c: x.tanh(),
    "Softplus": lambda x, c: x.softplus(),
    "Softsign": lambda x, c: x / (x.abs() + 1),
    "Mish": lambda x, c: x * x.softplus().tanh(),
    "HardSwish": lambda x, c: x * (x / 6 + 0.5).clip(0, 1),
    "Gelu": lambda x, c: x.gelu(c.attr("approximate", "none")),
    "LeakyRelu": lambda x, c: (x < 0).where(x * c.attr("alpha", 0.01), x),
    "Elu": lambda x, c: (x < 0).where((x.exp() - 1) * c.attr("alpha", 1.0), x),
    "Celu": lambda x, c: x.celu(c.attr("alpha", 1.0)),
    "Selu": lambda x, c: (
        (x <= 0).where((x.exp() - 1) * c.attr("alpha", 1.67326319217681884765625), x)
        * c.attr("gamma", 1.05070102214813232421875)
    ),
    "HardSigmoid": lambda x, c: (x * c.attr("alpha", 0.2) + c.attr("beta", 0.5)).clip(0, 1),
    "ThresholdedRelu": lambda x, c: (x > c.attr("alpha", 1.0)).where(x, 0.0),
    "Shrink": lambda x, c: (
        (x < -c.attr("lambd", 0.5))
        .where(x + c.attr("bias", 0.0), (x > c.attr("lambd", 0.5)).where(x - c.attr("bias", 0.0), 0))
        .cast(x.dtype)
    ),
    "Swish": lambda x, c: x * (x * c.attr("alpha", 1.0)).sigmoid(),
}.items():
    register(_name)(_activation(_fn))


@register("PRelu")
def prelu(c: NodeCall) -> Tensor:
    x, slope = c.tensor(0), c.tensor(1)
    return (x < 0).where(x * slope, x)


def _softmax_like(method: str):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        if c.opset < 13:  # the input is seen as 2-d: the dims before axis (default 1) and the dims from it on
            axis = normalize_axis(c.attr("axis", 1), x.ndim, c)
            flat = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
            return _softmax_on(flat, 1, method).reshape(x.shape)
        return _softmax_on(x, normalize_axis(c.attr("axis", -1), x.ndim, c), method)

    return op


def _softmax_on(x: Tensor, axis: int, method: str) -> Tensor:
    if method == "hardmax":  # one-hot of the first maximum along the axis
        first = x.argmax(axis=axis, keepdim=True)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        return (Tensor.arange(x.shape[axis], device=x.device).reshape(shape) == first).cast(x.dtype)
    return getattr(x, method)(axis=axis)


register("Softmax")(_softmax_like("softmax"))
register("LogSoftmax")(_softmax_like("log_softmax"))
register("Hardmax")(_softmax_like("hardmax"))


@register("Dropout")
def dropout(c: NodeCall) -> Tensor | tuple[Tensor, Tensor]:
    x = c.tensor(0)
    training = c.opset >= 12 and c.has(2) and bool(c.scalar(2))
    ratio = c.scalar(1, 0.5) if c.opset >= 12 else c.attr("ratio", 0.5)
    if training and ratio != 0:
        raise NotImplementedError(f"{c.where}: dropout in training mode (random masks) is not implemented")
    if c.n_outputs < 2:
        return x
    return x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=c.device)


@register("SwiGLU")
def swiglu(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    if a.shape != b.shape:
        raise ValueError(f"{c.where}: A and B must have one shape, got {a.shape} and {b.shape}")
    return a * (a * c.attr("alpha", 1.0)).sigmoid() * b


def _window(terms: tuple[float, ...]):
    """A cosine-sum window: sum over k of (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1."""

    def op(c: NodeCall) -> Tensor:
        size = int(c.scalar(0))
        n = np.arange(size, dtype=np.float64)
        span = size if c.attr("periodic", 1) else size - 1
        w = sum((-1) ** k * a * np.cos(2 * np.pi * k * n / span) for k, a in enumerate(terms))
        dt = onnx_dtype(c.attr("output_datatype", 1), c.where)
        return Tensor(np.asarray(w, dtype=np.float64), device=c.device).cast(dt)

    return op


register("HannWindow")(_window((0.5, 0.5)))
register("HammingWindow")(_window((25 / 46, 21 / 46)))
register("BlackmanWindow")(_window((0.42, 0.5, 0.08)))


@register("CausalConvWithState")
def causal_conv_with_state(c: NodeCall) -> tuple[Tensor, Tensor]:
    x, w, b = c.tensor(0), c.tensor(1), c.opt(2)
    batch, channels, _ = x.shape
    k = w.shape[-1]
    past = c.tensor(3) if c.has(3) else Tensor.zeros(batch, channels, k - 1, dtype=x.dtype, device=c.device)
    full = past.cat(x, dim=2) if k > 1 else x  # the last k - 1 positions before the input, then the input
    y = full.conv1d(w, b, groups=channels)
    activation = c.attr("activation", "none")
    if activation in ("silu", "swish"):
        y = y * y.sigmoid()
    elif activation != "none":
        raise ValueError(f"{c.where}: activation must be silu, swish or none, got {activation!r}")
    state = full[:, :, full.shape[2] - (k - 1) :] if k > 1 else past
    return y, state


@register("Col2Im")
def col2im(c: NodeCall) -> Tensor:
    cols = c.tensor(0)
    image, block = c.ints(1), c.ints(2)
    nd = len(image)
    dils, strides = c.attr("dilations", [1] * nd), c.attr("strides", [1] * nd)
    pads = c.attr("pads", [0] * (2 * nd))
    padded = [s + pads[i] + pads[i + nd] for i, s in enumerate(image)]
    outs = [(p - (k - 1) * d - 1) // s + 1 for p, k, d, s in zip(padded, block, dils, strides)]
    n, rows, length = cols.shape
    k_total = math.prod(block)
    if rows % k_total or length != math.prod(outs):
        raise ValueError(f"{c.where}: input {cols.shape} does not fit blocks {block} over image {image}")
    ch = rows // k_total
    cols = cols.reshape(n, ch, k_total, *outs)
    total = None
    for j, offset in enumerate(itertools.product(*(range(k) for k in block))):
        part = cols[:, :, j]  # (N, C, *outs): what each block puts at this kernel position
        for i in range(nd):
            part = _spread(part, 2 + i, strides[i])
        start = [o * d for o, d in zip(offset, dils)]
        part = part.pad([(0, 0), (0, 0), *((b, p - b - s) for b, p, s in zip(start, padded, part.shape[2:]))])
        total = part if total is None else total + part
    return total[(slice(None), slice(None), *(slice(pads[i], pads[i] + image[i]) for i in range(nd)))]
