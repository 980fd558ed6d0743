"""ONNX's losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) as tiny tensor ops."""

from __future__ import annotations

import math

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, register
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
