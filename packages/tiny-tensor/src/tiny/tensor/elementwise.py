"""Elementwise ops: arithmetic with broadcasting and PyTorch type promotion, comparisons, logic and bits, math
functions and activations.

Everything here is built from the primitive ops (ADD, MUL, EXP2, LOG2, SQRT, WHERE ...), so gradients come by
composition. Where a formula would overflow or divide by zero in the branch a WHERE does not take, that branch gets a
harmless input: a WHERE passes a zero gradient into the branch, and 0 * inf would still be NaN. The special functions
(atan, erf, tanh ...) are series and polynomial fits accurate to the precision they compute in (fits.py): float64's
own, float32's for float32 and for the half types, which compute in float32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tiny.ir.device import device_computes, new_buffer_view
from tiny.ir.dtypes import DType, dtypes, least_upper_dtype, to_dtype
from tiny.ir.multi import relayout, shard_bounds
from tiny.ir.schedule import data_view
from tiny.ir.uop import GroupOp, Ops, UOp, arg_key, make_node
from tiny.tensor.autograd import NO_GRAD, no_grad_wrap
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import check_dtype, default_int
from tiny.tensor.gradient import Grads, set_composite_rule
from tiny.tensor.shapes import broadcast_shape

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


_SCALARS: dict[tuple, UOp] = {}  # scalar operands broadcast to a shape (see _scalar)
_SCALARS_KEPT = 512
# the ops of the arithmetic operators, as globals (an Enum member is found through EnumType's __getattr__ hook on
# Python 3.11, ten times a global's cost: see tiny.ir.schedule.cache._BUFFER)
_ADD, _MUL, _FDIV, _NEG, _CMPLT, _CMPNE = Ops.ADD, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.CMPLT, Ops.CMPNE


def _expands(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether expand() takes `shape` to `to` (of as many dims) as it is: each size kept, or 1 made a size >= 0."""
    return all(type(t) is int and (s == t or (s == 1 and t >= 0)) for s, t in zip(shape, to))


