"""Elementwise ops: arithmetic with broadcasting and PyTorch type promotion, comparisons, logic, math."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tiny.ir.dtypes import DType, dtypes, least_upper_dtype, to_dtype
from tiny.ir.uop import GroupOp, Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import check_dtype
from tiny.tensor.shapes import broadcast_shape

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

Scalar = int | float | bool


class ElementwiseOps(TensorBase):
    __slots__ = ()

    def _alu(self, op: Ops, *others: Tensor, dtype: DType | None = None) -> Tensor:
        srcs = (self.uop, *(o.uop for o in others))
        out_dtype = dtype or (dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype)
        return self._new(UOp(op, out_dtype, srcs))

    def cast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        check_dtype(self.device, dt)
        return self._new(UOp(Ops.CAST, dt, (self.uop,)))

    def bitcast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise ValueError(
                f"bitcast needs dtypes of one size; {self.dtype.name} is {self.dtype.itemsize} bytes "
                f"and {dt.name} is {dt.itemsize}"
            )
        check_dtype(self.device, dt)
        return self._new(UOp(Ops.BITCAST, dt, (self.uop,)))

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def _float_input(self) -> Tensor:
        """Math functions take ints and bools as the default float, like PyTorch."""
        return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def _broadcasted(self, other: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x, y = self, other
        if isinstance(y, TensorBase):
            if y.device != x.device:
                raise ValueError(f"tensors are on different devices: {x.device} and {y.device}; use .to()")
            dt = least_upper_dtype(x.dtype, y.dtype)
        elif isinstance(y, (bool, int, float)):
            if isinstance(y, bool):
                dt = x.dtype
            elif isinstance(y, int):
                dt = x.dtype if not x.dtype.is_bool else dtypes.default_int
            else:
                dt = x.dtype if x.dtype.is_float else dtypes.default_float
            y = type(self)(y, device=x.device, dtype=dt)
        else:
            raise TypeError(f"unsupported operand type {type(y).__name__} for a Tensor op")
        x, y = x.cast(dt), y.cast(dt)
        shape = broadcast_shape(x.shape, y.shape)
        x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        return (y, x) if reverse else (x, y)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        return self.reshape(padded).expand(shape)

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.MUL, b)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            raise TypeError("subtracting bool tensors is not supported; use logical_xor or ^")
        return a._alu(Ops.ADD, -b)

    def div(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """True division; integers divide as floats."""
        a, b = self._broadcasted(x, reverse)
        a, b = a._float_input(), b._float_input()
        return a._alu(Ops.FDIV, b)

    def floordiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
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
        """Remainder with the sign of the divisor, as Python and torch.remainder."""
        a, b = self._broadcasted(x, reverse)
        r = a._alu(Ops.MOD, b)  # C's remainder (fmod for floats): the sign of the dividend, exact
        if a.dtype.is_unsigned or a.dtype.is_bool:
            return r
        return ((r != 0) & ((r < 0) ^ (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self ** x. Integers stay integers (wrapping like PyTorch); floats follow IEEE pow's signs."""
        small_int = isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 8
        if not reverse and small_int and self.dtype.is_float:
            out = self.ones_like()
            for _ in range(x):  # exact for small powers, as x*x is
                out = out * self
            return out
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if a.dtype.is_int:
            return a._int_pow(b, x if not reverse and isinstance(x, int) else None)
        mag = (b * a.abs().log2()).exp2()
        b_int = b.trunc() == b
        b_odd = b_int & ((b.abs() % 2) == 1)
        neg = a < 0
        out = neg.where(b_int.where(b_odd.where(-mag, mag), math.nan), mag)
        return (b == 0).where(1.0, out).cast(a.dtype)

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
        return self._alu(Ops.NEG)

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
        return a._alu(Ops.CMPLT, b)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x, True)
        return a._alu(Ops.CMPLT, b)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        return (self < x) | (self == x)

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        return (self > x) | (self == x)

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return (self != x).logical_not()

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        a, b = self._broadcasted(x)
        return a._alu(Ops.CMPNE, b)

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

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, type(self)(True, device=self.device)._broadcast_to(self.shape))

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """x where this (bool) tensor is true, else y."""
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

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._alu(Ops.MAX, b)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return a._order_flip()._alu(Ops.MAX, b._order_flip())._order_flip()

    def _order_flip(self) -> Tensor:
        """An order-reversing bijection, so that min(x) = flip(max(flip(x)))."""
        if self.dtype.is_float:
            return -self
        return self.logical_not() if self.dtype.is_bool else self ^ -1

    # math
    def exp(self) -> Tensor:
        return (self._float_input() * (1 / math.log(2))).exp2()

    def exp2(self) -> Tensor:
        return self._float_input()._alu(Ops.EXP2)

    def log(self) -> Tensor:
        return self.log2() * math.log(2)

    def log2(self) -> Tensor:
        return self._float_input()._alu(Ops.LOG2)

    def sqrt(self) -> Tensor:
        return self._float_input()._alu(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._float_input()._alu(Ops.RECIP)

    def sin(self) -> Tensor:
        return self._float_input()._alu(Ops.SIN)

    def cos(self) -> Tensor:
        return (math.pi / 2 - self._float_input()).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t > self).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    def abs(self) -> Tensor:
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        if not self.dtype.is_float:
            return self.maximum(-self)
        # 0 where x is 0 (also -0.0, and the gradient there is 0, as PyTorch's); NaN stays NaN
        return (self < 0).where(-self, (self == 0).where(0.0, self))

    def sign(self) -> Tensor:
        if self.dtype.is_bool:
            return self
        return (
            (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
            if not self.dtype.is_unsigned
            else (self != 0).cast(self.dtype)
        )

    def relu(self) -> Tensor:
        """max(x, 0); NaN stays NaN, and the gradient at 0 is 0, as in PyTorch."""
        return (self <= 0).where(0, self)

    def sigmoid(self) -> Tensor:
        return (1 + (-self._float_input()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2 * (2 * self._float_input()).sigmoid() - 1

    def gelu(self) -> Tensor:
        x = self._float_input()
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def square(self) -> Tensor:
        return self * self

    def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        """Values below min_ become min_, above max_ become max_; the gradient passes at the bounds, NaN stays."""
        out = self
        if min_ is not None:
            out = (out < min_).where(min_, out)
        if max_ is not None:
            out = (out > max_).where(max_, out)
        return out

    clamp = clip

    def isnan(self) -> Tensor:
        return self != self if self.dtype.is_float else self.full_like(False, dtypes.bool)

    def isinf(self) -> Tensor:
        return (self.abs() == math.inf) if self.dtype.is_float else self.full_like(False, dtypes.bool)
