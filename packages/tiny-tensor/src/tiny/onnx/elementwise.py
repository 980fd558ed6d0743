"""ONNX's elementwise operators (arithmetic, comparisons, logic, math functions, casts) as tiny tensor ops,
and their NumPy forms for the small integer tensors of shape computations."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, onnx_dtype, register, same_dtype
from tiny.tensor import Tensor

# ---------------------------------------------------------------- elementwise


def _binary(fn):
    def op(c: NodeCall) -> Tensor:
        a, b = c.tensor(0), c.tensor(1)
        same_dtype(c, a, b)
        return fn(a, b)

    return op


register("Add")(_binary(lambda a, b: a + b))
register("Sub")(_binary(lambda a, b: a - b))
register("Mul")(_binary(lambda a, b: a * b))
register("Equal")(_binary(lambda a, b: a == b))
register("Less")(_binary(lambda a, b: a < b))
register("LessOrEqual")(_binary(lambda a, b: a <= b))
register("Greater")(_binary(lambda a, b: a > b))
register("GreaterOrEqual")(_binary(lambda a, b: a >= b))
register("And")(_binary(lambda a, b: a.logical_and(b)))
register("Or")(_binary(lambda a, b: a.logical_or(b)))
register("Xor")(_binary(lambda a, b: a.logical_xor(b)))
register("BitwiseAnd")(_binary(lambda a, b: a.bitwise_and(b)))
register("BitwiseOr")(_binary(lambda a, b: a.bitwise_or(b)))
register("BitwiseXor")(_binary(lambda a, b: a.bitwise_xor(b)))


@register("Div")
def div(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    same_dtype(c, a, b)
    return a / b if a.dtype.is_float else a.div(b, rounding_mode="trunc")  # integers: C's division, toward zero


@register("Mod")
def mod(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    same_dtype(c, a, b)
    if c.attr("fmod", 0):
        return a.fmod(b)  # the sign of the dividend, as C's fmod
    return a.mod(b)  # the sign of the divisor, as Python's %


@register("Pow")
def pow_(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)  # the result has the base's dtype
    if a.dtype.is_float:
        return a.pow(b.cast(a.dtype))
    if b.dtype.is_float:
        return a.cast(b.dtype).pow(b).cast(a.dtype)
    return a.pow(b.cast(a.dtype))


@register("BitShift")
def bitshift(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    direction = c.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"{c.where}: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return a.bitwise_left_shift(b) if direction == "LEFT" else a.bitwise_right_shift(b)


def _unary(fn):
    return lambda c: fn(c.tensor(0))


for _name, _fn in {
    "Abs": Tensor.abs,
    "Neg": Tensor.neg,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,  # halves to even, as ONNX
    "Sign": Tensor.sign,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tan": Tensor.tan,
    "Asin": Tensor.asin,
    "Acos": Tensor.acos,
    "Atan": Tensor.atan,
    "Sinh": Tensor.sinh,
    "Cosh": Tensor.cosh,
    "Asinh": Tensor.asinh,
    "Acosh": Tensor.acosh,
    "Atanh": Tensor.atanh,
    "Erf": Tensor.erf,
    "IsNaN": Tensor.isnan,
    "Not": Tensor.logical_not,
    "BitwiseNot": Tensor.bitwise_not,
    "Identity": lambda x: x,
}.items():
    register(_name)(_unary(_fn))


@register("IsInf")
def isinf(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    return (x == math.inf) * bool(pos) | (x == -math.inf) * bool(neg) if x.dtype.is_float else x != x


def _variadic(fn):
    def op(c: NodeCall) -> Tensor:
        ts = [c.tensor(i) for i in range(len(c.inputs))]
        same_dtype(c, *ts)
        return fn(ts)

    return op


register("Sum")(_variadic(lambda ts: reduce(lambda a, b: a + b, ts)))
register("Mean")(_variadic(lambda ts: reduce(lambda a, b: a + b, ts) / len(ts)))
register("Max")(_variadic(lambda ts: reduce(Tensor.maximum, ts)))
register("Min")(_variadic(lambda ts: reduce(Tensor.minimum, ts)))


@register("Where")
def where(c: NodeCall) -> Tensor:
    cond, a, b = c.tensor(0), c.tensor(1), c.tensor(2)
    same_dtype(c, a, b)
    return cond.cast(dtypes.bool).where(a, b)


@register("Clip")
def clip(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    if c.opset < 11:
        lo, hi = c.attr("min"), c.attr("max")
    else:
        lo, hi = c.scalar(1), c.scalar(2)
    if lo is not None:
        x = x.maximum(Tensor(lo, device=c.device, dtype=x.dtype))
    if hi is not None:
        x = x.minimum(Tensor(hi, device=c.device, dtype=x.dtype))
    return x


@register("Cast")
def cast(c: NodeCall) -> Tensor:
    return c.tensor(0).cast(onnx_dtype(c.attr("to"), c.where))


@register("CastLike")
def cast_like(c: NodeCall) -> Tensor:
    return c.tensor(0).cast(c.tensor(1).dtype)


# ---------------------------------------------------------------- host arithmetic of shape computations

for _name, _np in {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "Max": np.maximum,
    "Min": np.minimum,
}.items():
    register(_name, host=True)(
        lambda c, f=_np: reduce(f, [c.host(i) for i in range(len(c.inputs))]).astype(
            bool if f in (np.equal, np.less, np.greater) else c.host(0).dtype
        )
    )
register("Identity", host=True)(lambda c: c.host(0))
register("And", host=True)(lambda c: np.logical_and(c.host(0), c.host(1)))
register("Or", host=True)(lambda c: np.logical_or(c.host(0), c.host(1)))
register("Abs", host=True)(lambda c: np.abs(c.host(0)))
register("Not", host=True)(lambda c: np.logical_not(c.host(0)))
register("Neg", host=True)(lambda c: -c.host(0))
register("Where", host=True)(lambda c: np.where(c.host(0), c.host(1), c.host(2)))
_NP = {dt: np.dtype(dt.fmt) for dt in dtypes.all() if dt.fmt is not None}


@register("Cast", host=True)
def cast_host(c: NodeCall) -> np.ndarray | Tensor:
    to = onnx_dtype(c.attr("to"), c.where)
    return c.host(0).astype(_NP[to]) if to in _NP else cast(c)  # (bfloat16 has no NumPy dtype: a tensor)


@register("Div", host=True)
def div_host(c: NodeCall) -> np.ndarray:
    a, b = c.host(0), c.host(1)
    if a.dtype.kind == "f":
        return (a / b).astype(a.dtype)
    return (np.trunc(a / b)).astype(a.dtype)


@register("BitCast")
def bitcast(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    to = onnx_dtype(c.attr("to"), c.where)
    if to.itemsize != x.dtype.itemsize:
        raise ValueError(f"{c.where}: BitCast needs types of one size, got {x.dtype.name} to {to.name}")
    return x.bitcast(to)