def float32_math(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A composite math function computes in float32 at least and rounds once to the input's float dtype."""

    @functools.wraps(fn)
    def in_float32(self: ElementwiseOps, *args: Any, **kwargs: Any) -> Tensor:
        x = self._float_input()
        wide = x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x
        return fn(wide, *args, **kwargs).cast(x.dtype)

    return in_float32


def _pow_grads(
    tensor: type[Tensor],
    exponent: float | None,
    node: UOp,
    inputs: tuple[UOp, ...],
    g: UOp,
    needed: tuple[bool, ...],
) -> Grads:
    """PyTorch's derivatives of y = a ** b, edges included: b * a ** (b - 1) for the base, 0 where b = 0 (an infinite
    or NaN base too); y * log(a) for the exponent, 0 where a = 0 and b >= 0. NaN where a negative base meets a
    fraction, and the infinities of a power at 0. `exponent`: b as a Python number, whose a ** (b - 1) is then a
    power by a number too, as torch's (with its sqrt for 0.5). (The primitives' gradient gave 0 in each branch a
    where() did not take, and NaN from the products of 0 and inf between them.)"""
    a, b, grad = tensor(inputs[0]), tensor(inputs[1]), tensor(g)
    da = db = None
    if needed[0] and exponent is not None:
        da = grad * (exponent * a.pow(exponent - 1)) if exponent != 0 else grad.zeros_like()
    elif needed[0]:
        da = (b == 0).where(0.0, grad * (b * a.pow(b - 1)))
    if needed[1]:
        db = ((a == 0) & (b >= 0)).where(0.0, grad * (tensor(node) * a.log()))
    return (None if da is None else da.uop, None if db is None else db.uop)


def _per_device_inputs(node: UOp, inputs: tuple[UOp, ...]) -> list[tuple[UOp, ...]] | None:
    """The inputs of an elementwise composite op on several devices as each device's node was computed from them:
    where each input is replicated (sliced as the node is split: the very slices the op's rules made) or laid out as
    the node is; None where one was resharded (its parts then are not what the device computed from)."""
    cuts = shard_bounds(node)
    if any(i.arg is not None and (i.arg, shard_bounds(i)) != (node.arg, cuts) for i in inputs):
        return None
    return list(zip(*(relayout(i, node.arg, cuts) for i in inputs)))


class ElementwiseOps(TensorBase):
    __slots__ = ()

    def _alu(self, op: Ops, *others: Tensor, dtype: DType | None = None) -> Tensor:
        srcs = (self.uop, others[0].uop) if len(others) == 1 else (self.uop, *(o.uop for o in others))
        out_dtype = dtype or (dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype)
        node = make_node(UOp, op, out_dtype, srcs)  # (UOp(op, out_dtype, srcs): see make_node)
        node.take_shape_of(srcs[0])  # (its sources' shape and device: set here, not walked for by the properties)
        return self._new(node)

    def cast(self, dtype: DType | str) -> Tensor:
        """The values converted to another dtype (floats to ints round toward zero).

        >>> Tensor([1.7, -1.7]).cast("int32").tolist()
        [1, -1]
        """
        if dtype is self.uop.dtype:  # (dtypes are interned: the usual case, asked before any conversion)
            return self
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        check_dtype(self.device, dt)
        return self._new(UOp(Ops.CAST, dt, (self.uop,)))

    def bitcast(self, dtype: DType | str) -> Tensor:
        """The same bits read as another dtype of the same size; on DISK, of any size (the last dim scales).

        >>> Tensor([1.0]).bitcast("int32").tolist()
        [1065353216]
        """
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            if not device_computes(self.device):
                return self._new(_bitcast_memory(self.uop, dt))
            raise ValueError(
                f"bitcast needs dtypes of one size (any sizes on DISK); {self.dtype.name} is {self.dtype.itemsize} "
                f"bytes and {dt.name} is {dt.itemsize}"
            )
        check_dtype(self.device, dt)
        return self._new(UOp(Ops.BITCAST, dt, (self.uop,)))

    def _float_input(self) -> Tensor:
        """Math functions take ints and bools as the default float, like PyTorch."""
        return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def _broadcasted(self, other: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x, y = self, other
        if isinstance(y, TensorBase):
            if y.device != x.device:
                raise ValueError(f"tensors are on different devices: {x.device} and {y.device}; use .to()")
            dt = least_upper_dtype(x.dtype, y.dtype)
        elif isinstance(y, (bool, int, float)):  # (every op with a number: the dtype read once, no cast to itself)
            have = x.uop.dtype
            if isinstance(y, bool):
                dt = have
            elif isinstance(y, int):
                dt = have if not have.is_bool else default_int(x.device)
            else:
                dt = have if have.is_float else dtypes.default_float
            if dt is not have:
                x = x.cast(dt)
            y = self._scalar(y, dt)
            return (y, x) if reverse else (x, y)
        else:
            raise TypeError(f"unsupported operand type {type(y).__name__} for a Tensor op")
        x, y = x.cast(dt), y.cast(dt)
        shape = broadcast_shape(x.shape, y.shape)
        x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        return (y, x) if reverse else (x, y)

    def _scalar(self, value: Scalar, dtype: DType) -> Tensor:
        """A Python number as a tensor of `dtype` on this tensor's device, broadcast to its shape. Every op with a
        scalar operand makes one, and mostly the same few again (x + 1, x * 0.5): the nodes are kept by value, dtype,
        device, shape and no_grad mode (a few hundred at most), so that making one again is a dict lookup."""
        u = self.uop
        key = (arg_key(value), dtype, u.device, u.shape, NO_GRAD.value)
        if (node := _SCALARS.get(key)) is None:
            const = type(self)(value, device=self.device, dtype=dtype)
            node = const._broadcast_to(self.shape).uop
            if len(_SCALARS) >= _SCALARS_KEPT:
                _SCALARS.clear()
            _SCALARS[key] = node
        return self._operand(node)  # the very node: no_grad wrapped it (or not) when it was made

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        if type(shape) is not tuple or len(shape) < self.ndim or not _expands(padded, shape):
            return self.reshape(padded).expand(shape)  # which says what is wrong
        # the nodes reshape(padded).expand(shape) makes, without two tensors and their checks (every op with a scalar)
        u = self.uop
        if padded != self.shape:
            u = no_grad_wrap(UOp(Ops.RESHAPE, u.dtype, (u,), padded))
        return self._new(UOp(Ops.EXPAND, u.dtype, (u,), shape) if padded != shape else u)

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self + x, broadcast and promoted as in PyTorch.

        >>> Tensor([[1], [2]]).add(Tensor([10, 20])).tolist()
        [[11, 21], [12, 22]]
        """
        a, b = self._broadcasted(x, reverse)
        return a._alu(_ADD, b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self * x.

        >>> Tensor([1, 2]).mul(1.5).tolist()
        [1.5, 3.0]
        """
        a, b = self._broadcasted(x, reverse)
        return a._alu(_MUL, b)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self - x (x - self with reverse=True).

        >>> Tensor([5, 7]).sub(2).tolist()
        [3, 5]
        """
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            raise TypeError("subtracting bool tensors is not supported; use logical_xor or ^")
        return a._alu(_ADD, -b)

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (integers divide as floats), or with rounding_mode "trunc" (toward zero) or "floor"
        (down), which keep integers integers, as torch.div.

        >>> Tensor([1, -3]).div(2).tolist(), Tensor([1, -3]).div(2, rounding_mode="trunc").tolist()
        ([0.5, -1.5], [0, -1])
        """
        if rounding_mode is not None:
            return self._rounded_div(x, reverse, rounding_mode)  # type: ignore[attr-defined]
        a, b = self._broadcasted(x, reverse)
        a, b = a._float_input(), b._float_input()
        return a._alu(_FDIV, b)

    def floordiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Division rounded down, as Python's //.

        >>> Tensor([7, -7]).floordiv(2).tolist()
        [3, -4]
        """
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:  # as Python's float //: from the exact remainder, so that a == b*(a//b) + a%b
            r = a._alu(Ops.MOD, b)
            q = (a - r) / b
            q = ((r != 0) & ((r < 0) ^ (b < 0))).where(q - 1, q)
            fq = q.floor()
            return (b == 0).where(a / b, (q - fq > 0.5).where(fq + 1, fq))
        q = a._alu(Ops.IDIV, b)
        if a.dtype.is_unsigned:
            return q
        inexact = a._alu(Ops.MOD, b) != 0
        return q - (inexact & ((a < 0) ^ (b < 0))).cast(q.dtype)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor, as Python and torch.remainder.

        >>> Tensor([7, -7]).mod(3).tolist()
        [1, 2]
        """
        a, b = self._broadcasted(x, reverse)
        r = a._alu(Ops.MOD, b)  # C's remainder (fmod for floats): the sign of the dividend, exact
        if a.dtype.is_unsigned or a.dtype.is_bool:
            return r
        return ((r != 0) & ((r < 0) ^ (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self ** x. Integers stay integers (wrapping like PyTorch); floats follow C's pow at every edge (0, +-inf,
        NaN, negative bases), and their gradients are PyTorch's (see _pow_grads).

        >>> Tensor([2.0, -2.0]).pow(3).tolist()
        [8.0, -8.0]
        """
        small_int = isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 8
        if not reverse and small_int and self.dtype.is_float:
            out = self
            for _ in range(x - 1):  # exact for small powers, as x*x is
                out = out * self
            return out
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            a, b = a.cast(default_int(a.device)), b.cast(default_int(a.device))
        if a.dtype.is_int:
            return a._int_pow(b, x if not reverse and isinstance(x, int) else None)
        exponent = x if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool) else None
        out = a._float_pow(b, exponent)
        rule = functools.partial(_pow_grads, type(self), exponent)
        if out.uop.op is not Ops.MULTI:
            set_composite_rule(out.uop, (a.uop, b.uop), rule)
        elif (parts := _per_device_inputs(out.uop, (a.uop, b.uop))) is not None:  # each device's power, its own rule
            for node, inputs in zip(out.uop.src, parts):
                set_composite_rule(node, inputs, rule)
        return out

    def _float_pow(self, b: Tensor, exponent: float | None) -> Tensor:
        """self ** b for floats of one shape, as C's pow: |self| ** b as exp2(b * log2|self|), its sign from an odd
        integer b, NaN for a finite negative base to a fraction, and 1 for b = 0, a base of 1, and -1 to +-inf.
        `exponent`: b as a Python number; torch computes 0.5 and -0.5 as sqrt and 1/sqrt (NaN for every negative
        base, -inf too; 1/sqrt(-0) is -inf), and so does this."""
        a = self
        mag = (b * a.abs().log2()).exp2()
        signed = (a < 0) | (a.reciprocal() < 0)  # -0 too: (-0) ** -1 is -inf
        if exponent in (0.5, -0.5):
            out = (a < 0).where(math.nan, signed.where(-mag, mag))  # (-0 alone is signed and not < 0)
        else:
            whole = b.trunc() == b  # (+-inf too)
            odd = whole & ((b.abs() % 2) == 1)
            out = (odd & signed).where(-mag, mag)
            out = ((a < 0) & (a != -math.inf) & whole.logical_not()).where(math.nan, out)
        one = (b == 0) | (a == 1) | ((a == -1) & b.isinf())
        return one.where(1.0, out).cast(a.dtype)

    def _int_pow(self, e: Tensor, scalar: int | None) -> Tensor:
        """Integer power by squaring, over the bits of the exponent; negative exponents as PyTorch."""
        if scalar is not None:
            if scalar < 0:
                raise ValueError(f"integers to negative integer powers are not allowed, got exponent {scalar}")
            out, base = self.ones_like(), self
            while scalar:
                if scalar & 1:
                    out = out * base
                base, scalar = base * base, scalar >> 1
            return out
        out, base = self.ones_like(), self
        for bit in range(self.dtype.bits - (0 if self.dtype.is_unsigned else 1)):
            out = ((e >> bit) & 1).cast(dtypes.bool).where(out * base, out)
            base = base * base
        if self.dtype.is_unsigned:
            return out
        odd = (e & 1).cast(dtypes.bool)
        negative = (self == 1).where(1, (self == -1).where(odd.where(-1, 1), 0)).cast(self.dtype)
        return (e < 0).where(negative, out)

    def __neg__(self) -> Tensor:
        if self.dtype.is_bool:
            raise TypeError("negating a bool tensor is not supported; use logical_not or ~")
        return self._alu(_NEG)

    __add__ = add
    __mul__ = mul
    __sub__ = sub
    __truediv__ = div
    __floordiv__ = floordiv
    __mod__ = mod
    __pow__ = pow

    def __radd__(self, x: Scalar) -> Tensor:
        return self.add(x, True)

    def __rmul__(self, x: Scalar) -> Tensor:
        return self.mul(x, True)

    def __rsub__(self, x: Scalar) -> Tensor:
        return self.sub(x, True)

    def __rtruediv__(self, x: Scalar) -> Tensor:
        return self.div(x, True)

    def __rfloordiv__(self, x: Scalar) -> Tensor:
        return self.floordiv(x, True)

    def __rmod__(self, x: Scalar) -> Tensor:
        return self.mod(x, True)

    def __rpow__(self, x: Scalar) -> Tensor:
        return self.pow(x, True)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self, x: Tensor) -> Tensor:
        return type(self)(x, device=self.device).matmul(self) if not isinstance(x, TensorBase) else x.matmul(self)

    # comparisons and logic
    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._alu(_CMPLT, b)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x, True)
        return a._alu(_CMPLT, b)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x, True)
        if not a.dtype.is_float:  # (one comparison: for numbers that are not floats, none is NaN)
            return a._alu(_CMPLT, b).logical_not()
        return (self < x) | (self == x)

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        if not a.dtype.is_float:
            return a._alu(_CMPLT, b).logical_not()
        return (self > x) | (self == x)

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return (self != x).logical_not()

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        a, b = self._broadcasted(x)
        return a._alu(_CMPNE, b)

    __hash__ = object.__hash__

    def _bitwise(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            raise TypeError(f"bitwise ops take integer or bool tensors, got {a.dtype.name}")
        return a._alu(op, b)

    def __and__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.AND, x)

    def __or__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.OR, x)

    def __xor__(self, x: Tensor | Scalar) -> Tensor:
        return self._bitwise(Ops.XOR, x)

    def __rand__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.AND, x, True)

    def __ror__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.OR, x, True)

    def __rxor__(self, x: Scalar) -> Tensor:
        return self._bitwise(Ops.XOR, x, True)

    def __lshift__(self, x: int) -> Tensor:
        return self._bitwise(Ops.SHL, x)

    def __rshift__(self, x: int) -> Tensor:
        return self._bitwise(Ops.SHR, x)

    def __invert__(self) -> Tensor:
        if self.dtype.is_float:
            raise TypeError(f"~ takes integer or bool tensors, got {self.dtype.name}")
        return self.logical_not() if self.dtype.is_bool else self ^ -1

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """x where this (bool) tensor is true, else y.

        >>> Tensor([True, False]).where(1.0, Tensor([5.0, 6.0])).tolist()
        [1.0, 6.0]
        """
        cond = self.cast(dtypes.bool)
        if not isinstance(x, TensorBase) and isinstance(y, TensorBase):
            y_, x_ = y._broadcasted(x)
        elif isinstance(x, TensorBase):
            x_, y_ = x._broadcasted(y)
        else:
            x_, y_ = type(self)(x, device=self.device)._broadcasted(y)
        if len({cond.device, x_.device, y_.device}) > 1:
            raise ValueError(
                f"where() got tensors on different devices: condition on {cond.device}, x on {x_.device}, "
                f"y on {y_.device}; use .to()"
            )
        shape = broadcast_shape(cond.shape, x_.shape)
        cond, x_, y_ = cond._broadcast_to(shape), x_._broadcast_to(shape), y_._broadcast_to(shape)
        return self._new(UOp(Ops.WHERE, x_.dtype, (cond.uop, x_.uop, y_.uop)))

    def _order_flip(self) -> Tensor:
        """An order-reversing bijection, so that min(x) = flip(max(flip(x)))."""
        if self.dtype.is_float:
            return -self
        return self.logical_not() if self.dtype.is_bool else self ^ -1

    # ---- logic and bits, by name

    def logical_and(self, x: Tensor | Scalar) -> Tensor:
        """True where both are nonzero; any dtypes, a bool result.

        >>> Tensor([0.0, 1.0, 2.0]).logical_and(Tensor([1, 1, 0])).tolist()
        [False, True, False]
        """
        return self._logical(Ops.AND, x)

    def logical_or(self, x: Tensor | Scalar) -> Tensor:
        """True where either is nonzero.

        >>> Tensor([0, 0, 3]).logical_or(Tensor([0, 1, 0])).tolist()
        [False, True, True]
        """
        return self._logical(Ops.OR, x)

    def logical_xor(self, x: Tensor | Scalar) -> Tensor:
        """True where exactly one is nonzero.

        >>> Tensor([0, 1, 1]).logical_xor(Tensor([0, 0, 2])).tolist()
        [False, True, False]
        """
        return self._logical(Ops.XOR, x)

    def logical_not(self) -> Tensor:
        """True where zero.

        >>> Tensor([0.0, 2.0]).logical_not().tolist()
        [True, False]
        """
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, type(self)(True, device=self.device)._broadcast_to(self.shape))

    def _logical(self, op: Ops, x: Tensor | Scalar) -> Tensor:
        other = x if isinstance(x, TensorBase) else type(self)(x, device=self.device)
        return self.cast(dtypes.bool)._bitwise(op, other.cast(dtypes.bool))

    def bitwise_and(self, x: Tensor | Scalar) -> Tensor:
        """Bitwise and of integers (logical and of bools), as `&`.

        >>> Tensor([12, 10]).bitwise_and(6).tolist()
        [4, 2]
        """
        return self._bitwise(Ops.AND, x)

    def bitwise_or(self, x: Tensor | Scalar) -> Tensor:
        """Bitwise or, as `|`.

        >>> Tensor([12, 10]).bitwise_or(1).tolist()
        [13, 11]
        """
        return self._bitwise(Ops.OR, x)

    def bitwise_xor(self, x: Tensor | Scalar) -> Tensor:
        """Bitwise exclusive or, as `^`.

        >>> Tensor([12, 10]).bitwise_xor(6).tolist()
        [10, 12]
        """
        return self._bitwise(Ops.XOR, x)

    def dot4(self, x: Tensor | int) -> Tensor:
        """Each int32 taken as four bytes: the sum of the products of self's bytes, unsigned (0..255), and x's,
        signed (-128..127), as int32 -- x86's vpdpbusd and CUDA's __dp4a; the int8 arithmetic of a quantized product.

        >>> Tensor([0x01020304], dtype="int32").dot4(Tensor([0x01FF0102], dtype="int32")).tolist()
        [10]
        """
        other = x.dtype.name if isinstance(x, TensorBase) else type(x).__name__
        if self.dtype != dtypes.int32 or other not in ("int32", "int"):
            raise TypeError(f"dot4 takes int32 tensors (four bytes each), got {self.dtype.name} and {other}")
        a, b = self._broadcasted(x)
        return a._alu(Ops.DOT4, b)

    def bitwise_not(self) -> Tensor:
        """Every bit flipped (logical not of bools), as `~`.

        >>> Tensor([0, 5, -1]).bitwise_not().tolist()
        [-1, -6, 0]
        """
        return ~self

    def bitwise_left_shift(self, x: Tensor | int) -> Tensor:
        """Integers shifted left by x bits, as `<<`.

        >>> Tensor([1, 3]).bitwise_left_shift(2).tolist()
        [4, 12]
        """
        return self._bitwise(Ops.SHL, x)

    def bitwise_right_shift(self, x: Tensor | int) -> Tensor:
        """Integers shifted right by x bits (arithmetic for signed types), as `>>`.

        >>> Tensor([16, -16]).bitwise_right_shift(2).tolist()
        [4, -4]
        """
        return self._bitwise(Ops.SHR, x)


def _bitcast_memory(u: UOp, dt: DType) -> UOp:
    """A tensor of a device that only holds data (DISK), its bytes read as `dt`: the last dim scales by the ratio
    of the item sizes. No kernel: the result is a view of the same memory."""
    shape = u.shape or (1,)
    last = shape[-1] * u.dtype.itemsize
    if last % dt.itemsize:
        raise ValueError(
            f"bitcast from {u.dtype.name} to {dt.name} needs a last dim of a whole number of {dt.name} items; "
            f"the last dim holds {last} bytes"
        )
    viewed = data_view(u)  # ValueError unless u is one contiguous range
    base = viewed.source
    out = new_buffer_view(base, base.shape[0] * u.dtype.itemsize // dt.itemsize, dt, 0)
    return UOp(Ops.RESHAPE, dt, (out,), (*shape[:-1], last // dt.itemsize))
