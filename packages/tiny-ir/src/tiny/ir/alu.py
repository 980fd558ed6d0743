"""What each ALU op computes on Python scalars: the executable definition every backend must match."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tiny.ir.dtypes import DType, truncate
from tiny.ir.uop import Ops


def _c_idiv(a: int, b: int) -> int:
    """C integer division: toward zero. Division by zero gives 0 (the hardware's answer varies)."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _c_mod(a: int | float, b: int | float) -> int | float:
    """C remainder: a - b * (a / b), with the sign of a; fmod for floats (exact; NaN for b == 0)."""
    if isinstance(a, float) or isinstance(b, float):
        return math.nan if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b) else math.fmod(a, b)
    return 0 if b == 0 else a - b * _c_idiv(a, b)


def _fdiv(a: float, b: float) -> float:
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _recip(a: float) -> float:
    return _fdiv(1.0, a)


def _sqrt(a: float) -> float:
    return math.nan if a < 0 or math.isnan(a) else math.sqrt(a)


def _log2(a: float) -> float:
    if math.isnan(a) or a < 0:
        return math.nan
    if a == 0:
        return -math.inf
    return math.log2(a) if a != math.inf else math.inf


def _exp2(a: float) -> float:
    try:
        return 2.0**a
    except OverflowError:
        return math.inf


def _sin(a: float) -> float:
    return math.nan if math.isinf(a) or math.isnan(a) else math.sin(a)


def _trunc(a: float) -> float:
    return a if math.isinf(a) or math.isnan(a) else math.copysign(float(math.trunc(a)), a)


def _max(a: Any, b: Any) -> Any:
    """MAX propagates NaN, as torch.maximum does."""
    if isinstance(a, float) and math.isnan(a):
        return a
    if isinstance(b, float) and math.isnan(b):
        return b
    return a if a >= b else b


def _shr(a: int, b: int, dtype: DType) -> int:
    return a >> b if b < dtype.bits else (-1 if a < 0 else 0)


def _shl(a: int, b: int, dtype: DType) -> int:
    return a << b if b < dtype.bits else 0


def _dot4(a: int, b: int) -> int:
    """Ops.DOT4: a's four bytes, unsigned, times b's, signed, summed."""
    total = 0
    for shift in (0, 8, 16, 24):
        unsigned, signed = (a >> shift) & 0xFF, (((b >> shift) & 0xFF) ^ 0x80) - 0x80
        total += unsigned * signed
    return total


def _sdot4(a: int, b: int) -> int:
    """Ops.SDOT4: a's four bytes times b's, both signed, summed."""
    return sum(((((a >> s) & 0xFF) ^ 0x80) - 0x80) * ((((b >> s) & 0xFF) ^ 0x80) - 0x80) for s in (0, 8, 16, 24))


_PY: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda a: (not a) if isinstance(a, bool) else -a,
    Ops.RECIP: _recip,
    Ops.SQRT: _sqrt,
    Ops.EXP2: _exp2,
    Ops.LOG2: _log2,
    Ops.SIN: _sin,
    Ops.TRUNC: _trunc,
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.FDIV: _fdiv,
    Ops.IDIV: _c_idiv,
    Ops.MOD: _c_mod,
    Ops.MAX: _max,
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.DOT4: _dot4,
    Ops.SDOT4: _sdot4,
    Ops.WHERE: lambda c, a, b: a if c else b,
}


def exec_alu(op: Ops, dtype: DType, operands: tuple[Any, ...]) -> Any:
    """The value of `op` on Python scalars, as a value of `dtype` (wrapped, rounded to its precision)."""
    if op is Ops.SHL:
        out = _shl(operands[0], operands[1], dtype)
    elif op is Ops.SHR:
        out = _shr(operands[0], operands[1], dtype)
    elif op is Ops.ADD and dtype.is_bool:
        out = operands[0] or operands[1]
    elif op is Ops.MUL and dtype.is_bool:
        out = operands[0] and operands[1]
    else:
        out = _PY[op](*operands)
    return truncate(dtype, out)
