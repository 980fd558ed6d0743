"""ONNX's reductions (ReduceSum ... ReduceLogSumExp, ArgMax/ArgMin), running sums and products, TopK and
Einsum as tiny tensor ops."""

from __future__ import annotations

import math

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, normalize_axis, register
from tiny.tensor import Tensor

# ---------------------------------------------------------------- reductions


def _reduce_axes(c: NodeCall, x: Tensor, input_from: int) -> tuple[int, ...] | None:
    """The axes to reduce (None: all). From `input_from` on (13 for ReduceSum, 18 for the others) they are an
    optional input, and empty axes with noop_with_empty_axes=1 reduce nothing (an empty tuple here)."""
    axes = c.attr("axes") if c.opset < input_from else c.ints(1)
    if not axes:
        return () if c.opset >= input_from and c.attr("noop_with_empty_axes", 0) else None
    return tuple(sorted({normalize_axis(a, x.ndim, c) for a in axes}))


def _reduction(fn, input_from: int = 18):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axes = _reduce_axes(c, x, input_from)
        if axes == ():
            return fn(x, None, True, identity=True)
        axes = axes if axes is not None else tuple(range(x.ndim))
        return fn(x, axes, bool(c.attr("keepdims", 1)), identity=False)

    return op


def _sum(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _extreme(method: str):
    def fn(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
        if identity:
            return x
        if any(x.shape[a] == 0 for a in axes):  # an empty set: the identity of max (-inf) or min (+inf)
            bound = x.dtype.min if method == "max" else x.dtype.max
            if x.dtype.is_float:
                bound = -math.inf if method == "max" else math.inf
            dims = (
                [1 if i in axes else d for i, d in enumerate(x.shape)]
                if keep
                else [d for i, d in enumerate(x.shape) if i not in axes]
            )
            return Tensor.full(tuple(dims), bound, dtype=x.dtype, device=x.device)
        return getattr(x, method)(axis=axes, keepdim=keep)

    return fn


def _mean(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.mean(axis=axes, keepdim=keep)


def _prod(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.prod(axis=axes, keepdim=keep, dtype=x.dtype)


def _l1(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x.abs() if identity else x.abs().sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _l2(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    sq = x * x
    s = sq if identity else sq.sum(axis=axes, keepdim=keep, dtype=x.dtype)
    return s.cast(dtypes.float32).sqrt().cast(x.dtype) if not x.dtype.is_float else s.sqrt()


def _sum_square(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x * x if identity else (x * x).sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _log_sum(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x.log() if identity else x.sum(axis=axes, keepdim=keep).log()


def _log_sum_exp(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    if identity:
        return x
    if any(x.shape[a] == 0 for a in axes):
        return _log_sum(x.exp(), axes, keep, identity)
    return x.logsumexp(axis=axes, keepdim=keep)


register("ReduceSum")(_reduction(_sum, input_from=13))
register("ReduceMax")(_reduction(_extreme("max")))
register("ReduceMin")(_reduction(_extreme("min")))
register("ReduceMean")(_reduction(_mean))
register("ReduceProd")(_reduction(_prod))
register("ReduceL1")(_reduction(_l1))
register("ReduceL2")(_reduction(_l2))
register("ReduceSumSquare")(_reduction(_sum_square))
register("ReduceLogSum")(_reduction(_log_sum))
register("ReduceLogSumExp")(_reduction(_log_sum_exp))


def _arg(method: str):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axis = normalize_axis(c.attr("axis", 0), x.ndim, c)
        keep = bool(c.attr("keepdims", 1))
        if c.attr("select_last_index", 0):  # the last of equal extremes: the first one of the flipped dim
            i = getattr(x.flip(axis), method)(axis=axis, keepdim=keep)
            return (x.shape[axis] - 1 - i).cast(dtypes.int64)
        return getattr(x, method)(axis=axis, keepdim=keep).cast(dtypes.int64)

    return op


register("ArgMax")(_arg("argmax"))
register("ArgMin")(_arg("argmin"))


def _cumulative(method: str, identity: int):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axis = normalize_axis(int(c.scalar(1)), x.ndim, c)
        if c.attr("reverse", 0):
            x = x.flip(axis)
        if c.attr("exclusive", 0):  # shifted one along: each element sees only the ones before it
            pairs = [(0, 0)] * x.ndim
            pairs[axis] = (1, -1)
            x = x.pad(pairs, value=identity)
        y = getattr(x, method)(axis).cast(x.dtype)
        return y.flip(axis) if c.attr("reverse", 0) else y

    return op


register("CumSum")(_cumulative("cumsum", 0))
register("CumProd")(_cumulative("cumprod", 1))


@register("TopK")
def topk(c: NodeCall) -> tuple[Tensor, Tensor]:
    x = c.tensor(0)
    k = int(c.attr("k")) if c.opset < 10 else int(c.scalar(1))
    axis = normalize_axis(c.attr("axis", -1), x.ndim, c)
    values, indices = x.topk(k, axis=axis, largest=bool(c.attr("largest", 1)), sorted=True)
    return values, indices.cast(dtypes.int64)


@register("Einsum")
def einsum(c: NodeCall) -> Tensor:
    return Tensor.einsum(c.attr("equation"), *[c.tensor(i) for i in range(len(c.inputs))])


@register("DFT")
def dft(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    if x.shape[-1] not in (1, 2):
        raise ValueError(f"{c.where}: the last dim must be 1 (real) or 2 (complex), got shape {x.shape}")
    axis = c.attr("axis", 1) if c.opset < 20 else int(c.scalar(2, -2))
    if not -x.ndim <= axis <= x.ndim - 2 or axis == -1:
        raise ValueError(f"{c.where}: axis {axis} is not a signal axis of shape {x.shape}")
    axis = axis % x.ndim
    inverse, onesided = c.attr("inverse", 0), c.attr("onesided", 0)
    if onesided and not inverse and x.shape[-1] != 1 or onesided and inverse and x.shape[-1] != 2:
        raise ValueError(
            f"{c.where}: a one-sided {'inverse ' if inverse else ''}DFT needs "
            f"{'complex' if inverse else 'real'} input, got shape {x.shape}"
        )
    sig = x.transpose(axis, -2) if axis != x.ndim - 2 else x  # (..., L, 1 or 2), the transformed axis second last
    length = sig.shape[-2]
    n = int(c.scalar(1)) if c.has(1) else (2 * (length - 1) if onesided and inverse else length)
    re = sig[..., 0]
    im = sig[..., 1] if sig.shape[-1] == 2 else None
    wide = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    re, im = re.cast(wide), im.cast(wide) if im is not None else None
    kept = n // 2 + 1 if onesided and inverse else n  # the entries of the signal the transform reads

    def fitted(t: Tensor) -> Tensor:  # zero-padded or truncated to `kept` along the last axis
        return t.pad([(0, 0)] * (t.ndim - 1) + [(0, kept - length)]) if kept > length else t[..., :kept]

    re, im = fitted(re), fitted(im) if im is not None else None
    if onesided and inverse:  # the full spectrum from its half: X[k] = conj(X[n - k]) past the middle
        mirror = np.array([k if k < kept else n - k for k in range(n)], dtype=np.int64)
        sign = np.where(np.arange(n) < kept, 1.0, -1.0)
        index = Tensor(mirror, device=c.device)
        re, im = re[..., index], im[..., index] * Tensor(sign, device=c.device).cast(wide)
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n  # (signal position, frequency)
    cos = Tensor(np.cos(angle), device=c.device).cast(wide)
    sin = Tensor(np.sin(angle), device=c.device).cast(wide)
    turn = 1.0 if inverse else -1.0  # e^{turn * 2 pi i k n / N}
    out_re = re @ cos - (im @ sin) * turn if im is not None else re @ cos
    out_im = (im @ cos if im is not None else 0.0) + (re @ sin) * turn
    if inverse:
        out_re, out_im = out_re / n, out_im / n
    if onesided and inverse:
        y = out_re.unsqueeze(-1)  # a real signal
    else:
        if onesided:
            out_re, out_im = out_re[..., : n // 2 + 1], out_im[..., : n // 2 + 1]
        y = out_re.unsqueeze(-1).cat(out_im.unsqueeze(-1), dim=-1)
    y = y.cast(x.dtype)
    return y.transpose(axis, -2) if axis != x.ndim - 2 else y


@register("STFT")
def stft(c: NodeCall) -> Tensor:
    x = c.tensor(0)  # (batch, length, 1 or 2)
    step = int(c.scalar(1))
    window = c.opt(2)
    size = int(c.scalar(3)) if c.has(3) else (window.shape[0] if window is not None else None)
    if size is None:
        raise ValueError(f"{c.where}: the frame length comes from frame_length or the window; neither was given")
    onesided = c.attr("onesided", 1)
    if onesided and x.shape[-1] != 1:
        raise ValueError(f"{c.where}: a one-sided STFT needs a real signal (last dim 1), got shape {x.shape}")
    frames = (x.shape[1] - size) // step + 1
    starts = np.arange(frames)[:, None] * step + np.arange(size)[None, :]  # (frames, frame_length) positions
    wide = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    framed = x.cast(wide)[:, Tensor(starts, device=c.device)]  # (batch, frames, frame_length, 1 or 2)
    if window is not None:
        framed = framed * window.cast(wide).reshape(1, 1, size, 1)
    bins = size // 2 + 1 if onesided else size
    angle = 2 * np.pi * np.outer(np.arange(size), np.arange(bins)) / size
    cos = Tensor(np.cos(angle), device=c.device).cast(wide)
    sin = Tensor(np.sin(angle), device=c.device).cast(wide)
    re = framed[..., 0]
    out_re, out_im = re @ cos, -(re @ sin)
    if x.shape[-1] == 2:  # (re + i im)(cos - i sin)
        im = framed[..., 1]
        out_re, out_im = out_re + im @ sin, out_im + im @ cos
    return out_re.unsqueeze(-1).cat(out_im.unsqueeze(-1), dim=-1).cast(x.dtype)


@register("Det")
def det(c: NodeCall) -> Tensor:
    a = c.tensor(0)
    n = a.shape[-1]
    if a.ndim < 2 or a.shape[-2] != n:
        raise ValueError(f"{c.where}: the input must be (..., n, n), got shape {a.shape}")
    batch = a.shape[:-2]
    rows = Tensor.arange(n, device=c.device).reshape(*([1] * len(batch)), n)
    result = Tensor.ones(*batch, dtype=a.dtype, device=c.device)
    for k in range(n):  # Gaussian elimination with partial pivoting: the product of the pivots, a sign per swap
        p = a[..., k:, k].abs().argmax(axis=-1) + k  # (...,)
        pk = p.unsqueeze(-1)
        order = (rows == k).where(pk, (rows == pk).where(k, rows))
        a = a.gather(-2, order.unsqueeze(-1).expand(*batch, n, n))
        pivot = a[..., k, k]
        result = result * (p != k).where(-pivot, pivot)
        if k + 1 < n:
            safe = (pivot == 0).where(1.0, pivot).cast(a.dtype)
            factors = a[..., k + 1 :, k] / safe.unsqueeze(-1)
            below = a[..., k + 1 :, :] - factors.unsqueeze(-1) * a[..., k : k + 1, :]
            a = a[..., : k + 1, :].cat(below, dim=-2)
    return result
