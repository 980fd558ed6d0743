"""Writing into a tensor's memory: assign, __setitem__, the in-place operators (+=, -= ...) and PyTorch's in-place
methods (add_, zero_, copy_ ...). Every view of the same buffer sees the write."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiny.ir.multi import multi, relayout, shard_bounds
from tiny.ir.schedule import is_memory, is_realized, memory_of
from tiny.ir.uop import GroupOp, Ops, UOp, substitute
from tiny.tensor.autograd import NO_GRAD
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int
from tiny.tensor.gradient import compute_gradient
from tiny.tensor.shapes import broadcast_shape

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class InplaceOps(TensorBase):
    __slots__ = ()

    def assign(self, value: Tensor | Scalar) -> Tensor:
        """Overwrite this tensor's values in place (in its buffer, seen by every view of it).

        >>> t = Tensor([1.0, 2.0]); t.assign(Tensor([3.0, 4.0])).tolist()
        [3.0, 4.0]

        A leaf with requires_grad can be written only under no_grad (an optimizer's step), as in PyTorch.
        """
        if self.requires_grad and not NO_GRAD.value:
            raise RuntimeError(
                "a leaf tensor that requires grad cannot be written in place outside Tensor.no_grad() (PyTorch refuses "
                "it too); write it inside `with Tensor.no_grad():`, or into .detach()"
            )
        v = value if isinstance(value, TensorBase) else type(self)(value, device=self.device, dtype=self.dtype)
        if v.device != self.device:
            raise ValueError(f"assign() of a tensor on {v.device} into one on {self.device}; use .to()")
        v = _fitted(v, self.shape, "the tensor").cast(self.dtype)
        if self.uop.op is Ops.MULTI:
            return self._assign_parts(v)
        self._into_memory()
        _settle_readers([self], [v])
        type(self)(UOp(Ops.ASSIGN, self.dtype, (self.uop, v.uop))).realize()
        return self  # type: ignore[return-value]

    def _into_memory(self) -> None:
        """This tensor as memory, or a view of memory, that a write can go into (computed first where it is not)."""
        target = _undetached(self.uop)  # (under no_grad a slice of memory is still a view of it: t[i:j] = x writes t)
        if target is not self.uop and is_memory(target):
            self.uop = target
        if not is_memory(self.uop):  # what a view views is computed into memory (not a copy of the view: the write
            base = _viewed(self.uop)  # must reach every tensor of that value and every view of it)
            (self if base is None else type(self)(base)).realize()
        _, path = memory_of(self.uop)
        if any(m.op in (Ops.EXPAND, Ops.PAD) for m in path):
            raise RuntimeError("cannot write through an expanded or padded view: several elements share memory")

    def _assign_parts(self, v: TensorBase) -> Tensor:
        """assign() into a tensor on several devices: each device's part written where it lies, all in one realize
        (the value laid out as this tensor is: sliced where it is replicated, gathered where it is split otherwise)."""
        if not all(is_memory(part) for part in self.uop.src):
            self.realize()
        for part in self.uop.src:
            if any(m.op in (Ops.EXPAND, Ops.PAD) for m in memory_of(part)[1]):
                raise RuntimeError("cannot write through an expanded or padded view: several elements share memory")
        values = relayout(v.uop, self.uop.arg, shard_bounds(self.uop))
        for part, value in zip(self.uop.src, values):
            _settle_readers([self._operand(part)], [self._operand(value)])
        writes = [UOp(Ops.ASSIGN, self.dtype, (part, value)) for part, value in zip(self.uop.src, values)]
        type(self)(multi(writes, self.uop.arg)).realize()
        return self  # type: ignore[return-value]

    def __setitem__(self, index: Any, value: Tensor | Scalar) -> None:
        """t[index] = value, for every index __getitem__ takes (slices with steps, ints, None, ..., tensors)."""
        part = self[index]
        v = value if isinstance(value, TensorBase) else type(self)(value, device=self.device, dtype=self.dtype)
        if v.device != self.device:
            raise ValueError(f"setting values from a tensor on {v.device} into one on {self.device}; use .to()")
        if _basic(index) and is_memory(self.uop) and not self.requires_grad and not _on_path(self, v):
            part.assign(v)  # a view of memory: written where it lies, the rest untouched (a KV cache's new row)
            return
        work = self.dtype if self.dtype.is_float else default_int(self.device)  # exact for integers and bools
        v = _fitted(v, part.shape, "the selection").cast(self.dtype).cast(work)
        # where the selected elements sit in self: the gradient of the selection, seeded with the values (and 1s)
        placed, hits = (compute_gradient(part.uop, seed.uop, [self.uop])[0] for seed in (v, part.ones_like(work)))
        assert placed is not None and hits is not None
        placed_t, hits_t = self._new(placed), self._new(hits)
        # an element chosen twice (repeated tensor indices) takes the mean of its values
        share = placed_t / hits_t.maximum(1) if work.is_float else placed_t // hits_t.maximum(1)
        written = (hits_t > 0).where(share.cast(self.dtype), self)
        if self._on_gradient_path() or written._on_gradient_path():  # type: ignore[attr-defined]
            self._inplace("[]=", written, instead="x = x.where(mask, values)")  # lazily, with its gradient
        else:
            self.assign(written)

    def _inplace(self, op: str, result: Tensor, instead: str | None = None) -> Tensor:
        """x op= y: the result written into x (in its buffer, as assign() does), or, where a gradient flows into
        x's graph (x computed from a leaf with requires_grad), x made the result's value so that the gradient flows
        through it as in PyTorch. A leaf with requires_grad is refused outside no_grad, and a result PyTorch would
        not cast back into x's dtype (a float into an int tensor, a number into a bool one) is a TypeError.
        `instead` is the out-of-place form the refusal suggests (for an operator, `x = x + y`)."""
        if self.requires_grad and not NO_GRAD.value:
            instead = instead or f"x = x {op[:-1]} y"
            raise RuntimeError(
                f"{op}: a leaf tensor that requires grad cannot be changed in place outside Tensor.no_grad() (PyTorch "
                f"refuses it too); write `{instead}` for a new tensor, or do it inside `with Tensor.no_grad():`"
            )
        if (result.dtype.is_float and not self.dtype.is_float) or (self.dtype.is_bool and not result.dtype.is_bool):
            raise TypeError(
                f"{op}: the result is {result.dtype.name} and cannot be written into this {self.dtype.name} tensor"
            )
        if result.shape != self.shape:
            raise ValueError(
                f"{op}: the result has shape {result.shape}, which does not fit this tensor's {self.shape}"
            )
        # (also where x holds no gradient path but what is written into it does: x.add_(w), w a leaf with requires_grad)
        if self._on_gradient_path() or result._on_gradient_path():  # type: ignore[attr-defined]
            # x takes the result as its value, and so does what x views where x lies in it: every tensor of that value
            # and every view of it (taken before) follow, values and gradient alike, as in PyTorch
            value, base = result.cast(self.dtype).uop, _viewed(self.uop)
            if base is None:
                base = self.uop
            else:
                value = _placed(self, base, value)
            _views_follow(type(self), base, value)
            return self  # type: ignore[return-value]
        return self.assign(result)

    def __iadd__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("+=", self + x)  # type: ignore[operator]

    def __isub__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("-=", self - x)  # type: ignore[operator]

    def __imul__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("*=", self * x)  # type: ignore[operator]

    def __itruediv__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("/=", self / x)  # type: ignore[operator]

    def __ifloordiv__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("//=", self // x)  # type: ignore[operator]

    def __imod__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("%=", self % x)  # type: ignore[operator]

    def __ipow__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("**=", self**x)  # type: ignore[operator]

    def __iand__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("&=", self & x)  # type: ignore[operator]

    def __ior__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("|=", self | x)  # type: ignore[operator]

    def __ixor__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("^=", self ^ x)  # type: ignore[operator]

    def __ilshift__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace("<<=", self << x)  # type: ignore[operator]

    def __irshift__(self, x: Tensor | Scalar) -> Tensor:
        return self._inplace(">>=", self >> x)  # type: ignore[operator]

    # ---- PyTorch's in-place methods: the same write as the operators, and they return the tensor

    def add_(self, x: Tensor | Scalar, alpha: Scalar = 1) -> Tensor:
        """self += alpha * x, in place; returns self.

        >>> t = Tensor([1.0, 2.0]); t.add_(Tensor([1.0, 1.0]), alpha=2).tolist()
        [3.0, 4.0]
        """
        return self._inplace("add_", self + (x if alpha == 1 else x * alpha), "x = x.add(y)")  # type: ignore[operator]

    def sub_(self, x: Tensor | Scalar, alpha: Scalar = 1) -> Tensor:
        """self -= alpha * x, in place; returns self.

        >>> t = Tensor([5, 7]); t.sub_(2).tolist()
        [3, 5]
        """
        return self._inplace("sub_", self - (x if alpha == 1 else x * alpha), "x = x.sub(y)")  # type: ignore[operator]

    def mul_(self, x: Tensor | Scalar) -> Tensor:
        """self *= x, in place; returns self.

        >>> t = Tensor([1.0, 2.0]); t.mul_(3).tolist()
        [3.0, 6.0]
        """
        return self._inplace("mul_", self * x, "x = x.mul(y)")  # type: ignore[operator]

    def div_(self, x: Tensor | Scalar, rounding_mode: str | None = None) -> Tensor:
        """self /= x in place (rounding_mode "trunc" or "floor" as div, which keeps integers integers); returns self.

        >>> t = Tensor([3.0, 5.0]); t.div_(2).tolist()
        [1.5, 2.5]
        """
        result = self.div(x, rounding_mode=rounding_mode)  # type: ignore[attr-defined]
        return self._inplace("div_", result, "x = x.div(y)")

    def clamp_(self, min: Tensor | Scalar | None = None, max: Tensor | Scalar | None = None) -> Tensor:  # noqa: A002
        """self clamped to [min, max] in place; returns self.

        >>> t = Tensor([-2.0, 0.5, 3.0]); t.clamp_(-1, 1).tolist()
        [-1.0, 0.5, 1.0]
        """
        return self._inplace("clamp_", self.clamp(min, max), "x = x.clamp(lo, hi)")  # type: ignore[attr-defined]

    clip_ = clamp_

    def zero_(self) -> Tensor:
        """Every element set to 0 in place; returns self.

        >>> t = Tensor([1.0, 2.0]); t.zero_().tolist()
        [0.0, 0.0]
        """
        return self._inplace("zero_", self.full_like(0), "x = x.zeros_like()")  # type: ignore[attr-defined]

    def fill_(self, value: Tensor | Scalar) -> Tensor:
        """Every element set to value (a number or a 0-d tensor, cast to this tensor's dtype) in place; returns self.

        >>> t = Tensor([1, 2, 3]); t.fill_(7).tolist()
        [7, 7, 7]
        """
        if isinstance(value, TensorBase):
            if value.ndim:
                raise ValueError(f"fill_() takes a number or a 0-d tensor, got a tensor of shape {value.shape}")
            if value.device != self.device:
                raise ValueError(f"fill_() with a tensor on {value.device} into one on {self.device}; use .to()")
            result = value.cast(self.dtype)._broadcast_to(self.shape)  # type: ignore[attr-defined]
        else:
            result = self.full_like(value)  # type: ignore[attr-defined]
        return self._inplace("fill_", result, "x = x.full_like(v)")

    def copy_(self, src: Tensor) -> Tensor:
        """src's values written into this tensor in place: broadcast to its shape, cast to its dtype (a float into an
        int tensor too, as PyTorch's copy_) and moved to its device; returns self.

        >>> t = Tensor([0, 0]); t.copy_(Tensor([1.7, -2.2])).tolist()
        [1, -2]
        """
        if not isinstance(src, TensorBase):
            raise TypeError(f"copy_() takes a Tensor, got {type(src).__name__}")
        v = _fitted(src.to(self.device), self.shape, "the tensor").cast(self.dtype)  # type: ignore[attr-defined]
        return self._inplace("copy_", v, "x = src.clone()")

    def uniform_(self, from_: float = 0.0, to: float = 1.0) -> Tensor:
        """Uniform samples in [from_, to) written in place (a float tensor); returns self.

        >>> t = Tensor.zeros(100); t.uniform_(-2, 2).min().item() >= -2
        True
        """
        sample = type(self).uniform(  # type: ignore[attr-defined]
            *self.shape, low=from_, high=to, dtype=self.dtype, device=self.device
        )
        return self._inplace("uniform_", sample, "x = Tensor.uniform(*x.shape, low=a, high=b)")

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
        """Normal samples with the given mean and standard deviation written in place (a float tensor); returns self.

        >>> t = Tensor.zeros(2, 3); t.normal_(1.0, 0.5).shape
        (2, 3)
        """
        sample = type(self).normal(  # type: ignore[attr-defined]
            *self.shape, mean=mean, std=std, dtype=self.dtype, device=self.device
        )
        return self._inplace("normal_", sample, "x = Tensor.normal(*x.shape, mean=m, std=s)")


def _fitted(v: TensorBase, shape: tuple[int, ...], what: str) -> Any:
    """v broadcast to shape, or a ValueError that names both shapes."""
    try:
        out_shape = broadcast_shape(v.shape, shape)
    except ValueError:
        out_shape = None
    if out_shape != shape:
        raise ValueError(f"a value of shape {v.shape} does not broadcast to {what}'s shape {shape}")
    return v._broadcast_to(shape)  # type: ignore[attr-defined]


def _basic(index: Any) -> bool:
    """An index of views alone: ints, slices of ints or sizes, None, Ellipsis and sizes (bound Variables)."""
    items = index if isinstance(index, tuple) else (index,)
    for i in items:
        if isinstance(i, slice):
            if not all(
                x is None or (isinstance(x, (int, UOp)) and not isinstance(x, bool)) for x in (i.start, i.stop, i.step)
            ):
                return False
        elif not (i is None or i is Ellipsis or isinstance(i, UOp) or (isinstance(i, int) and not isinstance(i, bool))):
            return False
    return True


def _on_path(target: TensorBase, value: TensorBase) -> bool:
    return target._on_gradient_path() or value._on_gradient_path()  # type: ignore[attr-defined]


def _undetached(u: UOp) -> UOp:
    """u without the DETACHes that no_grad puts over each op's result, in its chain of movement ops: a view of memory
    made under no_grad, as the view itself."""
    if u.op is Ops.DETACH:
        return _undetached(u.source)
    if u.op in GroupOp.Movement:
        src = _undetached(u.source)
        return u if src is u.source else u.replace(src=(src, *u.src[1:]))
    return u


def _viewed(u: UOp) -> UOp | None:
    """What a view views: the node under u's movement ops; None where u is no view (no movement op), or where one of
    them expands or pads (several elements, or none, of that node at one place: a broadcast zeros(3) is no view)."""
    if u.op not in GroupOp.Movement:
        return None
    while u.op in GroupOp.Movement:
        if u.op in (Ops.EXPAND, Ops.PAD):
            return None
        u = u.source
    return u


def _placed(view: TensorBase, base: UOp, value: UOp) -> UOp:
    """base with `value` where `view` lies in it: the view's movement ops taken back (their gradient, seeded with the
    values, and with ones to find where the view lies)."""
    seeds = (value, view.ones_like(view.dtype).uop)  # type: ignore[attr-defined]
    placed, hits = (view._new(compute_gradient(view.uop, seed, [base])[0]) for seed in seeds)  # type: ignore[attr-defined]
    return (hits > 0).where(placed, view._new(base)).uop


def _views_follow(cls: type, old: UOp, new: UOp) -> None:
    """Every live tensor whose value is `old`, or a view of it (slices, transposes, reshapes taken before: movement ops
    over it), now is `new`, or that view of it, as a PyTorch view of a tensor changed in place is."""
    mapping = {old: new}
    for t in cls._live.alive():  # type: ignore[attr-defined]
        u = t.uop
        while u.op in GroupOp.Movement and u is not old:
            u = u.source
        if u is old:
            was_memory = is_realized(t.uop)
            t.uop = substitute(t.uop, mapping)
            if was_memory:  # listed among the pending tensors again: it has work pending now
                cls._pending.add(t)  # type: ignore[attr-defined]


def assign_together(*writes: tuple[TensorBase, TensorBase]) -> None:
    """`target.assign(value)` for each (target, value), in one realize: one schedule, and one look for the tensors that
    must read the memory before it changes, where there were one of each per write (a language model's keys and
    values into their caches: a prompt's pass over 16 layers realized 35 times, now 19). Each value is fitted and
    cast as assign() does. Writes that one schedule cannot order as assign() each would (a value reading another
    write's memory, two writes into one buffer, a tensor on several devices) are done one after another instead."""
    targets, values = [], []
    for target, value in writes:
        v = value if isinstance(value, TensorBase) else type(target)(value, device=target.device, dtype=target.dtype)
        if v.device != target.device:
            raise ValueError(f"assign() of a tensor on {v.device} into one on {target.device}; use .to()")
        targets.append(target)
        values.append(_fitted(v, target.shape, "the tensor").cast(target.dtype))
    if any(t.uop.op is Ops.MULTI or t.requires_grad for t in targets):
        for t, v in zip(targets, values):  # (assign's own checks and its writes on each device)
            t.assign(v)
        return
    for t in targets:
        t._into_memory()
    bases = [memory_of(t.uop)[0] for t in targets]
    if len(set(bases)) < len(bases) or any(b in v.uop.toposort for v in values for b in bases):
        for t, v in zip(targets, values):
            t.assign(v)
        return
    _settle_readers(targets, values)
    writes_done = [type(t)(UOp(Ops.ASSIGN, t.dtype, (t.uop, v.uop))) for t, v in zip(targets, values)]
    writes_done[0].realize(*writes_done[1:])


def _settle_readers(targets: list[TensorBase], values: list[TensorBase]) -> None:
    """Compute now every pending tensor that reads the targets' memory, so that it sees the values from before the
    writes (not the values written, nor the targets)."""
    bases = {memory_of(t.uop)[0] for t in targets}
    written = {v.uop for v in values}
    pending = [
        t
        for t in type(targets[0])._pending.alive()
        if not is_memory(t.uop)
        and t.uop not in written
        and all(t is not x for x in targets)
        and not bases.isdisjoint(t.uop.toposort)
    ]
    if pending:
        pending[0].realize(*pending[1:])
