"""ONNX's losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) and the data-dependent selections
(Compress, ScatterND, ReverseSequence) as tiny tensor ops."""

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
