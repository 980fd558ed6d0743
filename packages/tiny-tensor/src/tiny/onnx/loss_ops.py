"""ONNX's losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), the selections (Compress, ScatterND,
ReverseSequence, Unique) and AffineGrid as tiny tensor ops."""

from __future__ import annotations

import math

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, register
from tiny.onnx.ops import _axis, _wrapped
from tiny.tensor import Tensor

# ---------------------------------------------------------------- losses


def _nll(c: NodeCall, logp: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    """-logp[n, target[n, ...], ...] times the class's weight, reduced as the node says. A target equal to
    ignore_index contributes nothing, and mean divides by the weights of the targets not ignored."""
    reduction = c.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{c.where}: reduction must be none, sum or mean, got {reduction!r}")
    target = target.cast(dtypes.int64)
    ignore = c.attr("ignore_index")
    kept = target != ignore if ignore is not None else None
    safe = kept.where(target, 0) if kept is not None else target  # (an ignored target may be no class at all)
    picked = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = weight[safe] if weight is not None else None
    if kept is not None:
        w = kept.where(w if w is not None else 1.0, 0.0).cast(logp.dtype)
    loss = picked * w if w is not None else picked
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (w.sum() if w is not None else math.prod(loss.shape))


@register("NegativeLogLikelihoodLoss")
def nll_loss(c: NodeCall) -> Tensor:
    return _nll(c, c.tensor(0), c.tensor(1), c.opt(2))


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(c: NodeCall) -> Tensor | tuple[Tensor, Tensor]:
    logp = c.tensor(0).log_softmax(axis=1)
    loss = _nll(c, logp, c.tensor(1), c.opt(2))
    return (loss, logp) if c.n_outputs > 1 else loss


# ---------------------------------------------------------------- selections


@register("Compress")
def compress(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    keep = np.nonzero(c.host(1).reshape(-1))[0]  # (the output's size depends on the condition's values)
    axis = c.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim, c)
    keep = keep[keep < x.shape[axis]]
    if keep.size == 0:
        return Tensor.zeros(*x.shape[:axis], 0, *x.shape[axis + 1 :], dtype=x.dtype, device=c.device)
    index = Tensor(keep.astype(np.int64), device=c.device)
    return x[(slice(None),) * axis + (index,)]


@register("ScatterND")
def scatter_nd(c: NodeCall) -> Tensor:
    x, index, upd = c.tensor(0), c.tensor(1), c.tensor(2)
    k = index.shape[-1]
    rest = x.shape[k:]
    # the data as (places, *rest) and each update's place in it: its k indices in row-major order
    flat = None
    for j in range(k):
        part = _wrapped(index[..., j], x.shape[j]) * math.prod(x.shape[j + 1 : k])
        flat = part if flat is None else flat + part
    rows = x.reshape(math.prod(x.shape[:k]), *rest)
    n = math.prod(index.shape[:-1])
    where = flat.reshape(n, *([1] * len(rest))).expand(n, *rest)
    upd = upd.reshape(n, *rest)
    red = c.attr("reduction", "none")
    if red == "none":
        return rows.scatter(0, where, upd).reshape(x.shape)
    names = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
    if red not in names:
        raise ValueError(f"{c.where}: reduction must be one of none, add, mul, max, min, got {red!r}")
    return rows.scatter_reduce(0, where, upd, names[red], include_self=True).reshape(x.shape)


@register("ReverseSequence")
def reverse_sequence(c: NodeCall) -> Tensor:
    x, lengths = c.tensor(0), c.tensor(1).cast(dtypes.int64)
    batch_axis, time_axis = c.attr("batch_axis", 1), c.attr("time_axis", 0)
    steps = x.shape[time_axis]
    shape = [1] * x.ndim
    shape[time_axis] = steps
    t = Tensor.arange(steps, device=c.device).reshape(shape)
    shape = [1] * x.ndim
    shape[batch_axis] = x.shape[batch_axis]
    n = lengths.reshape(shape)
    source = (t < n).where(n - 1 - t, t).expand(x.shape)  # the first n steps reversed, the rest in place
    return x.gather(time_axis, source)


@register("Unique")
def unique(c: NodeCall) -> tuple[Tensor | np.ndarray, ...]:
    x = c.host(0)  # (the outputs' sizes depend on the values: computed on the host)
    axis = c.attr("axis")
    axis = _axis(axis, x.ndim, c) if axis is not None else None
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    if not c.attr("sorted", 1):  # in the order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    as_int64 = (first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64))
    given = c.value(0).tensor
    if given is not None and given.dtype == dtypes.bfloat16:  # (read back as float32: the values are exact)
        return (Tensor(values, device=c.device).cast(dtypes.bfloat16), *as_int64)
    return (values, *as_int64)


@register("AffineGrid")
def affine_grid(c: NodeCall) -> Tensor:
    theta = c.tensor(0)
    size = c.ints(1)
    spatial = size[2:]  # (H, W) or (D, H, W)
    if len(spatial) not in (2, 3):
        raise ValueError(f"{c.where}: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    align = c.attr("align_corners", 0)

    def positions(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        return (np.arange(n) * 2 + 1) / n - 1

    # homogeneous positions (x, y[, z], 1), x along the last dim: (prod(spatial), nd + 1)
    axes = np.meshgrid(*(positions(n) for n in spatial), indexing="ij")
    base = np.stack([*(a.reshape(-1) for a in reversed(axes)), np.ones(axes[0].size)], axis=-1)
    grid = Tensor(base.astype(np.float32), device=c.device).cast(theta.dtype) @ theta.transpose(1, 2)
    return grid.reshape(size[0], *spatial, len(spatial))
