"""Autograd on the Tensor: requires_grad, backward, gradient, detach, no_grad, and the train/eval switch."""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING

from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.gradient import compute_gradient, substitute_keeping_rules

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

# each buffer view that realize() made -> the graph it computed, so that gradients flow through realized values
ORIGINS: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


class _Switch:
    """A process-wide mode (no_grad, training) that _Mode sets for a block or a function."""

    def __init__(self, value: bool) -> None:
        self.value = value


class _Mode(contextlib.ContextDecorator):
    """Sets a switch inside a with-block, or for the calls of a function it decorates."""

    def __init__(self, switch: _Switch, value: bool) -> None:
        self.switch, self.target = switch, value
        self.saved: list[bool] = []

    def __enter__(self) -> None:
        self.saved.append(self.switch.value)
        self.switch.value = self.target

    def __exit__(self, *exc: object) -> None:
        self.switch.value = self.saved.pop()


NO_GRAD = _Switch(False)
TRAINING = _Switch(False)


class AutogradOps(TensorBase):
    __slots__ = ()

    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value and not self.dtype.is_float:
            raise TypeError(f"only float tensors can require gradients, this one is {self.dtype.name}")
        self._requires_grad = value
        if value:
            self.realize()  # a leaf gets memory of its own, so that later realizes never rename it

    @staticmethod
    def no_grad() -> _Mode:
        """`with Tensor.no_grad():` or `@Tensor.no_grad()`: ops record no path for gradients.

        >>> with Tensor.no_grad(): y = Tensor([1.0]) * 2
        """
        return _Mode(NO_GRAD, True)

    @staticmethod
    def train(mode: bool = True) -> _Mode:
        """`with Tensor.train():` or `@Tensor.train()`: dropout drops and batch norm uses batch statistics."""
        return _Mode(TRAINING, mode)

    @staticmethod
    def eval() -> _Mode:
        return _Mode(TRAINING, False)

    @staticmethod
    def is_training() -> bool:
        return TRAINING.value

    def detach(self) -> Tensor:
        """The same values, through which no gradient flows."""
        return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor | None]:
        """d(self)/d(target) for each target, as new tensors (None where self does not depend on it)."""
        seed = self._seed_gradient(gradient)
        root = _through_realized(self.uop, {t.uop for t in targets})
        grads = compute_gradient(root, seed.uop, [t.uop for t in targets])
        return [None if g is None else self._new(g) for g in grads]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d(self)/d(leaf) into .grad of every tensor with requires_grad that self depends on."""
        leaves = [t for t in type(self)._live if t.requires_grad]
        grads = self.gradient(*leaves, gradient=gradient)
        if all(g is None for g in grads):
            raise RuntimeError("backward(): this tensor does not depend on any tensor with requires_grad=True")
        for leaf, g in zip(leaves, grads):
            if g is not None:
                leaf.grad = g if leaf.grad is None else leaf.grad + g
        return self  # type: ignore[return-value]

    def _seed_gradient(self, gradient: Tensor | None) -> Tensor:
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward()/gradient() without a gradient needs a tensor with one element, this one has shape "
                    f"{self.shape}; pass gradient= of that shape"
                )
            return self.ones_like()
        if gradient.shape != self.shape:
            raise ValueError(f"gradient has shape {gradient.shape}, expected the tensor's shape {self.shape}")
        return gradient.cast(self.dtype)


def _through_realized(root: UOp, keep: set[UOp]) -> UOp:
    """root with every buffer that realize() made replaced by the graph that computed it (but the targets), and the
    buffers in those graphs likewise: each buffer's graph is expanded once and used wherever the buffer appears. A
    buffer met again inside its own graph (a write that read what it overwrote) stays a buffer there."""
    full: dict[UOp, UOp] = {}

    def expand(graph: UOp, inside: tuple[UOp, ...]) -> UOp:
        views = [u for u in graph.toposort if u in ORIGINS and u not in keep and u not in inside]
        for v in views:
            if v not in full:
                full[v] = expand(ORIGINS[v], (*inside, v))
        return substitute_keeping_rules(graph, {v: full[v] for v in views}) if views else graph

    return expand(root, ())


def record_origins(becomes: dict[UOp, UOp]) -> None:
    for node, view in becomes.items():
        if view not in ORIGINS:  # the first graph that computed a buffer is where its gradient comes from
            ORIGINS[view] = node


def no_grad_wrap(uop: UOp) -> UOp:
    return UOp(Ops.DETACH, uop.dtype, (uop,)) if NO_GRAD.value and uop.op is not Ops.DETACH else uop
